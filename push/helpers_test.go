package push

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"edgegw/internal/testenv"
	"edgegw/receiver"
	"edgegw/ringstore"
	"edgegw/spool"
	"edgegw/stats"

	mqtt "github.com/eclipse/paho.mqtt.golang"
)

// syncBuffer is the receiver's output, written by its handlers while the
// test reads it.
type syncBuffer struct{ testenv.Buffer }

// seqs parses the JSON lines written so far and returns their seqs in order.
func (s *syncBuffer) seqs(t *testing.T, gateway string) []uint64 {
	t.Helper()
	data := s.Bytes()
	var out []uint64
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		var smp ringstore.Sample
		var gw struct{ Gateway string }
		if err := json.Unmarshal(sc.Bytes(), &smp); err != nil {
			t.Fatalf("bad line %q: %v", sc.Text(), err)
		}
		if err := json.Unmarshal(sc.Bytes(), &gw); err != nil || gw.Gateway != gateway {
			t.Fatalf("line %q: gateway %q, want %q", sc.Text(), gw.Gateway, gateway)
		}
		out = append(out, smp.Seq)
	}
	return out
}

func testLogger(t *testing.T) *slog.Logger {
	if testing.Verbose() {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug})).With("test", t.Name())
	}
	return slog.New(slog.DiscardHandler)
}

// serveReceiver runs r until stop is called (or the test ends).
func serveReceiver(t *testing.T, r *receiver.Receiver) (addr net.Addr, stop func()) {
	t.Helper()
	addr, err := r.Listen()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Serve(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := testenv.Recv(t, done, 10*time.Second, "the receiver's Serve to return after cancel"); err != nil {
				t.Errorf("receiver: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return addr, stop
}

// gateway is a ring feeding a queue, and a producer of polls.
type gateway struct {
	ring *ringstore.Ring
	q    *spool.Queue
	t    testing.TB
}

func newGateway(t *testing.T, dir string) *gateway {
	t.Helper()
	seq, err := ringstore.OpenSequence(dir)
	if err != nil {
		t.Fatal(err)
	}
	q, err := spool.Open(spool.Config{Dir: dir, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	g := &gateway{ring: ringstore.NewRing(200, seq), q: q, t: t}
	if err := g.ring.Consume(q.Consumer("queue")); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = q.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		testenv.Closed(t, done, 10*time.Second, "the queue's Run to return after cancel")
		q.Close()
	})
	return g
}

// poll appends one poll of a 2-tag device.
func (g *gateway) poll(i int) {
	ts := time.Now().UnixMicro()
	dev := fmt.Sprintf("logger-%02d", i%4)
	_, _, _ = g.ring.Append([]ringstore.Sample{
		{Device: dev, Tag: "temperature", Value: 20 + float64(i%50)/10, TS: ts},
		{Device: dev, Tag: "humidity", Value: 40 + float64(i%30)/10, TS: ts},
	})
}

// producer appends polls every 10 ms (200 samples/s) while running; pause
// and resume it, stop it once. Bounded by max polls.
type producer struct {
	mu      sync.Mutex
	paused  bool
	stopped chan struct{}
	done    chan struct{}
	polls   int
	once    sync.Once
	g       *gateway
}

func startProducer(g *gateway, max int) *producer {
	p := &producer{stopped: make(chan struct{}), done: make(chan struct{}), g: g}
	go func() {
		defer close(p.done)
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for i := 0; i < max; {
			select {
			case <-p.stopped:
				return
			case <-tick.C:
			}
			p.mu.Lock()
			if !p.paused {
				g.poll(i)
				i++
				p.polls = i
			}
			p.mu.Unlock()
		}
	}()
	return p
}

func (p *producer) pause(b bool) { p.mu.Lock(); p.paused = b; p.mu.Unlock() }
func (p *producer) stop() {
	p.once.Do(func() { close(p.stopped) })
	p.finished(10 * time.Second)
}

// finished waits until the producer has ended (stopped, or its polls all
// appended), for at most limit.
func (p *producer) finished(limit time.Duration) {
	p.g.t.Helper()
	testenv.Closed(p.g.t, p.done, limit, "the producer to end")
}

// runPusher runs p until the test ends (or stop).
func runPusher(t *testing.T, p *Pusher) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("pusher: %v", err)
				}
			case <-time.After(10 * time.Second):
				t.Error("pusher.Run did not return within 10s")
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// waitFor is testenv.WaitFor: poll a condition with a deadline.
var waitFor = testenv.WaitFor

func path(st *stats.Upstream) string { return st.Snapshot().Path }

// subscribe connects a paho client to broker and calls fn for every message
// on topic (subscribed in OnConnect, so it survives broker restarts).
func subscribe(t *testing.T, broker, topic string, fn func(topic string, payload []byte, retained bool)) mqtt.Client {
	t.Helper()
	o := mqtt.NewClientOptions().AddBroker("tcp://" + broker).SetClientID(fmt.Sprintf("sub-%d", time.Now().UnixNano())).
		SetCleanSession(true).SetOrderMatters(true).SetConnectRetry(true).SetConnectRetryInterval(50 * time.Millisecond).
		SetMaxReconnectInterval(200 * time.Millisecond).SetWriteTimeout(5 * time.Second)
	subscribed := make(chan mqtt.Token, 1)
	o.SetOnConnectHandler(func(c mqtt.Client) {
		tok := c.Subscribe(topic, 1, func(_ mqtt.Client, m mqtt.Message) { fn(m.Topic(), m.Payload(), m.Retained()) })
		select {
		case subscribed <- tok:
		default:
		}
	})
	c := mqtt.NewClient(o)
	if tok := c.Connect(); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("subscriber connect: %v", tok.Error())
	}
	if tok := testenv.Recv(t, subscribed, 10*time.Second, "the subscriber's OnConnect"); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("subscribe %s: %v", topic, tok.Error())
	}
	t.Cleanup(func() { c.Disconnect(100) })
	return c
}
