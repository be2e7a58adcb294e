package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"edgegw/lab/sim"
	"edgegw/ringstore"
	"edgegw/wire"

	mqtt "github.com/eclipse/paho.mqtt.golang"
)

// Machine describes where a report was made.
type Machine struct {
	CPUs   int    `json:"cpus"`
	Model  string `json:"model"`
	Kernel string `json:"kernel"`
	Go     string `json:"go"`
	Note   string `json:"note"`
}

func thisMachine() Machine {
	m := Machine{CPUs: runtime.NumCPU(), Go: runtime.Version(),
		Note: "loopback only; the gateway under test and the load generator share these CPUs"}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				m.Model = strings.TrimSpace(v)
				break
			}
		}
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = strings.TrimSpace(string(b))
	}
	return m
}

// findPeer resolves a peer binary: "off" skips it, "" looks on PATH.
func findPeer(name, path string) (string, string) {
	if path == "off" {
		return "", name + ": skipped (off)"
	}
	if path == "" {
		p, err := exec.LookPath(name)
		if err != nil {
			return "", name + ": not found on PATH (optional peer; skipped)"
		}
		return p, ""
	}
	if _, err := os.Stat(path); err != nil {
		return "", fmt.Sprintf("%s: %s: %v (skipped)", name, path, err)
	}
	return path, ""
}

func findTelegraf(path string) (string, string) { return findPeer("telegraf", path) }

func findMosquitto(path string) (string, string) { return findPeer("mosquitto", path) }

// peer is an external program started for one measurement.
type peer struct {
	cmd  *exec.Cmd
	done chan struct{}
	out  bytes.Buffer // stderr+stdout, for the error message
}

func startPeer(bin string, args ...string) (*peer, error) {
	p := &peer{cmd: exec.Command(bin, args...), done: make(chan struct{})}
	p.cmd.Stdout = &syncWriter{w: &p.out}
	p.cmd.Stderr = p.cmd.Stdout
	if err := p.cmd.Start(); err != nil {
		return nil, fmt.Errorf("bench: start %s: %w", bin, err)
	}
	go func() { _ = p.cmd.Wait(); close(p.done) }()
	return p, nil
}

func (p *peer) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// stop sends SIGTERM, waits at most 5 s, then kills.
func (p *peer) stop() {
	if p.exited() {
		return
	}
	_ = p.cmd.Process.Signal(os.Interrupt)
	t := time.NewTimer(5 * time.Second)
	defer t.Stop()
	select {
	case <-p.done:
	case <-t.C:
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

func (p *peer) output() string {
	w := p.cmd.Stdout.(*syncWriter)
	w.mu.Lock()
	defer w.mu.Unlock()
	return strings.TrimSpace(p.out.String())
}

type syncWriter struct {
	mu sync.Mutex
	w  *bytes.Buffer
}

func (s *syncWriter) Write(b []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.w.Len() > 64<<10 {
		return len(b), nil
	}
	return s.w.Write(b)
}

// freePort is a loopback port that was free a moment ago, for programs that
// cannot listen on port 0 and report it (callers retry on a bind failure).
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// waitAccept dials addr until it accepts, the peer exits or d passes.
func waitAccept(p *peer, addr string, d time.Duration) error {
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
			return nil
		}
		if p.exited() {
			return fmt.Errorf("exited: %s", p.output())
		}
		_ = sleepCtx(context.Background(), 20*time.Millisecond) // readiness poll with a deadline
	}
	return fmt.Errorf("not accepting on %s within %v", addr, d)
}

// startMosquitto runs mosquitto in the foreground on a random loopback port
// with a generated config (no persistence, unlimited queues so nothing is
// dropped silently).
func startMosquitto(bin, dir string) (*peer, string, error) {
	var last error
	for attempt := 0; attempt < 5; attempt++ {
		port, err := freePort()
		if err != nil {
			return nil, "", err
		}
		conf := filepath.Join(dir, fmt.Sprintf("mosquitto-%d.conf", port))
		body := fmt.Sprintf("listener %d 127.0.0.1\nallow_anonymous true\npersistence false\nmax_queued_messages 0\nmax_inflight_messages 0\n", port)
		if os.Geteuid() == 0 {
			body += "user root\n"
		}
		if err := os.WriteFile(conf, []byte(body), 0o600); err != nil {
			return nil, "", err
		}
		p, err := startPeer(bin, "-c", conf)
		if err != nil {
			return nil, "", err
		}
		addr := fmt.Sprintf("127.0.0.1:%d", port)
		if last = waitAccept(p, addr, 10*time.Second); last == nil {
			return p, addr, nil
		}
		p.stop()
	}
	return nil, "", fmt.Errorf("bench: mosquitto: %w", last)
}

const mqttTopic = "edgegw/bench/samples"

// publisher is the MQTT peer's source: the same synthetic updates as the
// gateway's, encoded like a WebSocket samples frame, QoS 0.
type publisher struct {
	cl    mqtt.Client
	spec  delSpec
	names []string
	seq   atomic.Uint64 // last seq published
	k     int
}

func (p *publisher) publish() error {
	now := time.Now().UnixMicro()
	batch := make([]ringstore.Sample, p.spec.Batch)
	first := p.seq.Load() + 1
	for i := range batch {
		t := (p.k*p.spec.Batch + i) % p.spec.Tags
		batch[i] = ringstore.Sample{Seq: first + uint64(i), Device: p.names[t], Tag: "value", Value: float64(p.k % 1000), TS: now}
	}
	p.k++
	last := first + uint64(len(batch)) - 1
	b := wire.AppendWSSamples(nil, last, batch)
	p.seq.Store(last)
	tok := p.cl.Publish(mqttTopic, 0, false, b)
	if !tok.WaitTimeout(5 * time.Second) {
		return errors.New("bench: mqtt publish timed out")
	}
	return tok.Error()
}

func (p *publisher) run(ctx context.Context) error {
	t := time.NewTicker(period(p.spec.Rate))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			if err := p.publish(); err != nil {
				return err
			}
		}
	}
}

func mqttOptions(addr, id string) *mqtt.ClientOptions {
	return mqtt.NewClientOptions().AddBroker("tcp://" + addr).SetClientID(id).
		SetCleanSession(true).SetAutoReconnect(false).SetConnectRetry(false).
		SetConnectTimeout(10 * time.Second).SetWriteTimeout(10 * time.Second).
		SetKeepAlive(60 * time.Second).SetOrderMatters(true)
}

// mqttStep measures mosquitto fanning the updates out to n subscribers.
func mqttStep(ctx context.Context, cfg DeliverConfig, bin string, n int) (StepReport, error) {
	st := StepReport{Method: MethodMQTT, Clients: n,
		Where: "mosquitto in its own process; publisher and subscribers (paho) in the bench process"}
	dir, err := os.MkdirTemp("", "edgegw-bench-mosquitto-")
	if err != nil {
		return st, err
	}
	defer os.RemoveAll(dir)
	broker, addr, err := startMosquitto(bin, dir)
	if err != nil {
		return st, err
	}
	defer broker.stop()
	pub := &publisher{spec: delSpec{Rate: cfg.Rate, Batch: cfg.Batch, Tags: cfg.Tags}}
	for i := 0; i < cfg.Tags; i++ {
		pub.names = append(pub.names, fmt.Sprintf("logger-%02d", i+1))
	}
	pub.cl = mqtt.NewClient(mqttOptions(addr, "bench-pub"))
	if tok := pub.cl.Connect(); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		return st, fmt.Errorf("bench: mqtt publisher connect: %v", tok.Error())
	}
	defer pub.cl.Disconnect(100)
	pctx, pause := context.WithCancel(ctx)
	defer pause()
	pubDone := make(chan error, 1)
	go func() { pubDone <- pub.run(pctx) }()
	paused := false
	var pubErr error
	stopPub := func() {
		if !paused {
			paused = true
			pause()
			pubErr = <-pubDone
		}
	}
	defer stopPub()

	run := &stepRun{cfg: cfg, addr: addr}
	var id atomic.Int64
	client := func(ctx context.Context, r *clientResult) {
		mu := &sync.Mutex{} // the paho callback runs on paho's goroutine
		opts := mqttOptions(addr, fmt.Sprintf("bench-sub-%d", id.Add(1)))
		opts.SetCustomOpenConnectionFn(func(uri *url.URL, _ mqtt.ClientOptions) (net.Conn, error) {
			var d net.Dialer
			c, err := d.DialContext(ctx, "tcp", uri.Host)
			if err != nil {
				return nil, err
			}
			return run.wire.wrap(c), nil
		})
		cl := mqtt.NewClient(opts)
		if tok := cl.Connect(); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
			r.errors++
			return
		}
		defer cl.Disconnect(50)
		handler := func(_ mqtt.Client, m mqtt.Message) {
			now := time.Now().UnixMicro()
			mu.Lock()
			defer mu.Unlock()
			if !r.started {
				return
			}
			b := m.Payload()
			h, rest, err := wire.ReadHead(b)
			if err != nil {
				r.errors++
				return
			}
			if h.Seq <= r.start {
				return // published before the subscription was acknowledged
			}
			r.requests++
			r.payload += uint64(len(b))
			r.observeAll(rest, now, run.recording.Load())
			r.lastAtom.Store(r.last)
		}
		tok := cl.Subscribe(mqttTopic, 0, handler)
		if !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
			r.errors++
			return
		}
		mu.Lock()
		r.begin(pub.seq.Load())
		mu.Unlock()
		<-ctx.Done()
	}
	var a, b, la, lb Usage
	var ma, mb machineCPU
	var sa, sb, final uint64
	results, err := runClients(ctx, cfg, n, run, client, func(results []*clientResult) error {
		var err error
		sa = pub.seq.Load()
		if a, err = procUsage(broker.cmd.Process.Pid); err != nil {
			return err
		}
		la, ma = selfUsage(), readMachineCPU()
		_ = sleepCtx(ctx, cfg.Duration)
		lb, mb = selfUsage(), readMachineCPU()
		sb = pub.seq.Load()
		if b, err = procUsage(broker.cmd.Process.Pid); err != nil {
			return err
		}
		stopPub()
		final = pub.seq.Load()
		drain(results, final, cfg.Drain)
		return nil
	})
	if err != nil {
		return st, err
	}
	if pubErr != nil {
		return st, pubErr
	}
	summarize(&st, results, final)
	st.setWire(&run.wire)
	st.Seconds = b.At.Sub(a.At).Seconds()
	st.Sent = sb - sa
	st.CPUPercent = cpuPercent(a, b)
	st.LoadCPU, st.MachineCPU = cpuPercent(la, lb), machinePercent(ma, mb)
	st.RSSMiB, st.HWMMiB = mib(b.RSS), mib(b.HWM)
	return st, nil
}

// telegrafConfig is a Telegraf config polling every logger of f over TCP
// (one [[inputs.modbus]] per logger, holding registers 0 and 1) into /dev/null.
func telegrafConfig(f *sim.Fleet, interval, timeout time.Duration) string {
	var b strings.Builder
	fmt.Fprintf(&b, "[agent]\n  interval = %q\n  flush_interval = \"10s\"\n  round_interval = true\n  omit_hostname = true\n  quiet = true\n\n", interval.String())
	b.WriteString("[[outputs.file]]\n  files = [\"/dev/null\"]\n  data_format = \"influx\"\n")
	for i := 0; i < f.Len(); i++ {
		fmt.Fprintf(&b, `
[[inputs.modbus]]
  name = "logger-%04d"
  slave_id = 1
  timeout = %q
  controller = "tcp://%s"
  holding_registers = [
    { name = "temperature", byte_order = "AB", data_type = "INT16", scale = 1.0, address = [0] },
    { name = "humidity", byte_order = "AB", data_type = "UINT16", scale = 1.0, address = [1] },
  ]
`, i+1, timeout.String(), f.Addr(i))
	}
	return b.String()
}

// acquireTelegraf measures Telegraf polling the same TCP loggers: its CPU and
// RSS from /proc, the polls it made from the loggers' counters.
func acquireTelegraf(ctx context.Context, cfg AcquireConfig, bin string, f *sim.Fleet) (ModeReport, error) {
	mr := ModeReport{Mode: "telegraf", Devices: f.Len(), Interval: cfg.Interval.String(),
		Where: "telegraf (inputs.modbus, one TCP connection per logger) in its own process; loggers in the bench process"}
	dir, err := os.MkdirTemp("", "edgegw-bench-telegraf-")
	if err != nil {
		return mr, err
	}
	defer os.RemoveAll(dir)
	conf := filepath.Join(dir, "telegraf.conf")
	if err := os.WriteFile(conf, []byte(telegrafConfig(f, cfg.Interval, timeoutFor(cfg, "tcp"))), 0o600); err != nil {
		return mr, err
	}
	p, err := startPeer(bin, "--config", conf)
	if err != nil {
		return mr, err
	}
	defer p.stop()
	var a, b Usage
	var sa, sb sim.Counters
	err = measureWindow(ctx, cfg.Warmup, cfg.Duration,
		func() (err error) { sa = simCounters(f); a, err = procUsage(p.cmd.Process.Pid); return },
		func() (err error) { sb = simCounters(f); b, err = procUsage(p.cmd.Process.Pid); return })
	if err != nil {
		if p.exited() {
			return mr, fmt.Errorf("bench: telegraf exited: %s", p.output())
		}
		return mr, err
	}
	mr.Seconds = b.At.Sub(a.At).Seconds()
	mr.SimRequests, mr.SimReplies, mr.SimDropped = sb.Requests-sa.Requests, sb.Replies-sa.Replies, sb.Dropped-sa.Dropped
	// One poll of a logger is one request (registers 0–1 in one read).
	mr.Polls, mr.Requests, mr.Responses = mr.SimRequests, mr.SimRequests, mr.SimReplies
	if mr.SimRequests > 0 {
		mr.LossRate = 1 - float64(mr.SimReplies)/float64(mr.SimRequests)
		mr.CPUPerPollUS = float64((b.CPU - a.CPU).Microseconds()) / float64(mr.SimRequests)
	}
	mr.CPUPercent = cpuPercent(a, b)
	mr.RSSMiB, mr.HWMMiB = mib(b.RSS), mib(b.HWM)
	return mr, nil
}
