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
	"edgegw/receiver"
	"edgegw/wire"

	mqtt "github.com/eclipse/paho.mqtt.golang"
	"github.com/gorilla/websocket"
)

// writeCall is one call the fake writer saw.
type writeCall struct {
	Device, Tag string
	Value       float64
	Origin      string
}

// kindErr is a writer error with a kind, as edge's *WriteError has.
type kindErr struct{ kind, msg string }

func (e *kindErr) Error() string          { return "edge: " + e.msg }
func (e *kindErr) WriteErrorKind() string { return e.kind }

// fakeWriter records calls and returns configured results: errs by tag
// (else the value written and read back unchanged). With gate set, every
// call waits for the gate (or its context) first and reports that it
// entered.
type fakeWriter struct {
	mu      sync.Mutex
	calls   []writeCall
	errs    map[string]error
	gate    chan struct{}
	entered chan struct{}
}

var _ Writer = (*fakeWriter)(nil)

func (f *fakeWriter) Write(ctx context.Context, device, tag string, value float64, origin string) (float64, float64, error) {
	f.mu.Lock()
	f.calls = append(f.calls, writeCall{device, tag, value, origin})
	err := f.errs[tag]
	f.mu.Unlock()
	if f.gate != nil {
		f.entered <- struct{}{}
		select {
		case <-f.gate:
		case <-ctx.Done():
			return 0, 0, fmt.Errorf("edge: write %s/%s: %w", device, tag, ctx.Err())
		}
	}
	if err != nil {
		return 0, 0, err
	}
	return value, value, nil
}

func (f *fakeWriter) getCalls() []writeCall {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]writeCall(nil), f.calls...)
}

// uplink runs a receiver and a WebSocket pusher with writer w (may be nil)
// and waits until the receiver knows the gateway.
func uplink(t *testing.T, w Writer, tune func(*Config)) (*receiver.Receiver, *Pusher, *gateway) {
	t.Helper()
	r := receiver.New(receiver.Config{Token: "tok", Logger: testLogger(t)})
	addr, _ := serveReceiver(t, r)
	g := newGateway(t, "")
	cfg := Config{GatewayID: gwID, WS: wsConfig(addr.String(), "tok"), Queue: g.q, Logger: testLogger(t)}
	cfg.WS.AckTimeout = loadedAckTimeout // a late ack must not drop the connection the writes ride on
	if w != nil {
		cfg.Writer = w
	}
	if tune != nil {
		tune(&cfg)
	}
	p, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	runPusher(t, p)
	waitFor(t, 5*time.Second, "gateway connected", func() bool { return fmt.Sprint(r.Connected()) == "["+gwID+"]" })
	return r, p, g
}

func rwrite(t *testing.T, r *receiver.Receiver, device, tag string, v float64) wire.WriteAnswer {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	a, err := r.Write(ctx, gwID, device, tag, v)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// A write over the uplink is carried out and answered; batches keep
// flowing and being acked on the same connection meanwhile.
func TestUplinkWrite(t *testing.T) {
	w := &fakeWriter{errs: map[string]error{"limited": &kindErr{"out of range", "90.5 > max 90"}}}
	r, p, g := uplink(t, w, nil)
	prod := startProducer(g, 40)
	defer prod.stop()

	a := rwrite(t, r, "boiler-plc", "setpoint", 42.5)
	if !a.OK || a.Written != 42.5 || a.ReadBack != 42.5 || a.ID == "" {
		t.Fatalf("answer %+v", a)
	}
	a = rwrite(t, r, "boiler-plc", "limited", 90.5)
	if a.OK || a.Kind != "out of range" || !strings.Contains(a.Error, "max 90") {
		t.Fatalf("answer %+v", a)
	}
	a = rwrite(t, r, "boiler plc", "setpoint", 1) // not a valid name: never reaches the writer
	if a.OK || a.Kind != wire.KindBadRequest {
		t.Fatalf("answer %+v", a)
	}
	calls := w.getCalls()
	u := "websocket uplink " + strings.TrimPrefix(strings.TrimSuffix(p.cfg.WS.URLs[0], "/ingest"), "ws://")
	want := []writeCall{{"boiler-plc", "setpoint", 42.5, u}, {"boiler-plc", "limited", 90.5, u}}
	if fmt.Sprint(calls) != fmt.Sprint(want) {
		t.Fatalf("writer calls %v, want %v", calls, want)
	}
	prod.finished(30 * time.Second)
	waitFor(t, 5*time.Second, "batches acked meanwhile", func() bool { return g.q.Stats().Samples == 0 && r.Stats().Samples == 80 })
	if ws := p.WriteStats(); ws.Received != 3 || ws.OK != 1 || ws.Failed != 1 || ws.Bad != 1 {
		t.Fatalf("write stats %+v", ws)
	}
	if rs := r.Stats(); rs.WriteAnswers != 3 || rs.UnknownAnswers != 0 {
		t.Fatalf("receiver %+v", rs)
	}
	// An unknown gateway is an error, not an answer.
	if _, err := r.Write(context.Background(), "gw-nope", "d", "t", 1); !errors.Is(err, receiver.ErrNotConnected) {
		t.Fatalf("unknown gateway: %v", err)
	}
}

// Beyond MaxWrites in flight a write is answered "busy" at once; the
// others complete when the writer does; a writer slower than WriteTimeout
// is answered "timeout".
func TestUplinkWriteBusyAndTimeout(t *testing.T) {
	w := &fakeWriter{gate: make(chan struct{}), entered: make(chan struct{}, 8)}
	r, p, _ := uplink(t, w, func(c *Config) { c.MaxWrites = 2; c.WriteTimeout = 5 * time.Second })
	type res struct {
		a   wire.WriteAnswer
		err error
	}
	results := make(chan res, 2)
	for i := range 2 {
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			a, err := r.Write(ctx, gwID, "d", "t", float64(i))
			results <- res{a, err}
		}()
	}
	for range 2 {
		select {
		case <-w.entered:
		case <-time.After(5 * time.Second):
			t.Fatal("writes did not reach the writer")
		}
	}
	start := time.Now()
	a := rwrite(t, r, "d", "t", 9)
	if a.OK || a.Kind != wire.KindBusy {
		t.Fatalf("third write: %+v", a)
	}
	// At once: not after waiting for a slot (the slots are held until the
	// gate opens, below; a wait would end in "timeout" after WriteTimeout).
	if d := time.Since(start); d >= 5*time.Second {
		t.Fatalf("busy answered after %v, not before a write could time out (5s)", d)
	}
	close(w.gate)
	for range 2 {
		x := testenv.Recv(t, results, 15*time.Second, "an in-flight write's result")
		if x.err != nil || !x.a.OK {
			t.Fatalf("in-flight write: %+v %v", x.a, x.err)
		}
	}
	if ws := p.WriteStats(); ws.Busy != 1 || ws.OK != 2 {
		t.Fatalf("write stats %+v", ws)
	}

	// Timeout: a writer that never finishes within WriteTimeout.
	w2 := &fakeWriter{gate: make(chan struct{}), entered: make(chan struct{}, 8)}
	defer close(w2.gate)
	r2, _, _ := uplink(t, w2, func(c *Config) { c.WriteTimeout = 100 * time.Millisecond })
	a = rwrite(t, r2, "d", "t", 1)
	if a.OK || a.Kind != wire.KindTimeout {
		t.Fatalf("slow writer: %+v", a)
	}
}

// No Writer: every write command is refused with a clear answer.
func TestUplinkWriteRefusedWithoutWriter(t *testing.T) {
	r, p, _ := uplink(t, nil, nil)
	a := rwrite(t, r, "boiler-plc", "setpoint", 42)
	if a.OK || a.Kind != wire.KindRefused || !strings.Contains(a.Error, "write commands are off") {
		t.Fatalf("answer %+v", a)
	}
	if ws := p.WriteStats(); ws.Refused != 1 || ws.Received != 1 {
		t.Fatalf("write stats %+v", ws)
	}
}

// Bad write commands are answered (the connection stays); a message that
// is not JSON or of an unknown type closes it, and one beyond the read
// limit closes it too. Seen from a hand-written receiver.
func TestUplinkBadMessages(t *testing.T) {
	answers := make(chan string, 16)
	var conns sync.WaitGroup
	var mu sync.Mutex
	connects := 0
	up := websocket.Upgrader{}
	// Connection 0: six write commands, then (once all six are answered) a
	// message of an unknown type. Connection 1: a message beyond the read
	// limit. Later connections are closed at once.
	cmds := []string{`{"type":"write","id":"a","device":"d","tag":"t","value":"x"}`,
		`{"type":"write","id":"b","device":"d","tag":"t","value":1e999}`,
		`{"type":"write","id":7,"device":"d","tag":"t","value":1}`,
		`{"type":"write","id":"c","device":"d/x","tag":"t","value":1}`,
		`{"type":"write","id":"d","device":"d","tag":"t"}`,
		`{"type":"write","id":"e","device":"d","tag":"t","value":true}`}
	big := `{"type":"write","id":"big","device":"d","tag":"t","value":1,"pad":"` + strings.Repeat("x", wsReadLimit) + `"}`
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		c, err := up.Upgrade(w, req, nil)
		if err != nil {
			return
		}
		conns.Add(1)
		defer conns.Done()
		defer c.Close()
		mu.Lock()
		n := connects
		connects++
		mu.Unlock()
		var script []string
		switch n {
		case 0:
			script = cmds
		case 1:
			script = []string{big}
		default:
			return
		}
		for _, m := range script {
			if err := c.WriteMessage(websocket.TextMessage, []byte(m)); err != nil {
				return
			}
		}
		results := 0
		for {
			_, msg, err := c.ReadMessage()
			if err != nil {
				answers <- fmt.Sprintf("closed %d", n)
				return
			}
			if strings.Contains(string(msg), "write_result") {
				answers <- string(msg)
				if results++; results == len(cmds) {
					_ = c.WriteMessage(websocket.TextMessage, []byte(`{"type":"hello"}`))
				}
			}
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

	w := &fakeWriter{}
	g := newGateway(t, "")
	p, err := New(Config{GatewayID: gwID, WS: wsConfig(ln.Addr().String(), ""), Queue: g.q, Writer: w, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	runPusher(t, p)
	want := map[string]string{"a": wire.KindBadRequest, "b": wire.KindBadRequest, "": wire.KindBadRequest, "c": wire.KindBadRequest, "d": wire.KindBadRequest}
	got := map[string]wire.WriteAnswer{}
	for len(got) < 6 {
		select {
		case m := <-answers:
			if strings.HasPrefix(m, "closed") {
				if len(got) < 6 {
					t.Fatalf("%s before all answers: %v", m, got)
				}
				continue
			}
			var a wire.WriteAnswer
			if err := json.Unmarshal([]byte(m), &a); err != nil {
				t.Fatalf("answer %q: %v", m, err)
			}
			got[a.ID] = a
		case <-time.After(5 * time.Second):
			t.Fatalf("answers so far: %v", got)
		}
	}
	for id, k := range want {
		if got[id].OK || got[id].Kind != k {
			t.Errorf("answer %q: %+v, want kind %q", id, got[id], k)
		}
	}
	if a := got["e"]; !a.OK || a.Written != 1 {
		t.Errorf("answer e: %+v", a)
	}
	// The unknown type closes the first connection; the oversize message the second.
	for _, want := range []string{"closed 0", "closed 1"} {
		select {
		case m := <-answers:
			if m != want {
				t.Fatalf("got %q, want %q", m, want)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("no %q", want)
		}
	}
	if calls := w.getCalls(); len(calls) != 1 || calls[0].Value != 1 {
		t.Fatalf("writer calls %v", calls)
	}
}

// mqttWriteRig is a mosquitto, a pusher with MQTT write commands (or
// not), and a subscriber collecting the result topics.
type mqttWriteRig struct {
	broker  string
	prefix  string
	p       *Pusher
	w       *fakeWriter
	results chan [2]string // topic, payload
	pub     mqtt.Client
}

func newMQTTWriteRig(t *testing.T, broker, prefix string, on bool, w *fakeWriter, tune func(*MQTTConfig)) *mqttWriteRig {
	t.Helper()
	rig := &mqttWriteRig{broker: broker, prefix: prefix, w: w, results: make(chan [2]string, 64)}
	rig.pub = subscribe(t, broker, prefix+"/write/+/+/result", func(topic string, payload []byte, _ bool) {
		rig.results <- [2]string{topic, string(payload)}
	})
	g := newGateway(t, "")
	m := MQTTConfig{Broker: "tcp://" + broker, TopicPrefix: prefix, NoPerTagTopics: true, WriteCommands: on,
		ClientID:     "gw-" + strings.ReplaceAll(prefix, "/", "-"),
		ReconnectMin: 50 * time.Millisecond, ReconnectMax: 200 * time.Millisecond}
	if tune != nil {
		tune(&m)
	}
	cfg := Config{GatewayID: gwID, MQTT: m, Queue: g.q, Logger: testLogger(t)}
	if w != nil {
		cfg.Writer = w
	}
	p, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	rig.p = p
	runPusher(t, p)
	return rig
}

func (rig *mqttWriteRig) publish(t *testing.T, topic, payload string, retained bool) {
	t.Helper()
	if tok := rig.pub.Publish(rig.prefix+"/write/"+topic, 1, retained, payload); !tok.WaitTimeout(5*time.Second) || tok.Error() != nil {
		t.Fatalf("publish: %v", tok.Error())
	}
}

// result waits for the next result on topic (skipping probe answers).
func (rig *mqttWriteRig) result(t *testing.T, topic string) wire.WriteAnswer {
	t.Helper()
	deadline := time.After(5 * time.Second)
	for {
		select {
		case r := <-rig.results:
			if strings.Contains(r[0], "/probe/") {
				continue
			}
			if r[0] != rig.prefix+"/write/"+topic+"/result" {
				t.Fatalf("result on %s (%s), want %s", r[0], r[1], topic)
			}
			var a wire.WriteAnswer
			if err := json.Unmarshal([]byte(r[1]), &a); err != nil || !strings.Contains(r[1], `"type":"write_result"`) {
				t.Fatalf("result %q: %v", r[1], err)
			}
			return a
		case <-deadline:
			t.Fatalf("no result on %s", topic)
		}
	}
}

// subscribed waits until the gateway answers on the write topic: a probe
// with an invalid tag name is answered without reaching the writer.
func (rig *mqttWriteRig) subscribed(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		rig.publish(t, "probe/bad$tag", "1", false)
		select {
		case r := <-rig.results:
			if strings.Contains(r[0], "/probe/") {
				return
			}
			t.Fatalf("unexpected result %v", r)
		case <-time.After(100 * time.Millisecond): // polling the subscription, bounded
		}
	}
	t.Fatal("the gateway never subscribed the write topic")
}

// MQTT write commands on a real mosquitto: results on the result topic,
// bad payloads answered with an error, retained commands ignored, the
// rate limit answered "busy".
func TestMQTTWrite(t *testing.T) {
	mosq := testenv.StartMosquitto(t)
	prefix := "site/gw"
	// A retained command waiting on the broker before the gateway connects.
	retainer := subscribe(t, mosq.Addr, prefix+"/nothing", func(string, []byte, bool) {})
	if tok := retainer.Publish(prefix+"/write/old/setpoint", 1, true, "666"); !tok.WaitTimeout(5*time.Second) || tok.Error() != nil {
		t.Fatal(tok.Error())
	}
	w := &fakeWriter{errs: map[string]error{"ro": &kindErr{"not writable", `tag "ro" is not writable`}}}
	rig := newMQTTWriteRig(t, mosq.Addr, prefix, true, w, func(m *MQTTConfig) { m.WriteRate = 0.001; m.WriteBurst = 4 })
	rig.subscribed(t)

	rig.publish(t, "boiler-plc/setpoint", "42.5", false)
	if a := rig.result(t, "boiler-plc/setpoint"); !a.OK || a.Written != 42.5 || a.ReadBack != 42.5 || a.ID != "" {
		t.Fatalf("answer %+v", a)
	}
	rig.publish(t, "pump-1/run", `{"value":true,"id":"cmd-1"}`, false)
	if a := rig.result(t, "pump-1/run"); !a.OK || a.Written != 1 || a.ID != "cmd-1" {
		t.Fatalf("answer %+v", a)
	}
	rig.publish(t, "pump-1/ro", `{"value":3,"id":"cmd-2"}`, false)
	if a := rig.result(t, "pump-1/ro"); a.OK || a.Kind != "not writable" || a.ID != "cmd-2" {
		t.Fatalf("answer %+v", a)
	}
	for _, bad := range []string{`"abc"`, `{"value":1e999}`, `nan`, `{"value":null}`, `{"value":1,"id":5}`, ``, strings.Repeat("1", 2000)} {
		rig.publish(t, "pump-1/speed", bad, false)
		if a := rig.result(t, "pump-1/speed"); a.OK || a.Kind != wire.KindBadRequest {
			t.Fatalf("payload %.20q: answer %+v", bad, a)
		}
	}
	// Burst 4: one left, then busy (bad payloads and probes took no token).
	rig.publish(t, "pump-1/speed", "10", false)
	if a := rig.result(t, "pump-1/speed"); !a.OK {
		t.Fatalf("answer %+v", a)
	}
	rig.publish(t, "pump-1/speed", "11", false)
	if a := rig.result(t, "pump-1/speed"); a.OK || a.Kind != wire.KindBusy {
		t.Fatalf("over the rate: %+v", a)
	}
	calls := w.getCalls()
	origin := "mqtt " + mosq.Addr
	want := []writeCall{{"boiler-plc", "setpoint", 42.5, origin}, {"pump-1", "run", 1, origin}, {"pump-1", "ro", 3, origin}, {"pump-1", "speed", 10, origin}}
	if fmt.Sprint(calls) != fmt.Sprint(want) { // the retained 666 never reached the writer
		t.Fatalf("writer calls %v, want %v", calls, want)
	}
}

// WriteCommands off: the gateway subscribes nothing. Gateway A (off) and
// gateway B (on) share the broker; a command to A is published before one
// to B, so once B has answered, A has had the same time to act (the
// sentinel): no writer call, no result, nothing received.
func TestMQTTWriteOff(t *testing.T) {
	mosq := testenv.StartMosquitto(t)
	wa, wb := &fakeWriter{}, &fakeWriter{}
	a := newMQTTWriteRig(t, mosq.Addr, "pa/gw", false, wa, nil)
	b := newMQTTWriteRig(t, mosq.Addr, "pb/gw", true, wb, nil)
	online := make(chan struct{})
	var once sync.Once
	subscribe(t, mosq.Addr, "pa/gw/status", func(_ string, p []byte, _ bool) {
		if string(p) == "online" {
			once.Do(func() { close(online) })
		}
	})
	select {
	case <-online:
	case <-time.After(5 * time.Second):
		t.Fatal("gateway A not online")
	}
	b.subscribed(t)
	a.publish(t, "boiler-plc/setpoint", "42", false)
	b.publish(t, "boiler-plc/setpoint", "43", false)
	if r := b.result(t, "boiler-plc/setpoint"); !r.OK || r.Written != 43 {
		t.Fatalf("sentinel answer %+v", r)
	}
	select {
	case r := <-a.results:
		t.Fatalf("gateway A answered with write commands off: %v", r)
	default:
	}
	if c := wa.getCalls(); len(c) != 0 {
		t.Fatalf("gateway A wrote: %v", c)
	}
	if ws := a.p.WriteStats(); ws.Received != 0 {
		t.Fatalf("gateway A received commands: %+v", ws)
	}
}
