package sparkplug

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"

	"edgegw/internal/testenv"
	"edgegw/ringstore"
	"edgegw/spool"
	"edgegw/stats"

	"edgegw/tagtype"
)

type gotMsg struct {
	topic string
	p     Payload
}

// sub is a plain MQTT subscriber on spBv1.0/# decoding with this package.
type sub struct {
	t    *testing.T
	c    mqtt.Client
	mu   sync.Mutex
	msgs []gotMsg
}

func subscribe(t *testing.T, addr string) *sub {
	t.Helper()
	s := &sub{t: t}
	c := mqtt.NewClient(mqtt.NewClientOptions().AddBroker("tcp://" + addr).SetClientID("node-test-sub"))
	if tok := c.Connect(); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("connect: %v", tok.Error())
	}
	s.c = c
	tok := c.Subscribe("spBv1.0/#", 1, func(_ mqtt.Client, m mqtt.Message) {
		p, err := DecodePayload(m.Payload())
		if err != nil {
			t.Errorf("%s: %v", m.Topic(), err)
		}
		s.mu.Lock()
		s.msgs = append(s.msgs, gotMsg{m.Topic(), p})
		s.mu.Unlock()
	})
	if !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("subscribe: %v", tok.Error())
	}
	t.Cleanup(func() { c.Disconnect(100) })
	return s
}

func (s *sub) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.msgs)
}

// wait returns the first message at or after from on a topic ending in suffix.
func (s *sub) wait(from int, suffix string, match func(*Payload) bool) gotMsg {
	s.t.Helper()
	var got gotMsg
	testenv.WaitFor(s.t, 20*time.Second, suffix, func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		for i := from; i < len(s.msgs); i++ {
			if strings.HasSuffix(s.msgs[i].topic, suffix) && (match == nil || match(&s.msgs[i].p)) {
				got = s.msgs[i]
				return true
			}
		}
		return false
	})
	return got
}

func (s *sub) publish(topic string, p *Payload) {
	if tok := s.c.Publish(topic, 0, false, AppendPayload(nil, p)); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		s.t.Fatalf("publish %s: %v", topic, tok.Error())
	}
}

type recWriter struct {
	mu  sync.Mutex
	got []string
}

func (w *recWriter) Write(_ context.Context, device, tag string, value float64, _ string) (float64, float64, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.got = append(w.got, device+"/"+tag+"="+strconv.FormatFloat(value, 'g', -1, 64))
	return value, value, nil
}

func (w *recWriter) writes() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]string(nil), w.got...)
}

func metricByAlias(p *Payload, alias uint64) *Metric {
	for i := range p.Metrics {
		if p.Metrics[i].HasAlias && p.Metrics[i].Alias == alias {
			return &p.Metrics[i]
		}
	}
	return nil
}

// The node against a real mosquitto, read with this package's decoder:
// births with current values, DDATA by alias with report by exception and
// is_null plus Quality for a timeout, samples of an unknown device
// skipped, DDEATH/DBIRTH from the health record, DCMD by alias through the
// Writer, unknown commands refused, and NDEATH when it stops.
func TestNodeSession(t *testing.T) {
	mosq := testenv.StartMosquitto(t)
	s := subscribe(t, mosq.Addr)
	seq, err := ringstore.OpenSequence("")
	if err != nil {
		t.Fatal(err)
	}
	ring := ringstore.NewRing(1000, seq)
	q, err := spool.Open(spool.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if err := ring.Consume(q.Consumer("queue")); err != nil {
		t.Fatal(err)
	}
	h1, h2 := new(stats.Device), new(stats.Device)
	entries := []stats.Entry{{Info: stats.Info{Name: "d1"}, Stats: h1}, {Info: stats.Info{Name: "d2"}, Stats: h2}}
	now := time.Now()
	app := func(dev, tag string, v float64, q ringstore.Quality, isBool bool) {
		if _, _, err := ring.Append([]ringstore.Sample{{Device: dev, Tag: tag, Value: v, Quality: q, Bool: isBool, TS: time.Now().UnixMicro()}}); err != nil {
			t.Fatal(err)
		}
	}
	app("d1", "t", 5, ringstore.Good, false)
	app("d1", "c", 1, ringstore.Good, true)
	app("d2", "x", 2.5, ringstore.Good, false)
	h1.LastGoodUS.Store(now.UnixMicro())
	h2.LastGoodUS.Store(now.UnixMicro())
	w := &recWriter{}
	dir := t.TempDir()
	n, err := New(Config{
		GroupID: "g", NodeID: "n", Writes: true, Broker: "tcp://" + mosq.Addr, DataDir: dir,
		Devices: []Device{
			{Name: "d1", Interval: time.Hour, Tags: []Tag{{Name: "t", Type: tagtype.Int16, Unit: "V"}, {Name: "c", Type: tagtype.Bool, Writable: true}}},
			{Name: "d2", Interval: time.Hour, Tags: []Tag{{Name: "x", Type: tagtype.Float64}}},
		},
		Queue: q, Latest: ring.Snapshot, Stats: func() []stats.Entry { return entries }, Writer: w,
		Version: "test", CheckEvery: 10 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- n.Run(ctx) }()
	defer func() {
		cancel()
		testenv.Recv(t, done, 10*time.Second, "the node's Run to return after cancel")
	}()

	nb := s.wait(0, "/NBIRTH/n", nil)
	if nb.p.Metrics[0].Name != MetricBdSeq || nb.p.Metrics[0].Value.U != 0 || nb.p.Seq != 0 {
		t.Fatalf("NBIRTH %+v", nb.p)
	}
	db := s.wait(0, "/DBIRTH/n/d1", nil)
	if len(db.p.Metrics) != 2 || db.p.Metrics[0].Name != "t" || db.p.Metrics[0].Datatype != TypeInt16 ||
		db.p.Metrics[0].Value.U != 5 || db.p.Metrics[0].Props[0].Value.S != "V" || !db.p.Metrics[1].Value.B {
		t.Fatalf("DBIRTH d1 %+v", db.p)
	}
	aT, aC := db.p.Metrics[0].Alias, db.p.Metrics[1].Alias
	s.wait(0, "/DBIRTH/n/d2", func(p *Payload) bool { return p.Metrics[0].Value.F64 == 2.5 })

	// Unknown device, unchanged value, then a change: only the change goes
	// out. The three samples queued before the births go out as
	// historical DDATA, maybe after the mark on a busy machine: the first
	// live DDATA is the one that counts.
	mark := s.count()
	app("d9", "t", 1, ringstore.Good, false)
	app("d1", "t", 5, ringstore.Good, false)
	app("d1", "t", 6, ringstore.Good, false)
	live := func(p *Payload) bool { return len(p.Metrics) > 0 && !p.Metrics[0].IsHistorical }
	dd := s.wait(mark, "/DDATA/n/d1", live)
	if m := metricByAlias(&dd.p, aT); m == nil || m.Value.U != 6 || m.HasName || !m.HasTimestamp || m.IsHistorical {
		t.Fatalf("first DDATA after the births: %+v, want t=6 by alias", dd.p)
	}
	if n.unknown.Load() != 1 {
		t.Fatalf("unknown samples %d, want 1", n.unknown.Load())
	}
	// A timeout: is_null with the Quality property.
	mark = s.count()
	app("d1", "t", 0, ringstore.Timeout, false)
	dd = s.wait(mark, "/DDATA/n/d1", nil)
	if m := metricByAlias(&dd.p, aT); m == nil || !m.IsNull || len(m.Props) != 1 || m.Props[0].Key != "Quality" || m.Props[0].Value.U != QualityCommFailure {
		t.Fatalf("timeout DDATA %+v", dd.p)
	}

	// d2 demoted: DDEATH; answering again: DBIRTH.
	mark = s.count()
	h2.Demoted.Store(true)
	s.wait(mark, "/DDEATH/n/d2", nil)
	mark = s.count()
	h2.Demoted.Store(false)
	s.wait(mark, "/DBIRTH/n/d2", nil)

	// DCMD by alias (coil to false) goes to the Writer; an unknown alias is refused.
	s.publish("spBv1.0/g/DCMD/n/d1", &Payload{Timestamp: 1, HasTimestamp: true, Metrics: []Metric{
		{Alias: aC, HasAlias: true, Value: Value{Kind: KindBool, B: false}},
		{Alias: 999, HasAlias: true, Value: Value{Kind: KindBool, B: true}},
	}})
	testenv.WaitFor(t, 20*time.Second, "the DCMD write", func() bool { return len(w.writes()) == 1 })
	if got := w.writes()[0]; got != "d1/c=0" {
		t.Fatalf("write %q, want d1/c=0", got)
	}
	testenv.WaitFor(t, 20*time.Second, "the refusal", func() bool { return n.Refused() == 1 })

	// Stopping publishes NDEATH with the session's bdSeq.
	mark = s.count()
	cancel()
	if err := testenv.Recv(t, done, 10*time.Second, "the node's Run to return after cancel"); err != nil {
		t.Fatalf("Run: %v", err)
	}
	done <- nil // for the deferred receive
	nd := s.wait(mark, "/NDEATH/n", nil)
	if nd.p.Metrics[0].Name != MetricBdSeq || nd.p.Metrics[0].Value.U != 0 || nd.p.HasSeq {
		t.Fatalf("NDEATH %+v", nd.p)
	}
}
