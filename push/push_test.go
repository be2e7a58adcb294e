package push

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"edgegw/internal/testenv"
	"edgegw/lab/mqttbroker"
	"edgegw/receiver"
	"edgegw/ringstore"
	"edgegw/spool"
	"edgegw/stats"
	"edgegw/wire"

	"github.com/gorilla/websocket"
)

const gwID = "gw-test"

// loadedAckTimeout is the ack timeout of tests whose point is not the
// timeout itself: a receiver under -race on a loaded 2-core machine has
// acked later than 1 s, which ends the session (a reconnect, a resend, a
// path flip) that such a test counts as a fault. It is the product's
// default AckTimeout.
const loadedAckTimeout = 10 * time.Second

func wsConfig(addr string, token string) WSConfig {
	return WSConfig{URL: "ws://" + addr + "/ingest", Token: token, BatchWait: 20 * time.Millisecond, BatchMax: 100,
		AckTimeout: time.Second, PingInterval: 200 * time.Millisecond, ReconnectMin: 20 * time.Millisecond, ReconnectMax: 150 * time.Millisecond}
}

func checkExactlyOnce(t *testing.T, seqs []uint64, from, to uint64) {
	t.Helper()
	if uint64(len(seqs)) != to-from+1 {
		t.Fatalf("%d seqs, want %d (%d..%d)", len(seqs), to-from+1, from, to)
	}
	for i, s := range seqs {
		if s != from+uint64(i) {
			t.Fatalf("position %d: seq %d, want %d", i, s, from+uint64(i))
		}
	}
}

// (a) WebSocket up: every sample acknowledged, the queue drains to zero.
func TestWebSocketAllAcked(t *testing.T) {
	var out syncBuffer
	r := receiver.New(receiver.Config{Token: "s3cret", Out: &out, Logger: testLogger(t)})
	addr, _ := serveReceiver(t, r)
	g := newGateway(t, "")
	st := new(stats.Upstream)
	w := wsConfig(addr.String(), "s3cret")
	w.AckTimeout = loadedAckTimeout // a late ack's resend would be a duplicate at the receiver
	p, err := New(Config{GatewayID: gwID, WS: w, Queue: g.q, State: st, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	first := g.ring.Seq() + 1
	stopPusher := runPusher(t, p)
	prod := startProducer(g, 150) // 300 samples at 200/s
	prod.finished(30 * time.Second)
	last := g.ring.Seq()
	waitFor(t, 10*time.Second, "queue drained", func() bool { return g.q.Stats().Samples == 0 && r.Stats().Samples == last-first+1 })
	checkExactlyOnce(t, out.seqs(t, gwID), first, last)
	waitFor(t, 2*time.Second, "state published", func() bool { return st.Snapshot().SentWS == last-first+1 })
	stopPusher()
	s := st.Snapshot()
	if s.Path != stats.PathWebSocket || s.QueueSamples != 0 || s.SentMQTT != 0 {
		t.Fatalf("state: %+v", s)
	}
	if rs := r.Stats(); rs.Gaps != 0 || rs.Batches < 3 || rs.Duplicates != 0 {
		t.Fatalf("receiver: %+v", rs)
	}
}

// A wrong token is refused (401): the pusher stops dialling and says so.
func TestBadTokenRefused(t *testing.T) {
	r := receiver.New(receiver.Config{Token: "right", Logger: testLogger(t)})
	addr, _ := serveReceiver(t, r)
	g := newGateway(t, "")
	st := new(stats.Upstream)
	p, err := New(Config{GatewayID: gwID, WS: wsConfig(addr.String(), "wrong"), Queue: g.q, State: st, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	runPusher(t, p)
	g.poll(1)
	waitFor(t, 5*time.Second, "unauthorized", func() bool { return path(st) == stats.PathUnauthorized })
	refused := r.Stats().Refused
	if refused != 1 || r.Stats().Connections != 0 {
		t.Fatalf("receiver: %+v", r.Stats())
	}
	// No retry storm: a few backoff periods later still one refusal.
	deadline := time.Now().Add(300 * time.Millisecond)
	for time.Now().Before(deadline) {
		if r.Stats().Refused != 1 {
			t.Fatalf("pusher retried after 401: %+v", r.Stats())
		}
		time.Sleep(10 * time.Millisecond) // observing that nothing happens, bounded
	}
	if g.q.Stats().Samples != 2 {
		t.Fatalf("queue: %+v", g.q.Stats())
	}
	// A missing token is refused too, with 401 on the handshake.
	_, resp, err := websocket.DefaultDialer.Dial("ws://"+addr.String()+"/ingest", nil)
	if err == nil || resp == nil || resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("no token: err %v resp %v", err, resp)
	}
	resp.Body.Close()
}

func TestNewConfigErrors(t *testing.T) {
	q, _ := spool.Open(spool.Config{})
	for _, c := range []Config{
		{Queue: q, WS: WSConfig{URL: "ws://x"}},
		{GatewayID: "g", WS: WSConfig{URL: "ws://x"}},
		{GatewayID: "g", Queue: q},
		{GatewayID: "g", Queue: q, WS: WSConfig{URL: "http://x"}},
		{GatewayID: "g", Queue: q, MQTT: MQTTConfig{Broker: "tcp://x", Mode: "sometimes"}},
		{GatewayID: "g", Queue: q, WS: WSConfig{URL: "wss://x", CAFile: "/nonexistent"}},
	} {
		if _, err := New(c); err == nil || !strings.HasPrefix(err.Error(), "push: ") {
			t.Errorf("%+v: err %v", c, err)
		}
	}
}

// TestFailover: (a) WS up; (b) receiver down: MQTT takes over after
// FallbackAfter; (c) mosquitto down too: the queue grows; (d) both back:
// WS takes over. The union of what the receiver and an MQTT subscriber got
// holds every seq exactly once after dedup, in order per path, and the
// queue drains to zero.
func TestFailover(t *testing.T) {
	mosq := testenv.StartMosquitto(t)
	var wsOut, mqttOut syncBuffer
	r := receiver.New(receiver.Config{Token: "tok", Out: &wsOut, Logger: testLogger(t)})
	addr, stopR := serveReceiver(t, r)
	// The MQTT side of the union: a subscriber feeding a second receiver.
	viaMQTT := receiver.New(receiver.Config{Out: &mqttOut, Logger: testLogger(t)})
	var subMu sync.Mutex
	var subErr error
	prefix := "edgegw/" + gwID
	subscribe(t, mosq.Addr, prefix+"/batch", func(_ string, payload []byte, _ bool) {
		if _, err := viaMQTT.Ingest(payload); err != nil {
			subMu.Lock()
			subErr = err
			subMu.Unlock()
		}
	})

	g := newGateway(t, t.TempDir())
	st := new(stats.Upstream)
	p, err := New(Config{GatewayID: gwID, WS: wsConfig(addr.String(), "tok"),
		MQTT: MQTTConfig{Broker: "tcp://" + mosq.Addr, FallbackAfter: 300 * time.Millisecond, NoPerTagTopics: true,
			ReconnectMin: 50 * time.Millisecond, ReconnectMax: 200 * time.Millisecond},
		Queue: g.q, State: st, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	first := g.ring.Seq() + 1
	runPusher(t, p)
	prod := startProducer(g, 2000)
	defer prod.stop()

	// (a)
	waitFor(t, 5*time.Second, "(a) samples over websocket", func() bool {
		return path(st) == stats.PathWebSocket && r.Stats().Samples >= 60
	})
	// (b)
	stopR()
	downAt := time.Now()
	waitFor(t, 5*time.Second, "(b) mqtt takes over", func() bool { return path(st) == stats.PathMQTT })
	if d := time.Since(downAt); d < 300*time.Millisecond {
		t.Fatalf("fallback after %v, before FallbackAfter", d)
	}
	n := viaMQTT.Stats().Samples
	waitFor(t, 5*time.Second, "(b) samples over mqtt", func() bool { return viaMQTT.Stats().Samples >= n+60 })
	// Let MQTT deliver what it acked before killing the broker: a PUBACK
	// means the broker has it, not the subscriber.
	prod.pause(true)
	waitFor(t, 5*time.Second, "(b) mqtt drained", func() bool {
		return g.q.Stats().Samples == 0 && viaMQTT.Stats().Samples+r.Stats().Samples >= g.ring.Seq()-first+1
	})
	// (c)
	mosq.Stop()
	prod.pause(false)
	waitFor(t, 5*time.Second, "(c) buffering", func() bool { return path(st) == stats.PathBuffering })
	waitFor(t, 5*time.Second, "(c) queue grows", func() bool { return g.q.Stats().Samples >= 60 })
	// (d)
	if _, err := r.Listen(); err != nil { // same address
		t.Fatal(err)
	}
	serveReceiver(t, r)
	waitFor(t, 5*time.Second, "(d) websocket takes over", func() bool { return path(st) == stats.PathWebSocket })
	mosq.Restart(t)
	prod.stop()
	last := g.ring.Seq()
	waitFor(t, 10*time.Second, "(d) queue drained", func() bool { return g.q.Stats().Samples == 0 })

	wsSeqs, mqttSeqs := wsOut.seqs(t, gwID), mqttOut.seqs(t, gwID)
	union := map[uint64]int{}
	for _, path := range [][]uint64{wsSeqs, mqttSeqs} {
		for i, s := range path {
			if i > 0 && s <= path[i-1] {
				t.Fatalf("out of order within a path at %d: %d after %d", i, s, path[i-1])
			}
			union[s]++
		}
	}
	for s := first; s <= last; s++ {
		if union[s] == 0 {
			t.Fatalf("seq %d missing (ws %d samples, mqtt %d samples)", s, len(wsSeqs), len(mqttSeqs))
		}
	}
	if uint64(len(union)) != last-first+1 {
		t.Fatalf("union holds %d seqs, want %d", len(union), last-first+1)
	}
	both := 0
	for _, c := range union {
		if c > 1 {
			both++
		}
	}
	subMu.Lock()
	defer subMu.Unlock()
	if subErr != nil {
		t.Fatal(subErr)
	}
	s := st.Snapshot()
	t.Logf("samples %d: websocket %d, mqtt %d, on both paths %d; state %+v; queue %+v", last-first+1, len(wsSeqs), len(mqttSeqs), both, s, g.q.Stats())
	if s.SentMQTT == 0 || s.SentWS == 0 || s.Dropped != 0 {
		t.Fatalf("state: %+v", s)
	}
}

// MQTT only, per-tag retained topics and the retained status with its will.
func TestMQTTPerTagAndStatus(t *testing.T) {
	mosq := testenv.StartMosquitto(t)
	prefix := "site/gw"
	var mu sync.Mutex
	retained := map[string]string{}
	sub := subscribe(t, mosq.Addr, prefix+"/#", func(topic string, payload []byte, _ bool) {
		mu.Lock()
		retained[topic] = string(payload)
		mu.Unlock()
	})
	_ = sub
	g := newGateway(t, "")
	st := new(stats.Upstream)
	p, err := New(Config{GatewayID: gwID, MQTT: MQTTConfig{Broker: "tcp://" + mosq.Addr, TopicPrefix: prefix},
		WS: WSConfig{BatchWait: 20 * time.Millisecond}, Queue: g.q, State: st, Latest: g.ring.Snapshot, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	stop := runPusher(t, p)
	for i := 0; i < 8; i++ {
		g.poll(i)
	}
	get := func(topic string) string {
		mu.Lock()
		defer mu.Unlock()
		return retained[topic]
	}
	waitFor(t, 5*time.Second, "per-tag topics, status and batches", func() bool {
		return get(prefix+"/status") == "online" && get(prefix+"/logger-03/humidity") != "" && g.q.Stats().Samples == 0
	})
	var v struct {
		Value   float64 `json:"value"`
		Quality string  `json:"quality"`
		TS      int64   `json:"ts"`
		Seq     uint64  `json:"seq"`
	}
	snap := g.ring.Snapshot()
	var want ringstore.Sample
	for _, s := range snap.Latest {
		if s.Device == "logger-03" && s.Tag == "humidity" {
			want = s
		}
	}
	waitFor(t, 5*time.Second, "latest value", func() bool {
		return json.Unmarshal([]byte(get(prefix+"/logger-03/humidity")), &v) == nil && v.Seq == want.Seq
	})
	if v.Value != want.Value || v.Quality != "good" || v.TS != want.TS {
		t.Fatalf("per-tag payload %q, want %+v", get(prefix+"/logger-03/humidity"), want)
	}
	if s := st.Snapshot(); s.Path != stats.PathMQTT || s.SentMQTT != 16 {
		t.Fatalf("state: %+v", s)
	}
	stop()
	waitFor(t, 5*time.Second, "status offline", func() bool { return get(prefix+"/status") == "offline" })
}

// The embedded broker carries the batches of an MQTT-only pusher.
func TestEmbeddedBroker(t *testing.T) {
	b := mqttbroker.New(mqttbroker.Config{Logger: testLogger(t)})
	addr, err := b.Listen()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- b.Run(ctx) }()
	defer func() {
		cancel()
		if err := testenv.Recv(t, done, 10*time.Second, "the broker's Run to return after cancel"); err != nil {
			t.Error(err)
		}
	}()
	var out syncBuffer
	rcv := receiver.New(receiver.Config{Out: &out})
	subscribe(t, addr.String(), "edgegw/"+gwID+"/batch", func(_ string, payload []byte, _ bool) { _, _ = rcv.Ingest(payload) })
	g := newGateway(t, "")
	p, err := New(Config{GatewayID: gwID, MQTT: MQTTConfig{Broker: "tcp://" + addr.String(), NoPerTagTopics: true},
		WS: WSConfig{BatchWait: 10 * time.Millisecond}, Queue: g.q, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	stop := runPusher(t, p)
	first := g.ring.Seq() + 1
	for i := 0; i < 50; i++ {
		g.poll(i)
	}
	waitFor(t, 5*time.Second, "batches via the embedded broker", func() bool { return rcv.Stats().Samples == 100 })
	checkExactlyOnce(t, out.seqs(t, gwID), first, first+99)
	stop()
}

// A gateway restart mid-outage: the queue is reopened from disk and the new
// pusher resends everything unacknowledged, from the oldest.
func TestRestartResends(t *testing.T) {
	dir := t.TempDir()
	var out syncBuffer
	r := receiver.New(receiver.Config{Out: &out, Logger: testLogger(t)})
	addr, err := r.Listen() // bound, not served yet: the gateway cannot get through
	if err != nil {
		t.Fatal(err)
	}
	open := func() (*ringstore.Ring, *spool.Queue, func()) {
		seq, err := ringstore.OpenSequence(dir)
		if err != nil {
			t.Fatal(err)
		}
		q, err := spool.Open(spool.Config{Dir: dir})
		if err != nil {
			t.Fatal(err)
		}
		ring := ringstore.NewRing(10, seq)
		if err := ring.Consume(q.Consumer("queue")); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { defer close(done); _ = q.Run(ctx) }()
		return ring, q, func() {
			cancel()
			testenv.Closed(t, done, 10*time.Second, "the queue's Run to return after cancel")
			q.Close()
		}
	}
	ring, q, closeQ := open()
	p, err := New(Config{GatewayID: gwID, WS: wsConfig(addr.String(), ""), Queue: q})
	if err != nil {
		t.Fatal(err)
	}
	stop := runPusher(t, p)
	first := ring.Seq() + 1
	for i := 0; i < 50; i++ {
		ring.Append([]ringstore.Sample{{Device: "d", Tag: "a", Value: float64(i)}, {Device: "d", Tag: "b", Value: 1}})
	}
	last := ring.Seq()
	stop()
	closeQ()

	_, q, closeQ = open()
	defer closeQ()
	if st := q.Stats(); st.Samples != 100 {
		t.Fatalf("reopened queue: %+v", st)
	}
	serveReceiver(t, r)
	p, err = New(Config{GatewayID: gwID, WS: wsConfig(addr.String(), ""), Queue: q})
	if err != nil {
		t.Fatal(err)
	}
	runPusher(t, p)
	waitFor(t, 5*time.Second, "resent after restart", func() bool { return q.Stats().Samples == 0 })
	checkExactlyOnce(t, out.seqs(t, gwID), first, last)
}

// A receiver that reads batches and never acks: after AckTimeout the
// pusher drops the connection, reconnects and resends from the oldest
// unacknowledged sample; nothing leaves the queue.
func TestWebSocketNoAckResends(t *testing.T) {
	var mu sync.Mutex
	var firsts []uint64
	var conns sync.WaitGroup
	up := websocket.Upgrader{}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		c, err := up.Upgrade(w, req, nil)
		if err != nil {
			return
		}
		conns.Add(1)
		defer conns.Done()
		defer c.Close()
		for {
			_, msg, err := c.ReadMessage()
			if err != nil {
				return
			}
			f, err := wire.ParseBatch(msg, wire.DefaultMaxBatch)
			if err != nil {
				t.Errorf("bad batch: %v", err)
				return
			}
			mu.Lock()
			firsts = append(firsts, f.First)
			mu.Unlock()
		}
	})}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan struct{})
	go func() { defer close(served); _ = srv.Serve(ln) }()
	defer func() {
		srv.Close()
		testenv.Closed(t, served, 10*time.Second, "the upstream server's Serve to return")
		testenv.Wait(t, 10*time.Second, "the upstream server's connections to end", conns.Wait)
	}()

	g := newGateway(t, "")
	st := new(stats.Upstream)
	cfg := wsConfig(ln.Addr().String(), "")
	cfg.AckTimeout = 200 * time.Millisecond
	cfg.BatchMax = 5
	p, err := New(Config{GatewayID: gwID, WS: cfg, Queue: g.q, State: st, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	first := g.ring.Seq() + 1
	stop := runPusher(t, p)
	for i := 0; i < 10; i++ {
		g.poll(i)
	}
	waitFor(t, 5*time.Second, "three connections each starting at the first sample", func() bool {
		mu.Lock()
		defer mu.Unlock()
		n := 0
		for _, f := range firsts {
			if f == first {
				n++
			}
		}
		return n >= 3
	})
	stop()
	if qs := g.q.Stats(); qs.Samples != 20 {
		t.Fatalf("queue: %+v", qs)
	}
	if s := st.Snapshot(); s.Reconnects < 2 || s.SentWS != 0 || s.WSSessionsFailed < 2 || s.Path != stats.PathBuffering {
		t.Fatalf("state: %+v", s)
	}
	mu.Lock()
	defer mu.Unlock()
	// never acked, a connection holds one batch (5 samples) of the stream,
	// and the next one starts from the same first sample
	for i, f := range firsts {
		if f != first {
			t.Fatalf("batch %d started at %d, want %d (all: %v)", i, f, first, firsts)
		}
	}
}

// A batch never mixes epochs and carries the restart skips it crosses; the
// receiver takes a skip as seen (no gap) and a new epoch as no gap.
func TestEpochBatchesAndReceiverState(t *testing.T) {
	q, _ := spool.Open(spool.Config{})
	const e1, e2 = 0x1111222233334444, 0x5555666677778888
	mk := func(epoch, first uint64, n int) []ringstore.Sample {
		b := make([]ringstore.Sample, n)
		for i := range b {
			b[i] = ringstore.Sample{Seq: first + uint64(i), Epoch: epoch, Device: "d", Tag: fmt.Sprint("t", i), Value: 1, TS: 1}
		}
		return b
	}
	q.Append(mk(e1, 1, 3))
	q.Resume(e1, 1000, true) // a restart: 4..999 never used
	q.Append(mk(e1, 1000, 3))
	q.Append(mk(e2, 1003, 2)) // a new epoch (the disk failed at the block's end)
	bt := batcher{max: 100}
	now := time.Now()
	b := bt.next(q, 0, now)
	if len(b) != 6 || b[5].Seq != 1002 {
		t.Fatalf("first batch %v: want seqs 1..3, 1000..1002 (one epoch, due at once)", b)
	}
	if len(bt.skips) != 1 || bt.skips[0].First != 4 || bt.skips[0].Last != 999 {
		t.Fatalf("skips %v", bt.skips)
	}
	f1 := wire.AppendBatch(nil, []byte(`"gw"`), b, false, skipRanges(bt.skips))
	if !strings.Contains(string(f1), `"v":2,"gateway":"gw","epoch":"1111222233334444","first":1,"last":1002,"skip":[[4,999]],`) {
		t.Fatalf("frame %s", f1)
	}
	f2 := wire.AppendBatch(nil, []byte(`"gw"`), bt.next(q, 1002, now), false, skipRanges(bt.skips))

	var out syncBuffer
	r := receiver.New(receiver.Config{Out: &out})
	for _, f := range [][]byte{f1, f1, f2} {
		if _, err := r.Ingest(f); err != nil {
			t.Fatal(err)
		}
	}
	if st := r.Stats(); st.Samples != 8 || st.Duplicates != 6 || st.Gaps != 0 || st.Epochs != 2 {
		t.Fatalf("stats %+v", st)
	}
	if !strings.Contains(out.String(), `{"gateway":"gw","epoch":"5555666677778888","seq":1003,`) {
		t.Fatalf("output %s", out.String())
	}
}

// Drops at the bound of a new epoch's first samples travel as a loss
// range with the batch that crosses them; the receiver reports them
// (counted, apart from gaps), not a silent start of the epoch.
func TestLossRangesInBatches(t *testing.T) {
	q, _ := spool.Open(spool.Config{MaxBytes: 2048})
	const e = 0x1111222233334444
	for s := uint64(1); s <= 200; s += 4 {
		b := make([]ringstore.Sample, 4)
		for i := range b {
			b[i] = ringstore.Sample{Seq: s + uint64(i), Epoch: e, Device: "d", Tag: fmt.Sprint("t", i), Value: 1, TS: 1}
		}
		q.Append(b)
	}
	dropped := q.Stats().Dropped
	bt := batcher{max: 1000}
	b := bt.next(q, 0, time.Now())
	if dropped == 0 || len(b) == 0 || b[0].Seq != dropped+1 {
		t.Fatalf("dropped %d, batch from %v", dropped, b[:min(1, len(b))])
	}
	want := wire.Loss{Epoch: "1111222233334444", First: 1, Last: dropped, Reason: wire.LossFull}
	if len(bt.loss) != 1 || bt.loss[0] != want {
		t.Fatalf("loss %+v, want %+v", bt.loss, want)
	}
	r := receiver.New(receiver.Config{})
	if _, err := r.Ingest(wire.AppendBatchLoss(nil, []byte(`"gw"`), b, false, nil, bt.loss)); err != nil {
		t.Fatal(err)
	}
	if st := r.Stats(); st.Losses != 1 || st.LostSamples != dropped || st.Gaps != 0 || st.Samples != uint64(len(b)) {
		t.Fatalf("receiver stats %+v (dropped %d)", st, dropped)
	}
}
