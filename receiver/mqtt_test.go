package receiver

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"edgegw/internal/testenv"
	"edgegw/ringstore"
	"edgegw/wire"

	mqtt "github.com/eclipse/paho.mqtt.golang"
)

// gwBatch is a frame of gateway gw, seqs from..to of epoch 1.
func gwBatch(gw string, from, to uint64) []byte {
	var s []ringstore.Sample
	for i := from; i <= to; i++ {
		s = append(s, ringstore.Sample{Seq: i, Epoch: 1, Device: "d", Tag: "t", Value: float64(i), TS: int64(i)})
	}
	return wire.AppendBatch(nil, []byte(`"`+gw+`"`), s, false, nil)
}

// publisher is a paho (3.1.1) client publishing QoS 1 as a gateway does.
func publisher(t *testing.T, addr string) mqtt.Client {
	t.Helper()
	c := mqtt.NewClient(mqtt.NewClientOptions().AddBroker("tcp://" + addr).SetClientID("test-gateway").
		SetOrderMatters(false).SetWriteTimeout(5 * time.Second))
	if tok := c.Connect(); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("publisher connect: %v", tok.Error())
	}
	t.Cleanup(func() { c.Disconnect(100) })
	return c
}

func publish(t *testing.T, c mqtt.Client, topic string, payload []byte) {
	t.Helper()
	if tok := c.Publish(topic, 1, false, payload); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("publish %s: %v", topic, tok.Error())
	}
}

// runIngest runs m until the test ends.
func runIngest(t *testing.T, m *MQTTIngest) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := testenv.Recv(t, done, 10*time.Second, "the MQTT ingest's Run to return"); err != nil {
			t.Errorf("run: %v", err)
		}
	})
}

// countLines counts JSON lines per (gateway, seq) written to an Out.
type countLines struct {
	mu   sync.Mutex
	seen map[string]int
	n    int
}

func (c *countLines) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.seen == nil {
		c.seen = map[string]int{}
	}
	for _, l := range strings.Split(strings.TrimSpace(string(p)), "\n") {
		var gw, seq string
		for _, f := range strings.Split(strings.Trim(l, "{}"), ",") {
			k, v, _ := strings.Cut(f, ":")
			switch k {
			case `"gateway"`:
				gw = v
			case `"seq"`:
				seq = v
			}
		}
		c.seen[gw+"/"+seq]++
		c.n++
	}
	return len(p), nil
}

// Two receivers in one share group split the batch topic of two gateways
// between them (mosquitto 2, MQTT 5 shared subscription): every batch is
// stored exactly once across the two, and each took some.
func TestMQTTSharedSubscriptionSplits(t *testing.T) {
	mosq := testenv.StartMosquitto(t)
	outs := []*countLines{{}, {}}
	var ms []*MQTTIngest
	for i := range 2 {
		r := New(Config{Out: outs[i], Logger: logger(t)})
		m, err := NewMQTT(r, MQTTConfig{Brokers: []string{"tcp://" + mosq.Addr}, Group: "g1", Prefix: "edgegw",
			ClientID: fmt.Sprintf("recv-%d", i), Logger: logger(t)})
		if err != nil {
			t.Fatal(err)
		}
		if m.Topic() != "$share/g1/edgegw/+/batch" {
			t.Fatalf("topic %q", m.Topic())
		}
		runIngest(t, m)
		ms = append(ms, m)
	}
	pub := publisher(t, mosq.Addr)
	// Subscriptions are made after the connect: probe until both take batches.
	seq := uint64(0)
	testenv.WaitFor(t, 10*time.Second, "both receivers take batches", func() bool {
		seq++
		publish(t, pub, "edgegw/probe/batch", gwBatch("probe", seq, seq))
		return ms[0].Stats().Batches > 0 && ms[1].Stats().Batches > 0
	})
	const batches, per = 200, 10
	for i := range batches {
		gw := []string{"gw-a", "gw-b"}[i%2]
		from := uint64(i/2*per + 1)
		publish(t, pub, "edgegw/"+gw+"/batch", gwBatch(gw, from, from+per-1))
	}
	// count is the lines of gw-a and gw-b each receiver wrote, and the
	// times each (gateway, seq) was written across both.
	count := func() (each [2]int, seen map[string]int) {
		seen = map[string]int{}
		for i, o := range outs {
			o.mu.Lock()
			for k, n := range o.seen {
				if !strings.HasPrefix(k, `"probe"`) {
					seen[k] += n
					each[i] += n
				}
			}
			o.mu.Unlock()
		}
		return each, seen
	}
	testenv.WaitFor(t, 20*time.Second, "every batch stored", func() bool {
		each, _ := count()
		return each[0]+each[1] >= batches*per
	})
	each, seen := count()
	for _, gw := range []string{"gw-a", "gw-b"} {
		for s := 1; s <= batches/2*per; s++ {
			if n := seen[fmt.Sprintf("%q/%d", gw, s)]; n != 1 {
				t.Fatalf("%s seq %d stored %d times", gw, s, n)
			}
		}
	}
	t.Logf("receiver 0 stored %d samples, receiver 1 %d", each[0], each[1])
	if each[0] == 0 || each[1] == 0 || len(seen) != batches*per {
		t.Fatalf("split %d + %d of %d keys: want both > 0", each[0], each[1], len(seen))
	}
}

// failingOut fails its first n writes (the store is down), then writes.
type failingOut struct {
	fails atomic.Int32
	countLines
}

func (f *failingOut) Write(p []byte) (int, error) {
	if f.fails.Add(-1) >= 0 {
		return 0, errors.New("disk full")
	}
	return f.countLines.Write(p)
}

// While Ingest fails, the batch is retried and not acknowledged, and
// nothing after it is taken; once the store works again each batch is
// stored once. A payload that is no batch is counted and dropped.
func TestMQTTIngestRetriesUntilStored(t *testing.T) {
	mosq := testenv.StartMosquitto(t)
	out := &failingOut{}
	out.fails.Store(3)
	r := New(Config{Out: out, Logger: logger(t)})
	m, err := NewMQTT(r, MQTTConfig{Brokers: []string{"tcp://" + mosq.Addr}, ClientID: "recv-retry", Logger: logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	runIngest(t, m)
	pub := publisher(t, mosq.Addr)
	testenv.WaitFor(t, 10*time.Second, "subscribed (a probe stored)", func() bool {
		publish(t, pub, "edgegw/gw-a/batch", gwBatch("gw-a", 1, 1)) // the same batch: stored once
		return r.Stats().Samples == 1
	})
	if st := m.Stats(); st.Retries < 3 {
		t.Fatalf("stats %+v: want the 3 failed writes retried", st)
	}
	publish(t, pub, "edgegw/gw-a/batch", []byte("not json"))
	publish(t, pub, "edgegw/gw-a/batch", gwBatch("gw-a", 2, 5))
	testenv.WaitFor(t, 10*time.Second, "batch after the bad payload stored", func() bool { return r.Stats().Samples == 5 })
	if st := m.Stats(); st.Bad != 1 {
		t.Fatalf("stats %+v: want 1 bad payload", st)
	}
	out.mu.Lock()
	defer out.mu.Unlock()
	if out.n != 5 {
		t.Fatalf("%d lines, want 5", out.n)
	}
}

func TestNewMQTTRefuses(t *testing.T) {
	r := New(Config{})
	for _, c := range []MQTTConfig{{}, {Brokers: []string{"tcp://h:1883"}, Group: "a/b"}, {Brokers: []string{"tcp://h:1883"}, Prefix: "x/#"}, {Brokers: []string{"nohost"}}} {
		if _, err := NewMQTT(r, c); err == nil {
			t.Errorf("%+v: no error", c)
		}
	}
}
