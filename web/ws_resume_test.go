package web

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"edgegw/ringstore"

	"github.com/gorilla/websocket"
)

// fillRing appends polls of 10 devices × 10 tags until the ring holds n
// (a snapshot of 100 tags).
func fillRing(t *testing.T, ring *ringstore.Ring, n int) (first uint64) {
	t.Helper()
	for i := 0; i < n/10; i++ {
		f, _ := appendBatch(t, ring, fmt.Sprintf("logger-%02d", i%10), 10, float64(i))
		if i == 0 {
			first = f
		}
	}
	return first
}

// A resume from the start of a full ring comes in messages of at most
// WSChunk samples, every sample once and in order, and the live frames
// follow without a duplicate; nothing stays counted as queued.
func TestWebSocketResumeInChunks(t *testing.T) {
	ring := newRing(t, 2000)
	ts := startServer(t, Config{Ring: ring, WSChunk: 64})
	first := fillRing(t, ring, 2000)
	last := ring.Seq()
	c := dialWS(t, ts.wsURL, nil)
	if f := mustFrame(t, c); f.Type != "snapshot" || f.Seq != last {
		t.Fatalf("first frame: %+v", f)
	}
	if err := c.WriteJSON(map[string]uint64{"lastSequence": first - 1}); err != nil {
		t.Fatal(err)
	}
	chk := seqChecker{next: first}
	msgs := 0
	for chk.next <= last {
		f := mustFrame(t, c)
		if f.Type != "samples" || len(f.Samples) == 0 || len(f.Samples) > 64 || f.Seq != f.Samples[len(f.Samples)-1].Seq {
			t.Fatalf("resume message %d: type %q, %d samples, seq %d", msgs, f.Type, len(f.Samples), f.Seq)
		}
		if err := chk.add(f.Samples); err != nil {
			t.Fatalf("resume message %d: %v", msgs, err)
		}
		msgs++
	}
	if msgs < 2000/64 {
		t.Fatalf("2000 samples came in %d messages, want at least %d", msgs, 2000/64)
	}
	_, live := appendBatch(t, ring, "logger-01", 5, 1)
	for chk.next <= live {
		if err := chk.add(mustFrame(t, c).Samples); err != nil {
			t.Fatalf("live after the resume: %v", err)
		}
	}
	waitFor(t, 5*time.Second, "no bytes counted as queued", func() bool { return ts.Stats().WSQueuedBytes == 0 })
}

// slowTail is a ring whose messages (~600 KB, a full ring of the field
// config) are more than a client that does not read takes in its socket
// buffers (its 4 KiB receive buffer and the server's WSSendBuffer of 64 KiB,
// doubled by Linux): its writer blocks. Without WSSendBuffer Linux grows
// the send buffer towards tcp_wmem's 4 MiB and takes the whole tail (the
// test below then fails: nothing is ever counted as queued).
const slowTail = 5760

// wsUpgradeRaw upgrades a raw connection with a small receive buffer and
// sends {"lastSequence":n} in a masked frame; it then never reads.
func wsUpgradeRaw(t *testing.T, ts *testServer, n uint64) net.Conn {
	t.Helper()
	host := strings.TrimPrefix(ts.base, "http://")
	raw := rawConn(t, host, 4096)
	fmt.Fprintf(raw, "GET /api/ws HTTP/1.1\r\nHost: %s\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"+
		"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n", host)
	_ = raw.SetReadDeadline(time.Now().Add(10 * time.Second))
	line, err := bufio.NewReader(raw).ReadString('\n') // the status line only; then never read again
	if err != nil || !strings.Contains(line, "101") {
		t.Fatalf("hand upgrade: %q %v", line, err)
	}
	msg, _ := json.Marshal(map[string]uint64{"lastSequence": n})
	mask := [4]byte{1, 2, 3, 4}
	frame := append([]byte{0x81, 0x80 | byte(len(msg))}, mask[:]...) // FIN + text, masked, len < 126
	for i, b := range msg {
		frame = append(frame, b^mask[i%4])
	}
	if _, err := raw.Write(frame); err != nil {
		t.Fatal(err)
	}
	return raw
}

// A client that resumes from the start of a full ring and does not read
// holds one chunk while its write is blocked, never the whole tail: the
// bytes counted as queued stay within one pooled buffer, the client is
// dropped when the write times out (counted as write_timeout), and the
// count goes back to 0.
func TestWebSocketSlowResumeHoldsOneChunk(t *testing.T) {
	ring := newRing(t, slowTail)
	ts := startServer(t, Config{Ring: ring, WSWriteTimeout: 2 * time.Second})
	first := fillRing(t, ring, slowTail)
	wsUpgradeRaw(t, ts, first-1)
	waitFor(t, 10*time.Second, "a blocked write counted as queued", func() bool { return ts.Stats().WSQueuedBytes > 0 })
	if q := ts.Stats().WSQueuedBytes; q > maxPooled {
		t.Fatalf("%d bytes queued for one slow client, want at most one message (%d)", q, maxPooled)
	}
	waitFor(t, 20*time.Second, "the slow client dropped", func() bool { return ts.Stats().WSDropped == 1 })
	st := ts.Stats()
	if st.WSDroppedBy.WriteTimeout != 1 {
		t.Fatalf("dropped by %+v, want one write_timeout", st.WSDroppedBy)
	}
	waitFor(t, 5*time.Second, "nothing counted as queued", func() bool { return ts.Stats().WSQueuedBytes == 0 })
	_, _, m := ts.get(t, "/metrics")
	if !strings.Contains(string(m), `edgegw_web_ws_dropped_total{reason="write_timeout"} 1`+"\n") ||
		!strings.Contains(string(m), "edgegw_web_ws_queue_budget_bytes 8.388608e+06\n") {
		t.Error("the drop's reason or the budget not in /metrics")
	}
}

// A slow resuming client holds one chunk (128 samples, ~13 KiB here) of a
// 16 KiB budget: another client, whose snapshot (100 tags, ~10 KiB) would
// pass it, is closed with 1013 and counted as queue_budget, while a client
// already connected keeps every live sample. Once the slow one is dropped,
// the budget is free and a new client is served.
func TestWebSocketQueueBudget(t *testing.T) {
	ring := newRing(t, slowTail)
	const budget = 16 << 10
	ts := startServer(t, Config{Ring: ring, WSWriteTimeout: 3 * time.Second, WSQueueBudget: budget})
	first := fillRing(t, ring, slowTail)
	good := dialWS(t, ts.wsURL, nil)
	mustFrame(t, good)
	waitFor(t, 5*time.Second, "the good client registered", func() bool { return ts.hub.count() == 1 })
	wsUpgradeRaw(t, ts, first-1)
	waitFor(t, 10*time.Second, "a blocked chunk counted", func() bool { return ts.Stats().WSQueuedBytes >= 8<<10 })

	// Between two chunks the slow client holds nothing for a moment (the
	// chunk before was written, the next not yet encoded): a snapshot that
	// lands there fits and is served, rightly. So a few tries, each once
	// the blocked chunk is counted again; one must be refused.
	d := websocket.Dialer{HandshakeTimeout: 10 * time.Second}
	var err error
	for try := 0; ; try++ {
		waitFor(t, 10*time.Second, "a blocked chunk counted", func() bool { return ts.Stats().WSQueuedBytes >= 8<<10 })
		third, _, derr := d.Dial(ts.wsURL, nil)
		if derr != nil {
			t.Fatal(derr)
		}
		_, err = readFrame(third, 10*time.Second)
		third.Close()
		var ce *websocket.CloseError
		if errors.As(err, &ce) && ce.Code == websocket.CloseTryAgainLater {
			break
		}
		if err != nil || try == 4 {
			t.Fatalf("third client over the budget (try %d): %v, want close 1013", try+1, err)
		}
	}
	if q := ts.Stats().WSQueuedBytes; q > budget {
		t.Fatalf("%d bytes queued, over the budget of %d", q, budget)
	}
	chk := seqChecker{next: ring.Seq() + 1}
	_, live := appendBatch(t, ring, "logger-01", 5, 1)
	for chk.next <= live {
		if err := chk.add(mustFrame(t, good).Samples); err != nil {
			t.Fatalf("the good client: %v", err)
		}
	}
	waitFor(t, 20*time.Second, "the slow client dropped", func() bool { return ts.Stats().WSDroppedBy.WriteTimeout == 1 })
	if by := ts.Stats().WSDroppedBy; by.QueueBudget != 1 || ts.Stats().WSDropped != 2 {
		t.Fatalf("dropped by %+v, want 1 queue_budget and 1 write_timeout", by)
	}
	waitFor(t, 5*time.Second, "the budget free", func() bool { return ts.Stats().WSQueuedBytes == 0 })
	late := dialWS(t, ts.wsURL, nil)
	if f := mustFrame(t, late); f.Type != "snapshot" {
		t.Fatalf("a client after the drops: %+v", f)
	}
	_, _, b := ts.get(t, "/api/status")
	var st struct {
		Clients struct {
			WSDropBy WSDrops `json:"ws_dropped_by"`
			Budget   int64   `json:"ws_queue_budget_bytes"`
		}
	}
	if err := json.Unmarshal(b, &st); err != nil || st.Clients.WSDropBy.QueueBudget != 1 || st.Clients.Budget != budget {
		t.Fatalf("/api/status clients: %s (%v)", b, err)
	}
}
