package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"edgegw/lab/sim"
)

// ModeFull is `bench acquire -full`: the gateway binary that ships, run
// with `edgegw run` and a plain default config, as the measured process.
const ModeFull = "full"

// fullConfig is the config of the measured gateway: the defaults (history
// on, ring 60 s, no upstream, data_dir "") and one TCP device per logger of
// f, the logger model's two tags. extra (-full-config) comes after [http],
// before the profile and the devices.
func fullConfig(f *sim.Fleet, interval, timeout time.Duration, httpAddr, extra string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "[gateway]\nid = \"bench-full\"\n\n[http]\nlisten = %q\n\n", httpAddr)
	if extra != "" {
		b.WriteString("# -full-config\n")
		b.WriteString(strings.TrimRight(extra, "\n"))
		b.WriteString("\n\n")
	}
	b.WriteString(`[[profile]]
name = "th-logger"
tags = [
  { name = "temperature", register = "holding", address = 0, type = "int16",  scale = 0.1, unit = "°C" },
  { name = "humidity",    register = "holding", address = 1, type = "uint16", scale = 0.1, unit = "%RH" },
]
`)
	for i := 0; i < f.Len(); i++ {
		fmt.Fprintf(&b, "\n[[device]]\nname = \"logger-%04d\"\ntransport = \"tcp\"\naddress = %q\nprofile = \"th-logger\"\ninterval = %q\ntimeout = %q\nretries = 1\n",
			i+1, f.Addr(i), interval.String(), timeout.String())
	}
	return b.String()
}

// tomlHeaders lists the table headers of a TOML text ("[ring]", …), for
// the report to say what -full-config changed.
func tomlHeaders(text string) []string {
	var out []string
	for _, l := range strings.Split(text, "\n") {
		if l = strings.TrimSpace(l); strings.HasPrefix(l, "[") {
			out = append(out, l)
		}
	}
	return out
}

// moduleRoot is the directory of the edgegw module around the working
// directory ("" when there is none).
func moduleRoot() string {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return ""
	}
	mod := strings.TrimSpace(string(out))
	if mod == "" || mod == os.DevNull {
		return ""
	}
	b, err := os.ReadFile(mod)
	if err != nil || !bytes.HasPrefix(bytes.TrimSpace(b), []byte("module edgegw")) {
		return ""
	}
	return filepath.Dir(mod)
}

// buildShippedGateway builds the gateway binary as `make amd64` does (for this
// machine: build/gateway.flags, static, trimmed, stripped) into dir; with
// profile, plus the build tag pprof (the -pprof listener the shipped build
// leaves out).
func buildShippedGateway(ctx context.Context, dir string, profile bool) (string, error) {
	root := moduleRoot()
	if root == "" {
		return "", fmt.Errorf("bench: acquire -full: not inside the edgegw module: give -gateway PATH (a binary built by make amd64)")
	}
	flags, err := os.ReadFile(filepath.Join(root, "build", "gateway.flags"))
	if err != nil {
		return "", fmt.Errorf("bench: acquire -full: %w", err)
	}
	bin := filepath.Join(dir, "edgegw-gateway")
	args := []string{"build", "-trimpath", "-buildvcs=false"}
	for _, l := range strings.Split(string(flags), "\n") {
		if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "#") {
			args = append(args, strings.Fields(l)...)
		}
	}
	if profile {
		for i, a := range args {
			if t, ok := strings.CutPrefix(a, "-tags="); ok {
				args[i] = "-tags=" + t + ",pprof"
			} else if a == "-tags" && i+1 < len(args) {
				args[i+1] += ",pprof"
			}
		}
	}
	args = append(args, "-ldflags", "-s -w -X main.version=bench", "-o", bin, ".")
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("bench: acquire -full: go build: %w: %s", err, out)
	}
	return bin, nil
}

// fullDevices is the part of /api/devices the bench reads.
type fullDevices struct {
	Devices []struct {
		Polls     uint64 `json:"polls"`
		GoodPolls uint64 `json:"good_polls"`
		Overruns  uint64 `json:"overruns"`
		Requests  uint64 `json:"requests"`
		Responses uint64 `json:"responses"`
		Timeouts  uint64 `json:"timeouts"`
		Errors    uint64 `json:"errors"`
		Late      uint64 `json:"late"`
	} `json:"devices"`
}

// total sums every device's counters into a ModeReport's fields.
func (d fullDevices) total() (m ModeReport) {
	for _, x := range d.Devices {
		m.Polls += x.Polls
		m.GoodPolls += x.GoodPolls
		m.Overruns += x.Overruns
		m.Requests += x.Requests
		m.Responses += x.Responses
		m.Timeouts += x.Timeouts
		m.Errors += x.Errors
		m.Late += x.Late
	}
	return m
}

var fullClient = &http.Client{Timeout: 10 * time.Second}

func getJSON(url string, v any) error {
	resp, err := fullClient.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return fmt.Errorf("bench: GET %s: %s: %s", url, resp.Status, b)
	}
	return json.NewDecoder(resp.Body).Decode(v)
}

// saveURL writes what GET url answers to path.
func saveURL(client *http.Client, url, path string) error {
	resp, err := client.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("bench: GET %s: %s", url, resp.Status)
	}
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o644)
}

// acquireFull measures `edgegw run` (the shipped build, a default config)
// polling every logger of f over TCP: CPU and RSS from /proc over the
// window, polls and valid rate from its /api/devices. With cfg.Profile it
// also takes a CPU profile of the window (full-cpu.pprof) and a heap
// profile at its end (full-heap.pprof) from the gateway's -pprof listener.
func acquireFull(ctx context.Context, cfg AcquireConfig, f *sim.Fleet) (ModeReport, error) {
	mr := ModeReport{Mode: ModeFull, Devices: f.Len(), Interval: cfg.Interval.String(),
		Where: "edgegw run (gateway build, default config: history, ring 60 s, web; no upstream) in its own process; loggers in the bench process"}
	if cfg.FullConfig != "" {
		mr.Where = "edgegw run (gateway build, default config with -full-config's sections: " + strings.Join(tomlHeaders(cfg.FullConfig), " ") + "; no upstream) in its own process; loggers in the bench process"
	}
	dir, err := os.MkdirTemp("", "edgegw-bench-full-")
	if err != nil {
		return mr, err
	}
	defer os.RemoveAll(dir)
	bin := cfg.Gateway
	if bin == "" {
		cfg.Logger.Info("bench: acquire -full: building the gateway binary (build/gateway.flags; with -pprof plus the tag pprof)")
		if bin, err = buildShippedGateway(ctx, dir, cfg.Profile != ""); err != nil {
			return mr, err
		}
	}
	port, err := freePort()
	if err != nil {
		return mr, err
	}
	httpAddr := fmt.Sprintf("127.0.0.1:%d", port)
	conf := filepath.Join(dir, "edgegw.toml")
	if err := os.WriteFile(conf, []byte(fullConfig(f, cfg.Interval, timeoutFor(cfg, "tcp"), httpAddr, cfg.FullConfig)), 0o600); err != nil {
		return mr, err
	}
	args := []string{"run", "-config", conf}
	pprofAddr := ""
	if cfg.Profile != "" {
		pp, err := freePort()
		if err != nil {
			return mr, err
		}
		pprofAddr = fmt.Sprintf("127.0.0.1:%d", pp)
		args = append(args, "-pprof", pprofAddr)
	}
	p, err := startPeer(bin, args...)
	if err != nil {
		return mr, err
	}
	defer p.stop()
	if err := waitAccept(p, httpAddr, 30*time.Second); err != nil {
		return mr, fmt.Errorf("bench: acquire -full: %s: %w", bin, err)
	}
	base := "http://" + httpAddr
	var a, b Usage
	var da, db fullDevices
	var sa, sb sim.Counters
	var la, lb Usage
	var ma, mb machineCPU
	profDone := make(chan error, 1)
	snap := func(u *Usage, d *fullDevices, s *sim.Counters, l *Usage, m *machineCPU) error {
		var err error
		*s, *l, *m = simCounters(f), selfUsage(), readMachineCPU()
		if *u, err = procUsage(p.cmd.Process.Pid); err != nil {
			return err
		}
		return getJSON(base+"/api/devices", d)
	}
	err = measureWindow(ctx, cfg.Warmup, cfg.Duration,
		func() error {
			if err := snap(&a, &da, &sa, &la, &ma); err != nil {
				return err
			}
			if pprofAddr == "" {
				close(profDone)
				return nil
			}
			secs := max(int(cfg.Duration.Seconds()), 1)
			go func() {
				c := &http.Client{Timeout: cfg.Duration + 30*time.Second}
				profDone <- saveURL(c, fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", pprofAddr, secs), filepath.Join(cfg.Profile, "full-cpu.pprof"))
			}()
			return nil
		},
		func() error { return snap(&b, &db, &sb, &lb, &mb) })
	if err != nil {
		if p.exited() {
			return mr, fmt.Errorf("bench: acquire -full: gateway exited: %s", p.output())
		}
		return mr, err
	}
	if pprofAddr != "" {
		if err := <-profDone; err != nil { // the client's timeout bounds it
			return mr, fmt.Errorf("bench: acquire -full: cpu profile: %w", err)
		}
		if err := saveURL(fullClient, "http://"+pprofAddr+"/debug/pprof/heap?gc=1", filepath.Join(cfg.Profile, "full-heap.pprof")); err != nil {
			return mr, fmt.Errorf("bench: acquire -full: heap profile: %w", err)
		}
	}
	ta, tb := da.total(), db.total()
	mr.Seconds = b.At.Sub(a.At).Seconds()
	mr.Polls, mr.GoodPolls, mr.Overruns = tb.Polls-ta.Polls, tb.GoodPolls-ta.GoodPolls, tb.Overruns-ta.Overruns
	mr.Scheduled = mr.Polls + mr.Overruns
	mr.Requests, mr.Responses = tb.Requests-ta.Requests, tb.Responses-ta.Responses
	mr.Timeouts, mr.Errors, mr.Late = tb.Timeouts-ta.Timeouts, tb.Errors-ta.Errors, tb.Late-ta.Late
	if mr.Requests > 0 {
		mr.LossRate = 1 - float64(mr.Responses)/float64(mr.Requests)
	}
	if mr.Scheduled > 0 {
		mr.ValidRate = float64(mr.GoodPolls) / float64(mr.Scheduled)
	}
	mr.CPUPercent = cpuPercent(a, b)
	if mr.Polls > 0 {
		mr.CPUPerPollUS = float64((b.CPU - a.CPU).Microseconds()) / float64(mr.Polls)
	}
	mr.RSSMiB, mr.HWMMiB = mib(b.RSS), mib(b.HWM)
	st := readStatusFields(fmt.Sprintf("/proc/%d/status", p.cmd.Process.Pid))
	mr.RSSAnonMiB, mr.RSSFileMiB = mib(st["RssAnon"]), mib(st["RssFile"])
	mr.LoadCPU, mr.MachineCPU = cpuPercent(la, lb), machinePercent(ma, mb)
	mr.SimRequests, mr.SimReplies, mr.SimDropped = sb.Requests-sa.Requests, sb.Replies-sa.Replies, sb.Dropped-sa.Dropped
	return mr, nil
}

// fullRatios is the note comparing the full gateway with Telegraf, when
// both ran.
func (r *AcquireReport) fullRatios() string {
	var full, tg *ModeReport
	for i := range r.Modes {
		switch m := &r.Modes[i]; {
		case m.Skipped != "":
		case m.Mode == ModeFull:
			full = m
		case m.Mode == "telegraf":
			tg = m
		}
	}
	if full == nil || tg == nil || tg.CPUPercent <= 0 || tg.RSSMiB <= 0 {
		return ""
	}
	return fmt.Sprintf("full / telegraf: cpu %.2f×, rss %.2f× (same loggers, one after the other, in one run)",
		full.CPUPercent/tg.CPUPercent, full.RSSMiB/tg.RSSMiB)
}
