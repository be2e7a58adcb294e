package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/gorilla/websocket"

	"edgegw/lab/sim"
	"edgegw/receiver"
	"edgegw/web"
)

// Flood kinds of the soak's request burst.
const (
	FloodWrongPassword = "wrong-password" // Basic auth with a wrong password: a hash per request
	FloodPlain         = "plain"          // no credentials at all: refused before any hashing
	FloodOff           = "off"
)

// SoakConfig configures `bench soak`: the real gateway (`edgegw run`) in a
// child process against simulated loggers, a reference receiver and a
// schedule of field events, for Duration. The zero value is the issue's
// compressed soak (48 loggers at 100 ms, 1% loss each way, a restart every
// 10 s, a reload every 30 s, the uplink cut every 60 s, a slow WebSocket
// client, a wrong-password flood every 60 s) for 30 minutes, except for two
// fields the CLI sets: Loss (0 here: none) and Unopenable (off here).
type SoakConfig struct {
	Duration  time.Duration // 30m
	Devices   int           // 48 loggers
	Interval  time.Duration // 100ms (10× the field rate of 1 s)
	Timeout   time.Duration // per request: 2/5 of the interval (a retry fits in the window)
	Retries   int           // 1; -1 for none
	Loss      float64       // each of request and reply dropped with this probability (0.01)
	Transport string        // "udp" (default) or "mixed" (every other logger over TCP)
	Seed      int64         // 1: the loggers' model and fault randomness

	RestartEvery time.Duration // 10s: restart one logger of the restart pool (a quarter of the loggers), round robin
	ReloadEvery  time.Duration // 30s: rewrite the config (one device in, one out) and SIGHUP
	UplinkEvery  time.Duration // 60s: cut the uplink (stop the receiver) this often…
	UplinkDown   time.Duration // 10s: …for this long
	FloodEvery   time.Duration // 60s: a request burst this often…
	FloodFor     time.Duration // 3s: …this long…
	FloodClients int           // 20: …from this many concurrent clients
	Flood        string        // FloodWrongPassword (default), FloodPlain or FloodOff
	// Unopenable makes every other reload also add a device whose transport
	// cannot open (an RTU device at a missing /dev path, then a UDP device
	// at a .invalid name).
	Unopenable bool

	Warmup      time.Duration // default: the longest event period (60s), at least Duration/10, at most Duration/2
	SampleEvery time.Duration // resources sampled this often: Duration/600, at least 1s
	Settle      time.Duration // after Duration, how long the receiver may take to catch up (90s)

	Gateway string       // the edgegw binary run as `GATEWAY run -config FILE`; "" = this executable
	Dir     string       // work directory (config, data, logs, received.jsonl); "" = a temporary one, removed
	Logger  *slog.Logger // progress; nil: discard
}

func (c SoakConfig) fill() (SoakConfig, error) {
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&c.Duration, 30*time.Minute)
	def(&c.Interval, 100*time.Millisecond)
	def(&c.Timeout, c.Interval*2/5)
	def(&c.RestartEvery, 10*time.Second)
	def(&c.ReloadEvery, 30*time.Second)
	def(&c.UplinkEvery, 60*time.Second)
	def(&c.UplinkDown, min(10*time.Second, c.UplinkEvery/2))
	def(&c.FloodEvery, 60*time.Second)
	def(&c.FloodFor, min(3*time.Second, c.FloodEvery/2))
	def(&c.Settle, 90*time.Second)
	if c.Warmup <= 0 {
		c.Warmup = min(max(c.UplinkEvery, c.FloodEvery, c.ReloadEvery, c.Duration/10), c.Duration/2)
	}
	def(&c.SampleEvery, max(time.Second, c.Duration/600))
	if c.Devices <= 0 {
		c.Devices = 48
	}
	if c.Devices < 4 {
		return c, fmt.Errorf("bench: soak: %d devices: at least 4 (a quarter are restarted, the rest untouched)", c.Devices)
	}
	if c.Retries == 0 {
		c.Retries = 1
	}
	if c.Retries < 0 {
		c.Retries = 0
	}
	if c.Loss < 0 {
		c.Loss = 0
	}
	if c.Seed == 0 {
		c.Seed = 1
	}
	if c.FloodClients <= 0 {
		c.FloodClients = 20
	}
	switch c.Transport {
	case "":
		c.Transport = "udp"
	case "udp", "mixed":
	default:
		return c, fmt.Errorf("bench: soak: transport %q: want udp or mixed", c.Transport)
	}
	switch c.Flood {
	case "":
		c.Flood = FloodWrongPassword
	case FloodWrongPassword, FloodPlain, FloodOff:
	default:
		return c, fmt.Errorf("bench: soak: flood %q: want %s, %s or %s", c.Flood, FloodWrongPassword, FloodPlain, FloodOff)
	}
	if c.Gateway == "" {
		p, err := os.Executable()
		if err != nil {
			return c, fmt.Errorf("bench: soak: executable: %w", err)
		}
		c.Gateway = p
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c, nil
}

// SoakSample is the gateway's resource use at one moment.
type SoakSample struct {
	T          float64 `json:"t_s"` // seconds since the gateway was ready
	RSSMiB     float64 `json:"rss_mib"`
	FDs        int     `json:"fds"`        // entries of /proc/PID/fd
	Threads    int     `json:"threads"`    // /proc/PID/status Threads
	Goroutines int     `json:"goroutines"` // go_goroutines of /metrics; -1 when not exposed
	CPU        float64 `json:"cpu_percent"`
	Queue      int64   `json:"queue_samples"` // upstream queue (grows while the uplink is cut)
	Phase      string  `json:"phase,omitempty"`
}

// Trend is one resource after warm-up: the first sample after warm-up, the
// last one (taken after the events stopped and the queue drained), the max.
type Trend struct {
	First float64 `json:"first_after_warmup"`
	Last  float64 `json:"last"`
	Max   float64 `json:"max"`
}

// SoakReport is the result of RunSoak.
type SoakReport struct {
	Started   time.Time `json:"started"`
	Machine   Machine   `json:"machine"`
	Devices   int       `json:"devices"`
	Transport string    `json:"transport"`
	Interval  string    `json:"interval"`
	Timeout   string    `json:"timeout"`
	Retries   int       `json:"retries"`
	Duration  string    `json:"duration"`
	Warmup    string    `json:"warmup"`
	Loss      float64   `json:"loss"`
	Seed      int64     `json:"seed"`
	Schedule  string    `json:"schedule"`

	Samples   []SoakSample `json:"samples"`
	RSSMiB    Trend        `json:"rss_mib"`
	FDs       Trend        `json:"fds"`
	Threads   Trend        `json:"threads"`
	Goroutine Trend        `json:"goroutines"` // zero when not exposed (GoroutinesFrom says)
	// GoroutinesFrom says where goroutines came from: "go_goroutines" or
	// "not exposed by /metrics (threads shown instead)".
	GoroutinesFrom string  `json:"goroutines_from"`
	CPUPercent     float64 `json:"cpu_percent"` // the gateway's mean over the run, % of one core

	Events SoakEvents `json:"events"`

	// The untouched loggers: never restarted, never reloaded.
	Untouched       int     `json:"untouched"`
	UntouchedSched  uint64  `json:"untouched_scheduled"` // windows over the run: its span / the interval, per logger
	UntouchedGood   uint64  `json:"untouched_good"`
	ValidRate       float64 `json:"untouched_valid_rate"`
	ValidBound      float64 `json:"untouched_valid_bound"` // the least valid rate the test accepts (see SoakBound)
	MaxGapIntervals float64 `json:"untouched_max_gap_intervals"`
	SingleMisses    uint64  `json:"untouched_single_misses"` // gaps of 1.5..3 intervals between good samples
	DoubleMisses    uint64  `json:"untouched_double_misses"` // gaps of ≥ 3 intervals: two windows or more in a row
	Demotions       uint64  `json:"untouched_demotions"`

	// The uplink, after the receiver caught up.
	Numbered    uint64  `json:"numbered"`    // samples the gateway numbered (1..seq)
	Received    uint64  `json:"received"`    // distinct (gateway, epoch, seq) at the receiver, within 1..seq
	Duplicates  uint64  `json:"duplicates"`  // lines at the receiver repeating a (gateway, epoch, seq)
	Lost        uint64  `json:"lost"`        // numbered − received
	Dropped     uint64  `json:"dropped"`     // the gateway's own upstream dropped counter
	QueueMax    int64   `json:"queue_max"`   // most samples queued (an uplink cut)
	CaughtUpS   float64 `json:"caught_up_s"` // seconds after Duration until the receiver had every sample
	Epochs      int     `json:"epochs"`      // distinct epochs seen (0: frames carry none)
	ReceiverGap uint64  `json:"receiver_gaps"`

	Alive    bool   `json:"alive_at_end"`
	ExitCode int    `json:"exit_code"` // after SIGTERM at the end
	Log      LogSum `json:"log"`
}

// SoakEvents counts what was done to the gateway.
type SoakEvents struct {
	Restarts         int               `json:"restarts"`
	Reloads          int               `json:"reloads"` // SIGHUPs sent
	UnopenableAdds   int               `json:"unopenable_reloads"`
	UplinkCuts       int               `json:"uplink_cuts"`
	SlowClients      int               `json:"slow_ws_clients"`
	WSDropped        uint64            `json:"ws_dropped"` // slow clients the gateway dropped (/api/status)
	Floods           int               `json:"floods"`
	FloodKind        string            `json:"flood_kind"`
	FloodClients     int               `json:"flood_clients"`
	FloodRequests    uint64            `json:"flood_requests"`
	FloodStatus      map[string]uint64 `json:"flood_status"` // replies by HTTP status; "error" for transport errors
	MonitorErrors    uint64            `json:"monitor_errors"`
	SlowClientErrors uint64            `json:"slow_client_errors"`
}

// LogSum counts lines of the gateway's log.
type LogSum struct {
	Lines          int      `json:"lines"`
	ReloadsApplied int      `json:"reloads_applied"`
	ReloadsRefused int      `json:"reloads_refused"`
	Errors         int      `json:"errors"`
	Warnings       int      `json:"warnings"`
	Panics         int      `json:"panics"`
	Last           []string `json:"last,omitempty"` // the last lines when the gateway died
}

// SoakBound is the least valid rate of the untouched loggers that the soak
// test accepts: every window the injected loss can take (a request or its
// reply lost on every attempt) at its binomial mean + 6σ, plus one window in
// twenty for scheduling on a shared CI machine (-race, 2 cores): a timeout
// that fires because the bus goroutine, or the loggers, did not run in time.
// A flood that starves polling for its 3 s in every 60 s takes 5% on its
// own and fails it. Gaps are checked beside it (MaxGapIntervals).
func SoakBound(loss float64, retries int, windows uint64) float64 {
	if windows == 0 {
		return 0
	}
	p := 1.0
	attempt := 1 - (1-loss)*(1-loss)
	for i := 0; i <= retries; i++ {
		p *= attempt
	}
	n := float64(windows)
	sd := 0.0
	if p > 0 {
		sd = math.Sqrt(n * p * (1 - p))
	}
	return max(0, 1-(n*p+6*sd+1)/n-0.05)
}

// soakLogger is one simulated logger the gateway polls.
type soakLogger struct {
	name, transport, addr string
	l                     *sim.Logger
	untouched             bool
}

// gatewayProc is the gateway under test: `edgegw run -config FILE`.
type gatewayProc struct {
	cmd  *exec.Cmd
	page chan string   // the page URL, once
	done chan struct{} // closed after exit (log read to the end)
	code int

	mu   sync.Mutex
	sum  LogSum
	tail []string
}

func startGateway(bin, config, logPath string) (*gatewayProc, error) {
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, fmt.Errorf("bench: soak: %w", err)
	}
	g := &gatewayProc{cmd: exec.Command(bin, "run", "-config", config), page: make(chan string, 1), done: make(chan struct{})}
	pr, pw, err := os.Pipe()
	if err != nil {
		logf.Close()
		return nil, fmt.Errorf("bench: soak: %w", err)
	}
	g.cmd.Stdout, g.cmd.Stderr = pw, pw
	if err := g.cmd.Start(); err != nil {
		logf.Close()
		pr.Close()
		pw.Close()
		return nil, fmt.Errorf("bench: soak: start %s: %w", bin, err)
	}
	pw.Close()
	go func() {
		defer close(g.done)
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		w := bufio.NewWriter(logf)
		for sc.Scan() {
			line := sc.Text()
			w.WriteString(line + "\n")
			g.count(line)
		}
		pr.Close()
		w.Flush()
		logf.Close()
		_ = g.cmd.Wait()
		g.code = g.cmd.ProcessState.ExitCode()
	}()
	return g, nil
}

func (g *gatewayProc) count(line string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	s := &g.sum
	s.Lines++
	switch {
	case strings.Contains(line, "reload: devices applied"):
		s.ReloadsApplied++
	case strings.Contains(line, "reload: config invalid"), strings.Contains(line, "reload: devices not applied"):
		s.ReloadsRefused++
	}
	switch {
	case strings.Contains(line, "level=ERROR"):
		s.Errors++
	case strings.Contains(line, "level=WARN"):
		s.Warnings++
	}
	if strings.HasPrefix(line, "panic:") || strings.HasPrefix(line, "fatal error:") {
		s.Panics++
	}
	if i := strings.Index(line, " page="); i >= 0 && strings.Contains(line, "edgegw running") {
		if f := strings.Fields(line[i+len(" page="):]); len(f) > 0 {
			select {
			case g.page <- f[0]:
			default:
			}
		}
	}
	g.tail = append(g.tail, line)
	if len(g.tail) > 20 {
		g.tail = g.tail[1:]
	}
}

func (g *gatewayProc) exited() bool {
	select {
	case <-g.done:
		return true
	default:
		return false
	}
}

// stop sends SIGTERM and waits at most 15 s, then kills; it returns the exit code.
func (g *gatewayProc) stop() int {
	if g.exited() {
		return g.code
	}
	_ = g.cmd.Process.Signal(syscall.SIGTERM)
	t := time.NewTimer(15 * time.Second)
	defer t.Stop()
	select {
	case <-g.done:
	case <-t.C:
		_ = g.cmd.Process.Kill()
		<-g.done
	}
	return g.code
}

func (g *gatewayProc) logSum() LogSum {
	g.mu.Lock()
	defer g.mu.Unlock()
	s := g.sum
	s.Last = append([]string(nil), g.tail...)
	return s
}

// uplink is the reference receiver, in this process, cut and restored on
// the same address; its dedup state survives a cut.
type uplink struct {
	r      *receiver.Receiver
	cancel context.CancelFunc
	done   chan error
}

func (u *uplink) up(ctx context.Context) error {
	var err error
	for range 50 { // the port was ours a moment ago; another bind may hold it briefly
		if _, err = u.r.Listen(); err == nil {
			break
		}
		if sleepCtx(ctx, 100*time.Millisecond) != nil {
			return ctx.Err()
		}
	}
	if err != nil {
		return err
	}
	sctx, cancel := context.WithCancel(context.Background())
	u.cancel, u.done = cancel, make(chan error, 1)
	go func() { u.done <- u.r.Serve(sctx) }()
	return nil
}

func (u *uplink) down() error {
	if u.cancel == nil {
		return nil
	}
	u.cancel()
	err := <-u.done
	u.cancel = nil
	return err
}

// soakAPI reads the gateway's API with the read token.
type soakAPI struct {
	base, token string
	client      *http.Client
}

// monitorAddr is the source address of the bench's own requests and the
// slow client (the flood comes from 127.0.0.1): the gateway limits each
// client address, and the monitor is not the attacker.
var monitorAddr = net.IPv4(127, 0, 0, 3)

func monitorDial(ctx context.Context, network, addr string) (net.Conn, error) {
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: monitorAddr}}
	return d.DialContext(ctx, network, addr)
}

// get reads path into v (a *string takes the body as is). A 429 is waited
// out (Retry-After, at most 2 s) up to 5 times.
func (a *soakAPI) get(ctx context.Context, path string, v any) error {
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	var resp *http.Response
	for try := 0; ; try++ {
		req, err := http.NewRequestWithContext(ctx, "GET", a.base+path, nil)
		if err != nil {
			return err
		}
		req.Header.Set("Authorization", "Bearer "+a.token)
		if resp, err = a.client.Do(req); err != nil {
			return err
		}
		if resp.StatusCode != http.StatusTooManyRequests || try == 5 {
			break
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		wait := time.Second
		if n, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil {
			wait = min(max(time.Duration(n)*time.Second, 100*time.Millisecond), 2*time.Second)
		}
		if err := sleepCtx(ctx, wait); err != nil {
			return err
		}
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, resp.Body)
		return fmt.Errorf("%s: %s", path, resp.Status)
	}
	if s, ok := v.(*string); ok {
		b, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
		*s = string(b)
		return err
	}
	return json.NewDecoder(resp.Body).Decode(v)
}

type soakStatus struct {
	Seq      uint64 `json:"seq"`
	Upstream struct {
		Path         string `json:"path"`
		QueueSamples int64  `json:"queue_samples"`
		Dropped      uint64 `json:"dropped"`
	} `json:"upstream"`
	Clients struct {
		WSDropped uint64 `json:"ws_dropped"`
	} `json:"clients"`
}

type soakDevice struct {
	Name      string `json:"name"`
	State     string `json:"state"`
	Polls     uint64 `json:"polls"`
	GoodPolls uint64 `json:"good_polls"`
	Overruns  uint64 `json:"overruns"`
	Demotions uint64 `json:"demotions"`
}

func (a *soakAPI) devices(ctx context.Context) (map[string]soakDevice, error) {
	var out struct {
		Devices []soakDevice `json:"devices"`
	}
	if err := a.get(ctx, "api/devices", &out); err != nil {
		return nil, err
	}
	m := make(map[string]soakDevice, len(out.Devices))
	for _, d := range out.Devices {
		m[d.Name] = d
	}
	return m, nil
}

// goroutines reads go_goroutines from /metrics; -1 when it is not there.
func (a *soakAPI) goroutines(ctx context.Context) int {
	var body string
	if err := a.get(ctx, "metrics", &body); err != nil {
		return -1
	}
	for _, line := range strings.Split(body, "\n") {
		if v, ok := strings.CutPrefix(line, "go_goroutines "); ok {
			var n float64
			if _, err := fmt.Sscan(v, &n); err == nil {
				return int(n)
			}
		}
	}
	return -1
}

// procFDs counts a process's open descriptors; procThreads its threads.
func procFDs(pid int) int {
	es, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		return -1
	}
	return len(es)
}

func procThreads(pid int) int {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return -1
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "Threads:"); ok {
			var n int
			_, _ = fmt.Sscan(strings.TrimSpace(v), &n)
			return n
		}
	}
	return -1
}

// soakRun is one RunSoak: what every piece needs.
type soakRun struct {
	cfg      SoakConfig
	dir      string
	loggers  []soakLogger // polled from the start to the end
	extras   []soakLogger // added and removed by reloads, in turn
	recvAddr string
	hashFile string
	token    string
	password string
}

const soakGatewayID = "soak"

// config is the gateway's config after reload k (0: the first one).
func (s *soakRun) config(k int) (string, bool) {
	var b strings.Builder
	fmt.Fprintf(&b, "[gateway]\nid = %q\ndata_dir = %q\n", soakGatewayID, filepath.Join(s.dir, "data"))
	fmt.Fprintf(&b, "[http]\nlisten = \"127.0.0.1:0\"\nread_token_file = %q\nbasic_auth_user = \"soak\"\nbasic_auth_hash_file = %q\n",
		filepath.Join(s.dir, "read.token"), s.hashFile)
	b.WriteString("[poll]\nudp_listen = \"127.0.0.1:0\"\n")
	fmt.Fprintf(&b, "[upstream.websocket]\nurl = \"ws://%s/ingest\"\nbatch_wait = \"100ms\"\n", s.recvAddr)
	b.WriteString("[[profile]]\nname = \"th\"\ntags = [ { name = \"temperature\", address = 0, type = \"int16\", scale = 0.1 }, { name = \"humidity\", address = 1, scale = 0.1 } ]\n")
	dev := func(l soakLogger) {
		fmt.Fprintf(&b, "[[device]]\nname = %q\ntransport = %q\naddress = %q\nprofile = \"th\"\ninterval = %q\ntimeout = %q\nretries = %d\n",
			l.name, l.transport, l.addr, s.cfg.Interval.String(), s.cfg.Timeout.String(), s.cfg.Retries)
	}
	for _, l := range s.loggers {
		dev(l)
	}
	dev(s.extras[k%len(s.extras)])
	unopenable := s.cfg.Unopenable && k%2 == 1
	if unopenable {
		if k%4 == 1 {
			fmt.Fprintf(&b, "[[device]]\nname = \"unplugged-%d\"\ntransport = \"rtu\"\naddress = \"/dev/ttyEDGEGWSOAK%d\"\n", k, k)
		} else {
			fmt.Fprintf(&b, "[[device]]\nname = \"unresolvable-%d\"\ntransport = \"udp\"\naddress = \"soak-%d.invalid:502\"\n", k, k)
		}
		fmt.Fprintf(&b, "profile = \"th\"\ninterval = %q\ntimeout = %q\n", s.cfg.Interval.String(), s.cfg.Timeout.String())
	}
	return b.String(), unopenable
}

// writeFile replaces path atomically (a reload never reads half a file).
func writeFile(path, body string) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(body), 0o600); err != nil {
		return fmt.Errorf("bench: soak: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("bench: soak: %w", err)
	}
	return nil
}

// at runs f(k) at start+offset+k·period for k = 0, 1, … while that is
// before end and ctx is not done.
func at(ctx context.Context, start, end time.Time, offset, period time.Duration, f func(k int)) {
	for k := 0; ; k++ {
		when := start.Add(offset + time.Duration(k)*period)
		if !when.Before(end) {
			return
		}
		if sleepCtx(ctx, time.Until(when)) != nil {
			return
		}
		f(k)
	}
}

// startLoggers starts the fleets (their goroutines join wg and run until
// ctx ends) and fills s.loggers and s.extras. Logger i is restarted in turn
// when (i/2)%4 == 0 (a quarter, of both transports when mixed); the rest are
// untouched.
func (s *soakRun) startLoggers(ctx context.Context, wg *sync.WaitGroup) error {
	cfg := s.cfg
	fault := sim.Faults{DropRequest: cfg.Loss, DropResponse: cfg.Loss}
	nUDP, nTCP := cfg.Devices, 0
	if cfg.Transport == "mixed" {
		nTCP = cfg.Devices / 2
		nUDP = cfg.Devices - nTCP
	}
	newFleet := func(n int, tr string, seed int64) (*sim.Fleet, error) {
		if n == 0 {
			return nil, nil
		}
		f, err := sim.NewFleet(sim.Config{Devices: n, Transport: tr, Seed: seed, Faults: fault})
		if err != nil {
			return nil, fmt.Errorf("bench: soak: %w", err)
		}
		wg.Add(1)
		go func() { defer wg.Done(); _ = f.Run(ctx) }()
		return f, nil
	}
	udp, err := newFleet(nUDP, "udp", cfg.Seed)
	if err != nil {
		return err
	}
	tcp, err := newFleet(nTCP, "tcp", cfg.Seed+1)
	if err != nil {
		return err
	}
	extra, err := newFleet(2, "udp", cfg.Seed+2)
	if err != nil {
		return err
	}
	for i := 0; i < cfg.Devices; i++ {
		f, j, tr := udp, i, "udp"
		if tcp != nil && i%2 == 1 {
			f, j, tr = tcp, i/2, "tcp"
		} else if tcp != nil {
			j = i / 2
		}
		s.loggers = append(s.loggers, soakLogger{name: fmt.Sprintf("logger-%02d", i+1), transport: tr, addr: f.Addr(j), l: f.Logger(j), untouched: (i/2)%4 != 0})
	}
	for i := range 2 {
		s.extras = append(s.extras, soakLogger{name: fmt.Sprintf("reloaded-%d", i+1), transport: "udp", addr: extra.Addr(i), l: extra.Logger(i)})
	}
	return nil
}

// soakEvents is what the event goroutines write: counters under mu, and
// the phase the monitor stamps on each sample.
type soakEvents struct {
	mu     sync.Mutex
	ev     SoakEvents
	status map[string]uint64 // flood replies
	phase  atomic.Value      // "", "uplink cut", "flood"
}

func (e *soakEvents) add(f func(e *SoakEvents)) { e.mu.Lock(); f(&e.ev); e.mu.Unlock() }

// startEvents starts one goroutine per kind of event (joining wg), each
// acting on its schedule from start until end or until ctx ends.
func (s *soakRun) startEvents(ctx context.Context, wg *sync.WaitGroup, start, end time.Time, gw *gatewayProc, up *uplink, page, confPath string) *soakEvents {
	cfg := s.cfg
	e := &soakEvents{status: map[string]uint64{}}
	e.phase.Store("")
	run := func(f func()) { wg.Add(1); go func() { defer wg.Done(); f() }() }
	var pool []*sim.Logger
	for _, l := range s.loggers {
		if !l.untouched {
			pool = append(pool, l.l)
		}
	}
	run(func() {
		at(ctx, start, end, cfg.RestartEvery/2, cfg.RestartEvery, func(k int) {
			l := pool[k%len(pool)]
			if err := l.Restart(); err != nil {
				cfg.Logger.Warn("bench: soak: restart logger", "logger", l.Name(), "err", err)
			}
			e.add(func(e *SoakEvents) { e.Restarts++ })
		})
	})
	run(func() {
		at(ctx, start, end, cfg.ReloadEvery/3, cfg.ReloadEvery, func(k int) {
			body, unopenable := s.config(k + 1)
			if err := writeFile(confPath, body); err != nil {
				cfg.Logger.Warn("bench: soak: reload", "err", err)
				return
			}
			_ = gw.cmd.Process.Signal(syscall.SIGHUP)
			cfg.Logger.Info("bench: soak: reload", "n", k+1, "unopenable", unopenable)
			e.add(func(e *SoakEvents) {
				e.Reloads++
				if unopenable {
					e.UnopenableAdds++
				}
			})
		})
	})
	run(func() {
		at(ctx, start, end, cfg.UplinkEvery/3, cfg.UplinkEvery, func(int) {
			if err := up.down(); err != nil {
				cfg.Logger.Warn("bench: soak: receiver", "err", err)
			}
			e.phase.Store("uplink cut")
			e.add(func(e *SoakEvents) { e.UplinkCuts++ })
			cfg.Logger.Info("bench: soak: uplink cut", "for", cfg.UplinkDown)
			_ = sleepCtx(ctx, cfg.UplinkDown)
			if err := up.up(context.Background()); err != nil {
				cfg.Logger.Error("bench: soak: receiver back", "err", err)
			}
			e.phase.Store("")
		})
	})
	run(func() {
		var conn *websocket.Conn
		defer func() {
			if conn != nil {
				conn.Close()
			}
		}()
		at(ctx, start, end, 2*time.Second, cfg.UplinkEvery, func(int) {
			if conn != nil {
				conn.Close()
			}
			var err error
			if conn, err = slowClient(ctx, page, s.token); err != nil {
				cfg.Logger.Warn("bench: soak: slow client", "err", err)
				e.add(func(e *SoakEvents) { e.SlowClientErrors++ })
				return
			}
			e.add(func(e *SoakEvents) { e.SlowClients++ })
		})
	})
	if cfg.Flood != FloodOff {
		run(func() {
			at(ctx, start, end, cfg.FloodEvery*3/4, cfg.FloodEvery, func(int) {
				e.phase.Store("flood")
				cfg.Logger.Info("bench: soak: flood", "kind", cfg.Flood, "clients", cfg.FloodClients, "for", cfg.FloodFor)
				st, n := flood(ctx, page, cfg.Flood, cfg.FloodClients, cfg.FloodFor)
				e.phase.Store("")
				e.add(func(ev *SoakEvents) {
					ev.Floods++
					ev.FloodRequests += n
					for k, v := range st {
						e.status[k] += v
					}
				})
			})
		})
	}
	return e
}

// RunSoak runs the compressed soak and returns its report. An error means
// the soak could not run or the gateway died; the report says what was
// measured until then.
func RunSoak(ctx context.Context, cfg SoakConfig) (*SoakReport, error) {
	cfg, err := cfg.fill()
	if err != nil {
		return nil, err
	}
	rep := &SoakReport{Started: time.Now(), Machine: thisMachine(), Devices: cfg.Devices, Transport: cfg.Transport,
		Interval: cfg.Interval.String(), Timeout: cfg.Timeout.String(), Retries: cfg.Retries, Duration: cfg.Duration.String(),
		Warmup: cfg.Warmup.String(), Loss: cfg.Loss, Seed: cfg.Seed,
		Schedule: fmt.Sprintf("restart every %v (a quarter of the loggers, round robin); reload every %v; uplink cut every %v for %v; flood (%s, %d clients) every %v for %v; a new slow WebSocket client every %v; unopenable device in every other reload: %v",
			cfg.RestartEvery, cfg.ReloadEvery, cfg.UplinkEvery, cfg.UplinkDown, cfg.Flood, cfg.FloodClients, cfg.FloodEvery, cfg.FloodFor, cfg.UplinkEvery, cfg.Unopenable)}
	if _, err := RaiseFileLimit(); err != nil {
		cfg.Logger.Warn("bench: cannot raise the file limit", "err", err)
	}
	s := &soakRun{cfg: cfg, dir: cfg.Dir, token: "soak-read-token", password: "soak-right-password"}
	if s.dir == "" {
		if s.dir, err = os.MkdirTemp("", "edgegw-soak-"); err != nil {
			return nil, fmt.Errorf("bench: soak: %w", err)
		}
		defer os.RemoveAll(s.dir)
	} else if err := os.MkdirAll(s.dir, 0o755); err != nil {
		return nil, fmt.Errorf("bench: soak: %w", err)
	}
	hash, err := web.HashPassword(s.password, web.DefaultHashIterations)
	if err != nil {
		return nil, err
	}
	s.hashFile = filepath.Join(s.dir, "basic.hash")
	if err := writeFile(s.hashFile, hash+"\n"); err != nil {
		return nil, err
	}
	if err := writeFile(filepath.Join(s.dir, "read.token"), s.token+"\n"); err != nil {
		return nil, err
	}

	fctx, stopFleets := context.WithCancel(context.Background())
	var fleetWG sync.WaitGroup
	defer func() { stopFleets(); fleetWG.Wait() }()
	if err := s.startLoggers(fctx, &fleetWG); err != nil {
		return nil, err
	}

	// The receiver.
	recvOut, err := os.Create(filepath.Join(s.dir, "received.jsonl"))
	if err != nil {
		return nil, fmt.Errorf("bench: soak: %w", err)
	}
	defer recvOut.Close()
	recv := receiver.New(receiver.Config{Listen: "127.0.0.1:0", Out: recvOut, Logger: cfg.Logger})
	up := &uplink{r: recv}
	if err := up.up(ctx); err != nil {
		return nil, fmt.Errorf("bench: soak: receiver: %w", err)
	}
	defer up.down()
	addr, _ := recv.Listen()
	s.recvAddr = addr.String()

	// The gateway.
	confPath := filepath.Join(s.dir, "edgegw.toml")
	body, _ := s.config(0)
	if err := writeFile(confPath, body); err != nil {
		return nil, err
	}
	gw, err := startGateway(cfg.Gateway, confPath, filepath.Join(s.dir, "gateway.log"))
	if err != nil {
		return nil, err
	}
	defer gw.stop()
	var page string
	select {
	case page = <-gw.page:
	case <-gw.done:
		rep.Log = gw.logSum()
		return rep, fmt.Errorf("bench: soak: the gateway exited at start (%d): %s", gw.code, strings.Join(rep.Log.Last, "\n"))
	case <-time.After(30 * time.Second):
		return rep, errors.New("bench: soak: the gateway did not say it was running within 30s")
	case <-ctx.Done():
		return rep, ctx.Err()
	}
	pid := gw.cmd.Process.Pid
	tr := &http.Transport{MaxIdleConnsPerHost: 4, IdleConnTimeout: 30 * time.Second, DialContext: monitorDial}
	defer tr.CloseIdleConnections()
	api := &soakAPI{base: page, token: s.token, client: &http.Client{Transport: tr}}
	start := time.Now()
	end := start.Add(cfg.Duration)
	cfg.Logger.Info("bench: soak: gateway running", "page", page, "pid", pid, "dir", s.dir, "duration", cfg.Duration)

	// The events, each in its own goroutine until end (or ctx, or the gateway's death).
	ectx, stopEvents := context.WithCancel(ctx)
	defer stopEvents()
	go func() {
		select {
		case <-gw.done:
			stopEvents()
		case <-ectx.Done():
		}
	}()
	var wg sync.WaitGroup
	evs := s.startEvents(ectx, &wg, start, end, gw, up, page, confPath)

	// The monitor, in this goroutine: resources until end.
	var a0 map[string]soakDevice
	var aAt time.Time
	var queueMax int64
	var monErr uint64
	sample := func(prev *Usage) SoakSample {
		u, _ := procUsage(pid)
		smp := SoakSample{T: time.Since(start).Seconds(), RSSMiB: mib(u.RSS), FDs: procFDs(pid), Threads: procThreads(pid),
			Goroutines: api.goroutines(ctx), Phase: evs.phase.Load().(string)}
		if prev.At.IsZero() {
			smp.CPU = cpuPercent(Usage{At: start}, u)
		} else {
			smp.CPU = cpuPercent(*prev, u)
		}
		*prev = u
		var st soakStatus
		if err := api.get(ctx, "api/status", &st); err != nil {
			monErr++
		} else {
			smp.Queue = st.Upstream.QueueSamples
			queueMax = max(queueMax, st.Upstream.QueueSamples)
		}
		return smp
	}
	u0, _ := procUsage(pid)
	prev := u0
	if sleepCtx(ectx, time.Second) == nil {
		aAt = time.Now()
		if a0, err = api.devices(ctx); err != nil {
			monErr++
		}
	}
	for next := start.Add(cfg.SampleEvery); next.Before(end); next = next.Add(cfg.SampleEvery) {
		if sleepCtx(ectx, time.Until(next)) != nil {
			break
		}
		rep.Samples = append(rep.Samples, sample(&prev))
	}
	_ = sleepCtx(ectx, time.Until(end))
	bAt := time.Now()
	b0, devErr := api.devices(ctx)
	uEnd, _ := procUsage(pid)
	stopEvents()
	wg.Wait()
	rep.Events = evs.ev // the event goroutines have exited
	rep.Events.FloodKind, rep.Events.FloodClients, rep.Events.FloodStatus, rep.Events.MonitorErrors = cfg.Flood, cfg.FloodClients, evs.status, monErr
	rep.CPUPercent = cpuPercent(u0, uEnd)
	if gw.exited() {
		rep.trends(cfg.Warmup)
		rep.Log = gw.logSum()
		rep.ExitCode = gw.code
		return rep, fmt.Errorf("bench: soak: the gateway died after %.0fs (exit %d): %s", time.Since(start).Seconds(), gw.code, strings.Join(rep.Log.Last, "\n"))
	}
	if err := ctx.Err(); err != nil {
		return rep, err
	}
	if up.cancel == nil { // cut when the events stopped
		if err := up.up(ctx); err != nil {
			return rep, err
		}
	}

	// Settle: the receiver catches up with what the gateway had numbered.
	var st soakStatus
	if err := api.get(ctx, "api/status", &st); err != nil {
		return rep, fmt.Errorf("bench: soak: status: %w", err)
	}
	rep.Numbered = st.Seq
	settleEnd := time.Now().Add(cfg.Settle)
	for recv.Stats().Samples < rep.Numbered && time.Now().Before(settleEnd) {
		if sleepCtx(ctx, 200*time.Millisecond) != nil {
			return rep, ctx.Err()
		}
	}
	rep.CaughtUpS = time.Since(end).Seconds()
	last := sample(&prev)
	last.Phase = "settled"
	rep.Samples = append(rep.Samples, last)
	if err := api.get(ctx, "api/status", &st); err == nil {
		rep.Dropped = st.Upstream.Dropped
		rep.Events.WSDropped = st.Clients.WSDropped
	}
	rep.QueueMax = queueMax
	rep.ReceiverGap = recv.Stats().Gaps
	rep.Alive = !gw.exited()
	rep.ExitCode = gw.stop()
	rep.Log = gw.logSum()
	if rep.ExitCode == 0 && rep.Log.Panics == 0 {
		rep.Log.Last = nil
	}
	if err := up.down(); err != nil {
		cfg.Logger.Warn("bench: soak: receiver", "err", err)
	}

	// The figures.
	rep.trends(cfg.Warmup)
	if devErr != nil || a0 == nil {
		return rep, fmt.Errorf("bench: soak: /api/devices: %v", devErr)
	}
	untouched := rep.untouchedRates(s.loggers, a0, b0, bAt.Sub(aAt), cfg)
	if _, err := recvOut.Seek(0, io.SeekStart); err != nil {
		return rep, err
	}
	if err := rep.received(recvOut, untouched, cfg.Interval, end.UnixMicro()); err != nil {
		return rep, err
	}
	return rep, nil
}

// untouchedRates sets the valid rate of the untouched loggers from two
// /api/devices snapshots span apart and returns their names. Every window
// of the span counts, polled or not (overrun, or skipped while demoted):
// the clock, not the gateway, says how many.
func (r *SoakReport) untouchedRates(loggers []soakLogger, a0, b0 map[string]soakDevice, span time.Duration, cfg SoakConfig) map[string]bool {
	untouched := map[string]bool{}
	for _, l := range loggers {
		if !l.untouched {
			continue
		}
		untouched[l.name] = true
		a, b := a0[l.name], b0[l.name]
		r.UntouchedSched += uint64(span / cfg.Interval)
		r.UntouchedGood += b.GoodPolls - a.GoodPolls
		r.Demotions += b.Demotions - a.Demotions
	}
	r.Untouched = len(untouched)
	if r.UntouchedSched > 0 {
		r.ValidRate = min(1, float64(r.UntouchedGood)/float64(r.UntouchedSched))
	}
	r.ValidBound = SoakBound(cfg.Loss, cfg.Retries, r.UntouchedSched)
	return untouched
}

// trends fills the resource trends from the samples after warm-up.
func (r *SoakReport) trends(warmup time.Duration) {
	r.GoroutinesFrom = "go_goroutines"
	for _, s := range r.Samples {
		if s.Goroutines < 0 {
			r.GoroutinesFrom = "not exposed by /metrics (threads shown instead)"
		}
	}
	var first bool
	for _, s := range r.Samples {
		if s.T < warmup.Seconds() {
			continue
		}
		g := float64(s.Goroutines)
		if !first {
			first = true
			r.RSSMiB.First, r.FDs.First, r.Threads.First, r.Goroutine.First = s.RSSMiB, float64(s.FDs), float64(s.Threads), g
		}
		r.RSSMiB.Last, r.FDs.Last, r.Threads.Last, r.Goroutine.Last = s.RSSMiB, float64(s.FDs), float64(s.Threads), g
		r.RSSMiB.Max, r.FDs.Max = max(r.RSSMiB.Max, s.RSSMiB), max(r.FDs.Max, float64(s.FDs))
		r.Threads.Max, r.Goroutine.Max = max(r.Threads.Max, float64(s.Threads)), max(r.Goroutine.Max, g)
	}
	if r.GoroutinesFrom != "go_goroutines" {
		r.Goroutine = Trend{}
	}
}

// received reads the receiver's JSON lines: dedup by (gateway, epoch, seq)
// against 1..Numbered, and the gaps between good samples of the untouched
// loggers up to endUS.
func (r *SoakReport) received(f io.Reader, untouched map[string]bool, iv time.Duration, endUS int64) error {
	type key struct {
		gw    string
		epoch string // 16 hex digits; "" in version 1 frames
	}
	seen := map[key][]uint64{} // bitmaps over 1..Numbered
	words := (r.Numbered + 64) / 64
	ts := map[string][]int64{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		var s struct {
			Gateway string `json:"gateway"`
			Epoch   string `json:"epoch"`
			Seq     uint64 `json:"seq"`
			Device  string `json:"device"`
			Tag     string `json:"tag"`
			Quality string `json:"quality"`
			TS      int64  `json:"ts"`
		}
		if err := json.Unmarshal(sc.Bytes(), &s); err != nil {
			return fmt.Errorf("bench: soak: received.jsonl: %w", err)
		}
		k := key{gw: s.Gateway, epoch: s.Epoch}
		bm := seen[k]
		if bm == nil {
			bm = make([]uint64, words)
			seen[k] = bm
		}
		if s.Seq >= 1 && s.Seq <= r.Numbered {
			w, bit := s.Seq/64, uint64(1)<<(s.Seq%64)
			if bm[w]&bit != 0 {
				r.Duplicates++
				continue
			}
			bm[w] |= bit
			r.Received++
		}
		if untouched[s.Device] && s.Tag == "temperature" && s.Quality == "good" && s.TS <= endUS {
			ts[s.Device] = append(ts[s.Device], s.TS)
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("bench: soak: received.jsonl: %w", err)
	}
	for k := range seen {
		if k.epoch != "" {
			r.Epochs++
		}
	}
	r.Lost = r.Numbered - min(r.Received, r.Numbered)
	ivUS := float64(iv.Microseconds())
	for dev := range untouched {
		t := ts[dev]
		slices.Sort(t)
		for i := 1; i < len(t); i++ {
			g := float64(t[i]-t[i-1]) / ivUS
			r.MaxGapIntervals = max(r.MaxGapIntervals, g)
			switch {
			case g >= 3:
				r.DoubleMisses++
			case g >= 1.5:
				r.SingleMisses++
			}
		}
	}
	return nil
}

// slowClient connects to /api/ws with a small receive buffer and never
// reads: the gateway must drop it, not grow a queue for it.
func slowClient(ctx context.Context, page, token string) (*websocket.Conn, error) {
	d := websocket.Dialer{
		HandshakeTimeout: 10 * time.Second,
		ReadBufferSize:   1024,
		NetDialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := monitorDial(ctx, network, addr)
			if tc, ok := c.(*net.TCPConn); ok {
				_ = tc.SetReadBuffer(4096)
			}
			return c, err
		},
	}
	h := http.Header{}
	h.Set("Authorization", "Bearer "+token)
	c, resp, err := d.DialContext(ctx, "ws"+strings.TrimPrefix(page, "http")+"api/ws", h)
	if resp != nil && resp.Body != nil {
		resp.Body.Close()
	}
	return c, err
}

// flood sends requests from n concurrent clients for d: with a wrong
// Basic password, or with no credentials (plain). It returns the replies
// by status and the number of requests.
func flood(ctx context.Context, page, kind string, n int, d time.Duration) (map[string]uint64, uint64) {
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	tr := &http.Transport{MaxIdleConnsPerHost: n, MaxConnsPerHost: n}
	defer tr.CloseIdleConnections()
	cl := &http.Client{Transport: tr}
	var mu sync.Mutex
	status := map[string]uint64{}
	var total uint64
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			mine := map[string]uint64{}
			var count uint64
			for ctx.Err() == nil {
				req, _ := http.NewRequestWithContext(ctx, "GET", page+"api/devices", nil)
				if kind == FloodWrongPassword {
					req.SetBasicAuth("soak", "wrong-password")
				}
				resp, err := cl.Do(req)
				if err != nil {
					if ctx.Err() == nil {
						mine["error"]++
						count++
					}
					continue
				}
				_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
				resp.Body.Close()
				mine[fmt.Sprint(resp.StatusCode)]++
				count++
			}
			mu.Lock()
			for k, v := range mine {
				status[k] += v
			}
			total += count
			mu.Unlock()
		}()
	}
	wg.Wait()
	return status, total
}
