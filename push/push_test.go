package push

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"edgegw/internal/testenv"
	"edgegw/lab/mqttbroker"
	"edgegw/ringstore"
	"edgegw/spool"
	"edgegw/stats"

	"github.com/gorilla/websocket"
)

const gwID = "gw-test"

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
	r := NewReceiver(ReceiverConfig{Token: "s3cret", Out: &out, Logger: testLogger(t)})
	addr, _ := serveReceiver(t, r)
	g := newGateway(t, "")
	st := new(stats.Upstream)
	p, err := New(Config{GatewayID: gwID, WS: wsConfig(addr.String(), "s3cret"), Queue: g.q, State: st, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	first := g.ring.Seq() + 1
	stopPusher := runPusher(t, p)
	prod := startProducer(g, 150) // 300 samples at 200/s
	<-prod.done
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
	r := NewReceiver(ReceiverConfig{Token: "right", Logger: testLogger(t)})
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

// Duplicate and overlapping batches are acked but not written twice.
func TestReceiverDuplicates(t *testing.T) {
	var out syncBuffer
	r := NewReceiver(ReceiverConfig{Out: &out, Logger: testLogger(t)})
	addr, _ := serveReceiver(t, r)
	c, _, err := websocket.DefaultDialer.Dial("ws://"+addr.String()+"/ingest", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	mk := func(from, to uint64) []byte {
		var s []ringstore.Sample
		for i := from; i <= to; i++ {
			s = append(s, ringstore.Sample{Seq: i, Device: "d", Tag: "t", Value: float64(i), TS: int64(i)})
		}
		return appendBatch(nil, []byte(`"`+gwID+`"`), s)
	}
	send := func(frame []byte, wantAck uint64) {
		t.Helper()
		if err := c.WriteMessage(websocket.TextMessage, frame); err != nil {
			t.Fatal(err)
		}
		_, msg, err := c.ReadMessage()
		if err != nil {
			t.Fatal(err)
		}
		if last, err := parseAck(msg); err != nil || last != wantAck {
			t.Fatalf("ack %q: %d %v, want %d", msg, last, err, wantAck)
		}
	}
	send(mk(10, 19), 19)
	send(mk(10, 19), 19) // the same batch again (a resend after a lost ack)
	send(mk(15, 24), 24) // overlapping
	send(mk(30, 31), 31) // a gap 25..29
	send(mk(25, 29), 29) // filled late (the other path)
	send(mk(10, 31), 31) // all of it again
	var want []uint64
	for i := uint64(10); i <= 24; i++ {
		want = append(want, i)
	}
	want = append(want, 30, 31, 25, 26, 27, 28, 29)
	got := out.seqs(t, gwID)
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("written %v, want %v", got, want)
	}
	rs := r.Stats()
	if rs.Samples != 22 || rs.Duplicates != 10+5+22 || rs.Batches != 6 || rs.Gaps != 1 || rs.GapSamples != 5 {
		t.Fatalf("stats: %+v", rs)
	}
	// A malformed frame closes the connection and is counted.
	_ = c.WriteMessage(websocket.TextMessage, []byte(`{"type":"batch","gateway":"x","first":2,"last":1,"samples":[]}`))
	if _, _, err := c.ReadMessage(); err == nil {
		t.Fatal("bad frame: connection still open")
	}
	if r.Stats().BadFrames != 1 {
		t.Fatalf("bad frames: %+v", r.Stats())
	}
}

func TestDedupCompaction(t *testing.T) {
	d := &dedup{max: 3}
	steps := []struct {
		seq      uint64
		skipFrom uint64 // > 0: skip(skipFrom, seq) instead of add(seq)
		new      bool
		gap      seqRange
		hwm      uint64
		held     int
	}{
		{seq: 100, new: true, hwm: 100},
		{seq: 101, new: true, hwm: 101},
		{seq: 101, hwm: 101},
		{seq: 105, new: true, gap: seqRange{102, 104}, hwm: 101, held: 1},
		{seq: 107, new: true, gap: seqRange{106, 106}, hwm: 101, held: 2},
		{seq: 103, new: true, hwm: 101, held: 3},
		{seq: 108, new: true, hwm: 101, held: 3}, // joins 107's range
		{seq: 109, new: true, hwm: 101, held: 3},
		{seq: 111, new: true, gap: seqRange{110, 110}, hwm: 103, held: 3}, // over max: the hole 102 is given up, 103 absorbed
		{seq: 102, hwm: 103, held: 3},
		{seq: 104, new: true, hwm: 105, held: 2}, // fills a hole: 105 absorbed
		{seq: 106, new: true, hwm: 109, held: 1},
		{seq: 108, hwm: 109, held: 1},
		{skipFrom: 112, seq: 200, hwm: 109, held: 1},                          // a restart's skip right after the top: no gap
		{seq: 201, new: true, hwm: 109, held: 1},                              // the next run's first sample: no gap
		{seq: 150, hwm: 109, held: 1},                                         // inside the skip: seen
		{skipFrom: 300, seq: 400, gap: seqRange{202, 299}, hwm: 109, held: 2}, // samples before a skip missing: a gap
		{seq: 110, new: true, hwm: 201, held: 1},
	}
	for i, s := range steps {
		var isNew bool
		var gap seqRange
		if s.skipFrom > 0 {
			gap = d.skip(s.skipFrom, s.seq)
		} else {
			isNew, gap = d.add(s.seq)
		}
		if isNew != s.new || gap != s.gap {
			t.Fatalf("step %d (seq %d): new %v gap %v, want %v %v", i, s.seq, isNew, gap, s.new, s.gap)
		}
		if d.HWM != s.hwm || len(d.Above) != s.held {
			t.Fatalf("step %d: hwm %d held %v, want %d %d", i, d.HWM, d.Above, s.hwm, s.held)
		}
	}
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

func TestProtocolErrorsTyped(t *testing.T) {
	_, err := parseAck([]byte(`{"type":"batch"}`))
	var pe *ProtocolError
	if !errors.As(err, &pe) || pe.Frame != "ack" {
		t.Fatalf("%v", err)
	}
	_, err = parseBatch([]byte(`{"type":"batch","gateway":"g","first":1,"last":2,"samples":[{"seq":2,"device":"d","tag":"t","value":1,"quality":"good","ts":1},{"seq":1,"device":"d","tag":"t","value":1,"quality":"good","ts":1}]}`))
	if !errors.As(err, &pe) || pe.Frame != "batch" {
		t.Fatalf("%v", err)
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
	r := NewReceiver(ReceiverConfig{Token: "tok", Out: &wsOut, Logger: testLogger(t)})
	addr, stopR := serveReceiver(t, r)
	// The MQTT side of the union: a subscriber feeding a second receiver.
	viaMQTT := NewReceiver(ReceiverConfig{Out: &mqttOut, Logger: testLogger(t)})
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
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	var out syncBuffer
	rcv := NewReceiver(ReceiverConfig{Out: &out})
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

// Bytes on the wire per sample: a WebSocket frame, the MQTT batch payload
// (the same bytes) and a per-tag payload.
func BenchmarkBatchFrame(b *testing.B) {
	samples := make([]ringstore.Sample, 500)
	ts := time.Now().UnixMicro()
	for i := range samples {
		samples[i] = ringstore.Sample{Seq: 1795987408427661 + uint64(i), Device: fmt.Sprintf("logger-%02d", i/2%48),
			Tag: []string{"temperature", "humidity"}[i%2], Value: 21.5 + float64(i%7)/10, TS: ts + int64(i/2)*1000}
	}
	gw, _ := json.Marshal("gw-01")
	var buf []byte
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		buf = appendBatch(buf[:0], gw, samples)
	}
	b.ReportMetric(float64(len(buf))/float64(len(samples)), "B/sample")
	tag := appendTagValue(nil, &samples[0])
	b.ReportMetric(float64(len(tag)), "pertag-B")
}

// A gateway restart mid-outage: the queue is reopened from disk and the new
// pusher resends everything unacknowledged, from the oldest.
func TestRestartResends(t *testing.T) {
	dir := t.TempDir()
	var out syncBuffer
	r := NewReceiver(ReceiverConfig{Out: &out, Logger: testLogger(t)})
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
		ring.OnAppend(q.Append)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { defer close(done); _ = q.Run(ctx) }()
		return ring, q, func() { cancel(); <-done; q.Close() }
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
			f, err := parseBatch(msg)
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
	defer func() { srv.Close(); <-served; conns.Wait() }()

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
	if s := st.Snapshot(); s.Reconnects < 2 || s.SentWS != 0 {
		t.Fatalf("state: %+v", s)
	}
	mu.Lock()
	defer mu.Unlock()
	// each connection sends the window (4 batches of 5: 20 samples) in order
	if len(firsts) < 8 || firsts[0] != first || firsts[1] != first+5 || firsts[3] != first+15 {
		t.Fatalf("batches started at %v", firsts)
	}
}

// A batch never mixes epochs and carries the restart skips it crosses; the
// receiver takes a skip as seen (no gap), a new epoch as no gap, and its
// state file carries the dedup across its own restart.
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
	f1 := appendBatch(nil, []byte(`"gw"`), b, bt.skips...)
	if !strings.Contains(string(f1), `"v":2,"gateway":"gw","epoch":"1111222233334444","first":1,"last":1002,"skip":[[4,999]],`) {
		t.Fatalf("frame %s", f1)
	}
	f2 := appendBatch(nil, []byte(`"gw"`), bt.next(q, 1002, now), bt.skips...)

	dir := t.TempDir()
	var out syncBuffer
	r := NewReceiver(ReceiverConfig{Out: &out, StateDir: dir})
	for _, f := range [][]byte{f1, f1, f2} {
		if _, err := r.Ingest(f); err != nil {
			t.Fatal(err)
		}
	}
	if st := r.Stats(); st.Samples != 8 || st.Duplicates != 6 || st.Gaps != 0 || st.Epochs != 2 {
		t.Fatalf("stats %+v", st)
	}
	if !strings.Contains(out.b.String(), `{"gateway":"gw","epoch":"5555666677778888","seq":1003,`) {
		t.Fatalf("output %s", out.b.String())
	}
	// A new receiver on the same state: everything is a duplicate, and a
	// late batch of the older epoch too.
	r2 := NewReceiver(ReceiverConfig{Out: &out, StateDir: dir})
	for _, f := range [][]byte{f2, f1} {
		if _, err := r2.Ingest(f); err != nil {
			t.Fatal(err)
		}
	}
	if st := r2.Stats(); st.Samples != 0 || st.Duplicates != 8 || st.Gaps != 0 {
		t.Fatalf("after restart: stats %+v", st)
	}
}
