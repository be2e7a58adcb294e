package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"edgegw/internal/testenv"
	"edgegw/lab/sim"
	"edgegw/web"
)

// floodSpec is the wrong-password flood: concurrent clients, how long, and
// the poll interval of the 48 loggers. make test runs 20 × 5 s at 200 ms
// (5× the field rate: 25 windows a device); EDGEGW_FLOOD="50,30s,1s" runs
// the measurement, and EDGEGW_FLOOD_BIN=/path/to/edgegw runs it
// against another build (the one before, for a comparison in one run).
type floodSpec struct {
	workers  int
	dur      time.Duration
	interval time.Duration
}

func floodFromEnv(t *testing.T) floodSpec {
	spec := floodSpec{20, 5 * time.Second, 200 * time.Millisecond}
	if v := os.Getenv("EDGEGW_FLOOD"); v != "" {
		f := strings.Split(v, ",")
		var err1, err2, err3 error
		if len(f) == 3 {
			spec.workers, err1 = strconv.Atoi(f[0])
			spec.dur, err2 = time.ParseDuration(f[1])
			spec.interval, err3 = time.ParseDuration(f[2])
		}
		if len(f) != 3 || err1 != nil || err2 != nil || err3 != nil {
			t.Fatalf("EDGEGW_FLOOD=%q: want workers,duration,interval", v)
		}
	}
	return spec
}

// cpuTicks is utime+stime of a process in clock ticks (USER_HZ = 100).
func cpuTicks(t *testing.T, pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
	u, _ := strconv.ParseInt(f[11], 10, 64)
	s, _ := strconv.ParseInt(f[12], 10, 64)
	return u + s
}

type devCounts struct {
	Name      string `json:"name"`
	Polls     uint64 `json:"polls"`
	GoodPolls uint64 `json:"good_polls"`
	Overruns  uint64 `json:"overruns"`
	Late      uint64 `json:"late"`
}

// A wrong-password flood from loopback (the real binary, basic auth on,
// 48 UDP loggers): 429s come at once (no more wrong-password answers
// before the first than the auth bucket holds), the gateway runs no more
// PBKDF2 verifications than the bucket allows, and no logger misses more
// than one poll window while it lasts, besides the windows its own
// counters put down to load: overruns (the gateway's scheduler was late)
// and late replies (the device, or the reading of its reply, was late).
// The gateway's CPU time and the valid sample rate are logged (the
// figures of the issue).
func TestWrongPasswordFloodE2E(t *testing.T) {
	spec := floodFromEnv(t)
	gwBin := bin
	if b := os.Getenv("EDGEGW_FLOOD_BIN"); b != "" {
		gwBin = b
	}
	// The loggers run in their own process (`edgegw sim`): the test
	// process runs under -race with the flood clients in it.
	addrs := simFleet(t, 48)
	hashFile := hashPasswordFile(t, t.TempDir(), "right")
	head := fmt.Sprintf("[http]\nlisten = \"127.0.0.1:0\"\nbasic_auth_user = \"operator\"\nbasic_auth_hash_file = %q\n", hashFile)
	gw, page := runFleetGateway(t, gwBin, head, addrs, spec.interval, min(200*time.Millisecond, spec.interval/2))

	// The operator reads from another address (127.0.0.2: loopback too).
	operator := httpFrom("127.0.0.2")
	// Its requests are rate-limited too (a 429 is held 500 ms): a wait
	// loop on them paces itself.
	devices := func() map[string]devCounts {
		return deviceCounts(t, "the operator's /api/devices", func(v any) error {
			return getJSONWith(operator, page+"api/devices", "operator", "right", v)
		})
	}
	waitFor(t, 20*time.Second, "every logger polled well", func() bool {
		for _, d := range devices() {
			if d.GoodPolls < 3 {
				return false
			}
		}
		return true
	})
	// PBKDF2 verifications so far, from /metrics.
	hashes := func() (n float64) {
		const name = "edgegw_web_password_hashes_total "
		waitFor(t, 20*time.Second, "the operator's /metrics", func() bool {
			req, _ := http.NewRequest("GET", page+"metrics", nil)
			req.SetBasicAuth("operator", "right")
			resp, err := operator.Do(req)
			if err != nil {
				return false
			}
			defer resp.Body.Close()
			body, _ := io.ReadAll(resp.Body)
			i := strings.Index(string(body), "\n"+name)
			if resp.StatusCode != 200 || i < 0 {
				return false
			}
			_, err = fmt.Sscan(string(body[i+1+len(name):]), &n)
			return err == nil
		})
		return n
	}
	// Warm-up past: one window of tolerance starts here.
	before, hash0 := devices(), hashes()
	cpu0, t0 := cpuTicks(t, gw.Cmd.Process.Pid), time.Now()

	flood := httpFrom("127.0.0.1")
	var mu sync.Mutex
	codes := map[int]int{}
	var first429 time.Duration
	before429 := 0 // answers other than 429 (wrong password: 401) before the first 429
	var wg sync.WaitGroup
	for w := range spec.workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; time.Since(t0) < spec.dur; i++ {
				req, _ := http.NewRequest("GET", page+"api/shortPolling", nil)
				req.SetBasicAuth("operator", fmt.Sprintf("guess-%d-%d", w, i))
				code := 0
				if resp, err := flood.Do(req); err == nil {
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					code = resp.StatusCode
				}
				mu.Lock()
				codes[code]++
				if code != 429 && code != 0 && first429 == 0 {
					before429++
				}
				if code == 429 && first429 == 0 {
					first429 = time.Since(t0)
				}
				mu.Unlock()
			}
		}()
	}
	testenv.Wait(t, spec.dur+time.Minute, "the flood's clients (10 s client timeout)", wg.Wait)
	elapsed := time.Since(t0)
	cpu1 := cpuTicks(t, gw.Cmd.Process.Pid)
	after, hash1 := devices(), hashes()

	cpu := float64(cpu1-cpu0) / 100 / elapsed.Seconds()
	var polls, good, load uint64
	worst, worstDev := uint64(0), ""
	for name, a := range after {
		p := before[name]
		n := (a.Polls - p.Polls) + (a.Overruns - p.Overruns)
		g := a.GoodPolls - p.GoodPolls
		// Windows the gateway's counters put down to load: skipped
		// because its scheduler was late, or failed with the reply late.
		l := min(n-g, (a.Overruns-p.Overruns)+(a.Late-p.Late))
		polls, good, load = polls+n, good+g, load+l
		if n-g-l > worst {
			worst, worstDev = n-g-l, name
		}
	}
	auth := web.DefaultAuthRate
	// The flood's hashes: the bucket's burst, its refill over the flood,
	// one for rounding, one for the operator's cache.
	maxHashes := float64(auth.Burst) + math.Ceil(auth.PerSec*elapsed.Seconds()) + 2
	// Before the first 429: the burst and the refill until then, one for
	// rounding (first429 is stamped when the client reads the 429, after
	// the gateway decided: a slow machine only widens the bound).
	max401 := auth.Burst + int(math.Ceil(auth.PerSec*first429.Seconds())) + 1
	t.Logf("flood %d clients × %v (binary %s): replies %v, first 429 after %v (%d answers before it); %.0f PBKDF2 runs; gateway CPU %.1f%% of one core; "+
		"valid sample rate %.2f%% (%d of %d polls), %d windows lost to load (overruns, late replies); worst device %s missed %d windows besides",
		spec.workers, spec.dur, gwBin, codes, first429, before429, hash1-hash0, 100*cpu, 100*float64(good)/float64(max(polls, 1)), good, polls, load, worstDev, worst)
	if gwBin != bin {
		return // a measurement of another build: figures only
	}
	if codes[429] == 0 || before429 > max401 {
		t.Errorf("429s: %d, the first after %v and %d other answers (want at most %d)", codes[429], first429, before429, max401)
	}
	if h := hash1 - hash0; h > maxHashes {
		t.Errorf("%.0f PBKDF2 runs during the %v flood, want at most %.0f", h, elapsed, maxHashes)
	}
	if worst > 1 {
		t.Errorf("device %s missed %d windows during the flood besides those lost to load (at most 1 allowed)", worstDev, worst)
	}
	gw.Stop(os.Interrupt, 10*time.Second)
}

// runFleetGateway runs binary on a config of head (its [http] section and
// any other but [poll]) and the UDP loggers at addrs, each a "th" logger
// (temperature, humidity) polled every interval (timeout 0: the default),
// until its page is up.
func runFleetGateway(t *testing.T, binary, head string, addrs []string, interval, timeout time.Duration) (*proc, string) {
	t.Helper()
	var b strings.Builder
	b.WriteString(head)
	b.WriteString("[poll]\nudp_listen = \"127.0.0.1:0\"\n")
	b.WriteString("[[profile]]\nname = \"th\"\ntags = [ { name = \"temperature\", address = 0, type = \"int16\", scale = 0.1 }, { name = \"humidity\", address = 1, scale = 0.1 } ]\n")
	for i, addr := range addrs {
		fmt.Fprintf(&b, "[[device]]\nname = \"logger-%02d\"\ntransport = \"udp\"\naddress = %q\nprofile = \"th\"\ninterval = %q\n", i+1, addr, interval)
		if timeout > 0 {
			fmt.Fprintf(&b, "timeout = %q\n", timeout)
		}
	}
	return runConfig(t, binary, filepath.Join(t.TempDir(), "edgegw.toml"), b.String())
}

// runConfig writes text to cfg and runs `binary run -config cfg`,
// returning it with its page URL.
func runConfig(t *testing.T, binary, cfg, text string) (*proc, string) {
	t.Helper()
	if err := os.WriteFile(cfg, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	gw := startProcBin(t, binary, "run", "-config", cfg)
	line := gw.WaitLine("edgegw running", 20*time.Second)
	return gw, line[strings.Index(line, "page=")+len("page="):]
}

// windows counts the poll windows of every device between two readings of
// /api/devices: polls (overruns included), good ones, and the device that
// missed most.
func windows(before, after map[string]devCounts) (polls, good, worst uint64, worstDev string) {
	for name, a := range after {
		p := before[name]
		n := (a.Polls - p.Polls) + (a.Overruns - p.Overruns)
		g := a.GoodPolls - p.GoodPolls
		polls, good = polls+n, good+g
		if n-g > worst {
			worst, worstDev = n-g, name
		}
	}
	return polls, good, worst, worstDev
}

// simFleet runs `edgegw sim` with n UDP loggers on random ports and
// returns their addresses.
func simFleet(t *testing.T, n int) []string {
	t.Helper()
	p := startProc(t, "sim", "-devices", strconv.Itoa(n), "-transport", "udp", "-port", "0")
	var addrs []string
	deadline := time.After(20 * time.Second)
	for len(addrs) < n {
		select {
		case l := <-p.Lines:
			if f := strings.Fields(l); len(f) == 3 && f[1] == "udp" {
				addrs = append(addrs, f[2])
			}
		case <-p.Done:
			t.Fatal("edgegw sim exited")
		case <-deadline:
			t.Fatalf("edgegw sim: %d of %d addresses after 20s", len(addrs), n)
		}
	}
	return addrs
}

// httpFrom is a client whose connections leave from src (any 127.0.0.0/8
// address is loopback): a client IP of its own for the rate limiter.
func httpFrom(src string) *http.Client {
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: 5 * time.Second}
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DialContext: d.DialContext, MaxIdleConnsPerHost: 100}}
}

// /healthz of the real binary: a good logger, a dead one and an upstream
// that cannot be reached. A device polling well keeps the devices healthy
// (the dead one is listed), and it turns 503, with the reason, once the
// upstream has been down longer than healthz_upstream_max_down.
func TestHealthzE2E(t *testing.T) {
	fleet := runFleet(t, sim.Config{Devices: 1, Transport: "udp"})
	dir := t.TempDir()
	deadUp := refusedAddr(t)
	var b strings.Builder
	fmt.Fprintf(&b, "[gateway]\ndata_dir = %q\n[http]\nlisten = \"127.0.0.1:0\"\nhealthz_upstream_max_down = \"2s\"\n[poll]\nudp_listen = \"127.0.0.1:0\"\n", filepath.Join(dir, "data"))
	fmt.Fprintf(&b, "[upstream.websocket]\nurl = \"ws://%s/ingest\"\n[upstream.mqtt]\nmode = \"off\"\n", deadUp)
	fmt.Fprintf(&b, "[[device]]\nname = \"good\"\ntransport = \"udp\"\naddress = %q\ninterval = \"100ms\"\ntimeout = \"50ms\"\ntags = [ { name = \"t\", address = 0 } ]\n", fleet.Addr(0))
	fmt.Fprintf(&b, "[[device]]\nname = \"dead\"\ntransport = \"udp\"\naddress = %q\ninterval = \"100ms\"\ntimeout = \"50ms\"\ntags = [ { name = \"t\", address = 0 } ]\n", silentUDPAddr(t))
	cfg := filepath.Join(dir, "edgegw.toml")
	if err := os.WriteFile(cfg, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	gw, page := runGateway(t, cfg)
	type health struct {
		code    int
		Status  string
		Reasons []string
		Down    []string
	}
	get := func() (h health) {
		resp, err := http.Get(page + "healthz")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		h.code = resp.StatusCode
		if h.code != 429 {
			if err := json.NewDecoder(resp.Body).Decode(&h); err != nil {
				t.Fatal(err)
			}
		}
		return h
	}
	var h health
	waitFor(t, 20*time.Second, "the dead device listed as down", func() bool {
		h = get()
		return h.code != 429 && strings.Join(h.Down, ",") == "dead"
	})
	for _, r := range h.Reasons {
		if strings.Contains(r, "device") {
			t.Fatalf("unhealthy for the devices while one polls well: %+v", h)
		}
	}
	// 503 for the upstream alone: a loaded machine may delay the good
	// device past 3 intervals for a moment (healthz then says so, too).
	waitFor(t, 40*time.Second, "503 for the upstream alone (2 s down, then the 10 s hold)", func() bool {
		h = get()
		return h.code == 503 && len(h.Reasons) == 1 && strings.Join(h.Down, ",") == "dead"
	})
	if h.Status != "unhealthy" || !strings.Contains(h.Reasons[0], "upstream down for") {
		t.Fatalf("healthz: %+v", h)
	}
	gw.Stop(os.Interrupt, 10*time.Second)
}
