package web

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"edgegw/internal/testenv"

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
	testenv.Wait(t, 30*time.Second, "the slow connections' reads (15 s deadline each)", wg.Wait)
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

// clientFrom is an HTTP client whose connections leave from the loopback
// address src (127.0.0.0/8 is all loopback on Linux): another client IP
// for the rate limiter.
func clientFrom(src string) *http.Client {
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: 5 * time.Second}
	return &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{DialContext: d.DialContext, MaxIdleConnsPerHost: 64}}
}

func status(t testing.TB, c *http.Client, url string, set func(*http.Request)) (int, http.Header) {
	req, _ := http.NewRequest("GET", url, nil)
	if set != nil {
		set(req)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Errorf("GET %s: %v", url, err)
		return 0, nil
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, resp.Header
}

// A right password costs one PBKDF2 per cache period; repeating a wrong
// one costs one too; the cache holds verdicts, not passwords.
func TestBasicVerdictCache(t *testing.T) {
	hash, err := HashPassword("right", 2000)
	if err != nil {
		t.Fatal(err)
	}
	ts := startServer(t, Config{BasicAuthUser: "op", BasicAuthHash: hash,
		RateLimit: RateLimits{ExemptLoopback: true}})
	for range 50 {
		if r := ts.getWith(t, "/api/status", withBasic("op", "right")); r.StatusCode != 200 {
			t.Fatalf("right password: %d", r.StatusCode)
		}
	}
	for range 20 {
		if r := ts.getWith(t, "/api/status", withBasic("op", "wrong")); r.StatusCode != 401 {
			t.Fatalf("wrong password: %d", r.StatusCode)
		}
	}
	if st := ts.Stats(); st.PasswordHashes != 2 || st.AuthFailures != 20 {
		t.Fatalf("70 requests, 2 distinct credentials: %d hashes, %d failures", st.PasswordHashes, st.AuthFailures)
	}
	// Expired verdicts are hashed again.
	b := ts.basic
	d := b.digest("op", "right")
	if ok, found := b.lookup(d, time.Now().Add(goodTTL+time.Second)); found || ok {
		t.Error("a verdict outlives goodTTL")
	}
	// Bounded: a full map of wrong verdicts makes room, the right one stays.
	now := time.Now()
	for i := range verdictsMax + 10 {
		b.remember(b.digest("op", strconv.Itoa(i)), false, now)
	}
	if len(b.verdicts) > verdictsMax {
		t.Fatalf("%d verdicts", len(b.verdicts))
	}
}

// The budget of CPU time for hashing: positive balance lets work start,
// what it took is charged, refill at share per second.
func TestCPUBudget(t *testing.T) {
	c := cpuBudget{share: 0.1, max: time.Second, bal: time.Second}
	now := time.Now()
	if c.take(now) != 0 {
		t.Fatal("full budget refused")
	}
	c.charge(1500 * time.Millisecond)
	wait := c.take(now)
	if wait < 5*time.Second || wait > 5*time.Second+10*time.Millisecond {
		t.Fatalf("500ms in debt at 10%%: wait %v, want 5s", wait)
	}
	if c.take(now.Add(wait)) != 0 {
		t.Fatal("refused after the wait")
	}
	if c.take(now.Add(time.Hour)); c.bal != time.Second {
		t.Fatalf("balance above max: %v", c.bal)
	}
}

// A flood of wrong passwords (random ones, so the cache cannot help) from
// one address: 429s come at once, PBKDF2 runs only as often as the auth
// bucket allows, and a user at another address who logged in before is
// served throughout (from the verdict cache).
func TestWrongPasswordFlood(t *testing.T) {
	hash, err := HashPassword("right", DefaultHashIterations)
	if err != nil {
		t.Fatal(err)
	}
	ts := startServer(t, Config{BasicAuthUser: "op", BasicAuthHash: hash,
		RateLimit: RateLimits{Auth: Rate{PerSec: 1, Burst: 3}, Hold: 100 * time.Millisecond}})
	user := clientFrom("127.0.0.2")
	if code, _ := status(t, user, ts.base+"/api/status", withBasic("op", "right")); code != 200 {
		t.Fatalf("user: %d", code)
	}
	const workers, dur = 20, 2 * time.Second
	var mu sync.Mutex
	codes := map[int]int{}
	var first429 time.Duration
	before429 := 0 // flood answers other than 429 received before the first 429
	start := time.Now()
	var wg sync.WaitGroup
	flood := clientFrom("127.0.0.3")
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; time.Since(start) < dur; i++ {
				code, hdr := status(t, flood, ts.base+"/api/status", withBasic("op", fmt.Sprintf("guess-%d-%d", w, i)))
				mu.Lock()
				codes[code]++
				if code != 429 && first429 == 0 {
					before429++
				}
				if code == 429 && first429 == 0 {
					first429 = time.Since(start)
					if hdr.Get("Retry-After") == "" {
						t.Error("429 without Retry-After")
					}
				}
				mu.Unlock()
			}
		}()
	}
	userOK := 0
	pace := time.NewTicker(100 * time.Millisecond) // a page polling at 10/s: under its read limit
	defer pace.Stop()
	for ; time.Since(start) < dur; <-pace.C {
		if code, _ := status(t, user, ts.base+"/api/status", withBasic("op", "right")); code == 200 {
			userOK++
		} else {
			t.Errorf("user during the flood: %d", code)
		}
	}
	testenv.Wait(t, time.Minute, "the flood's workers", wg.Wait)
	elapsed := time.Since(start)
	st := ts.Stats()
	t.Logf("%v: codes %v, first 429 after %v, %d hashes, user served %d times", elapsed.Round(time.Millisecond), codes, first429, st.PasswordHashes, userOK)
	// 429s come at once: before the first, no more answers than the burst
	// and what the bucket refilled until then allow (first429 is stamped
	// when the client reads it, after the server decided: the bound only
	// grows when the machine is slow).
	if max := 3 + int(first429.Seconds()) + 1; codes[429] == 0 || before429 > max {
		t.Errorf("429s: %d, first after %v and %d other answers (want at most %d)", codes[429], first429, before429, max)
	}
	// 1 for the user; the flood: burst 3 + 1/s (+1 for rounding).
	if max := uint64(1 + 3 + int(elapsed.Seconds()) + 1); st.PasswordHashes > max {
		t.Errorf("%d PBKDF2 runs in %v, want at most %d", st.PasswordHashes, elapsed, max)
	}
	if userOK == 0 {
		t.Error("the user was never served")
	}
}

// Many addresses cannot buy more hashing than the gateway-wide budget:
// one verification at a time, HashCPU of one core.
func TestHashBudgetAcrossAddresses(t *testing.T) {
	hash, err := HashPassword("right", DefaultHashIterations)
	if err != nil {
		t.Fatal(err)
	}
	ts := startServer(t, Config{BasicAuthUser: "op", BasicAuthHash: hash,
		RateLimit: RateLimits{Hold: -1, HashCPU: 0.05}})
	const addrs = 40
	start := time.Now()
	var wg sync.WaitGroup
	var refused atomic.Int64
	for a := range addrs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := clientFrom(fmt.Sprintf("127.0.%d.%d", 10+a/200, 10+a%200))
			for i := range 3 { // within each address's auth burst
				if code, _ := status(t, c, ts.base+"/api/status", withBasic("op", fmt.Sprintf("g%d-%d", a, i))); code == 429 {
					refused.Add(1)
				}
			}
		}()
	}
	testenv.Wait(t, time.Minute, "the guessing addresses", wg.Wait)
	elapsed := time.Since(start)
	st := ts.Stats()
	t.Logf("%d addresses × 3 guesses in %v: %d hashes, %d refused (hash %d)", addrs, elapsed.Round(time.Millisecond), st.PasswordHashes, refused.Load(), st.HashRefused)
	if st.HashRefused == 0 || refused.Load() == 0 {
		t.Fatal("no request refused for want of hashing budget")
	}
	// The budget: 1 s saved + 5% of the elapsed time, plus the one that may
	// start on a last positive balance. Each hash took at least the
	// quickest one; bound the count by what that would allow, generously.
	if st.PasswordHashes+st.HashRefused+uint64(st.RateLimitedAuth) < addrs*3 {
		t.Errorf("requests unaccounted: %+v", st)
	}
	if st.PasswordHashes >= addrs*3 {
		t.Errorf("every guess was hashed (%d)", st.PasswordHashes)
	}
}
