package web

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"edgegw/internal/testenv"
	"edgegw/ringstore"

	"github.com/gorilla/websocket"
)

func TestShortPolling(t *testing.T) {
	ts := startServer(t, Config{})
	start := ts.ring.Seq()

	code, h, b := ts.get(t, "/api/shortPolling")
	if code != 200 || h.Get("Content-Type") != "application/json" {
		t.Fatalf("empty ring: %d %q", code, h.Get("Content-Type"))
	}
	if want := `{"seq":` + itoa(start) + `,"epoch":"` + ringstore.FormatEpoch(ts.ring.Epoch()) + `","tags":[]}` + "\n"; string(b) != want {
		t.Fatalf("empty ring: got %s, want %s", b, want)
	}

	appendBatch(t, ts.ring, "logger-02", 2, 10)
	appendBatch(t, ts.ring, "logger-01", 2, 20)
	_, last := appendBatch(t, ts.ring, "logger-02", 2, 30) // newer values of logger-02

	_, _, b = ts.get(t, "/api/shortPolling")
	var r struct {
		Seq  uint64             `json:"seq"`
		Tags []ringstore.Sample `json:"tags"`
	}
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatal(err)
	}
	if r.Seq != last || len(r.Tags) != 4 {
		t.Fatalf("got seq %d and %d tags, want %d and 4: %s", r.Seq, len(r.Tags), last, b)
	}
	want := []struct {
		dev, tag string
		v        float64
	}{{"logger-01", "t00", 20}, {"logger-01", "t01", 21}, {"logger-02", "t00", 30}, {"logger-02", "t01", 31}}
	for i, w := range want {
		g := r.Tags[i]
		if g.Device != w.dev || g.Tag != w.tag || g.Value != w.v {
			t.Errorf("tag %d: got %s/%s=%v, want %s/%s=%v", i, g.Device, g.Tag, g.Value, w.dev, w.tag, w.v)
		}
	}

	// Encoded once per snapshot: the same bytes until the next append.
	b1, b2 := ts.shortBody(), ts.shortBody()
	if &b1[0] != &b2[0] {
		t.Error("shortPolling body re-encoded for an unchanged snapshot")
	}
	appendBatch(t, ts.ring, "logger-01", 2, 40)
	if b3 := ts.shortBody(); &b3[0] == &b1[0] || !strings.Contains(string(b3), `"value":40`) {
		t.Errorf("shortPolling body not renewed after an append: %s", b3)
	}
}

func itoa(n uint64) string { b, _ := json.Marshal(n); return string(b) }

func TestLongPollingImmediateAndOrder(t *testing.T) {
	ts := startServer(t, Config{LongPollTimeout: 5 * time.Second})
	start := ts.ring.Seq()
	for i := range 5 {
		appendBatch(t, ts.ring, "logger-01", 3, float64(i))
	}
	r := ts.longPoll(t, start)
	chk := seqChecker{next: start + 1}
	if err := chk.add(r.Samples); err != nil || r.Reset || chk.n != 15 || r.Seq != start+15 {
		t.Fatalf("got %d samples seq %d reset %v (%v), want 15 up to %d", len(r.Samples), r.Seq, r.Reset, err, start+15)
	}
	// From the middle: only what is newer.
	r = ts.longPoll(t, start+10)
	chk = seqChecker{next: start + 11}
	if err := chk.add(r.Samples); err != nil || chk.n != 5 {
		t.Fatalf("from the middle: %d samples, %v", len(r.Samples), err)
	}
}

func TestLongPollingWaitsAndWakes(t *testing.T) {
	ts := startServer(t, Config{LongPollTimeout: 20 * time.Second})
	start := ts.ring.Seq()
	got := make(chan longReply, 1)
	go func() {
		resp, err := ts.client.Get(ts.base + "/api/longPolling?lastSequence=" + itoa(start))
		var r longReply
		if err == nil {
			err = json.NewDecoder(resp.Body).Decode(&r)
			resp.Body.Close()
		}
		if err != nil {
			r.Error = err.Error()
		}
		got <- r
	}()
	waitFor(t, 5*time.Second, "the long poll to wait", func() bool { return ts.Stats().LongPolling.Active == 1 })
	select {
	case r := <-got:
		t.Fatalf("returned before any append: %+v", r)
	default:
	}
	appendBatch(t, ts.ring, "logger-01", 2, 1)
	select {
	case r := <-got:
		if r.Error != "" || len(r.Samples) != 2 || r.Samples[0].Seq != start+1 || r.Seq != start+2 {
			t.Fatalf("woken reply: %+v", r)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("long poll not woken by an append")
	}
}

func TestLongPollingTimeoutReturnsEmpty(t *testing.T) {
	ts := startServer(t, Config{LongPollTimeout: 150 * time.Millisecond})
	appendBatch(t, ts.ring, "logger-01", 2, 1)
	seq := ts.ring.Seq()
	t0 := time.Now()
	r := ts.longPoll(t, seq)
	if len(r.Samples) != 0 || r.Reset || r.Seq != seq {
		t.Fatalf("timeout reply: %+v", r)
	}
	if el := time.Since(t0); el < 150*time.Millisecond {
		t.Fatalf("returned after %v, before the timeout", el)
	}
	if b := string(mustGet(t, ts, "/api/longPolling?lastSequence="+itoa(seq))); !strings.Contains(b, `"samples":[]`) {
		t.Fatalf("empty list must be [] (not null): %s", b)
	}
}

func mustGet(t *testing.T, ts *testServer, path string) []byte {
	t.Helper()
	code, _, b := ts.get(t, path)
	if code != 200 {
		t.Fatalf("GET %s: %d %s", path, code, b)
	}
	return b
}

func TestLongPollingReset(t *testing.T) {
	ring := newRing(t, 10)
	ts := startServer(t, Config{Ring: ring, LongPollTimeout: 5 * time.Second})
	first, _ := appendBatch(t, ring, "logger-01", 4, 0)
	for i := range 5 {
		appendBatch(t, ring, "logger-01", 4, float64(10*i))
	}
	last := ring.Seq()
	for _, tc := range []struct {
		name  string
		after uint64
	}{{"fell out of the ring", first}, {"ahead of the gateway", last + 1000}} {
		r := ts.longPoll(t, tc.after)
		if !r.Reset || r.Seq != last || len(r.Samples) != 4 {
			t.Errorf("%s: got reset=%v seq=%d %d samples, want reset with the 4-tag snapshot at %d", tc.name, r.Reset, r.Seq, len(r.Samples), last)
		}
	}
	// The oldest sample still in the ring is last-9: asking from last-10 is not a reset.
	r := ts.longPoll(t, last-10)
	if r.Reset || len(r.Samples) != 10 {
		t.Errorf("edge of the ring: reset=%v %d samples, want 10", r.Reset, len(r.Samples))
	}
}

func TestLongPollingBadParameter(t *testing.T) {
	ts := startServer(t, Config{})
	for _, q := range []string{"", "?lastSequence=", "?lastSequence=abc", "?lastSequence=-1", "?lastSequence=1.5",
		"?lastSequence=99999999999999999999999", "?last=3",
		// 10 KB of bytes that quote to four characters each: the message
		// repeats 64 of them and says how long the value was.
		"?lastSequence=" + strings.Repeat("%CE", 10000)} {
		code, h, b := ts.get(t, "/api/longPolling"+q)
		var e struct {
			Error string `json:"error"`
		}
		if code != http.StatusBadRequest || h.Get("Content-Type") != "application/json" ||
			json.Unmarshal(b, &e) != nil || !strings.Contains(e.Error, "lastSequence") {
			t.Errorf("%.80q: got %d %.300s, want 400 naming lastSequence", q, code, b)
		}
		if len(e.Error) > 400 {
			t.Errorf("%.80q: a %d-byte message", q, len(e.Error))
		}
	}
	if _, _, b := ts.get(t, "/api/longPolling?lastSequence="+strings.Repeat("%CE", 10000)); !strings.Contains(string(b), `... (10000 bytes) is not a non-negative integer`) {
		t.Errorf("a long value: %.400s", b)
	}
}

func TestQuoteInput(t *testing.T) {
	for in, want := range map[string]string{
		"x":                           `"x"`,
		strings.Repeat("a", 64):       `"` + strings.Repeat("a", 64) + `"`,
		strings.Repeat("a", 65):       `"` + strings.Repeat("a", 64) + `"... (65 bytes)`,
		strings.Repeat("é", 40):       `"` + strings.Repeat("é", 32) + `"... (80 bytes)`,
		"a" + strings.Repeat("é", 40): `"a` + strings.Repeat("é", 31) + `"... (81 bytes)`,
	} {
		if got := quoteInput(in); got != want {
			t.Errorf("%.20q...: got %s, want %s", in, got, want)
		}
	}
}

func TestLongPollingClientGoneEndsWait(t *testing.T) {
	ts := startServer(t, Config{LongPollTimeout: time.Minute})
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		req, _ := http.NewRequestWithContext(ctx, "GET", ts.base+"/api/longPolling?lastSequence="+itoa(ts.ring.Seq()), nil)
		resp, err := ts.client.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		errc <- err
	}()
	waitFor(t, 5*time.Second, "the long poll to wait", func() bool { return ts.Stats().LongPolling.Active == 1 })
	cancel()
	if err := testenv.Recv(t, errc, 10*time.Second, "the cancelled long poll's request to return"); err == nil {
		t.Fatal("request succeeded after cancel")
	}
	waitFor(t, 5*time.Second, "the server to end the wait", func() bool { return ts.Stats().LongPolling.Active == 0 })
}

func TestShutdownReturnsLongPolls(t *testing.T) {
	ts := startServer(t, Config{LongPollTimeout: time.Minute})
	seq := ts.ring.Seq()
	const n = 20
	got := make(chan longReply, n)
	for range n {
		go func() {
			var r longReply
			resp, err := ts.client.Get(ts.base + "/api/longPolling?lastSequence=" + itoa(seq))
			if err == nil {
				err = json.NewDecoder(resp.Body).Decode(&r)
				resp.Body.Close()
			}
			if err != nil {
				r.Error = err.Error()
			}
			got <- r
		}()
	}
	waitFor(t, 5*time.Second, "the long polls to wait", func() bool { return ts.Stats().LongPolling.Active == n })
	t0 := time.Now()
	ts.stop()
	for range n {
		r := testenv.Recv(t, got, 10*time.Second, "a long poll's reply at shutdown")
		if r.Error != "" || len(r.Samples) != 0 || r.Seq != seq {
			t.Errorf("long poll at shutdown: %+v", r)
		}
	}
	if el := time.Since(t0); el > 3*time.Second {
		t.Errorf("shutdown took %v with waiting long polls", el)
	}
}

func TestMaxClients(t *testing.T) {
	ts := startServer(t, Config{MaxClients: 2, LongPollTimeout: time.Minute})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan struct{}, 2)
	for range 2 {
		go func() {
			defer func() { done <- struct{}{} }()
			req, _ := http.NewRequestWithContext(ctx, "GET", ts.base+"/api/longPolling?lastSequence="+itoa(ts.ring.Seq()), nil)
			if resp, err := ts.client.Do(req); err == nil {
				resp.Body.Close()
			}
		}()
	}
	waitFor(t, 5*time.Second, "2 waiting long polls", func() bool { return ts.Stats().LongPolling.Active == 2 })
	code, h, b := ts.get(t, "/api/longPolling?lastSequence=0")
	if code != http.StatusServiceUnavailable || h.Get("Retry-After") != "1" || !strings.Contains(string(b), "longPolling") {
		t.Fatalf("third long poll: %d Retry-After=%q %s", code, h.Get("Retry-After"), b)
	}
	// Other methods have their own budget.
	if code, _, _ := ts.get(t, "/api/shortPolling"); code != 200 {
		t.Fatalf("short poll while long polls are full: %d", code)
	}
	c1, c2 := dialWS(t, ts.wsURL, nil), dialWS(t, ts.wsURL, nil)
	mustFrame(t, c1)
	mustFrame(t, c2)
	_, resp, err := (&websocket.Dialer{}).Dial(ts.wsURL, nil)
	if err == nil || resp == nil || resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") != "1" {
		t.Fatalf("third websocket: err=%v resp=%v", err, resp)
	}
	st := ts.Stats()
	if st.LongPolling.Rejected != 1 || st.WebSocket.Rejected != 1 || st.ShortPolling.Rejected != 0 {
		t.Fatalf("rejections: %+v", st)
	}
	cancel()
	for range 2 {
		testenv.Recv(t, done, 10*time.Second, "a cancelled long poll to return")
	}
}

func TestRequestTooLarge(t *testing.T) {
	ts := startServer(t, Config{MaxRequestBytes: 1024})
	// Headers beyond MaxHeaderBytes (plus net/http's 4 KiB slack): 431.
	req, _ := http.NewRequest("GET", ts.base+"/api/shortPolling", nil)
	req.Header.Set("X-Big", strings.Repeat("a", 16<<10))
	resp, err := ts.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
		t.Fatalf("big header: %d", resp.StatusCode)
	}
	// A body beyond MaxRequestBytes: 413, counted.
	req, _ = http.NewRequest("GET", ts.base+"/api/shortPolling", strings.NewReader(strings.Repeat("b", 4096)))
	resp, err = ts.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestEntityTooLarge || ts.Stats().TooLarge != 1 {
		t.Fatalf("big body: %d, counted %d", resp.StatusCode, ts.Stats().TooLarge)
	}
	// Wrong method: 405.
	resp, err = ts.client.Post(ts.base+"/api/shortPolling", "text/plain", strings.NewReader("x"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Fatalf("POST: %d", resp.StatusCode)
	}
}

func TestListenAddress(t *testing.T) {
	s := New(Config{Listen: "127.0.0.1:0", Ring: newRing(t, 10)})
	a, err := s.Listen()
	if err != nil {
		t.Fatal(err)
	}
	defer s.ln.Close()
	if p := a.(*net.TCPAddr).Port; p == 0 {
		t.Fatal("Listen returned port 0")
	}
	if s.cfg.WriteTimeout <= s.cfg.LongPollTimeout {
		t.Fatalf("write timeout %v not above long-poll timeout %v", s.cfg.WriteTimeout, s.cfg.LongPollTimeout)
	}
	s2 := New(Config{Ring: newRing(t, 10), LongPollTimeout: time.Minute, WriteTimeout: time.Second})
	if s2.cfg.WriteTimeout <= time.Minute {
		t.Fatalf("a write timeout below the long-poll timeout was kept: %v", s2.cfg.WriteTimeout)
	}
}
