package bench

import (
	"fmt"
	"log/slog"
	"math"
	"os"
	"time"
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
