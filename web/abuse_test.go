package web

import (
	"errors"
	"io"
	"net"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorilla/websocket"
)

func heapInuse() uint64 {
	runtime.GC()
	runtime.GC() // sync.Pool contents (net/http's bufio pools) survive one GC
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapInuse
}

// 2000 connections trickle their headers (slowloris): ReadHeaderTimeout
// closes every one of them, memory stays bounded while they are held and
// returns afterwards, and another client is served meanwhile.
func TestSlowlorisConnections(t *testing.T) {
	const n = 2000
	needFiles(t, 2*n+200)
	ts := startServer(t, Config{ReadHeaderTimeout: 500 * time.Millisecond})
	addr := strings.TrimPrefix(ts.base, "http://")
	baseHeap, baseG := heapInuse(), runtime.NumGoroutine()
	conns := make([]net.Conn, 0, n)
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	start := time.Now()
	for range n {
		c, err := net.DialTimeout("tcp", addr, 5*time.Second)
		if err != nil {
			t.Fatalf("dial %d: %v", len(conns), err)
		}
		conns = append(conns, c)
		if _, err := io.WriteString(c, "GET /api/shortPolling HTTP/1.1\r\nHost: x\r\n"); err != nil {
			t.Fatal(err)
		}
	}
	// trickle one more header line on every connection
	for _, c := range conns {
		_, _ = io.WriteString(c, "X-Slow: 1\r\n")
	}
	held := heapInuse()
	t.Logf("%d connections opened in %v; heap %.1f MiB -> %.1f MiB (%.1f KiB per connection)",
		n, time.Since(start), float64(baseHeap)/(1<<20), float64(held)/(1<<20), float64(held-min(held, baseHeap))/n/1024)
	if grow := held - min(held, baseHeap); grow > 64<<20 {
		t.Errorf("heap grew by %d MiB for %d idle connections", grow>>20, n)
	}
	// another client is served while they are held
	if code, _, _ := ts.get(t, "/healthz"); code != 200 {
		t.Errorf("healthz during the flood: %d", code)
	}
	// every slow connection is closed by the server
	var wg sync.WaitGroup
	var mu sync.Mutex
	var open int
	for _, c := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = c.SetReadDeadline(time.Now().Add(15 * time.Second))
			_, err := io.Copy(io.Discard, c) // returns at EOF (closed by the server)
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				mu.Lock()
				open++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if open > 0 {
		t.Fatalf("%d of %d slow connections still open after 15s", open, n)
	}
	t.Logf("all closed %v after the first dial", time.Since(start))
	for _, c := range conns {
		c.Close()
	}
	conns = conns[:0]
	waitFor(t, 10*time.Second, "goroutines and open connections back to baseline", func() bool {
		return runtime.NumGoroutine() <= baseG+5 && ts.Stats().ConnsOpen <= 1
	})
	if after := heapInuse(); after > baseHeap+8<<20 {
		t.Errorf("heap %.1f MiB after the flood, %.1f MiB before", float64(after)/(1<<20), float64(baseHeap)/(1<<20))
	}
}

// Beyond MaxConns, new connections are closed at accept and counted; the
// server serves again once the flood is gone.
func TestConnectionFlood(t *testing.T) {
	ts := startServer(t, Config{MaxConns: 20, ReadHeaderTimeout: 10 * time.Second})
	addr := strings.TrimPrefix(ts.base, "http://")
	var conns []net.Conn
	for range 100 {
		c, err := net.DialTimeout("tcp", addr, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
	}
	waitFor(t, 5*time.Second, "refusals counted", func() bool { return ts.Stats().ConnsRefused == 80 })
	if st := ts.Stats(); st.ConnsOpen != 20 {
		t.Errorf("open %d", st.ConnsOpen)
	}
	for _, c := range conns {
		c.Close()
	}
	waitFor(t, 5*time.Second, "connections released", func() bool { return ts.Stats().ConnsOpen == 0 })
	if code, _, _ := ts.get(t, "/healthz"); code != 200 {
		t.Errorf("after the flood: %d", code)
	}
	_, _, m := ts.get(t, "/metrics")
	if !strings.Contains(string(m), "edgegw_web_connections_refused_total 80\n") {
		t.Error("refusals not in /metrics")
	}
}

// A WebSocket client that sends garbage or a huge frame is closed with a
// code and reason, and counted; others keep their stream.
func TestWebSocketGarbageAndHugeFrames(t *testing.T) {
	ts := startServer(t, Config{WSReadLimit: 1024})
	good := dialWS(t, ts.wsURL, nil)
	mustFrame(t, good)
	cases := []struct {
		name   string
		typ    int
		data   []byte
		code   int
		reason string
	}{
		// a masked text frame header announcing 64 KiB, no payload: refused on the header
		{"huge", -1, []byte{0x81, 0x80 | 127, 0, 0, 0, 0, 0, 1, 0, 0, 1, 2, 3, 4}, websocket.CloseMessageTooBig, ""},
		{"garbage text", websocket.TextMessage, []byte("\x00\xff not json"), websocket.CloseInvalidFramePayloadData, "bad message"},
		{"binary", websocket.BinaryMessage, []byte{1, 2, 3}, websocket.CloseInvalidFramePayloadData, "bad message"},
		{"negative", websocket.TextMessage, []byte(`{"lastSequence":-1}`), websocket.CloseInvalidFramePayloadData, "non-negative"},
	}
	for i, c := range cases {
		ws := dialWS(t, ts.wsURL, nil)
		mustFrame(t, ws)
		var err error
		if c.typ < 0 {
			_, err = ws.NetConn().Write(c.data)
		} else {
			err = ws.WriteMessage(c.typ, c.data)
		}
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		_, _, err = func() (int, []byte, error) {
			_ = ws.SetReadDeadline(time.Now().Add(5 * time.Second))
			for {
				typ, b, err := ws.ReadMessage()
				if err != nil {
					return typ, b, err
				}
			}
		}()
		var ce *websocket.CloseError
		if !errors.As(err, &ce) || ce.Code != c.code || !strings.Contains(ce.Text, c.reason) {
			t.Errorf("%s: %v, want close %d %q", c.name, err, c.code, c.reason)
		}
		waitFor(t, 5*time.Second, "bad message counted", func() bool { return ts.Stats().WSBadMessages == uint64(i+1) })
	}
	appendBatch(t, ts.ring, "d", 1, 1)
	if f := mustFrame(t, good); f.Type != "samples" {
		t.Errorf("the good client: %+v", f)
	}
	_, _, m := ts.get(t, "/metrics")
	if !strings.Contains(string(m), "edgegw_web_ws_bad_messages_total 4\n") {
		t.Error("bad messages not in /metrics")
	}
}
