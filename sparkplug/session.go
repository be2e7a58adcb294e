package sparkplug

// One MQTT connection: connect with the will, subscribe, wait for the
// primary host, then the loop that publishes and acknowledges the queue.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"

	"edgegw/internal/mqttopts"
	"edgegw/ringstore"
	"edgegw/stats"
)

// events from paho's goroutines to the session loop.
type events struct {
	lost    chan struct{} // closed on connection loss
	lostErr error
	once    sync.Once
	rebirth chan struct{} // cap 1
	state   chan struct{} // cap 1: hostOnline changed
	mu      sync.Mutex
	online  bool
	stateTS uint64
}

func (e *events) kick(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// session is one MQTT connection: connect with the will, subscribe,
// (wait for the primary host,) births, then the data loop.
func (n *Node) session(ctx context.Context) error {
	bdSeq := n.bd.next()
	ev := &events{lost: make(chan struct{}), rebirth: make(chan struct{}, 1), state: make(chan struct{}, 1)}
	will := AppendPayload(nil, &Payload{Timestamp: nowMS(), HasTimestamp: true,
		Metrics: []Metric{{Name: MetricBdSeq, HasName: true, Datatype: TypeInt64, Value: Value{Kind: KindLong, U: bdSeq}}}})
	o := mqttopts.Options([]string{n.cfg.Broker}, n.cfg.ClientID, n.cfg.Username, n.cfg.Password, n.tlsConf)
	// One connection per session: a reconnect must carry a new bdSeq in a
	// new will, which paho's own reconnect cannot do.
	o.SetAutoReconnect(false).
		SetConnectRetry(false).
		SetBinaryWill(n.Topic("NDEATH", ""), will, 1, false)
	o.SetConnectionLostHandler(func(_ mqtt.Client, err error) {
		ev.once.Do(func() { ev.lostErr = err; close(ev.lost) })
	})
	c := mqtt.NewClient(o)
	tok := c.Connect()
	if !waitToken(ctx, tok, 15*time.Second) {
		c.Disconnect(0)
		return fmt.Errorf("sparkplug: connect %s: %w", n.cfg.Broker, orTimeout(tok.Error()))
	}
	defer c.Disconnect(250)
	log := n.log.With("bdSeq", bdSeq)
	// Subscribed before any birth (the spec's order): with auto-reconnect
	// off there is one connect per client, so this is the OnConnect point.
	subs := map[string]byte{
		n.Topic("NCMD", ""):  1,
		n.Topic("DCMD", "+"): 1,
	}
	if h := n.cfg.PrimaryHostID; h != "" {
		subs["spBv1.0/STATE/"+h] = 1
	}
	st := c.SubscribeMultiple(subs, func(_ mqtt.Client, m mqtt.Message) { n.onMessage(ev, m) })
	if !waitToken(ctx, st, 10*time.Second) {
		return fmt.Errorf("sparkplug: subscribe: %w", orTimeout(st.Error()))
	}
	log.Info("sparkplug: connected", "broker", n.cfg.Broker, "node", n.Topic("NBIRTH", ""))
	s := &sess{n: n, c: c, ev: ev, bdSeq: bdSeq, log: log, last: map[uint64]lastVal{}, dead: map[string]bool{}, health: map[string]*stats.Device{}}
	return s.run(ctx)
}

func orTimeout(err error) error {
	if err == nil {
		return errors.New("timed out")
	}
	return err
}

// waitToken waits for tok, ctx or limit; true when tok completed without error.
func waitToken(ctx context.Context, tok mqtt.Token, limit time.Duration) bool {
	t := time.NewTimer(limit)
	defer t.Stop()
	select {
	case <-tok.Done():
		return tok.Error() == nil
	case <-ctx.Done():
		return false
	case <-t.C:
		return false
	}
}

type lastVal struct {
	v float64
	s string // a string tag's text
	q ringstore.Quality
}

type pub struct {
	tok  mqtt.Token
	last uint64 // queue seq acknowledged when tok completes (0 = none)
}

// sess is the state of one session, owned by its loop.
type sess struct {
	n        *Node
	c        mqtt.Client
	ev       *events
	bdSeq    uint64
	log      *slog.Logger
	seq      uint64 // of the next message
	liveMark uint64 // queue samples up to here are historical
	last     map[uint64]lastVal
	dead     map[string]bool
	health   map[string]*stats.Device
	inflight []pub
	nodeLast map[uint64]Value
}

func (s *sess) nextSeq() uint64 {
	q := s.seq
	s.seq = (s.seq + 1) % 256
	return q
}

func (s *sess) publish(topic string, p *Payload, last uint64) {
	p.Timestamp, p.HasTimestamp = nowMS(), true
	p.Seq, p.HasSeq = s.nextSeq(), true
	// paho keeps the slice until written: a fresh one each time.
	tok := s.c.Publish(topic, 0, false, AppendPayload(nil, p))
	s.inflight = append(s.inflight, pub{tok: tok, last: last})
}

func (s *sess) hostOnline() bool {
	if s.n.cfg.PrimaryHostID == "" {
		return true
	}
	s.ev.mu.Lock()
	defer s.ev.mu.Unlock()
	return s.ev.online
}

func (s *sess) run(ctx context.Context) error {
	n := s.n
	// Wait for the primary host before any birth.
	for !s.hostOnline() {
		s.log.Info("sparkplug: waiting for the primary host", "host", n.cfg.PrimaryHostID)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-s.ev.lost:
			return fmt.Errorf("sparkplug: connection lost: %w", s.ev.lostErr)
		case <-s.ev.state:
		}
	}
	snap := s.firstValues(ctx)
	s.liveMark = snap.Seq
	s.births(snap, true)
	s.refreshHealth()
	after := n.cfg.Queue.Acked()
	check := time.NewTicker(n.cfg.CheckEvery)
	defer check.Stop()
	nodeData := time.NewTicker(n.cfg.NodeDataEvery)
	defer nodeData.Stop()
	var buf []ringstore.Sample
	for {
		// Settle written messages in order: the queue is acknowledged up
		// to the last sample of each.
		for len(s.inflight) > 0 && mqttopts.Done(s.inflight[0].tok) {
			f := s.inflight[0]
			if err := f.tok.Error(); err != nil {
				return fmt.Errorf("sparkplug: publish: %w", err)
			}
			if f.last != 0 {
				n.cfg.Queue.Ack(f.last)
			}
			s.inflight = s.inflight[1:]
		}
		select { // a long replay still hears a stop or a lost link
		case <-ctx.Done():
			s.sayDeath()
			return ctx.Err()
		case <-s.ev.lost:
			return fmt.Errorf("sparkplug: connection lost: %w", s.ev.lostErr)
		default:
		}
		wake := n.cfg.Queue.Wait()
		if len(s.inflight) < n.cfg.MaxInFlight {
			buf = n.cfg.Queue.PeekAfter(after, 500, buf[:0])
			if len(buf) > 0 {
				after = s.data(buf)
				continue
			}
		}
		var done <-chan struct{}
		if len(s.inflight) > 0 {
			done = s.inflight[0].tok.Done()
			wake = nil
		}
		select {
		case <-ctx.Done():
			s.sayDeath()
			return ctx.Err()
		case <-s.ev.lost:
			return fmt.Errorf("sparkplug: connection lost: %w", s.ev.lostErr)
		case <-s.ev.state:
			if !s.hostOnline() {
				s.log.Warn("sparkplug: primary host offline: NDEATH, disconnect, store until it is back", "host", n.cfg.PrimaryHostID)
				t := s.c.Publish(n.Topic("NDEATH", ""), 1, false, s.death())
				waitToken(ctx, t, 5*time.Second)
				// Acknowledge, in order, what paho wrote before the NDEATH.
				for _, f := range s.inflight {
					if !mqttopts.Done(f.tok) || f.tok.Error() != nil {
						break
					}
					if f.last != 0 {
						n.cfg.Queue.Ack(f.last)
					}
				}
				return errHostOffline
			}
		case <-s.ev.rebirth:
			s.births(n.cfg.Latest(), false)
		case <-check.C:
			if after >= s.liveMark {
				// Not while replaying: a DDEATH would precede the
				// historical DDATA of the device it declares dead.
				s.checkDevices()
			}
		case <-nodeData.C:
			s.nodeData()
		case <-wake:
		case <-done:
		}
	}
}

// sayDeath publishes NDEATH when the node stops: a clean disconnect sends
// no will.
func (s *sess) sayDeath() {
	waitToken(context.Background(), s.c.Publish(s.n.Topic("NDEATH", ""), 1, false, s.death()), time.Second)
}

// death is the NDEATH payload of the session (the will's, with a fresh timestamp).
func (s *sess) death() []byte {
	return AppendPayload(nil, &Payload{Timestamp: nowMS(), HasTimestamp: true,
		Metrics: []Metric{{Name: MetricBdSeq, HasName: true, Datatype: TypeInt64, Value: Value{Kind: KindLong, U: s.bdSeq}}}})
}

// doneToken is a completed token: a queue step that needed no message.
type doneToken struct{}

var closedCh = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

func (doneToken) Wait() bool { return true }

func (doneToken) WaitTimeout(time.Duration) bool { return true }

func (doneToken) Done() <-chan struct{} { return closedCh }

func (doneToken) Error() error { return nil }

var _ mqtt.Token = doneToken{}
