package web

import (
	"bufio"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"edgegw/internal/testenv"
	"edgegw/ringstore"

	"github.com/gorilla/websocket"
)

// A client gets a snapshot, then every later sample once, in order. The
// hub, idle while no client is connected, takes up the ring where it stands
// when it wakes for the first client; samples appended between the client's
// snapshot and that moment reach it with the hub's next frame (the writer
// catches up from the ring). So until the first live frame arrives the test
// appends a batch every 100 ms, as a logger would (bounded): it asserts
// order and completeness, not how soon an idle hub wakes on a loaded machine.
func TestWebSocketSnapshotThenLive(t *testing.T) {
	ts := startServer(t, Config{})
	appendBatch(t, ts.ring, "logger-01", 3, 1)
	snapSeq := ts.ring.Seq()
	c := dialWS(t, ts.wsURL, nil)
	f := mustFrame(t, c)
	if f.Type != "snapshot" || f.Reset || f.Seq != snapSeq || len(f.Samples) != 3 {
		t.Fatalf("first frame: %+v", f)
	}
	waitFor(t, 5*time.Second, "the hub to register the client", func() bool { return ts.hub.count() == 1 })
	frames, done := make(chan wsFrame), make(chan struct{})
	readErr := make(chan error, 1)
	go func() {
		for {
			f, err := readFrame(c, 20*time.Second)
			if err != nil {
				readErr <- err
				return
			}
			select {
			case frames <- f:
			case <-done:
				readErr <- nil
				return
			}
		}
	}()
	defer func() {
		close(done)
		c.Close()
		testenv.Recv(t, readErr, 10*time.Second, "the reading goroutine to end")
	}()
	chk := seqChecker{next: snapSeq + 1}
	for i := range 10 {
		appendBatch(t, ts.ring, "logger-01", 3, float64(i))
	}
	nudge := time.NewTicker(100 * time.Millisecond)
	defer nudge.Stop()
	nudges := 0
	for chk.n < 30 {
		select {
		case f := <-frames:
			if f.Type != "samples" || f.Seq != f.Samples[len(f.Samples)-1].Seq {
				t.Fatalf("live frame: %+v", f)
			}
			if err := chk.add(f.Samples); err != nil {
				t.Fatal(err)
			}
		case err := <-readErr:
			t.Fatalf("read frame after %d samples (%d nudges): %v", chk.n, nudges, err)
		case <-nudge.C:
			if chk.n > 0 {
				continue // the hub is live: what is missing is on its way
			}
			if nudges++; nudges > 100 {
				t.Fatalf("no live frame after %d appends", 10+nudges)
			}
			appendBatch(t, ts.ring, "logger-01", 3, 100+float64(nudges))
		}
	}
	if nudges > 0 {
		t.Logf("the hub woke after the appends: %d nudges", nudges)
	}
	// The counter moves after the write returns, possibly after the client read it.
	waitFor(t, 5*time.Second, "2 frames counted", func() bool { return ts.Stats().WSFramesSent >= 2 })
}

func TestWebSocketResume(t *testing.T) {
	ring := newRing(t, 20)
	ts := startServer(t, Config{Ring: ring})
	first, _ := appendBatch(t, ring, "logger-01", 4, 0)
	for i := range 3 {
		appendBatch(t, ring, "logger-01", 4, float64(i+1))
	}
	last := ring.Seq() // 16 samples in a ring of 20

	c := dialWS(t, ts.wsURL, nil)
	if f := mustFrame(t, c); f.Type != "snapshot" || f.Seq != last {
		t.Fatalf("first frame: %+v", f)
	}
	// Resume from inside the ring: exactly the samples after it, once.
	if err := c.WriteJSON(map[string]uint64{"lastSequence": first + 5}); err != nil {
		t.Fatal(err)
	}
	f := mustFrame(t, c)
	chk := seqChecker{next: first + 6}
	if err := chk.add(f.Samples); err != nil || f.Type != "samples" || f.Seq != last || chk.n != 10 {
		t.Fatalf("resume in ring: %+v (%v)", f, err)
	}
	// Live frames continue after the catch-up, without duplicates.
	appendBatch(t, ring, "logger-01", 4, 9)
	f = mustFrame(t, c)
	if err := chk.add(f.Samples); err != nil || chk.n != 14 {
		t.Fatalf("live after resume: %+v (%v)", f, err)
	}
	// Overflow the ring, then resume from a sequence that fell out: reset snapshot.
	for i := range 6 {
		_, last := appendBatch(t, ring, "logger-01", 4, float64(20+i))
		for chk.next <= last { // paced: the hub never falls a ring behind here
			if err := chk.add(mustFrame(t, c).Samples); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := c.WriteJSON(map[string]uint64{"lastSequence": first}); err != nil {
		t.Fatal(err)
	}
	f = mustFrame(t, c)
	if f.Type != "snapshot" || !f.Reset || f.Seq != ring.Seq() || len(f.Samples) != 4 {
		t.Fatalf("resume out of the ring: %+v", f)
	}
	// Ahead of the gateway: reset snapshot too.
	if err := c.WriteJSON(map[string]uint64{"lastSequence": ring.Seq() + 100}); err != nil {
		t.Fatal(err)
	}
	if f = mustFrame(t, c); f.Type != "snapshot" || !f.Reset {
		t.Fatalf("resume ahead: %+v", f)
	}
	// Up to date: nothing is sent; the next live frame follows without a gap.
	if err := c.WriteJSON(map[string]uint64{"lastSequence": ring.Seq()}); err != nil {
		t.Fatal(err)
	}
	next := ring.Seq() + 1
	appendBatch(t, ring, "logger-01", 4, 99)
	f = mustFrame(t, c)
	chk = seqChecker{next: next}
	if err := chk.add(f.Samples); err != nil || chk.n != 4 {
		t.Fatalf("after an up-to-date resume: %+v (%v)", f, err)
	}
}

func TestWebSocketBadMessageCloses(t *testing.T) {
	ts := startServer(t, Config{})
	for _, msg := range []string{`not json`, `{"lastSequence":-1}`, `{"other":1}`, `{"lastSequence":"x"}`} {
		c := dialWS(t, ts.wsURL, nil)
		mustFrame(t, c)
		if err := c.WriteMessage(websocket.TextMessage, []byte(msg)); err != nil {
			t.Fatal(err)
		}
		_, err := readFrame(c, 5*time.Second)
		var ce *websocket.CloseError
		if !errors.As(err, &ce) || ce.Code != websocket.CloseInvalidFramePayloadData || !strings.Contains(ce.Text, "bad message") {
			t.Errorf("%s: got %v, want close 1007 with a reason", msg, err)
		}
	}
	// Too big for WSReadLimit: closed too.
	c := dialWS(t, ts.wsURL, nil)
	mustFrame(t, c)
	_ = c.WriteMessage(websocket.TextMessage, []byte(`{"lastSequence":1,"pad":"`+strings.Repeat("x", 8<<10)+`"}`))
	if _, err := readFrame(c, 5*time.Second); err == nil {
		t.Error("an oversized message did not close the connection")
	}
}

func TestWebSocketOrigin(t *testing.T) {
	ts := startServer(t, Config{})
	hdr := func(o string) http.Header { return http.Header{"Origin": {o}} }
	// Same origin: accepted.
	c := dialWS(t, ts.wsURL, hdr(ts.base))
	mustFrame(t, c)
	// Cross origin: 403.
	_, resp, err := websocket.DefaultDialer.Dial(ts.wsURL, hdr("http://evil.example"))
	if err == nil || resp == nil || resp.StatusCode != http.StatusForbidden {
		t.Fatalf("cross-origin upgrade: err=%v resp=%v, want 403", err, resp)
	}

	ts2 := startServer(t, Config{AllowedOrigins: []string{"http://scada.example:8080"}})
	c = dialWS(t, ts2.wsURL, hdr("http://scada.example:8080"))
	mustFrame(t, c)
	_, resp, err = websocket.DefaultDialer.Dial(ts2.wsURL, hdr("http://other.example"))
	if err == nil || resp == nil || resp.StatusCode != http.StatusForbidden {
		t.Fatalf("origin not in the allow-list: err=%v resp=%v, want 403", err, resp)
	}
	// CORS on the JSON endpoints follows the same list.
	req, _ := http.NewRequest("GET", ts2.base+"/api/shortPolling", nil)
	req.Header.Set("Origin", "http://scada.example:8080")
	r, err := ts2.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	r.Body.Close()
	if r.Header.Get("Access-Control-Allow-Origin") != "http://scada.example:8080" {
		t.Fatalf("CORS header: %q", r.Header.Get("Access-Control-Allow-Origin"))
	}
}

// TestWebSocketWriterBookkeeping feeds one connection's queue by hand (no hub:
// the handler runs outside Serve) with frames out of order, duplicated, after
// a gap and partly overlapping: the client still sees every sample once, in order.
func TestWebSocketWriterBookkeeping(t *testing.T) {
	ring := newRing(t, 100)
	s := New(Config{Ring: ring})
	hs := httptest.NewServer(s.Handler())
	defer hs.Close()
	c := dialWS(t, "ws"+strings.TrimPrefix(hs.URL, "http")+"/api/ws", nil)
	snap := mustFrame(t, c)
	var cl *wsClient
	waitFor(t, 5*time.Second, "the client to register", func() bool {
		s.hub.mu.Lock()
		defer s.hub.mu.Unlock()
		for k := range s.hub.clients {
			cl = k
		}
		return cl != nil
	})
	take := func(from, to uint64) *frame { // samples [from, to] from the ring
		res := ring.Since(from-1, nil)
		var ss []ringstore.Sample
		for _, x := range res.Samples {
			if x.Seq <= to {
				ss = append(ss, x)
			}
		}
		f, err := newFrame(ss)
		if err != nil {
			t.Fatal(err)
		}
		return f
	}
	S := snap.Seq
	appendBatch(t, ring, "d", 3, 0) // S+1..S+3
	appendBatch(t, ring, "d", 3, 0) // S+4..S+6
	cl.queue <- take(S+4, S+6)      // gap: the writer catches up S+1..S+3 from the ring first
	cl.queue <- take(S+1, S+3)      // duplicate: skipped
	cl.queue <- take(S+4, S+6)      // duplicate: skipped
	appendBatch(t, ring, "d", 3, 0) // S+7..S+9
	cl.queue <- take(S+6, S+9)      // overlaps by one: only S+7..S+9
	appendBatch(t, ring, "d", 3, 0) // S+10..S+12
	cl.queue <- take(S+10, S+12)
	chk := seqChecker{next: S + 1}
	for chk.n < 12 {
		f := mustFrame(t, c)
		if err := chk.add(f.Samples); err != nil {
			t.Fatal(err)
		}
	}
	c.Close()
}

// TestSlowWebSocketClientDropped: a client that upgrades by hand and never
// reads fills its socket and then its queue; the hub drops it and counts it,
// and the other clients keep receiving every sample.
func TestSlowWebSocketClientDropped(t *testing.T) {
	ring := newRing(t, 1000)
	ts := startServer(t, Config{Ring: ring, WSQueue: 4, WSWriteTimeout: 2 * time.Second})
	raw := rawConn(t, strings.TrimPrefix(ts.base, "http://"), 4096)
	fmt.Fprintf(raw, "GET /api/ws HTTP/1.1\r\nHost: %s\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"+
		"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n", strings.TrimPrefix(ts.base, "http://"))
	_ = raw.SetReadDeadline(time.Now().Add(10 * time.Second))
	line, err := bufio.NewReader(raw).ReadString('\n') // the status line only; then never read again
	if err != nil || !strings.Contains(line, "101") {
		t.Fatalf("hand upgrade: %q %v", line, err)
	}
	const good = 3
	conns := make([]*websocket.Conn, good)
	for i := range conns {
		conns[i] = dialWS(t, ts.wsURL, nil)
		mustFrame(t, conns[i])
	}
	waitFor(t, 5*time.Second, "4 clients registered", func() bool { return ts.hub.count() == good+1 })

	start := ring.Seq()
	checkers := make([]seqChecker, good)
	for i := range checkers {
		checkers[i].next = start + 1
	}
	long := strings.Repeat("x", 200)
	// The bound is the batches (the socket and the queue fill); the time
	// limit only ends a test that hangs: a loaded machine paces slowly.
	deadline := time.Now().Add(2 * time.Minute)
	steps := 0
	for ts.Stats().WSDropped == 0 {
		if steps >= 3000 || time.Now().After(deadline) {
			t.Fatalf("slow client not dropped after %d batches", steps)
		}
		steps++
		batch := make([]ringstore.Sample, 40)
		for i := range batch {
			batch[i] = ringstore.Sample{Device: "logger-" + long, Tag: fmt.Sprintf("tag-%02d-%s", i, long), Value: float64(steps), TS: time.Now().UnixMicro()}
		}
		_, last, err := ring.Append(batch)
		if err != nil {
			t.Fatal(err)
		}
		// Pace on the good clients (a condition, not a sleep): they read every batch.
		for i, c := range conns {
			for checkers[i].next <= last {
				f := mustFrame(t, c)
				if err := checkers[i].add(f.Samples); err != nil {
					t.Fatalf("good client %d: %v", i, err)
				}
			}
		}
	}
	t.Logf("slow client dropped after %d batches of ~%d KiB", steps, 40*(2*len(long)+80)/1024)
	if d := ts.Stats().WSDropped; d != 1 {
		t.Fatalf("dropped %d clients, want 1", d)
	}
	// The others still receive everything.
	_, last := appendBatch(t, ring, "logger-01", 3, 1)
	for i, c := range conns {
		for checkers[i].next <= last {
			if err := checkers[i].add(mustFrame(t, c).Samples); err != nil {
				t.Fatalf("good client %d after the drop: %v", i, err)
			}
		}
	}
	waitFor(t, 10*time.Second, "the dropped connection to end", func() bool { return ts.Stats().WebSocket.Active == good })
}

// TestWebSocketHubFallsBehind appends faster than a tiny ring can hold: the
// hub may skip ahead. A client then gets either every sample or a reset
// snapshot, never a silent gap, and always reaches the ring's last sequence.
func TestWebSocketHubFallsBehind(t *testing.T) {
	ring := newRing(t, 4)
	ts := startServer(t, Config{Ring: ring})
	c := dialWS(t, ts.wsURL, nil)
	f := mustFrame(t, c)
	waitFor(t, 5*time.Second, "the hub to register the client", func() bool { return ts.hub.count() == 1 })
	chk := seqChecker{next: f.Seq + 1}
	for i := range 200 {
		appendBatch(t, ring, "d", 3, float64(i))
	}
	last := ring.Seq()
	resets := 0
	for chk.next <= last {
		f := mustFrame(t, c)
		switch {
		case f.Type == "snapshot" && f.Reset:
			resets++
			chk.next = f.Seq + 1
		case f.Type == "samples":
			if err := chk.add(f.Samples); err != nil {
				t.Fatal(err)
			}
		default:
			t.Fatalf("unexpected frame %+v", f)
		}
	}
	t.Logf("%d samples in order, %d reset snapshots", chk.n, resets)
}

func TestShutdownClosesWebSockets(t *testing.T) {
	ts := startServer(t, Config{})
	conns := make([]*websocket.Conn, 5)
	for i := range conns {
		conns[i] = dialWS(t, ts.wsURL, nil)
		mustFrame(t, conns[i])
	}
	t0 := time.Now()
	ts.stop()
	if el := time.Since(t0); el > 3*time.Second {
		t.Errorf("Serve took %v to return with 5 websocket clients", el)
	}
	for i, c := range conns {
		_, err := readFrame(c, 5*time.Second)
		var ce *websocket.CloseError
		if !errors.As(err, &ce) || ce.Code != websocket.CloseGoingAway {
			t.Errorf("client %d: got %v, want close 1001", i, err)
		}
	}
	// After shutdown: nothing listens.
	if _, _, err := websocket.DefaultDialer.Dial(ts.wsURL, nil); err == nil {
		t.Error("dial after shutdown succeeded")
	}
}

// TestWebSocketPingDeadline: a peer that never answers pings is closed after
// 2 pings + WSWriteTimeout (1.2 s here); a peer that reads (and so answers
// pings) stays. (The deadline is long enough that a loaded machine's
// delay of the reading peer's pong does not end it.)
func TestWebSocketPingDeadline(t *testing.T) {
	ts := startServer(t, Config{WSPingInterval: 100 * time.Millisecond, WSWriteTimeout: time.Second})
	host := strings.TrimPrefix(ts.base, "http://")
	raw := rawConn(t, host, 1<<16)
	fmt.Fprintf(raw, "GET /api/ws HTTP/1.1\r\nHost: %s\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"+
		"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n", host)
	_ = raw.SetReadDeadline(time.Now().Add(10 * time.Second))
	if line, err := bufio.NewReader(raw).ReadString('\n'); err != nil || !strings.Contains(line, "101") {
		t.Fatalf("hand upgrade: %q %v", line, err)
	}
	c := dialWS(t, ts.wsURL, nil)
	mustFrame(t, c)
	var pings atomic.Int64
	c.SetPingHandler(func(data string) error {
		pings.Add(1)
		return c.WriteControl(websocket.PongMessage, []byte(data), time.Now().Add(time.Second))
	})
	waitFor(t, 10*time.Second, "2 clients", func() bool { return ts.Stats().WebSocket.Active == 2 })
	// Read (no data frames come) until the silent one is closed: pings are
	// answered from inside ReadMessage.
	readErr := make(chan error, 1)
	go func() {
		_, err := readFrame(c, time.Minute)
		readErr <- err
	}()
	waitFor(t, 30*time.Second, "the silent client closed", func() bool { return ts.Stats().WebSocket.Active <= 1 })
	select {
	case err := <-readErr:
		t.Fatalf("the reading client ended: %v", err)
	default:
	}
	if n := pings.Load(); n < 1 {
		t.Errorf("%d pings before the silent client was closed (100 ms interval, 1.2 s deadline)", n)
	}
	if a := ts.Stats().WebSocket.Active; a != 1 {
		t.Errorf("%d websocket clients after the silent one closed, want 1 (the reading one kept)", a)
	}
	c.Close()
	testenv.Recv(t, readErr, 10*time.Second, "the reading client's read to end")
}

// TestSilentWebSocketClientDropped: a client that upgrades and then reads
// nothing at all, while the frames are small (field rates: the socket
// buffers never fill, the queue never fills). It never answers a ping, so
// its read deadline ends it: that is a slow client dropped too — counted in
// /metrics and logged once with its address (it used to end uncounted).
// A client that closes by itself is not counted.
// A client that joins an empty hub gets the batch appended after its
// snapshot, however late the hub goroutine wakes for it (a busy machine):
// the hub goes on from the ring's sequence taken before the snapshot. It
// went on from the ring's sequence when it woke, so a batch appended in
// between reached the client only with the next one.
func TestHubWakingLateKeepsTheNextBatch(t *testing.T) {
	ts := startServer(t, Config{})
	appended := make(chan struct{})
	woken := func() { // the hub wakes only once the test has appended
		select {
		case <-appended:
		case <-time.After(20 * time.Second):
		}
	}
	ts.hub.woken.Store(&woken)
	c := dialWS(t, ts.wsURL, nil)
	if f := mustFrame(t, c); f.Type != "snapshot" {
		t.Fatalf("first frame %q, want the snapshot", f.Type)
	}
	_, last := appendBatch(t, ts.ring, "logger-01", 2, 1)
	close(appended)
	f := mustFrame(t, c)
	if len(f.Samples) != 2 || f.Samples[1].Seq != last {
		t.Fatalf("frame after the snapshot: %+v, want the batch up to %d", f, last)
	}
}

func TestSilentWebSocketClientDropped(t *testing.T) {
	var logs testenv.Buffer
	ts := startServer(t, Config{WSPingInterval: 100 * time.Millisecond, WSWriteTimeout: 200 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	host := strings.TrimPrefix(ts.base, "http://")
	raw := rawConn(t, host, 1<<20)
	fmt.Fprintf(raw, "GET /api/ws HTTP/1.1\r\nHost: %s\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"+
		"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n", host)
	good := dialWS(t, ts.wsURL, nil)
	mustFrame(t, good)
	waitFor(t, 5*time.Second, "2 clients", func() bool { return ts.hub.count() == 2 })
	appendBatch(t, ts.ring, "logger-01", 2, 1) // a small frame each
	mustFrame(t, good)
	// The good client answers pings as long as it reads: keep it reading.
	readerDone := make(chan struct{})
	go func() {
		defer close(readerDone)
		for {
			if _, _, err := good.ReadMessage(); err != nil {
				return
			}
		}
	}()
	waitFor(t, 30*time.Second, "the silent client dropped", func() bool { return ts.Stats().WSDropped == 1 })
	waitFor(t, 5*time.Second, "one log line", func() bool { return strings.Contains(logs.String(), "dropped a slow websocket client") })
	line := logs.String()
	if n := strings.Count(line, "dropped a slow websocket client"); n != 1 || !strings.Contains(line, "remote="+raw.LocalAddr().String()) ||
		!strings.Contains(line, "reason=no_pong") {
		t.Fatalf("%d lines, want 1 with the address %s:\n%s", n, raw.LocalAddr(), line)
	}
	_, _, m := ts.get(t, "/metrics")
	if !strings.Contains(string(m), `edgegw_web_ws_dropped_total{reason="no_pong"} 1`+"\n") {
		t.Error("drop not in /metrics")
	}
	good.Close()
	testenv.Closed(t, readerDone, 10*time.Second, "the good client's reader to end")
	waitFor(t, 5*time.Second, "the good client gone", func() bool { return ts.Stats().WebSocket.Active == 0 })
	if d := ts.Stats().WSDropped; d != 1 {
		t.Fatalf("a client that closed by itself counted as dropped: %d", d)
	}
}
