package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"time"

	"edgegw/edge"
	"edgegw/lab/sim"
	"edgegw/ringstore"
	"edgegw/stats"
)

// Acquisition modes, run one after another on the same loggers.
const (
	ModeTCPSerial   = "tcp-serial"
	ModeTCPParallel = "tcp-parallel"
	ModeUDP         = "udp"
)

// AllModes is the default order.
var AllModes = []string{ModeTCPSerial, ModeTCPParallel, ModeUDP}

// AcquireConfig configures `bench acquire`. The zero value is the study's
// setup: 48 loggers at 1 s for 60 s per mode, every mode, no faults.
type AcquireConfig struct {
	Devices  int           // 48
	Interval time.Duration // 1s
	Duration time.Duration // 60s measured per mode
	Warmup   time.Duration // 2 intervals, at least 1s: polled but not measured
	Modes    []string      // AllModes
	Timeout  time.Duration // per request: 200ms (udp) / 500ms (tcp), at most Interval
	Retries  int           // 1 (only inside the interval); -1 for none
	Loss     float64       // each of request and response dropped with this probability
	Faults   sim.Faults    // further faults (Delay, Jitter, Duplicate, …); Loss adds to DropRequest/DropResponse
	// RestartEvery restarts one logger (round robin) this often; 0 never.
	RestartEvery time.Duration
	// Telegraf is the path of a telegraf binary with inputs.modbus; "" looks
	// on PATH; "off" skips it.
	Telegraf string
	// Before runs another edgegw lab binary (say, built from an earlier
	// commit; Path "" for none): every mode then runs its gateway child
	// too, just before this binary's, on the same loggers, as the row
	// "MODE@before".
	Before Exec
	Exec   Exec         // how to re-execute this binary (default os.Executable() bench)
	Logger *slog.Logger // progress; nil: discard
	// Profile, when set, is a directory where each gateway child writes a
	// CPU profile of its whole run (acquire-MODE.pprof); in mode full, the
	// gateway's CPU profile of the window and heap profile at its end
	// (full-cpu.pprof, full-heap.pprof).
	Profile string
	// Gateway is the gateway binary mode full runs ("": built from the
	// module around the working directory with build/gateway.flags).
	Gateway string
	// FullConfig is TOML that mode full adds to the gateway's default
	// config, after [gateway] and [http]: sections such as [ring] and
	// [history], to measure a site's settings ("": the defaults).
	FullConfig string
}

func (c AcquireConfig) fill() AcquireConfig {
	if c.Devices <= 0 {
		c.Devices = 48
	}
	if c.Interval <= 0 {
		c.Interval = time.Second
	}
	if c.Duration <= 0 {
		c.Duration = 60 * time.Second
	}
	if c.Warmup <= 0 {
		c.Warmup = max(2*c.Interval, time.Second)
	}
	if len(c.Modes) == 0 {
		c.Modes = AllModes
	}
	if c.Retries == 0 {
		c.Retries = 1
	}
	if c.Retries < 0 {
		c.Retries = 0
	}
	c.Faults.DropRequest += c.Loss
	c.Faults.DropResponse += c.Loss
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

// ModeReport is one acquisition mode (or peer) over the measured window.
type ModeReport struct {
	Mode    string `json:"mode"`
	Where   string `json:"where"` // which side ran in which process
	Skipped string `json:"skipped,omitempty"`

	Devices  int     `json:"devices"`
	Interval string  `json:"interval"`
	Seconds  float64 `json:"seconds"` // measured window

	Polls      uint64 `json:"polls"`
	GoodPolls  uint64 `json:"good_polls"`
	Scheduled  uint64 `json:"scheduled"` // polls + overruns + skipped windows
	Overruns   uint64 `json:"overruns"`
	Requests   uint64 `json:"requests"`
	Responses  uint64 `json:"responses"`
	Timeouts   uint64 `json:"timeouts"`
	Errors     uint64 `json:"errors"`
	Reconnects uint64 `json:"reconnects"`
	Late       uint64 `json:"late"`
	Duplicates uint64 `json:"duplicates"`

	// Poll cycle: one device's whole poll (every read of it, retries
	// included), from stats.Device.Cycle, all devices merged. Milliseconds.
	CycleP50 float64 `json:"cycle_p50_ms"`
	CycleP99 float64 `json:"cycle_p99_ms"`
	RTTP50   float64 `json:"rtt_p50_ms"`
	RTTP95   float64 `json:"rtt_p95_ms"`
	RTTP99   float64 `json:"rtt_p99_ms"`

	LossRate  float64 `json:"loss_rate"`  // requests without a valid response
	ValidRate float64 `json:"valid_rate"` // good polls / scheduled polls

	CPUPercent   float64 `json:"cpu_percent"`         // % of one core over the window
	LoadCPU      float64 `json:"load_cpu_percent"`    // the bench process (the loggers)
	MachineCPU   float64 `json:"machine_cpu_percent"` // every process on the machine
	CPUPerPollUS float64 `json:"cpu_per_poll_us"`
	RSSMiB       float64 `json:"rss_mib"`
	HWMMiB       float64 `json:"hwm_mib"`
	// Mode full: RSS by kind at the window's end (/proc/PID/status):
	// anonymous (heap, stacks, runtime) and file-backed (the binary's pages).
	RSSAnonMiB float64 `json:"rss_anon_mib,omitempty"`
	RSSFileMiB float64 `json:"rss_file_mib,omitempty"`

	// The loggers' side, over the same window.
	SimRequests uint64 `json:"sim_requests"`
	SimReplies  uint64 `json:"sim_replies"`
	SimDropped  uint64 `json:"sim_dropped"`
}

// AcquireReport is the result of RunAcquire.
type AcquireReport struct {
	Started  time.Time      `json:"started"`
	Machine  Machine        `json:"machine"`
	Devices  int            `json:"devices"`
	Interval string         `json:"interval"`
	Duration string         `json:"duration"`
	Loss     float64        `json:"loss"`
	Faults   string         `json:"faults"`
	Restart  string         `json:"restart_every,omitempty"`
	Timeout  string         `json:"timeout"` // per request, per transport
	Retries  int            `json:"retries"` // inside the interval
	Modes    []ModeReport   `json:"modes"`
	Study    []StudyNumbers `json:"study"`
}

// StudyNumbers are a published study's figures, printed beside ours.
type StudyNumbers struct {
	Label    string  `json:"label"`
	CycleP50 float64 `json:"cycle_p50_ms,omitempty"`
	CycleP99 float64 `json:"cycle_p99_ms,omitempty"`
	RTTP50   float64 `json:"rtt_p50_ms,omitempty"`
	RTTP99   float64 `json:"rtt_p99_ms,omitempty"`
	Loss     float64 `json:"loss_rate,omitempty"`
	Valid    float64 `json:"valid_rate,omitempty"`
	CPU      string  `json:"cpu,omitempty"`
	RSS      string  `json:"rss,omitempty"`
}

// AcquireStudy is the 48-logger polling study's table.
var AcquireStudy = []StudyNumbers{
	{Label: "study udp", CycleP50: 95, CycleP99: 180, RTTP50: 2.1, RTTP99: 12, Loss: 0.003, Valid: 0.997, CPU: "8–12%", RSS: "45 MB"},
	{Label: "study tcp-parallel", CPU: "35%", RSS: "320 MB"},
}

// acqSpec is what the acquisition child polls.
type acqSpec struct {
	TCPMode  string        `json:"tcp_mode"`
	Devices  []acqDevice   `json:"devices"`
	Interval time.Duration `json:"interval"`
	Timeout  time.Duration `json:"timeout"`
	Retries  int           `json:"retries"`
	Profile  string        `json:"profile,omitempty"`
}

type acqDevice struct {
	Name      string `json:"name"`
	Transport string `json:"transport"`
	Address   string `json:"address"`
}

// acqSnap is the child's answer to "snap".
type acqSnap struct {
	Usage   Usage            `json:"usage"`
	Devices []stats.Snapshot `json:"devices"`
	Appends uint64           `json:"appends"`
}

// RunAcquire runs the loggers in this process and, for each mode in turn,
// the gateway's acquisition (edge + ring) in a child process, and measures
// the child over Duration after Warmup.
func RunAcquire(ctx context.Context, cfg AcquireConfig) (*AcquireReport, error) {
	cfg = cfg.fill()
	rep := &AcquireReport{
		Started: time.Now(), Machine: thisMachine(), Devices: cfg.Devices,
		Interval: cfg.Interval.String(), Duration: cfg.Duration.String(), Loss: cfg.Loss,
		Faults: faultsString(cfg.Faults), Study: AcquireStudy, Retries: cfg.Retries,
		Timeout: fmt.Sprintf("udp %v, tcp %v", timeoutFor(cfg, "udp"), timeoutFor(cfg, "tcp")),
	}
	if cfg.RestartEvery > 0 {
		rep.Restart = cfg.RestartEvery.String()
	}
	if _, err := RaiseFileLimit(); err != nil {
		cfg.Logger.Warn("bench: cannot raise the file limit", "err", err)
	}
	needTCP, needUDP := false, false
	for _, m := range cfg.Modes {
		switch m {
		case ModeTCPSerial, ModeTCPParallel:
			needTCP = true
		case ModeUDP:
			needUDP = true
		case ModeFull:
			needTCP = true
		case "telegraf":
		default:
			return nil, fmt.Errorf("bench: acquire: mode %q is not %s, %s, %s or %s", m, ModeTCPSerial, ModeTCPParallel, ModeUDP, ModeFull)
		}
	}
	telegraf, whyNot := findTelegraf(cfg.Telegraf)
	if telegraf != "" {
		needTCP = true
	}

	runCtx, stopFleets := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() {
		stopFleets()
		wg.Wait()
	}()
	fleets := map[string]*sim.Fleet{}
	for tr, need := range map[string]bool{"tcp": needTCP, "udp": needUDP} {
		if !need {
			continue
		}
		f, err := sim.NewFleet(sim.Config{Devices: cfg.Devices, Transport: tr, Seed: 1, Faults: cfg.Faults})
		if err != nil {
			return nil, fmt.Errorf("bench: acquire: %w", err)
		}
		fleets[tr] = f
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = f.Run(runCtx)
		}()
	}

	for _, mode := range cfg.Modes {
		if mode == "telegraf" {
			continue
		}
		if mode == ModeFull {
			cfg.Logger.Info("bench: acquire", "mode", mode, "devices", cfg.Devices, "interval", cfg.Interval, "duration", cfg.Duration)
			mr, err := acquireFull(ctx, cfg, fleets["tcp"])
			if err != nil {
				return rep, fmt.Errorf("bench: acquire: %w", err)
			}
			rep.Modes = append(rep.Modes, mr)
			continue
		}
		tr, tcpMode := "udp", ""
		switch mode {
		case ModeTCPSerial:
			tr, tcpMode = "tcp", edge.TCPSerial
		case ModeTCPParallel:
			tr, tcpMode = "tcp", edge.TCPParallel
		}
		if cfg.Before.Path != "" {
			bc := cfg
			bc.Exec = cfg.Before
			cfg.Logger.Info("bench: acquire", "mode", mode+"@before", "binary", cfg.Before.Path, "devices", cfg.Devices, "interval", cfg.Interval, "duration", cfg.Duration)
			mr, err := acquireMode(ctx, bc, mode, tcpMode, fleets[tr])
			if err != nil {
				return rep, fmt.Errorf("bench: acquire: %s with %s: %w", mode, cfg.Before.Path, err)
			}
			mr.Mode += "@before"
			rep.Modes = append(rep.Modes, mr)
		}
		cfg.Logger.Info("bench: acquire", "mode", mode, "devices", cfg.Devices, "interval", cfg.Interval, "duration", cfg.Duration)
		mr, err := acquireMode(ctx, cfg, mode, tcpMode, fleets[tr])
		if err != nil {
			return rep, err
		}
		rep.Modes = append(rep.Modes, mr)
	}
	if telegraf != "" {
		cfg.Logger.Info("bench: acquire: telegraf", "path", telegraf)
		mr, err := acquireTelegraf(ctx, cfg, telegraf, fleets["tcp"])
		if err != nil {
			mr = ModeReport{Mode: "telegraf", Skipped: err.Error()}
		}
		rep.Modes = append(rep.Modes, mr)
	} else {
		rep.Modes = append(rep.Modes, ModeReport{Mode: "telegraf", Skipped: whyNot})
	}
	return rep, ctx.Err()
}

// timeoutFor is the request timeout of a transport (the study's values).
func timeoutFor(cfg AcquireConfig, transport string) time.Duration {
	if cfg.Timeout > 0 {
		return min(cfg.Timeout, cfg.Interval)
	}
	t := 200 * time.Millisecond
	if transport == "tcp" {
		t = 500 * time.Millisecond
	}
	return min(t, cfg.Interval)
}

func simCounters(f *sim.Fleet) sim.Counters {
	var s sim.Counters
	for i := 0; i < f.Len(); i++ {
		c := f.Logger(i).Counters()
		s.Requests += c.Requests
		s.Replies += c.Replies
		s.Dropped += c.Dropped
		s.Faults += c.Faults
		s.Malformed += c.Malformed
	}
	return s
}

// restarter restarts one logger of f every period, round robin, until ctx is done.
func restarter(ctx context.Context, f *sim.Fleet, every time.Duration, log *slog.Logger) {
	t := time.NewTicker(every)
	defer t.Stop()
	for i := 0; ; i = (i + 1) % f.Len() {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if err := f.Logger(i).Restart(); err != nil {
			log.Warn("bench: restart logger", "logger", f.Logger(i).Name(), "err", err)
		}
	}
}

// measure waits warmup, snapshots, waits d, snapshots again. Both waits
// end early when ctx is done (the window is then shorter, and says so).
func measureWindow(ctx context.Context, warmup, d time.Duration, snap func() error, snap2 func() error) error {
	if err := sleepCtx(ctx, warmup); err != nil {
		return err
	}
	if err := snap(); err != nil {
		return err
	}
	_ = sleepCtx(ctx, d)
	return snap2()
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func acquireMode(ctx context.Context, cfg AcquireConfig, mode, tcpMode string, f *sim.Fleet) (ModeReport, error) {
	tr := "udp"
	if tcpMode != "" {
		tr = "tcp"
	}
	spec := acqSpec{TCPMode: tcpMode, Interval: cfg.Interval, Timeout: timeoutFor(cfg, tr), Retries: cfg.Retries,
		Profile: profilePath(cfg.Profile, "acquire-"+mode)}
	for i := 0; i < f.Len(); i++ {
		spec.Devices = append(spec.Devices, acqDevice{Name: fmt.Sprintf("logger-%04d", i+1), Transport: tr, Address: f.Addr(i)})
	}
	mr := ModeReport{Mode: mode, Devices: f.Len(), Interval: cfg.Interval.String(),
		Where: "gateway (edge + ring) in a child process; loggers in the bench process"}
	c, err := startChild(ctx, cfg.Exec, roleAcquire, spec, nil)
	if err != nil {
		return mr, err
	}
	defer c.stop()
	rctx, stopRestarts := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() { stopRestarts(); wg.Wait() }()
	if cfg.RestartEvery > 0 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			restarter(rctx, f, cfg.RestartEvery, cfg.Logger)
		}()
	}
	var a, b acqSnap
	var sa, sb sim.Counters
	var la, lb Usage
	var ma, mb machineCPU
	err = measureWindow(ctx, cfg.Warmup, cfg.Duration,
		func() error { sa, la, ma = simCounters(f), selfUsage(), readMachineCPU(); return c.call("snap", &a) },
		func() error { sb, lb, mb = simCounters(f), selfUsage(), readMachineCPU(); return c.call("snap", &b) })
	if err != nil {
		return mr, err
	}
	fillMode(&mr, a, b)
	mr.LoadCPU, mr.MachineCPU = cpuPercent(la, lb), machinePercent(ma, mb)
	mr.SimRequests = sb.Requests - sa.Requests
	mr.SimReplies = sb.Replies - sa.Replies
	mr.SimDropped = sb.Dropped - sa.Dropped
	return mr, nil
}

// fillMode sets mr's figures from the difference of two child snapshots.
func fillMode(mr *ModeReport, a, b acqSnap) {
	var rtt, cycle stats.HistogramSnapshot
	var tot stats.Snapshot
	for i := range b.Devices {
		d := b.Devices[i]
		if i < len(a.Devices) {
			d = subSnapshot(d, a.Devices[i])
		}
		addSnapshot(&tot, d)
	}
	rtt, cycle = tot.RTT, tot.Cycle
	mr.Seconds = b.Usage.At.Sub(a.Usage.At).Seconds()
	mr.Polls, mr.GoodPolls, mr.Overruns = tot.Polls, tot.GoodPolls, tot.Overruns
	mr.Scheduled = tot.Polls + tot.Overruns + tot.Skipped
	mr.Requests, mr.Responses, mr.Timeouts, mr.Errors = tot.Requests, tot.Responses, tot.Timeouts, tot.Errors
	mr.Reconnects, mr.Late, mr.Duplicates = tot.Reconnects, tot.Late, tot.Duplicates
	mr.CycleP50, mr.CycleP99 = cycle.Quantile(0.5)/1000, cycle.Quantile(0.99)/1000
	mr.RTTP50, mr.RTTP95, mr.RTTP99 = rtt.Quantile(0.5)/1000, rtt.Quantile(0.95)/1000, rtt.Quantile(0.99)/1000
	mr.LossRate, mr.ValidRate = tot.LossRate(), tot.ValidRate()
	mr.CPUPercent = cpuPercent(a.Usage, b.Usage)
	if tot.Polls > 0 {
		mr.CPUPerPollUS = float64((b.Usage.CPU - a.Usage.CPU).Microseconds()) / float64(tot.Polls)
	}
	mr.RSSMiB, mr.HWMMiB = mib(b.Usage.RSS), mib(b.Usage.HWM)
}

func subHist(a, b stats.HistogramSnapshot) stats.HistogramSnapshot {
	for i := range a.Counts {
		a.Counts[i] -= b.Counts[i]
	}
	a.SumUS -= b.SumUS
	a.N -= b.N
	return a
}

// subSnapshot is a − b for every counter and histogram.
func subSnapshot(a, b stats.Snapshot) stats.Snapshot {
	a.Requests -= b.Requests
	a.Responses -= b.Responses
	a.Timeouts -= b.Timeouts
	a.Exceptions -= b.Exceptions
	a.Errors -= b.Errors
	a.Reconnects -= b.Reconnects
	a.Late -= b.Late
	a.Duplicates -= b.Duplicates
	a.Dropped -= b.Dropped
	a.Polls -= b.Polls
	a.GoodPolls -= b.GoodPolls
	a.Overruns -= b.Overruns
	a.Skipped -= b.Skipped
	a.Demotions -= b.Demotions
	a.RTT = subHist(a.RTT, b.RTT)
	a.Cycle = subHist(a.Cycle, b.Cycle)
	return a
}

func addHist(a *stats.HistogramSnapshot, b stats.HistogramSnapshot) {
	for i := range a.Counts {
		a.Counts[i] += b.Counts[i]
	}
	a.SumUS += b.SumUS
	a.N += b.N
}

func addSnapshot(a *stats.Snapshot, b stats.Snapshot) {
	a.Requests += b.Requests
	a.Responses += b.Responses
	a.Timeouts += b.Timeouts
	a.Exceptions += b.Exceptions
	a.Errors += b.Errors
	a.Reconnects += b.Reconnects
	a.Late += b.Late
	a.Duplicates += b.Duplicates
	a.Dropped += b.Dropped
	a.Polls += b.Polls
	a.GoodPolls += b.GoodPolls
	a.Overruns += b.Overruns
	a.Skipped += b.Skipped
	a.Demotions += b.Demotions
	addHist(&a.RTT, b.RTT)
	addHist(&a.Cycle, b.Cycle)
}

const roleAcquire = "acquire-gateway"

// thTags is the logger model's two tags (holding 0 and 1).
func thTags() []edge.Tag {
	return []edge.Tag{
		{Name: "temperature", Register: edge.Holding, Address: 0, Type: edge.Int16, Scale: 0.1, Unit: "°C"},
		{Name: "humidity", Register: edge.Holding, Address: 1, Type: edge.Uint16, Scale: 0.1, Unit: "%RH"},
	}
}

// childAcquire is the gateway side of `bench acquire`: edge polling into a
// ring, nothing else, answering "snap" with its statistics and usage.
func childAcquire(in io.Reader, out io.Writer) error {
	cio := newChildIO(in, out)
	var spec acqSpec
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
	ring := ringstore.NewRing(0, seq)
	ecfg := edge.Config{TCPMode: spec.TCPMode, UDPListen: "127.0.0.1:0", Sink: ring}
	if spec.TCPMode == "" {
		ecfg.TCPMode = edge.TCPParallel
	}
	for _, d := range spec.Devices {
		ecfg.Devices = append(ecfg.Devices, edge.DeviceConfig{
			Name: d.Name, Transport: d.Transport, Address: d.Address, Unit: 1,
			Interval: spec.Interval, Timeout: spec.Timeout, Retries: spec.Retries, Tags: thTags(),
		})
	}
	s, err := edge.New(ecfg)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	if err := cio.reply("ready ", struct{}{}); err != nil {
		cancel()
		<-done
		return err
	}
	entries := s.Devices()
	err = cio.serve(func(cmd string) any {
		snap := acqSnap{Appends: ring.Appends()}
		for _, e := range entries {
			snap.Devices = append(snap.Devices, e.Stats.Snapshot())
		}
		snap.Usage = selfUsage()
		return snap
	})
	cancel()
	if rerr := <-done; rerr != nil && !errors.Is(rerr, context.Canceled) && err == nil {
		err = rerr
	}
	return err
}

// faultsString lists the faults that are on.
func faultsString(f sim.Faults) string {
	var parts []string
	add := func(name string, v float64) {
		if v > 0 {
			parts = append(parts, fmt.Sprintf("%s %.2f%%", name, 100*v))
		}
	}
	if f.Delay > 0 {
		parts = append(parts, "delay "+f.Delay.String())
	}
	if f.Jitter > 0 {
		parts = append(parts, "jitter "+f.Jitter.String())
	}
	add("drop-request", f.DropRequest)
	add("drop-response", f.DropResponse)
	add("exception", f.Exception)
	add("duplicate", f.Duplicate)
	add("wrong-tid", f.WrongTID)
	add("other-port", f.OtherPort)
	add("truncate", f.Truncate)
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}
