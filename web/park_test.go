package web

import (
	"bufio"
	"crypto/tls"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"
)

// pollConn is a client of our own on one kept-alive connection: it holds
// no goroutine, so runtime.NumGoroutine counts the server's alone.
type pollConn struct {
	c net.Conn
	r *bufio.Reader
}

func dialPoll(t testing.TB, addr string) *pollConn {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &pollConn{c: c, r: bufio.NewReader(c)}
}

func (p *pollConn) send(t testing.TB, after uint64, header string) {
	t.Helper()
	req := "GET /api/longPolling?lastSequence=" + strconv.FormatUint(after, 10) + " HTTP/1.1\r\nHost: gw\r\n" + header + "\r\n"
	if _, err := io.WriteString(p.c, req); err != nil {
		t.Fatal(err)
	}
}

// reply reads one response; body is its whole body.
func (p *pollConn) reply(t testing.TB) (*http.Response, []byte) {
	t.Helper()
	_ = p.c.SetReadDeadline(time.Now().Add(20 * time.Second))
	resp, err := http.ReadResponse(p.r, nil)
	if err != nil {
		t.Fatalf("reading a long poll's reply: %v", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("reading a long poll's body: %v", err)
	}
	return resp, b
}

func decodeLong(t testing.TB, b []byte) longReply {
	t.Helper()
	var r longReply
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatalf("long poll body %q: %v", b, err)
	}
	return r
}

func addrOf(ts *testServer) string { return strings.TrimPrefix(ts.base, "http://") }

// Waiting long polls hold no goroutine of the server's: they are parked,
// answered when the ring has something newer, and their connections kept
// alive for the next poll. The parked reply is the bytes a handler writes.
func TestParkedLongPollsHoldNoGoroutine(t *testing.T) {
	ts := startServer(t, Config{LongPollTimeout: time.Minute})
	const n = 100
	seq := ts.ring.Seq()
	base := runtime.NumGoroutine()
	conns := make([]*pollConn, n)
	for i := range conns {
		conns[i] = dialPoll(t, addrOf(ts))
		conns[i].send(t, seq, "")
	}
	waitFor(t, 10*time.Second, "the long polls to wait", func() bool { return ts.Stats().LongPolling.Active == n })
	// A handler that waits holds two goroutines (its own and net/http's
	// background read); a parked poll none.
	waitFor(t, 10*time.Second, "the waiting polls to hold no goroutine", func() bool { return runtime.NumGoroutine() < base+n/10 })

	for round := range 2 {
		_, last := appendBatch(t, ts.ring, "logger-01", 2, float64(round))
		code, _, want := ts.get(t, "/api/longPolling?lastSequence="+strconv.FormatUint(seq, 10)) // answered at once, by the handler
		if code != 200 {
			t.Fatalf("a long poll answered at once: %d", code)
		}
		for i, p := range conns {
			resp, b := p.reply(t)
			if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/json" ||
				resp.Header.Get("Cache-Control") != "no-store" || resp.ContentLength != int64(len(b)) ||
				resp.Header.Get("Date") == "" || resp.Close {
				t.Fatalf("round %d conn %d: %s %v close=%v", round, i, resp.Status, resp.Header, resp.Close)
			}
			if string(b) != string(want) {
				t.Fatalf("round %d conn %d: parked reply %q, the handler's %q", round, i, b, want)
			}
			if r := decodeLong(t, b); r.Seq != last || len(r.Samples) != 2 {
				t.Fatalf("round %d conn %d: %+v", round, i, r)
			}
			p.send(t, last, "") // the same connection, kept alive
		}
		seq = last
		waitFor(t, 10*time.Second, "the next polls to wait", func() bool { return ts.Stats().LongPolling.Active == n })
	}
	st := ts.Stats()
	if st.LongPolling.Served != 2*n+2 || st.LongPollsGone != 0 || st.LongPollsNotKept != 0 || st.ConnsOpen != n+1 {
		t.Errorf("stats: served %d (want %d), gone %d, not kept %d, conns %d (want %d)",
			st.LongPolling.Served, 2*n+2, st.LongPollsGone, st.LongPollsNotKept, st.ConnsOpen, n+1)
	}
	// Connections given back and idle do not hold up a shutdown: net/http
	// counts them as new, and would wait 5 s for each.
	appendBatch(t, ts.ring, "logger-01", 1, 0)
	for _, p := range conns {
		p.reply(t) // and no next poll
	}
	t0 := time.Now()
	ts.stop()
	if el := time.Since(t0); el > 3*time.Second {
		t.Errorf("shutdown took %v with kept-alive connections given back", el)
	}
	for i, p := range conns {
		_ = p.c.SetReadDeadline(time.Now().Add(10 * time.Second))
		if _, err := p.r.Read(make([]byte, 1)); err != io.EOF {
			t.Fatalf("conn %d after shutdown: %v, want EOF", i, err)
		}
	}
}

// A parked reply carries the headers set before the handler (CORS), and a
// request that came with the next one pipelined is answered with
// Connection: close.
func TestParkedLongPollHeadersAndPipelining(t *testing.T) {
	ts := startServer(t, Config{LongPollTimeout: time.Minute, AllowedOrigins: []string{"http://hmi.example"}})
	seq := ts.ring.Seq()
	cors := dialPoll(t, addrOf(ts))
	cors.send(t, seq, "Origin: http://hmi.example\r\n")
	piped := dialPoll(t, addrOf(ts))
	req := "GET /api/longPolling?lastSequence=" + strconv.FormatUint(seq, 10) + " HTTP/1.1\r\nHost: gw\r\n\r\n"
	if _, err := io.WriteString(piped.c, req+req); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "both polls to wait", func() bool { return ts.Stats().LongPolling.Active == 2 })
	appendBatch(t, ts.ring, "logger-01", 1, 1)
	resp, _ := cors.reply(t)
	if resp.Header.Get("Access-Control-Allow-Origin") != "http://hmi.example" || resp.Header.Get("Vary") != "Origin" || resp.Close {
		t.Errorf("parked reply to a cross origin: %v close=%v", resp.Header, resp.Close)
	}
	resp, b := piped.reply(t)
	if resp.StatusCode != 200 || !resp.Close || len(decodeLong(t, b).Samples) != 1 {
		t.Errorf("pipelined: %s close=%v %s", resp.Status, resp.Close, b)
	}
	_ = piped.c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if n, err := piped.r.Read(make([]byte, 1)); err != io.EOF {
		t.Errorf("after Connection: close: read %d, %v; want EOF", n, err)
	}
}

// A parked poll whose client closes is found by the sweep: its count and
// its slot are given back and it is counted.
func TestParkedLongPollClientGone(t *testing.T) {
	ts := startServer(t, Config{LongPollTimeout: time.Minute, RateLimit: RateLimits{ConnsPerClient: 4, Hold: -1}})
	seq := ts.ring.Seq()
	var held []*pollConn
	for range 4 {
		p := dialPoll(t, addrOf(ts))
		p.send(t, seq, "")
		held = append(held, p)
	}
	waitFor(t, 10*time.Second, "4 waiting polls", func() bool { return ts.Stats().LongPolling.Active == 4 })
	extra := dialPoll(t, addrOf(ts))
	extra.send(t, seq, "")
	if resp, _ := extra.reply(t); resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("a fifth poll of the client: %s, want 429", resp.Status)
	}
	for _, p := range held {
		_ = p.c.Close()
	}
	waitFor(t, 10*time.Second, "the closed polls to be found", func() bool {
		st := ts.Stats()
		return st.LongPolling.Active == 0 && st.LongPollsGone == 4
	})
	extra.send(t, seq, "")
	waitFor(t, 10*time.Second, "a new poll of the client to wait", func() bool { return ts.Stats().LongPolling.Active == 1 })
	if st := ts.Stats(); st.ConnsOpen != 1 {
		t.Errorf("%d connections open, want 1", st.ConnsOpen)
	}
}

// A client that sends more while its poll is parked (the next request, a
// TLS close_notify) is answered at once with nothing new, and net/http
// reads what it sent.
func TestParkedLongPollClientSpeaks(t *testing.T) {
	ts := startServer(t, Config{LongPollTimeout: time.Minute})
	seq := ts.ring.Seq()
	p := dialPoll(t, addrOf(ts))
	p.send(t, seq, "")
	waitFor(t, 10*time.Second, "the poll to wait", func() bool { return ts.Stats().LongPolling.Active == 1 })
	p.send(t, seq, "") // while the first waits
	resp, b := p.reply(t)
	if r := decodeLong(t, b); resp.StatusCode != 200 || resp.Close || r.Seq != seq || len(r.Samples) != 0 {
		t.Fatalf("first reply: %s close=%v %+v", resp.Status, resp.Close, r)
	}
	waitFor(t, 10*time.Second, "the second poll to wait", func() bool { return ts.Stats().LongPolling.Active == 1 })
	_, last := appendBatch(t, ts.ring, "logger-01", 3, 1)
	if r := decodeLong(t, second(p.reply(t))); r.Seq != last || len(r.Samples) != 3 {
		t.Fatalf("second reply: %+v", r)
	}
}

func second[A, B any](_ A, b B) B { return b }

// A reply larger than the socket takes at once is finished by a writer of
// its own; the connection then serves the next poll.
func TestParkedLongPollLargeReply(t *testing.T) {
	ring := newRing(t, 40000)
	ts := startServer(t, Config{Ring: ring, LongPollTimeout: time.Minute})
	seq := ring.Seq()
	c := rawConn(t, addrOf(ts), 4096)
	p := &pollConn{c: c, r: bufio.NewReader(c)}
	p.send(t, seq, "")
	waitFor(t, 10*time.Second, "the poll to wait", func() bool { return ts.Stats().LongPolling.Active == 1 })
	_, last := appendBatch(t, ring, "logger-01", 30000, 0)
	resp, b := p.reply(t)
	if r := decodeLong(t, b); resp.StatusCode != 200 || r.Seq != last || len(r.Samples) != 30000 {
		t.Fatalf("large reply: %s, %d bytes, seq %d, %d samples", resp.Status, len(b), r.Seq, len(r.Samples))
	}
	if len(b) < 1<<20 {
		t.Fatalf("the reply is %d bytes: too small to test a write that waits", len(b))
	}
	p.send(t, last, "")
	waitFor(t, 10*time.Second, "the next poll to wait", func() bool { return ts.Stats().LongPolling.Active == 1 })
	appendBatch(t, ring, "logger-01", 1, 0)
	if r := decodeLong(t, second(p.reply(t))); len(r.Samples) != 1 {
		t.Fatalf("next reply: %+v", r)
	}
}

// Over TLS: parked, answered and kept alive the same way.
func TestParkedLongPollTLS(t *testing.T) {
	certFile, keyFile, pool := selfSigned(t)
	ts := startServer(t, Config{TLSCertFile: certFile, TLSKeyFile: keyFile, LongPollTimeout: time.Minute})
	c, err := tls.Dial("tcp", addrOf(ts), &tls.Config{RootCAs: pool, ServerName: "127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	p := &pollConn{c: c, r: bufio.NewReader(c)}
	seq := ts.ring.Seq()
	for i := range 3 {
		p.send(t, seq, "")
		waitFor(t, 10*time.Second, "the poll to wait", func() bool { return ts.Stats().LongPolling.Active == 1 })
		_, last := appendBatch(t, ts.ring, "logger-01", 1, float64(i))
		resp, b := p.reply(t)
		if r := decodeLong(t, b); resp.StatusCode != 200 || resp.Close || r.Seq != last || len(r.Samples) != 1 {
			t.Fatalf("TLS poll %d: %s close=%v %+v", i, resp.Status, resp.Close, r)
		}
		seq = last
	}
	if st := ts.Stats(); st.ConnsOpen != 1 {
		t.Errorf("%d connections open: the TLS one was not kept alive", st.ConnsOpen)
	}
}
