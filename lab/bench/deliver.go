package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"edgegw/ringstore"
	"edgegw/web"
	"edgegw/wire"
)

// Delivery methods.
const (
	MethodShort = "short" // GET /api/shortPolling, open loop at ShortPeriod
	MethodLong  = "long"  // GET /api/longPolling back to back
	MethodWS    = "ws"    // GET /api/ws
	MethodMQTT  = "mqtt"  // peer: mosquitto fan-out to N subscribers
)

// AllMethods is the default order.
var AllMethods = []string{MethodShort, MethodLong, MethodWS, MethodMQTT}

// DefaultClients is the SCADA study's client matrix.
var DefaultClients = []int{1, 10, 30, 50, 100, 500, 1000}

// DeliverConfig configures `bench deliver`. The zero value is the study's
// matrix at 10 updates a second, 30 s per step.
type DeliverConfig struct {
	Clients     []int         // DefaultClients
	Methods     []string      // AllMethods
	Duration    time.Duration // 30s measured per step
	Rate        float64       // 10 updates (ring batches) a second
	Batch       int           // 1 sample per update
	Tags        int           // 48 distinct tags (one per simulated logger) cycled through
	ShortPeriod time.Duration // 100ms per short-polling client
	Ramp        time.Duration // clients connect spread over this; default 1s + 1ms per client
	Drain       time.Duration // after the source pauses, how long clients may take to catch up; 3s
	// Mosquitto is the mosquitto binary; "" looks on PATH; "off" skips it.
	Mosquitto string
	// Before runs another edgegw lab binary (say, built from an earlier
	// commit; Path "" for none): every short, long and ws step then also
	// runs against its gateway child, with this process's clients, as the
	// method "METHOD@before", interleaved with this binary's (see Repeat).
	Before Exec
	// Repeat runs every step this many times (default 1); with Before, the
	// pair before/after is repeated, the order alternating (before, after;
	// after, before; …) so neither side always runs first. With Before or
	// Repeat > 1 the report's Compare has the medians.
	Repeat int
	Exec   Exec
	Logger *slog.Logger
	// Profile, when set, is a directory where each gateway child writes a
	// CPU profile of its whole run (deliver-METHOD-N.pprof; METHOD-before
	// for Before's child; -rK appended for run K when Repeat > 1).
	Profile string
}

func (c DeliverConfig) fill() DeliverConfig {
	if len(c.Clients) == 0 {
		c.Clients = DefaultClients
	}
	if len(c.Methods) == 0 {
		c.Methods = AllMethods
	}
	if c.Duration <= 0 {
		c.Duration = 30 * time.Second
	}
	if c.Rate <= 0 {
		c.Rate = 10
	}
	if c.Batch <= 0 {
		c.Batch = 1
	}
	if c.Tags <= 0 {
		c.Tags = 48
	}
	if c.ShortPeriod <= 0 {
		c.ShortPeriod = 100 * time.Millisecond
	}
	if c.Drain <= 0 {
		c.Drain = 3 * time.Second
	}
	if c.Repeat <= 0 {
		c.Repeat = 1
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

// StepReport is one method at one client count.
type StepReport struct {
	Method    string  `json:"method"` // METHOD, or METHOD@before (DeliverConfig.Before's gateway)
	Clients   int     `json:"clients"`
	Run       int     `json:"run,omitempty"` // 1…Repeat when the step is repeated
	Connected int     `json:"connected"`     // clients that got a first reply
	Seconds   float64 `json:"seconds"`       // measured window
	Where     string  `json:"where"`
	Skipped   string  `json:"skipped,omitempty"`

	// Samples. Sent: appended by the source during the measured window.
	// Per client: received + missed = samples appended between its first
	// reply and the end of the step (checked; Inconsistent counts clients
	// where it does not hold).
	Sent         uint64 `json:"sent"`
	Expected     uint64 `json:"expected"` // Σ over clients of samples appended while each was connected
	Received     uint64 `json:"received"`
	Missed       uint64 `json:"missed"`
	Duplicates   uint64 `json:"duplicates"`
	Repeated     uint64 `json:"repeated"` // short polling: unchanged samples sent again
	Resets       uint64 `json:"resets"`
	Inconsistent int    `json:"inconsistent"`

	LatP50 float64 `json:"latency_p50_ms"` // receipt − sample ts, measured window only
	LatP95 float64 `json:"latency_p95_ms"`
	LatP99 float64 `json:"latency_p99_ms"`
	LatMax float64 `json:"latency_max_ms"`
	LatN   uint64  `json:"latency_n"`
	Hist   *Hist   `json:"-"`

	Requests     uint64  `json:"requests"` // HTTP requests, or messages received (ws, mqtt)
	Overruns     uint64  `json:"overruns"` // short polling: requests that took longer than the period
	Errors       uint64  `json:"errors"`
	PayloadBytes uint64  `json:"payload_bytes"` // JSON bodies / WebSocket or MQTT message payloads
	WireBytes    uint64  `json:"wire_bytes"`    // read+written on the client sockets (app level)
	PayloadShare float64 `json:"payload_share"`
	UsefulBytes  uint64  `json:"useful_bytes"` // JSON of the samples each client received new (no envelope, no repeats)
	UsefulShare  float64 `json:"useful_share"` // useful / wire: the study's "payload vs overhead"
	Dials        uint64  `json:"dials"`        // new connections opened by the clients

	CPUPercent float64 `json:"cpu_percent"`         // gateway (or mosquitto), % of one core
	LoadCPU    float64 `json:"load_cpu_percent"`    // the bench process (clients, and the MQTT publisher)
	MachineCPU float64 `json:"machine_cpu_percent"` // every process on the machine, % of one core
	RSSMiB     float64 `json:"rss_mib"`
	HWMMiB     float64 `json:"hwm_mib"`

	WSDropped uint64 `json:"ws_dropped,omitempty"` // clients the gateway dropped as too slow
	Rejected  uint64 `json:"rejected,omitempty"`   // 503 beyond MaxClients
}

// DeliverReport is the result of RunDeliver.
type DeliverReport struct {
	Started     time.Time    `json:"started"`
	Machine     Machine      `json:"machine"`
	Rate        float64      `json:"rate_hz"`
	Batch       int          `json:"batch"`
	Tags        int          `json:"tags"`
	Duration    string       `json:"duration"`
	ShortPeriod string       `json:"short_period"`
	Source      string       `json:"source"`
	Before      string       `json:"before,omitempty"` // the other binary of the METHOD@before steps
	Repeat      int          `json:"repeat,omitempty"`
	Steps       []StepReport `json:"steps"` // in the order run
	Compare     []Compare    `json:"compare,omitempty"`
}

// Side is the medians of one side's runs of one method at one client count.
type Side struct {
	Runs   int     `json:"runs"`
	LatP50 float64 `json:"latency_p50_ms"`
	LatP99 float64 `json:"latency_p99_ms"`
	CPU    float64 `json:"cpu_percent"`
}

// Compare is one method at one client count over its runs: this binary's
// gateway (After) and, with Before, the other binary's, and the ratios
// after / before of the medians (0 when there is no before side).
type Compare struct {
	Method   string  `json:"method"`
	Clients  int     `json:"clients"`
	After    Side    `json:"after"`
	Before   *Side   `json:"before,omitempty"`
	P99Ratio float64 `json:"p99_ratio,omitempty"`
	CPURatio float64 `json:"cpu_ratio,omitempty"`
}

// median of v (the mean of the middle two when len(v) is even); 0 for none.
func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// sideOf is the medians of the steps (skipped ones left out).
func sideOf(steps []StepReport) Side {
	var p50, p99, cpu []float64
	for _, s := range steps {
		if s.Skipped != "" {
			continue
		}
		p50, p99, cpu = append(p50, s.LatP50), append(p99, s.LatP99), append(cpu, s.CPUPercent)
	}
	return Side{Runs: len(p99), LatP50: median(p50), LatP99: median(p99), CPU: median(cpu)}
}

// compare folds the runs of one method at one client count.
func compare(method string, clients int, after, before []StepReport, withBefore bool) Compare {
	c := Compare{Method: method, Clients: clients, After: sideOf(after)}
	if withBefore {
		b := sideOf(before)
		c.Before = &b
		if b.LatP99 > 0 {
			c.P99Ratio = c.After.LatP99 / b.LatP99
		}
		if b.CPU > 0 {
			c.CPURatio = c.After.CPU / b.CPU
		}
	}
	return c
}

// DeliverStudy is the SCADA study's headline at 1000 clients.
const DeliverStudy = "study at 1000 clients: WebSocket p50 10 ms, p99 33 ms, 36% CPU; payload share 17% (WebSocket) vs 7% (HTTP)"

// RunDeliver runs every method at every client count: a fresh gateway child
// per step (ring + web server fed by a synthetic source at Rate), the
// clients in this process.
func RunDeliver(ctx context.Context, cfg DeliverConfig) (*DeliverReport, error) {
	cfg = cfg.fill()
	rep := &DeliverReport{
		Started: time.Now(), Machine: thisMachine(), Rate: cfg.Rate, Batch: cfg.Batch, Tags: cfg.Tags,
		Duration: cfg.Duration.String(), ShortPeriod: cfg.ShortPeriod.String(),
		Source: fmt.Sprintf("synthetic: %d sample(s) every %v appended to the gateway's ring, cycling over %d tags, ts = append time",
			cfg.Batch, period(cfg.Rate), cfg.Tags),
	}
	limit, err := RaiseFileLimit()
	if err != nil {
		cfg.Logger.Warn("bench: cannot raise the file limit", "err", err)
	}
	mosq, whyNot := findMosquitto(cfg.Mosquitto)
	for _, m := range cfg.Methods {
		switch m {
		case MethodShort, MethodLong, MethodWS, MethodMQTT:
		default:
			return nil, fmt.Errorf("bench: deliver: method %q is not short, long, ws or mqtt", m)
		}
	}
	if cfg.Before.Path != "" {
		rep.Before = cfg.Before.Path
	}
	if cfg.Repeat > 1 {
		rep.Repeat = cfg.Repeat
	}
	for _, m := range cfg.Methods {
		for _, n := range cfg.Clients {
			if err := ctx.Err(); err != nil {
				return rep, err
			}
			if limit > 0 && uint64(n)*2+64 > limit {
				rep.Steps = append(rep.Steps, StepReport{Method: m, Clients: n, Skipped: fmt.Sprintf("file limit %d too low", limit)})
				continue
			}
			if m == MethodMQTT && mosq == "" {
				rep.Steps = append(rep.Steps, StepReport{Method: m, Clients: n, Skipped: whyNot})
				continue
			}
			// The sides of this step: this binary's gateway, and before it
			// (in odd runs; after it in even ones) the other binary's.
			// mosquitto is the same peer for both: it runs once per run.
			withBefore := cfg.Before.Path != "" && m != MethodMQTT
			var after, before []StepReport
			for run := 1; run <= cfg.Repeat; run++ {
				sides := []bool{false} // isBefore of each side, in the order run
				if withBefore {
					sides = []bool{run%2 == 1, run%2 == 0}
				}
				for _, isBefore := range sides {
					st, err := deliverStep(ctx, cfg, mosq, m, n, run, isBefore)
					if err != nil {
						return rep, err
					}
					if isBefore {
						before = append(before, st)
					} else {
						after = append(after, st)
					}
					rep.Steps = append(rep.Steps, st)
				}
			}
			if withBefore || cfg.Repeat > 1 {
				rep.Compare = append(rep.Compare, compare(m, n, after, before, withBefore))
			}
		}
	}
	return rep, nil
}

// deliverStep runs one step: method m with n clients, against this
// binary's gateway child, the Before binary's (isBefore), or mosquitto.
func deliverStep(ctx context.Context, cfg DeliverConfig, mosq, m string, n, run int, isBefore bool) (StepReport, error) {
	label, x := m, cfg.Exec
	if isBefore {
		label, x = m+"@before", cfg.Before
	}
	profile := fmt.Sprintf("deliver-%s-%d", strings.Replace(label, "@", "-", 1), n)
	if cfg.Repeat > 1 {
		profile += fmt.Sprintf("-r%d", run)
	}
	cfg.Logger.Info("bench: deliver", "method", label, "clients", n, "run", run, "duration", cfg.Duration)
	var st StepReport
	var err error
	if m == MethodMQTT {
		st, err = mqttStep(ctx, cfg, mosq, n)
	} else {
		st, err = gatewayStep(ctx, cfg, x, m, n, profile)
	}
	if err != nil {
		if isBefore {
			return st, fmt.Errorf("bench: deliver %s × %d with %s: %w", label, n, x.Path, err)
		}
		return st, fmt.Errorf("bench: deliver %s × %d: %w", label, n, err)
	}
	st.Method = label
	if cfg.Repeat > 1 {
		st.Run = run
	}
	if isBefore {
		st.Where += "; the gateway child of " + x.Path
	}
	return st, nil
}

func period(rate float64) time.Duration { return time.Duration(float64(time.Second) / rate) }

// clientResult is one client's record, owned by its goroutine until it exits.
type clientResult struct {
	started   bool   // got its first reply
	start     uint64 // seq of the first reply: the client expects everything after it
	last      uint64 // highest seq seen
	received  uint64
	missed    uint64
	dups      uint64
	repeated  uint64
	resets    uint64
	requests  uint64
	overruns  uint64
	errors    uint64
	payload   uint64
	useful    uint64 // JSON bytes of the samples received new
	lat       Hist
	lastAtom  atomic.Uint64 // copy of last for the drain check
	readyOnce sync.Once
	ready     chan struct{} // closed at the first reply or when the client gives up
}

func newClientResult() *clientResult { return &clientResult{ready: make(chan struct{})} }

func (r *clientResult) markReady() { r.readyOnce.Do(func() { close(r.ready) }) }

// begin records the first reply's seq.
func (r *clientResult) begin(seq uint64) {
	r.started, r.start, r.last = true, seq, seq
	r.lastAtom.Store(seq)
	r.markReady()
}

// observe counts one sample (of size JSON bytes) of a stream that promises
// every sample once, in order.
func (r *clientResult) observe(seq uint64, ts int64, size int, now int64, record bool) {
	if seq <= r.last {
		r.dups++
		return
	}
	r.missed += seq - r.last - 1
	r.last = seq
	r.received++
	r.useful += uint64(size)
	if record {
		r.lat.Record(now - ts)
	}
}

// skipTo moves the cursor to seq: what was not received up to it is missed.
func (r *clientResult) skipTo(seq uint64) {
	if seq > r.last {
		r.missed += seq - r.last
		r.last = seq
	}
}

// observeAll counts every sample of a reply body (rest, after its head).
func (r *clientResult) observeAll(rest []byte, now int64, record bool) {
	if err := wire.EachSample(rest, func(seq uint64, ts int64, size int) { r.observe(seq, ts, size, now, record) }); err != nil {
		r.errors++
	}
}

// take applies one reply of a stream: the first starts the count, a reset
// (or snapshot) jumps the cursor, any other is observed sample by sample.
func (r *clientResult) take(h wire.Head, rest []byte, reset bool, now int64, record bool) {
	switch {
	case !r.started:
		r.begin(h.Seq)
	case reset:
		r.jump(h.Seq)
	default:
		r.observeAll(rest, now, record)
	}
	r.lastAtom.Store(r.last)
}

// jump is a reset: the gateway says the client's cursor fell out of its ring.
func (r *clientResult) jump(seq uint64) {
	r.skipTo(seq)
	r.resets++
}

// finish counts the samples up to final that never arrived.
func (r *clientResult) finish(final uint64) {
	if r.started && final > r.last {
		r.missed += final - r.last
		r.last = final
	}
}

// stepRun is the shared state of one step's clients.
type stepRun struct {
	cfg       DeliverConfig
	addr      string
	wire      wireCounter
	recording atomic.Bool
}

// runClients starts n clients ramped over cfg.Ramp, waits until each got
// its first reply (or gave up), then calls window (the measured part, with
// recording on, ending with the source paused and the clients drained),
// then cancels the clients and waits for them.
func runClients(ctx context.Context, cfg DeliverConfig, n int, run *stepRun,
	client func(ctx context.Context, r *clientResult), window func(results []*clientResult) error) ([]*clientResult, error) {
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ramp := cfg.Ramp
	if ramp <= 0 {
		ramp = time.Second + time.Duration(n)*time.Millisecond
	}
	results := make([]*clientResult, n)
	var wg sync.WaitGroup
	for i := range results {
		r := newClientResult()
		results[i] = r
		delay := ramp * time.Duration(i) / time.Duration(n)
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer r.markReady()
			if sleepCtx(cctx, delay) != nil {
				return
			}
			client(cctx, r)
		}()
	}
	deadline := time.NewTimer(ramp + 20*time.Second)
	defer deadline.Stop()
	var err error
wait:
	for _, r := range results {
		select {
		case <-r.ready:
		case <-deadline.C:
			break wait
		case <-ctx.Done():
			err = ctx.Err()
			break wait
		}
	}
	if err == nil {
		run.recording.Store(true)
		err = window(results)
		run.recording.Store(false)
	}
	cancel()
	wg.Wait()
	return results, err
}

// drain waits until every started client has seen final, or d passes.
func drain(results []*clientResult, final uint64, d time.Duration) {
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		behind := false
		for _, r := range results {
			if r.started && r.lastAtom.Load() < final {
				behind = true
				break
			}
		}
		if !behind {
			return
		}
		t := time.NewTimer(10 * time.Millisecond) // condition poll with a deadline
		<-t.C
	}
}

// summarize folds the clients into st.
func summarize(st *StepReport, results []*clientResult, final uint64) {
	var h Hist
	for _, r := range results {
		if !r.started {
			st.Errors += r.errors
			continue
		}
		r.finish(final)
		st.Connected++
		st.Expected += final - r.start
		if r.received+r.missed != final-r.start {
			st.Inconsistent++
		}
		st.Received += r.received
		st.Missed += r.missed
		st.Duplicates += r.dups
		st.Repeated += r.repeated
		st.Resets += r.resets
		st.Requests += r.requests
		st.Overruns += r.overruns
		st.Errors += r.errors
		st.PayloadBytes += r.payload
		st.UsefulBytes += r.useful
		h.Merge(&r.lat)
	}
	st.Hist = &h
	st.LatN = h.N
	st.LatP50, st.LatP95, st.LatP99 = h.Quantile(0.5)/1000, h.Quantile(0.95)/1000, h.Quantile(0.99)/1000
	st.LatMax = float64(h.Max) / 1000
}

func (st *StepReport) setWire(w *wireCounter) {
	st.WireBytes = w.read.Load() + w.written.Load()
	st.Dials = w.dials.Load()
	if st.WireBytes > 0 {
		st.PayloadShare = float64(st.PayloadBytes) / float64(st.WireBytes)
		st.UsefulShare = float64(st.UsefulBytes) / float64(st.WireBytes)
	}
}

// delSpec is the delivery child's configuration.
type delSpec struct {
	Rate     float64 `json:"rate"`
	Batch    int     `json:"batch"`
	Tags     int     `json:"tags"`
	Clients  int     `json:"clients"`
	RingSize int     `json:"ring_size"`
	Profile  string  `json:"profile,omitempty"`
}

type delReady struct {
	Addr string `json:"addr"`
}

type delSnap struct {
	Usage Usage           `json:"usage"`
	Seq   uint64          `json:"seq"`
	Stats web.ClientStats `json:"stats"`
}

const roleDeliver = "deliver-gateway"

// gatewayStep measures one method with n clients against a fresh gateway child.
// x is the binary whose child runs the gateway; profile names its CPU profile.
func gatewayStep(ctx context.Context, cfg DeliverConfig, x Exec, method string, n int, profile string) (StepReport, error) {
	st := StepReport{Method: method, Clients: n,
		Where: "gateway (ring + web server + synthetic source) in a child process; clients in the bench process"}
	var ready delReady
	c, err := startChild(ctx, x, roleDeliver, delSpec{Rate: cfg.Rate, Batch: cfg.Batch, Tags: cfg.Tags, Clients: n,
		Profile: profilePath(cfg.Profile, profile)}, &ready)
	if err != nil {
		return st, err
	}
	defer c.stop()
	run := &stepRun{cfg: cfg, addr: ready.Addr}
	var client func(ctx context.Context, r *clientResult)
	var closeIdle func()
	switch method {
	case MethodShort:
		hc := newHTTPClient(run, n)
		closeIdle = hc.CloseIdleConnections
		client = func(ctx context.Context, r *clientResult) { shortClient(ctx, run, hc, r) }
	case MethodLong:
		hc := newHTTPClient(run, n)
		closeIdle = hc.CloseIdleConnections
		client = func(ctx context.Context, r *clientResult) { longClient(ctx, run, hc, r) }
	case MethodWS:
		client = func(ctx context.Context, r *clientResult) { wsClient(ctx, run, r) }
	}
	var a, b, p delSnap
	var la, lb Usage
	var ma, mb machineCPU
	results, err := runClients(ctx, cfg, n, run, client, func(results []*clientResult) error {
		if err := c.call("snap", &a); err != nil {
			return err
		}
		la, ma = selfUsage(), readMachineCPU()
		_ = sleepCtx(ctx, cfg.Duration)
		lb, mb = selfUsage(), readMachineCPU()
		if err := c.call("snap", &b); err != nil {
			return err
		}
		if err := c.call("pause", &p); err != nil {
			return err
		}
		drain(results, p.Seq, cfg.Drain)
		return nil
	})
	if closeIdle != nil {
		closeIdle()
	}
	if err != nil {
		return st, err
	}
	// Clients have exited: their records are ours now.
	summarize(&st, results, p.Seq)
	st.setWire(&run.wire)
	st.Seconds = b.Usage.At.Sub(a.Usage.At).Seconds()
	st.Sent = b.Seq - a.Seq
	st.CPUPercent = cpuPercent(a.Usage, b.Usage)
	st.LoadCPU, st.MachineCPU = cpuPercent(la, lb), machinePercent(ma, mb)
	st.RSSMiB, st.HWMMiB = mib(b.Usage.RSS), mib(b.Usage.HWM)
	st.WSDropped = b.Stats.WSDropped
	st.Rejected = b.Stats.ShortPolling.Rejected + b.Stats.LongPolling.Rejected + b.Stats.WebSocket.Rejected
	return st, nil
}

// source appends synthetic samples to the ring at a fixed rate: update k
// carries Batch samples of tags k·Batch … (mod Tags), ts = now.
type source struct {
	ring  *ringstore.Ring
	spec  delSpec
	names []string
	k     int
}

func (s *source) update() error {
	batch := make([]ringstore.Sample, s.spec.Batch)
	now := time.Now().UnixMicro()
	for i := range batch {
		t := (s.k*s.spec.Batch + i) % s.spec.Tags
		batch[i] = ringstore.Sample{Device: s.names[t], Tag: "value", Value: math.Round(200+100*math.Sin(float64(s.k)/10)) / 10, TS: now}
	}
	s.k++
	_, _, err := s.ring.Append(batch)
	return err
}

func (s *source) run(ctx context.Context) error {
	t := time.NewTicker(period(s.spec.Rate))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			if err := s.update(); err != nil {
				return err
			}
		}
	}
}

// childDeliver is the gateway side of `bench deliver`: a ring fed by the
// synthetic source and the web server on 127.0.0.1:0.
func childDeliver(in io.Reader, out io.Writer) error {
	cio := newChildIO(in, out)
	var spec delSpec
	if err := cio.spec(&spec); err != nil {
		return err
	}
	stopProfile, err := startProfile(spec.Profile)
	if err != nil {
		return err
	}
	defer stopProfile()
	seq, err := ringstore.OpenSequence("")
	if err != nil {
		return err
	}
	ring := ringstore.NewRing(spec.RingSize, seq)
	src := &source{ring: ring, spec: spec}
	for i := 0; i < spec.Tags; i++ {
		src.names = append(src.names, fmt.Sprintf("logger-%02d", i+1))
	}
	for i := 0; i < (spec.Tags+spec.Batch-1)/spec.Batch; i++ { // every tag has a value before the first client
		if err := src.update(); err != nil {
			return err
		}
	}
	srv := web.New(web.Config{Listen: "127.0.0.1:0", Ring: ring, MaxClients: max(2*spec.Clients, web.DefaultMaxClients),
		RateLimit: web.RateLimits{ExemptLoopback: true}}) // the load comes from loopback
	addr, err := srv.Listen()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	srvDone := make(chan error, 1)
	go func() { srvDone <- srv.Serve(ctx) }()
	srcCtx, pause := context.WithCancel(ctx)
	srcDone := make(chan error, 1)
	go func() { srcDone <- src.run(srcCtx) }()
	var srcErr error
	paused := false
	stopSource := func() {
		if !paused {
			paused = true
			pause()
			srcErr = <-srcDone
		}
	}
	err = cio.reply("ready ", delReady{Addr: addr.String()})
	if err == nil {
		err = cio.serve(func(cmd string) any {
			if cmd == "pause" {
				stopSource()
			}
			return delSnap{Usage: selfUsage(), Seq: ring.Seq(), Stats: srv.Stats()}
		})
	}
	stopSource()
	cancel()
	serr := <-srvDone
	return errors.Join(err, srcErr, serr)
}
