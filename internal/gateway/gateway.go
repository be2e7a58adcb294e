package gateway

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"edgegw/conf"
	"edgegw/edge"
	"edgegw/history"
	"edgegw/mbserver"
	"edgegw/push"
	"edgegw/ringstore"
	"edgegw/spool"
	"edgegw/stats"
	"edgegw/web"
)

// gateway is every piece of a running gateway, wired together.
type gateway struct {
	cfg   *conf.Config
	log   *slog.Logger
	seq   *ringstore.Sequence
	ring  *ringstore.Ring
	sched *edge.Scheduler
	hist  *history.Store
	web   *web.Server
	up    *stats.Upstream    // nil when no upstream is configured
	queue *spool.Queue       // nil when neither push nor Sparkplug is configured; one cursor each (upstream.go)
	push  *push.Pusher       // nil when no upstream is configured
	spb   *sparkplugParts    // nil without [upstream.sparkplug] (sparkplug_mapping.go)
	acq   *stats.Acquisition // gateway-wide acquisition counters (UDP datagrams from no device)
	mbs   []*mbserver.Server // [[modbus_server]] (modbus_server.go)
}

// newGateway builds every piece of the gateway from c, as run runs it and
// check checks it: the durable queue, the sequence, the ring, the history,
// the scheduler, the pusher, the Sparkplug node and the web server, each
// from its own Config mapped from c. It opens no listener and no device
// (listen and Run do). dry builds the stores of data_dir in memory, so
// that nothing on disk is read or written (check, beside a running
// gateway); every refusal a constructor makes is made either way. An error
// is returned as itself, after what was built before it is released.
func newGateway(c *conf.Config, log *slog.Logger, dry bool) (*gateway, error) {
	g := &gateway{cfg: c, log: log}
	if dry {
		cc := *c
		cc.Gateway.DataDir = ""
		c = &cc
	}
	if err := g.build(c, log); err != nil {
		g.release()
		return nil, err
	}
	return g, nil
}

// release closes what build opened, for a gateway that never ran.
func (g *gateway) release() {
	if g.hist != nil {
		g.hist.Close()
	}
	if g.queue != nil {
		g.queue.Close()
	}
}

// consume registers every reader of the ring's batches, in one place and
// in this order: the queue that push and Sparkplug read (its hand-off under
// the ring's lock, its disk writes after it), then the history.
func (g *gateway) consume() error {
	var cs []ringstore.Consumer
	if g.queue != nil {
		cs = append(cs, g.queue.Consumer("queue"))
	}
	hist := g.hist
	cs = append(cs, ringstore.Consumer{Name: "history", After: func(b []ringstore.Sample, _ uint64) { hist.Add(b) }})
	for _, c := range cs {
		if err := g.ring.Consume(c); err != nil {
			return err
		}
	}
	return nil
}

// build fills g; on an error release undoes what it did.
func (g *gateway) build(c *conf.Config, log *slog.Logger) error {
	// The queue first: the sequence starts above the highest seq it holds,
	// and the queue keeps the restart's skip for the receiver.
	var err error
	if hasUpstream(c) || c.Upstream.Sparkplug != nil {
		if g.queue, err = openQueue(c, log.With("pkg", "queue")); err != nil {
			return err
		}
	}
	scfg := ringstore.SequenceConfig{Dir: c.Gateway.DataDir, Logger: log.With("pkg", "ringstore")}
	if g.queue != nil {
		scfg.Floor = g.queue.LastSeq()
	}
	if g.seq, err = ringstore.OpenSequenceConfig(scfg); err != nil {
		return err
	}
	if g.queue != nil {
		g.queue.Resume(g.seq.First())
	}
	size, window := ringSize(c)
	g.ring = ringstore.NewRing(size, g.seq)
	g.acq = new(stats.Acquisition) // gateway-wide: UDP datagrams from no device
	if g.hist, err = history.Open(historyConfig(c, func() []stats.Entry { return g.sched.Devices() }, log.With("pkg", "history"))); err != nil {
		return err
	}
	if g.sched, err = newScheduler(c, g.ring, g.acq, log.With("pkg", "edge")); err != nil {
		return err
	}
	log.Info("ring sized", "samples", size, "resume_window", window.Round(time.Second))
	writeToken, err := secret("http.write_token_file", c.HTTP.WriteTokenFile)
	if err != nil {
		return err
	}
	readToken, err := secret("http.read_token_file", c.HTTP.ReadTokenFile)
	if err != nil {
		return err
	}
	basicHash, err := secret("http.basic_auth_hash_file", c.HTTP.BasicAuthHashFile)
	if err != nil {
		return err
	}
	if hasUpstream(c) {
		g.up = new(stats.Upstream)
		if g.push, err = newPusher(c, queueReader(g.queue, cursorPush), g.ring.Snapshot, g.sched.Devices, g.up, edgeWriter{g.sched}, log.With("pkg", "push")); err != nil {
			return err
		}
	}
	if err = g.addSparkplug(c, edgeWriter{g.sched}, log.With("pkg", "sparkplug")); err != nil {
		return err
	}
	if err = g.consume(); err != nil {
		return err
	}
	var mbStats []*stats.ModbusServer
	if g.mbs, mbStats, err = newModbusServers(c, g.sched, g.ring, log.With("pkg", "mbserver")); err != nil {
		return err
	}
	g.web = web.New(web.Config{
		Listen: c.HTTP.Listen, LongPollTimeout: c.HTTP.LongPollTimeout, MaxClients: c.HTTP.MaxClients,
		MaxRequestBytes: c.HTTP.MaxRequestBytes, ReadHeaderTimeout: c.HTTP.ReadHeaderTimeout,
		IdleTimeout: c.HTTP.IdleTimeout, WriteTimeout: c.HTTP.WriteTimeout, AllowedOrigins: c.HTTP.AllowedOrigins,
		GatewayID: c.Gateway.ID, Version: version,
		WriteToken: writeToken, Writer: edgeWriter{g.sched}, ReadToken: readToken,
		BasicAuthUser: c.HTTP.BasicAuthUser, BasicAuthHash: basicHash, ProtectMetrics: c.HTTP.ProtectMetrics,
		TLSCertFile: c.HTTP.TLSCertFile, TLSKeyFile: c.HTTP.TLSKeyFile,
		RateLimit: webLimits(c.HTTP), TrustedProxies: c.HTTP.TrustedProxies, AllowedNetworks: c.HTTP.AllowedNetworks,
		Ring: g.ring, Devices: g.sched, Upstream: g.up, Acquisition: g.acq, Logger: log.With("pkg", "web"),
		History: g.hist, RingInfo: web.RingInfo{Size: size, Window: window},
		Storage: g.storage(c.Gateway.DataDir), HealthzUpstreamMaxDown: c.HTTP.HealthzUpstreamMaxDown,
		ModbusServers: mbStats,
	})
	return g.web.Check() // what Listen would refuse before binding
}

// edgeWriter lets web and push write through the scheduler without
// importing edge: both declare the same one-method Writer.
type edgeWriter struct{ s *edge.Scheduler }

func (w edgeWriter) Write(ctx context.Context, device, tag string, value float64, origin string) (float64, float64, error) {
	r, err := w.s.Write(ctx, edge.WriteRequest{Device: device, Tag: tag, Value: value, Origin: origin})
	return r.Written, r.ReadBack, err
}

var (
	_ web.Writer  = edgeWriter{}
	_ push.Writer = edgeWriter{}
)

// listen binds the local HTTP server and returns the page's URL.
func (g *gateway) listen() (string, error) {
	addr, err := g.web.Listen()
	if err != nil {
		return "", err
	}
	for _, m := range g.mbs {
		a, err := m.Listen()
		if err != nil {
			return "", err
		}
		g.log.Info("modbus server listening", "addr", a.String())
	}
	return "http://" + addr.String() + "/", nil
}

// stage is one running piece with its own lifetime.
type stage struct {
	name   string
	cancel context.CancelFunc
	done   chan struct{} // closed when run has returned; err is set then
	err    error
}

// start runs fn in its own goroutine; exited hears of the stage when fn returns.
func start(name string, fn func(context.Context) error, exited chan<- *stage) *stage {
	ctx, cancel := context.WithCancel(context.Background())
	s := &stage{name: name, cancel: cancel, done: make(chan struct{})}
	go func() {
		s.err = fn(ctx)
		close(s.done)
		exited <- s
	}()
	return s
}

// stop cancels the stage and waits for it, at most limit.
func (s *stage) stop(limit time.Duration) error {
	s.cancel()
	select {
	case <-s.done:
		if s.err != nil && !errors.Is(s.err, context.Canceled) {
			return fmt.Errorf("%s: %w", s.name, s.err)
		}
		return nil
	case <-time.After(limit):
		return fmt.Errorf("%s: did not stop within %v", s.name, limit)
	}
}

// runStages starts the pieces in order and, when ctx is done or a piece
// ends by itself, stops them in the reverse order, each within limit.
func runStages(ctx context.Context, log *slog.Logger, limit time.Duration, pieces []piece) error {
	exited := make(chan *stage, len(pieces))
	var stages []*stage
	for _, p := range pieces {
		stages = append(stages, start(p.name, p.run, exited))
	}
	var errs []error
	select {
	case <-ctx.Done():
	case s := <-exited:
		errs = append(errs, fmt.Errorf("%s stopped by itself: %v", s.name, s.err))
		log.Error("a piece of the gateway stopped; shutting down", "piece", s.name, "err", s.err)
	}
	for i := len(stages) - 1; i >= 0; i-- {
		if err := stages[i].stop(limit); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

type piece struct {
	name string
	run  func(context.Context) error
}

// pieces lists the gateway's running parts, consumers first: runStages
// starts them in this order and stops them in reverse (the scheduler
// first, so no new samples, then delivery, then the queue, then the
// sequence's mark writer). listen must
// have been called.
func (g *gateway) pieces() []piece {
	ps := []piece{{"sequence", g.seq.Run}} // writes the next marks; stopped last
	if g.queue != nil {
		ps = append(ps, piece{"queue", func(ctx context.Context) error {
			err := g.queue.Run(ctx)
			return errors.Join(err, g.queue.Close()) // writes what is still waiting
		}})
	}
	if g.push != nil {
		ps = append(ps, piece{"push", g.push.Run})
	}
	ps = append(ps, piece{"history", func(ctx context.Context) error {
		err := g.hist.Run(ctx) // writes the closed buckets still pending
		return errors.Join(err, g.hist.Close())
	}})
	if g.spb != nil {
		ps = append(ps, piece{"sparkplug", g.spb.node.Run})
	}
	for _, m := range g.mbs {
		ps = append(ps, piece{"modbus server " + m.Stats().Listen, m.Serve})
	}
	return append(ps, piece{"web", g.web.Serve}, piece{"edge", g.sched.Run})
}

// markRemoved appends one sample of quality stale (value null, stamped now)
// for every tag among the ring's latest values that devices no longer poll:
// its device, or the tag itself, was removed by a reload. Without it, those
// tags would show their last value as good for ever (shortPolling, the
// retained per-tag MQTT topics, a client resuming by snapshot). Marked once:
// a tag whose latest sample is stale already is left alone. It runs after
// Reload has returned, so no poll of a removed device can come after it.
// It returns the number of tags marked.
func (g *gateway) markRemoved(devices []edge.DeviceConfig, now time.Time) (int, error) {
	polled := make(map[[2]string]bool)
	for _, d := range devices {
		for _, t := range d.Tags {
			polled[[2]string{d.Name, t.Name}] = true
		}
	}
	sink := g.ring
	var batch []ringstore.Sample
	flush := func() error {
		if len(batch) == 0 {
			return nil
		}
		_, _, err := sink.Append(batch)
		batch = batch[:0]
		return err
	}
	n := 0
	for _, s := range g.ring.Snapshot().Latest { // sorted by device: one batch a device
		if s.Quality == ringstore.Stale || polled[[2]string{s.Device, s.Tag}] {
			continue
		}
		if len(batch) > 0 && batch[0].Device != s.Device {
			if err := flush(); err != nil {
				return n, err
			}
		}
		batch = append(batch, ringstore.Sample{Device: s.Device, Tag: s.Tag, Bool: s.Bool, Kind: s.Kind,
			Quality: ringstore.Stale, TS: now.UnixMicro()})
		n++
	}
	return n, flush()
}
