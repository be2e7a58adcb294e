package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"edgegw/conf"
	"edgegw/edge"
	"edgegw/push"
	"edgegw/ringstore"
	"edgegw/stats"
	"edgegw/web"
)

// gateway is every piece of a running gateway, wired together.
type gateway struct {
	cfg   *conf.Config
	log   *slog.Logger
	ring  *ringstore.Ring
	sched *edge.Scheduler
	web   *web.Server
	up    *stats.Upstream  // nil when no upstream is configured
	queue *ringstore.Queue // nil when no upstream is configured
	push  *push.Pusher     // nil when no upstream is configured
}

func newGateway(c *conf.Config, log *slog.Logger) (*gateway, error) {
	seq, err := ringstore.OpenSequence(c.Gateway.DataDir)
	if err != nil {
		return nil, err
	}
	ring := ringstore.NewRing(c.Ring.Size, seq)
	acq := new(stats.Acquisition) // gateway-wide: UDP datagrams from no device
	sched, err := newScheduler(c, ring, acq, log.With("pkg", "edge"))
	if err != nil {
		return nil, err
	}
	g := &gateway{cfg: c, log: log, ring: ring, sched: sched}
	writeToken, err := secret("http.write_token_file", c.HTTP.WriteTokenFile)
	if err != nil {
		return nil, err
	}
	readToken, err := secret("http.read_token_file", c.HTTP.ReadTokenFile)
	if err != nil {
		return nil, err
	}
	basicHash, err := secret("http.basic_auth_hash_file", c.HTTP.BasicAuthHashFile)
	if err != nil {
		return nil, err
	}
	if hasUpstream(c) {
		if g.queue, err = openQueue(c, log.With("pkg", "queue")); err != nil {
			return nil, err
		}
		ring.OnAppend(g.queue.Append)
		g.up = new(stats.Upstream)
		if g.push, err = newPusher(c, g.queue, ring.Snapshot, g.up, edgeWriter{sched}, log.With("pkg", "push")); err != nil {
			g.queue.Close()
			return nil, err
		}
	}
	g.web = web.New(web.Config{
		Listen: c.HTTP.Listen, LongPollTimeout: c.HTTP.LongPollTimeout, MaxClients: c.HTTP.MaxClients,
		MaxRequestBytes: c.HTTP.MaxRequestBytes, ReadHeaderTimeout: c.HTTP.ReadHeaderTimeout,
		IdleTimeout: c.HTTP.IdleTimeout, WriteTimeout: c.HTTP.WriteTimeout, AllowedOrigins: c.HTTP.AllowedOrigins,
		GatewayID: c.Gateway.ID, Version: version,
		WriteToken: writeToken, Writer: edgeWriter{sched}, ReadToken: readToken,
		BasicAuthUser: c.HTTP.BasicAuthUser, BasicAuthHash: basicHash, ProtectMetrics: c.HTTP.ProtectMetrics,
		TLSCertFile: c.HTTP.TLSCertFile, TLSKeyFile: c.HTTP.TLSKeyFile,
		Ring: ring, Devices: sched, Upstream: g.up, Acquisition: acq, Logger: log.With("pkg", "web"),
	})
	return g, nil
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
// first, so no new samples, then delivery, then the queue). listen must
// have been called.
func (g *gateway) pieces() []piece {
	var ps []piece
	if g.push != nil {
		ps = append(ps,
			piece{"queue", func(ctx context.Context) error {
				err := g.queue.Run(ctx)
				return errors.Join(err, g.queue.Close()) // writes what is still waiting
			}},
			piece{"push", g.push.Run})
	}
	return append(ps, piece{"web", g.web.Serve}, piece{"edge", g.sched.Run})
}
