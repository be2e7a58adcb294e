// RunSoak and its steps: prepare, start the loggers, the receiver and the
// gateway, monitor while the events run, settle, then the figures.

package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"edgegw/receiver"
	"edgegw/web"
)

// RunSoak runs the compressed soak and returns its report. An error means
// the soak could not run or the gateway died; the report says what was
// measured until then.
func RunSoak(ctx context.Context, cfg SoakConfig) (*SoakReport, error) {
	cfg, err := cfg.fill()
	if err != nil {
		return nil, err
	}
	rep := newSoakReport(cfg)
	if _, err := RaiseFileLimit(); err != nil {
		cfg.Logger.Warn("bench: cannot raise the file limit", "err", err)
	}
	s := &soakRun{cfg: cfg, dir: cfg.Dir, token: "soak-read-token", password: "soak-right-password"}
	cleanup, err := s.prepare()
	if err != nil {
		return nil, err
	}
	defer cleanup()

	fctx, stopFleets := context.WithCancel(context.Background())
	var fleetWG sync.WaitGroup
	defer func() { stopFleets(); fleetWG.Wait() }()
	if err := s.startLoggers(fctx, &fleetWG); err != nil {
		return nil, err
	}

	recvOut, recv, up, err := s.startReceiver(ctx)
	if err != nil {
		return nil, err
	}
	defer recvOut.Close()
	defer up.down()

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
	page, err := waitRunning(ctx, gw, rep)
	if err != nil {
		return rep, err
	}
	m := newSoakMonitor(page, s.token, gw.cmd.Process.Pid)
	defer m.close()
	start := time.Now()
	end := start.Add(cfg.Duration)
	m.start = start
	cfg.Logger.Info("bench: soak: gateway running", "page", page, "pid", m.pid, "dir", s.dir, "duration", cfg.Duration)

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
	m.evs = s.startEvents(ectx, &wg, start, end, gw, up, page, confPath)

	// The monitor, in this goroutine: resources until end.
	var uEnd Usage
	rep.Samples, uEnd = m.watch(ectx, ctx, end, cfg.SampleEvery)
	stopEvents()
	wg.Wait()
	rep.Events = m.evs.ev // the event goroutines have exited
	rep.Events.FloodKind, rep.Events.FloodClients, rep.Events.FloodStatus, rep.Events.MonitorErrors = cfg.Flood, cfg.FloodClients, m.evs.status, m.errs
	rep.CPUPercent = cpuPercent(m.u0, uEnd)
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
	if err := s.settle(ctx, rep, m, gw, up, recv, end); err != nil {
		return rep, err
	}
	if err := s.figures(rep, m, recvOut, end); err != nil {
		return rep, err
	}
	return rep, nil
}

// newSoakReport is the report's header: what cfg asks for.
func newSoakReport(cfg SoakConfig) *SoakReport {
	return &SoakReport{Started: time.Now(), Machine: thisMachine(), Devices: cfg.Devices, Transport: cfg.Transport,
		Interval: cfg.Interval.String(), Timeout: cfg.Timeout.String(), Retries: cfg.Retries, Duration: cfg.Duration.String(),
		Warmup: cfg.Warmup.String(), Loss: cfg.Loss, Seed: cfg.Seed,
		Schedule: fmt.Sprintf("restart every %v (a quarter of the loggers, round robin); reload every %v; uplink cut every %v for %v; flood (%s, %d clients) every %v for %v; a new slow WebSocket client every %v; unopenable device in every other reload: %v",
			cfg.RestartEvery, cfg.ReloadEvery, cfg.UplinkEvery, cfg.UplinkDown, cfg.Flood, cfg.FloodClients, cfg.FloodEvery, cfg.FloodFor, cfg.UplinkEvery, cfg.Unopenable)}
}

// prepare makes the soak's directory (a temporary one unless cfg.Dir) and
// writes the Basic hash and the read token into it. cleanup removes the
// temporary directory.
func (s *soakRun) prepare() (cleanup func(), err error) {
	cleanup = func() {}
	if s.dir == "" {
		if s.dir, err = os.MkdirTemp("", "edgegw-soak-"); err != nil {
			return nil, fmt.Errorf("bench: soak: %w", err)
		}
		dir := s.dir
		cleanup = func() { os.RemoveAll(dir) }
	} else if err := os.MkdirAll(s.dir, 0o755); err != nil {
		return nil, fmt.Errorf("bench: soak: %w", err)
	}
	hash, err := web.HashPassword(s.password, web.DefaultHashIterations)
	if err != nil {
		cleanup()
		return nil, err
	}
	s.hashFile = filepath.Join(s.dir, "basic.hash")
	if err := writeFile(s.hashFile, hash+"\n"); err != nil {
		cleanup()
		return nil, err
	}
	if err := writeFile(filepath.Join(s.dir, "read.token"), s.token+"\n"); err != nil {
		cleanup()
		return nil, err
	}
	return cleanup, nil
}

// startReceiver starts the reference receiver, storing into
// received.jsonl, and sets s.recvAddr.
func (s *soakRun) startReceiver(ctx context.Context) (*os.File, *receiver.Receiver, *uplink, error) {
	recvOut, err := os.Create(filepath.Join(s.dir, "received.jsonl"))
	if err != nil {
		return nil, nil, nil, fmt.Errorf("bench: soak: %w", err)
	}
	recv := receiver.New(receiver.Config{Listen: "127.0.0.1:0", Out: recvOut, Logger: s.cfg.Logger})
	up := &uplink{r: recv}
	if err := up.up(ctx); err != nil {
		recvOut.Close()
		return nil, nil, nil, fmt.Errorf("bench: soak: receiver: %w", err)
	}
	addr, _ := recv.Listen()
	s.recvAddr = addr.String()
	return recvOut, recv, up, nil
}

// waitRunning waits up to 30 s for the gateway to print its page URL.
func waitRunning(ctx context.Context, gw *gatewayProc, rep *SoakReport) (string, error) {
	select {
	case page := <-gw.page:
		return page, nil
	case <-gw.done:
		rep.Log = gw.logSum()
		return "", fmt.Errorf("bench: soak: the gateway exited at start (%d): %s", gw.code, strings.Join(rep.Log.Last, "\n"))
	case <-time.After(30 * time.Second):
		return "", errors.New("bench: soak: the gateway did not say it was running within 30s")
	case <-ctx.Done():
		return "", ctx.Err()
	}
}

// soakMonitor samples the gateway's resources and reads its API from the
// bench's own address.
type soakMonitor struct {
	api   *soakAPI
	tr    *http.Transport
	pid   int
	start time.Time   // when the gateway was ready
	evs   *soakEvents // the phase stamped on each sample

	u0, prev Usage
	queueMax int64
	errs     uint64 // failed API reads

	a0, b0   map[string]soakDevice // /api/devices 1 s after start, and at end
	aAt, bAt time.Time
	devErr   error // of b0
}

func newSoakMonitor(page, token string, pid int) *soakMonitor {
	tr := &http.Transport{MaxIdleConnsPerHost: 4, IdleConnTimeout: 30 * time.Second, DialContext: monitorDial}
	return &soakMonitor{api: &soakAPI{base: page, token: token, client: &http.Client{Transport: tr}}, tr: tr, pid: pid}
}

func (m *soakMonitor) close() { m.tr.CloseIdleConnections() }

// sample is the gateway's resources now, the CPU since the last sample.
func (m *soakMonitor) sample(ctx context.Context) SoakSample {
	u, _ := procUsage(m.pid)
	smp := SoakSample{T: time.Since(m.start).Seconds(), RSSMiB: mib(u.RSS), FDs: procFDs(m.pid), Threads: procThreads(m.pid),
		Goroutines: m.api.goroutines(ctx), Phase: m.evs.phase.Load().(string)}
	if m.prev.At.IsZero() {
		smp.CPU = cpuPercent(Usage{At: m.start}, u)
	} else {
		smp.CPU = cpuPercent(m.prev, u)
	}
	m.prev = u
	var st soakStatus
	if err := m.api.get(ctx, "api/status", &st); err != nil {
		m.errs++
	} else {
		smp.Queue = st.Upstream.QueueSamples
		m.queueMax = max(m.queueMax, st.Upstream.QueueSamples)
	}
	return smp
}

// watch samples every period until end (or until ectx ends), takes the two
// /api/devices snapshots, and returns the samples and the usage at end.
func (m *soakMonitor) watch(ectx, ctx context.Context, end time.Time, every time.Duration) ([]SoakSample, Usage) {
	var samples []SoakSample
	m.u0, _ = procUsage(m.pid)
	m.prev = m.u0
	if sleepCtx(ectx, time.Second) == nil {
		m.aAt = time.Now()
		var err error
		if m.a0, err = m.api.devices(ctx); err != nil {
			m.errs++
		}
	}
	for next := m.start.Add(every); next.Before(end); next = next.Add(every) {
		if sleepCtx(ectx, time.Until(next)) != nil {
			break
		}
		samples = append(samples, m.sample(ctx))
	}
	_ = sleepCtx(ectx, time.Until(end))
	m.bAt = time.Now()
	m.b0, m.devErr = m.api.devices(ctx)
	uEnd, _ := procUsage(m.pid)
	return samples, uEnd
}

// settle lets the receiver catch up with what the gateway had numbered
// (up to cfg.Settle), takes the last sample and stops the gateway and the
// receiver.
func (s *soakRun) settle(ctx context.Context, rep *SoakReport, m *soakMonitor, gw *gatewayProc, up *uplink, recv *receiver.Receiver, end time.Time) error {
	var st soakStatus
	if err := m.api.get(ctx, "api/status", &st); err != nil {
		return fmt.Errorf("bench: soak: status: %w", err)
	}
	rep.Numbered = st.Seq
	settleEnd := time.Now().Add(s.cfg.Settle)
	for recv.Stats().Samples < rep.Numbered && time.Now().Before(settleEnd) {
		if sleepCtx(ctx, 200*time.Millisecond) != nil {
			return ctx.Err()
		}
	}
	rep.CaughtUpS = time.Since(end).Seconds()
	last := m.sample(ctx)
	last.Phase = "settled"
	rep.Samples = append(rep.Samples, last)
	if err := m.api.get(ctx, "api/status", &st); err == nil {
		rep.Dropped = st.Upstream.Dropped
		rep.Events.WSDropped = st.Clients.WSDropped
	}
	rep.QueueMax = m.queueMax
	rep.ReceiverGap = recv.Stats().Gaps
	rep.Alive = !gw.exited()
	rep.ExitCode = gw.stop()
	rep.Log = gw.logSum()
	if rep.ExitCode == 0 && rep.Log.Panics == 0 {
		rep.Log.Last = nil
	}
	if err := up.down(); err != nil {
		s.cfg.Logger.Warn("bench: soak: receiver", "err", err)
	}
	return nil
}

// figures fills the trends, the untouched loggers' valid rates and what
// the receiver stored (recvOut, read from its start).
func (s *soakRun) figures(rep *SoakReport, m *soakMonitor, recvOut *os.File, end time.Time) error {
	rep.trends(s.cfg.Warmup)
	if m.devErr != nil || m.a0 == nil {
		return fmt.Errorf("bench: soak: /api/devices: %v", m.devErr)
	}
	untouched := rep.untouchedRates(s.loggers, m.a0, m.b0, m.bAt.Sub(m.aAt), s.cfg)
	if _, err := recvOut.Seek(0, io.SeekStart); err != nil {
		return err
	}
	return rep.received(recvOut, untouched, s.cfg.Interval, end.UnixMicro())
}
