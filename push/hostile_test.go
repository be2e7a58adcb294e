package push

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"edgegw/internal/testenv"
	"edgegw/receiver"
	"edgegw/stats"
	"edgegw/wire"

	"github.com/gorilla/websocket"
)

// hostile is a real WebSocket server on 127.0.0.1:0 that answers the
// handshake and then behaves as serve says (it never stores anything).
type hostile struct {
	addr    string
	mu      sync.Mutex
	handAt  []time.Time // when each handshake was answered (server side)
	batches int         // messages read
	closed  bool        // the test's cleanup waits for the connections
	conns   map[*websocket.Conn]bool
}

// hostile behaviours: what a receiver does after the handshake.
var hostileKinds = map[string]func(h *hostile, c *websocket.Conn){
	// reads every batch, acks none
	"never acks": func(h *hostile, c *websocket.Conn) {
		for {
			if _, _, err := c.ReadMessage(); err != nil {
				return
			}
			h.read(1)
		}
	},
	// answers with garbage at once, and to every batch
	"garbage": func(h *hostile, c *websocket.Conn) {
		for {
			if err := c.WriteMessage(websocket.TextMessage, []byte("\x00{not json")); err != nil {
				return
			}
			if _, _, err := c.ReadMessage(); err != nil {
				return
			}
			h.read(1)
		}
	},
	// reads one batch and closes (a close frame, then the socket)
	"closes after every batch": func(h *hostile, c *websocket.Conn) {
		if _, _, err := c.ReadMessage(); err != nil {
			return
		}
		h.read(1)
		_ = c.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(websocket.CloseNormalClosure, "bye"), time.Now().Add(time.Second))
	},
}

// read counts n batches read and returns the count so far.
func (h *hostile) read(n int) int { h.mu.Lock(); defer h.mu.Unlock(); h.batches += n; return h.batches }

func (h *hostile) handshakes() []time.Time {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]time.Time(nil), h.handAt...)
}

// startHostile serves serve on 127.0.0.1:0 until the test ends (or stop).
func startHostile(t *testing.T, serve func(h *hostile, c *websocket.Conn)) (h *hostile, stop func()) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	h = &hostile{addr: ln.Addr().String(), conns: map[*websocket.Conn]bool{}}
	var conns sync.WaitGroup
	up := websocket.Upgrader{}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		c, err := up.Upgrade(w, req, nil)
		if err != nil {
			return
		}
		h.mu.Lock()
		if h.closed { // the cleanup waits already: no Add after its Wait
			h.mu.Unlock()
			c.Close()
			return
		}
		h.handAt = append(h.handAt, time.Now())
		h.conns[c] = true
		conns.Add(1)
		h.mu.Unlock()
		defer conns.Done()
		defer func() {
			h.mu.Lock()
			delete(h.conns, c)
			h.mu.Unlock()
			c.Close()
		}()
		serve(h, c)
	})}
	served := make(chan struct{})
	go func() { defer close(served); _ = srv.Serve(ln) }()
	var once sync.Once
	// stop is the receiver process dying: the listener and every
	// connection close (srv.Close leaves hijacked connections open).
	stop = func() {
		once.Do(func() {
			srv.Close()
			testenv.Closed(t, served, 5*time.Second, "hostile receiver's Serve")
			h.mu.Lock()
			for c := range h.conns {
				_ = c.Close()
			}
			h.mu.Unlock()
		})
	}
	t.Cleanup(func() {
		stop()
		h.mu.Lock()
		h.closed = true
		h.mu.Unlock()
		testenv.Wait(t, 10*time.Second, "hostile receiver's connections", conns.Wait)
	})
	return h, stop
}

// A receiver that answers the handshake but stores nothing is down: the
// path never says websocket, MQTT takes over after FallbackAfter and gets
// every sample, each failing session is followed by a growing backoff
// (never reset by a handshake), and the log says the failure once per
// reason, not once per session.
func TestHostileReceiverFallsBackToMQTT(t *testing.T) {
	mosq := testenv.StartMosquitto(t)
	for name, serve := range hostileKinds {
		t.Run(name, func(t *testing.T) {
			h, _ := startHostile(t, serve)
			var mqttOut syncBuffer
			viaMQTT := receiver.New(receiver.Config{Out: &mqttOut, Logger: testLogger(t)})
			topic := "edgegw/" + strings.ReplaceAll(t.Name(), "/", "_")
			subscribe(t, mosq.Addr, topic+"/batch", func(_ string, payload []byte, _ bool) {
				if _, err := viaMQTT.Ingest(payload); err != nil {
					t.Errorf("mqtt batch: %v", err)
				}
			})
			g := newGateway(t, t.TempDir())
			st := new(stats.Upstream)
			var logs logLines
			t.Cleanup(func() {
				if t.Failed() {
					t.Logf("state %+v, queue %+v, %d handshakes, %d batches read; log:\n%s", st.Snapshot(), g.q.Stats(), len(h.handshakes()), h.read(0), strings.Join(logs.with(""), "\n"))
				}
			})
			w := wsConfig(h.addr, "")
			w.AckTimeout = time.Second
			w.ReconnectMin, w.ReconnectMax = 40*time.Millisecond, 640*time.Millisecond
			const fallbackAfter = 500 * time.Millisecond
			p, err := New(Config{GatewayID: gwID, WS: w, Queue: g.q, State: st, Logger: logs.logger(),
				MQTT: MQTTConfig{Broker: "tcp://" + mosq.Addr, TopicPrefix: topic, FallbackAfter: fallbackAfter, NoPerTagTopics: true,
					ReconnectMin: 50 * time.Millisecond, ReconnectMax: 200 * time.Millisecond}})
			if err != nil {
				t.Fatal(err)
			}
			first := g.ring.Seq() + 1
			started := time.Now() // before Run: the elapsed time measured is at least the real one
			runPusher(t, p)
			prod := startProducer(g, 1<<30)
			defer prod.stop()

			waitFor(t, 20*time.Second, "mqtt takes over", func() bool { return path(st) == stats.PathMQTT })
			if at := time.UnixMicro(st.Snapshot().PathSinceUS); at.Sub(started) < fallbackAfter {
				t.Errorf("mqtt took over %v after the start, before fallback_after %v", at.Sub(started), fallbackAfter)
			}
			// a session fails only when it has a batch to send: samples keep coming
			waitFor(t, 60*time.Second, "6 failed sessions", func() bool { return st.Snapshot().WSSessionsFailed >= 6 })
			prod.stop()
			last := g.ring.Seq()
			waitFor(t, 30*time.Second, "every sample over mqtt", func() bool { return viaMQTT.Stats().Samples == last-first+1 })
			checkExactlyOnce(t, mqttOut.seqs(t, gwID), first, last)
			waitFor(t, 10*time.Second, "queue acked", func() bool { return g.q.Stats().Samples == 0 })

			s := st.Snapshot()
			if s.SentWS != 0 || s.SentMQTT != last-first+1 || s.Dropped != 0 {
				t.Errorf("state: %+v", s)
			}
			if got := logs.with("push: upstream path", "path=websocket"); len(got) != 0 {
				t.Errorf("the path said websocket for a receiver that stores nothing:\n%s", strings.Join(got, "\n"))
			}
			if got := logs.with("push: upstream path"); len(got) > 2 {
				t.Errorf("path changes logged %d times:\n%s", len(got), strings.Join(got, "\n"))
			}
			if got := logs.with("push: websocket: connected"); len(got) != 0 {
				t.Errorf("connected logged for a receiver that acks nothing:\n%s", strings.Join(got, "\n"))
			}
			ws := logs.with("push: websocket:")
			if len(ws) == 0 || len(ws) > 3 || !strings.Contains(ws[0], "level=WARN") || !strings.Contains(ws[0], "acknowledged no batch") {
				t.Errorf("%d failed sessions logged in %d lines, want 1 to 3 WARN lines (one per reason):\n%s",
					s.WSSessionsFailed, len(ws), strings.Join(ws, "\n"))
			}
			// Backoff with jitter after each failed session, not reset by
			// the handshake: the wait before session k+1 is at least half
			// of min(ReconnectMax, ReconnectMin*2^k). Server-side stamps:
			// the gap also holds session k itself, so it can only be longer.
			hs := h.handshakes()
			for k := 1; k < len(hs); k++ {
				d := min(w.ReconnectMax, w.ReconnectMin<<(k-1))
				if gap := hs[k].Sub(hs[k-1]); gap < d/2 {
					t.Errorf("session %d started %v after session %d, want >= %v (backoff %v)", k+1, gap, k, d/2, d)
				}
			}
			t.Logf("%d sessions, %d batches read by the hostile receiver, %d samples over mqtt; log:\n%s",
				len(hs), h.read(0), viaMQTT.Stats().Samples, strings.Join(ws, "\n"))
		})
	}
}

// Without MQTT, a receiver that stores nothing leaves the path buffering
// from the start, without a flip: /healthz (which reads the path and its
// since) sees the upstream down for as long as it lasts.
func TestHostileReceiverStaysBuffering(t *testing.T) {
	for name, serve := range hostileKinds {
		t.Run(name, func(t *testing.T) {
			h, _ := startHostile(t, serve)
			g := newGateway(t, "")
			st := new(stats.Upstream)
			var logs logLines
			w := wsConfig(h.addr, "")
			w.AckTimeout = 300 * time.Millisecond
			w.ReconnectMin, w.ReconnectMax = 20*time.Millisecond, 160*time.Millisecond
			p, err := New(Config{GatewayID: gwID, WS: w, Queue: g.q, State: st, Logger: logs.logger()})
			if err != nil {
				t.Fatal(err)
			}
			since := st.Snapshot().PathSinceUS
			runPusher(t, p)
			prod := startProducer(g, 1<<30)
			defer prod.stop()
			waitFor(t, 30*time.Second, "6 failed sessions", func() bool { return st.Snapshot().WSSessionsFailed >= 6 })
			s := st.Snapshot()
			if s.Path != stats.PathBuffering || s.PathSinceUS != since || s.SentWS != 0 {
				t.Errorf("after %d failed sessions: path %s since %d (start %d), sent %d", s.WSSessionsFailed, s.Path, s.PathSinceUS, since, s.SentWS)
			}
			if got := logs.with("push: upstream path"); len(got) != 0 {
				t.Errorf("path changes logged:\n%s", strings.Join(got, "\n"))
			}
			if len(h.handshakes()) < 6 {
				t.Errorf("%d handshakes", len(h.handshakes()))
			}
		})
	}
}

// A receiver that stores nothing, then a good one at the same address:
// WebSocket is up at its first ack and takes over from MQTT; the union of
// both paths holds every sample exactly once.
func TestHostileThenGoodReceiver(t *testing.T) {
	mosq := testenv.StartMosquitto(t)
	h, stopHostile := startHostile(t, hostileKinds["never acks"])
	var wsOut, mqttOut syncBuffer
	viaMQTT := receiver.New(receiver.Config{Out: &mqttOut, Logger: testLogger(t)})
	subscribe(t, mosq.Addr, "edgegw/"+gwID+"/batch", func(_ string, payload []byte, _ bool) {
		if _, err := viaMQTT.Ingest(payload); err != nil {
			t.Errorf("mqtt batch: %v", err)
		}
	})
	g := newGateway(t, t.TempDir())
	st := new(stats.Upstream)
	var logs logLines
	w := wsConfig(h.addr, "")
	// The good receiver's session must not end on an ack it sends late on
	// a loaded machine (its resend would store samples over both paths).
	// MQTT takes over once the first hostile session has failed on the
	// ack timeout; the later one ends when the hostile receiver dies.
	w.AckTimeout = loadedAckTimeout
	w.ReconnectMin, w.ReconnectMax = 40*time.Millisecond, 320*time.Millisecond
	p, err := New(Config{GatewayID: gwID, WS: w, Queue: g.q, State: st, Logger: logs.logger(),
		MQTT: MQTTConfig{Broker: "tcp://" + mosq.Addr, FallbackAfter: 300 * time.Millisecond, NoPerTagTopics: true,
			ReconnectMin: 50 * time.Millisecond, ReconnectMax: 200 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	first := g.ring.Seq() + 1
	runPusher(t, p)
	prod := startProducer(g, 1<<30) // until websocket has taken over
	defer prod.stop()
	// a session holds the stream until it fails: twice the ack timeout
	waitFor(t, 2*w.AckTimeout+20*time.Second, "mqtt takes over", func() bool { return path(st) == stats.PathMQTT && viaMQTT.Stats().Samples >= 100 })
	waitFor(t, 20*time.Second, "a session with the hostile receiver", func() bool { return len(h.handshakes()) > 0 })
	stopHostile()
	r := receiver.New(receiver.Config{Listen: h.addr, Out: &wsOut, Logger: testLogger(t)})
	serveReceiver(t, r)
	waitFor(t, 20*time.Second, "websocket takes over", func() bool { return path(st) == stats.PathWebSocket && r.Stats().Samples > 0 })
	if s := st.Snapshot(); s.WSSessionsFailed < 1 {
		t.Errorf("the hostile receiver's session(s) not counted failed: %+v", s)
	}
	n := r.Stats().Samples
	waitFor(t, 20*time.Second, "100 more samples over websocket", func() bool { return r.Stats().Samples >= n+100 })
	prod.stop()
	last := g.ring.Seq()
	waitFor(t, 20*time.Second, "queue drained", func() bool { return g.q.Stats().Samples == 0 })
	count := map[uint64]int{}
	for _, s := range append(wsOut.seqs(t, gwID), mqttOut.seqs(t, gwID)...) {
		count[s]++
	}
	for s := first; s <= last; s++ {
		if count[s] != 1 {
			t.Fatalf("seq %d stored %d times (websocket %d samples, mqtt %d)", s, count[s], r.Stats().Samples, viaMQTT.Stats().Samples)
		}
	}
	if len(count) != int(last-first+1) {
		t.Fatalf("%d seqs stored, want %d", len(count), last-first+1)
	}
	if got := logs.with("push: websocket: connected"); len(got) != 1 {
		t.Errorf("connected logged %d times:\n%s", len(got), strings.Join(got, "\n"))
	}
}

// The reason a session ended is the same words for the same cause, so
// that the log's state key does not change from session to session.
func TestSessionReasonStable(t *testing.T) {
	for _, c := range []struct {
		err  error
		want string
	}{
		{&noAckError{last: 17, timeout: time.Second}, "no ack within 1s"},
		{&noAckError{last: 99017, timeout: time.Second}, "no ack within 1s"},
		{fmt.Errorf("read: %w", &wire.ProtocolError{Frame: "uplink", Msg: "invalid character 'x'"}), "bad uplink frame from the receiver"},
		{&wire.ProtocolError{Frame: "ack", Msg: "last 12 beyond what was sent (10)"}, "bad ack frame from the receiver"},
		{&websocket.CloseError{Code: 1000, Text: "bye"}, "receiver closed the connection (code 1000)"},
		{fmt.Errorf("push: websocket: write batch 1-5: %w", &net.OpError{Op: "write", Err: os.NewSyscallError("write", syscall.EPIPE)}), "receiver dropped the connection"},
		{&net.OpError{Op: "read", Err: os.NewSyscallError("read", syscall.ECONNRESET)}, "receiver dropped the connection"},
		{io.ErrUnexpectedEOF, "receiver dropped the connection"},
		{&net.OpError{Op: "read", Err: os.ErrDeadlineExceeded}, "receiver silent (read or write timeout)"},
	} {
		if got := sessionReason(c.err); got != c.want {
			t.Errorf("%v: %q, want %q", c.err, got, c.want)
		}
	}
}
