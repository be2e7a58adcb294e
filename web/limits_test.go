package web

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"edgegw/internal/testenv"
	"edgegw/ringstore"

	"github.com/gorilla/websocket"
)

// defaultLimits is RateLimits with nothing changed: loopback limited like
// any client (startServer exempts loopback only for a zero RateLimits).
var defaultLimits = RateLimits{Hold: DefaultHold}

// host is one client machine: every connection comes from its address.
type host struct {
	ip     string
	client *http.Client
	tr     *http.Transport
	ws     *websocket.Dialer
}

func newHost(t testing.TB, ip string) *host {
	t.Helper()
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}, Timeout: 30 * time.Second}
	tr := &http.Transport{DialContext: d.DialContext, MaxIdleConnsPerHost: 2000, DisableCompression: true}
	h := &host{ip: ip, tr: tr, client: &http.Client{Transport: tr, Timeout: 60 * time.Second},
		ws: &websocket.Dialer{NetDialContext: d.DialContext, HandshakeTimeout: 30 * time.Second}}
	t.Cleanup(tr.CloseIdleConnections)
	return h
}

// get returns the status code of GET url (0 and the error when none came),
// reading the body to the end so that the connection is reused.
func (h *host) get(url string) (int, error) {
	resp, err := h.client.Get(url)
	if err != nil {
		return 0, err
	}
	_, err = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, err
}

// refusals sums every refusal the server counted.
func refusals(st ClientStats) uint64 {
	return st.RateLimitedPoll + st.RateLimitedRead + st.RateLimitedConnect + st.RateLimitedMonitor +
		st.RateLimitedWrite + st.RateLimitedAuth + st.HashRefused + st.ConnsPerClientLimited + st.Forbidden +
		st.ShortPolling.Rejected + st.LongPolling.Rejected + st.WebSocket.Rejected + st.ConnsRefused
}

// feed appends a batch every interval until the test ends.
func feed(t *testing.T, ts *testServer, interval time.Duration) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(interval)
		defer tick.Stop()
		for i := 0; ; i++ {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				batch := make([]ringstore.Sample, 3)
				for k := range batch {
					batch[k] = ringstore.Sample{Device: "logger-01", Tag: fmt.Sprintf("t%02d", k), Value: float64(i + k), TS: time.Now().UnixMicro()}
				}
				if _, _, err := ts.ring.Append(batch); err != nil {
					t.Error(err)
					return
				}
			}
		}
	}()
	t.Cleanup(func() { cancel(); testenv.Closed(t, done, 10*time.Second, "the feeder's end") })
}

// wsClients connects n WebSocket clients from h in parallel (at most 50
// dials at once), reads each one's snapshot, then reads every frame until
// the test ends. It returns the conns and the number of dials refused.
func wsClients(t *testing.T, ts *testServer, h *host, n int, frames *atomic.Int64) (conns []*websocket.Conn, refused map[int]int) {
	t.Helper()
	var (
		mu  sync.Mutex
		wg  sync.WaitGroup
		sem = make(chan struct{}, 50)
	)
	refused = map[int]int{}
	for range n {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			c, resp, err := h.ws.Dial(ts.wsURL, nil)
			if err != nil {
				code := 0
				if resp != nil {
					code = resp.StatusCode
				}
				mu.Lock()
				refused[code]++
				mu.Unlock()
				return
			}
			if f, err := readFrame(c, 30*time.Second); err != nil || f.Type != "snapshot" {
				t.Errorf("first frame %+v: %v", f, err)
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}()
	}
	wg.Wait()
	var rwg sync.WaitGroup
	for _, c := range conns {
		rwg.Add(1)
		go func() {
			defer rwg.Done()
			for {
				if _, _, err := c.ReadMessage(); err != nil {
					return
				}
				frames.Add(1)
			}
		}()
	}
	t.Cleanup(func() {
		for _, c := range conns {
			c.Close()
		}
		rwg.Wait()
	})
	return conns, refused
}

// pollers runs n clients of h: long pollers (interval 0) or short pollers
// at one request per interval, until stop is closed. Each counts its
// replies in ok[i] and every reply that is not 200 in bad.
func pollers(t *testing.T, wg *sync.WaitGroup, stop <-chan struct{}, h *host, url string, n int, interval time.Duration, ok []atomic.Int64, bad *atomic.Int64) {
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var tick <-chan time.Time
			if interval > 0 {
				tk := time.NewTicker(interval)
				defer tk.Stop()
				tick = tk.C
			}
			last := uint64(0)
			for {
				select {
				case <-stop:
					return
				default:
				}
				u := url
				if interval == 0 {
					u += "?lastSequence=" + strconv.FormatUint(last, 10)
				}
				resp, err := h.client.Get(u)
				if err != nil {
					t.Errorf("%s: %v", url, err)
					bad.Add(1)
					return
				}
				var r longReply
				if interval == 0 && resp.StatusCode == http.StatusOK {
					err = json.NewDecoder(resp.Body).Decode(&r)
				} else {
					_, err = io.Copy(io.Discard, resp.Body)
				}
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK || err != nil {
					bad.Add(1)
					t.Errorf("%s from %s: HTTP %d %v", url, h.ip, resp.StatusCode, err)
					return
				}
				ok[i].Add(1)
				last = r.Seq
				if tick != nil {
					select {
					case <-stop:
						return
					case <-tick:
					}
				}
			}
		}()
	}
}

// load is nLong long pollers and nShort short pollers at 10 Hz from one
// host, running until end.
type load struct {
	wg              sync.WaitGroup
	stop            chan struct{}
	once            sync.Once
	longOK, shortOK []atomic.Int64
	bad             atomic.Int64 // replies not 200
}

func startLoad(t *testing.T, ts *testServer, h *host, nLong, nShort int) *load {
	l := &load{stop: make(chan struct{}), longOK: make([]atomic.Int64, nLong), shortOK: make([]atomic.Int64, nShort)}
	t.Cleanup(l.end)
	pollers(t, &l.wg, l.stop, h, ts.base+"/api/longPolling", nLong, 0, l.longOK, &l.bad)
	pollers(t, &l.wg, l.stop, h, ts.base+"/api/shortPolling", nShort, 100*time.Millisecond, l.shortOK, &l.bad)
	return l
}

// end stops every client of the load (and the flood's, which share wg) and waits for them.
func (l *load) end() {
	l.once.Do(func() { close(l.stop) })
	l.wg.Wait()
}

func sum(v []atomic.Int64) (n int64) {
	for i := range v {
		n += v[i].Load()
	}
	return n
}

func minOf(v []atomic.Int64) int64 {
	m := int64(1 << 62)
	for i := range v {
		m = min(m, v[i].Load())
	}
	return m
}

// The default limits serve the SCADA benchmark's load from one host: 1000
// WebSocket clients all connected, and then 100 long pollers and 50 short
// pollers at 10 Hz beside them, 0 refused. (Before: 40 of 100 and 46 of
// 1000 WebSocket clients served, the rest refused with 429 at upgrade.)
func TestDefaultLimitsServeOneHost(t *testing.T) {
	if testing.Short() {
		t.Skip("-short")
	}
	const nWS, nLong, nShort = 1000, 100, 50
	needFiles(t, 2*(nWS+nLong+nShort)+200)
	ts := startServer(t, Config{Ring: newRing(t, 5000), RateLimit: defaultLimits, LongPollTimeout: 5 * time.Second})
	h := newHost(t, "127.0.0.1")
	var frames atomic.Int64
	conns, refused := wsClients(t, ts, h, nWS, &frames)
	if len(conns) != nWS {
		t.Fatalf("%d of %d WebSocket clients connected; refused by HTTP status: %v", len(conns), nWS, refused)
	}
	waitFor(t, 30*time.Second, "1000 WebSocket clients in the hub", func() bool { return ts.hub.count() == nWS })
	// Batches at 2 Hz: enough for the long pollers, and the 1000 readers
	// keep up on a loaded machine (the hub drops a client that does not).
	feed(t, ts, 500*time.Millisecond)

	l := startLoad(t, ts, h, nLong, nShort)
	// Bounded by counts: every short poller 20 replies (2 s at 10 Hz), every
	// long poller 5 (one a batch), whatever the machine's speed.
	waitFor(t, 120*time.Second, "20 short polls and 5 long polls by every poller", func() bool {
		return l.bad.Load() > 0 || minOf(l.shortOK) >= 20 && minOf(l.longOK) >= 5
	})
	l.end()
	st := ts.Stats()
	if n := refusals(st); n != 0 || l.bad.Load() != 0 {
		t.Errorf("refused: %d counted by the server, %d replies not 200: %+v", n, l.bad.Load(), st)
	}
	// A client that cannot keep up is dropped (the slow-client policy, not
	// a limit); every other one is still connected.
	if st.WebSocket.Active+int64(st.WSDropped) != nWS {
		t.Errorf("%d WebSocket clients connected at the end and %d dropped, want %d in all", st.WebSocket.Active, st.WSDropped, nWS)
	}
	t.Logf("one host, default limits: %d/%d WebSocket clients connected (%d frames read, %d dropped); %d long pollers: %d replies; %d short pollers at 10 Hz: %d replies; refused 0",
		len(conns), nWS, frames.Load(), st.WSDropped, nLong, sum(l.longOK), nShort, sum(l.shortOK))
}

// A flood of 50 clients hammering shortPolling with no pause, from another
// host, is limited (at most burst + rate × time served) and counted, while
// the first host's WebSocket clients, long pollers and 10 Hz short pollers
// are served with nothing refused.
func TestDefaultLimitsFlood(t *testing.T) {
	if testing.Short() {
		t.Skip("-short")
	}
	const nWS, nLong, nShort, nFlood = 100, 20, 50, 50
	needFiles(t, 2*(nWS+nLong+nShort+nFlood)+200)
	ts := startServer(t, Config{Ring: newRing(t, 5000), RateLimit: defaultLimits, LongPollTimeout: 5 * time.Second})
	good, bad := newHost(t, "127.0.0.1"), newHost(t, "127.0.0.2")
	var frames atomic.Int64
	conns, refused := wsClients(t, ts, good, nWS, &frames)
	if len(conns) != nWS {
		t.Fatalf("%d of %d WebSocket clients connected; refused: %v", len(conns), nWS, refused)
	}
	feed(t, ts, 500*time.Millisecond)
	l := startLoad(t, ts, good, nLong, nShort)

	var served, limited, other, sent atomic.Int64
	framesAtFlood := frames.Load()
	longAtFlood, shortAtFlood := minOf(l.longOK), minOf(l.shortOK)
	t0 := time.Now()
	for range nFlood {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			for {
				select {
				case <-l.stop:
					return
				default:
				}
				sent.Add(1)
				code, err := bad.get(ts.base + "/api/shortPolling")
				switch {
				case err != nil:
					other.Add(1)
					return
				case code == http.StatusOK:
					served.Add(1)
				case code == http.StatusTooManyRequests:
					limited.Add(1)
				default:
					other.Add(1)
				}
			}
		}()
	}
	// Bounded by counts: the flood runs until it was refused 100 times or
	// sent 5000 requests (a machine too loaded to flood faster than the
	// limit sees no refusal: the bound below still holds), and every good
	// poller went on meanwhile.
	waitFor(t, 120*time.Second, "the flood refused 100 times or 5000 requests, while every good poller went on", func() bool {
		return l.bad.Load() > 0 || (limited.Load() >= 100 || sent.Load() >= 5000) && minOf(l.shortOK) >= shortAtFlood+10 && minOf(l.longOK) >= longAtFlood+3
	})
	l.end()
	elapsed := time.Since(t0)
	st := ts.Stats()
	if l.bad.Load() != 0 {
		t.Errorf("%d replies to the good host were not 200", l.bad.Load())
	}
	if other.Load() != 0 {
		t.Errorf("%d flood requests neither served nor refused with 429", other.Load())
	}
	// Every 429 the flood got is counted, and nothing else was refused.
	if st.RateLimitedPoll != uint64(limited.Load()) || refusals(st) != st.RateLimitedPoll {
		t.Errorf("flood got %d 429s; server counted poll %d, all refusals %d: %+v", limited.Load(), st.RateLimitedPoll, refusals(st), st)
	}
	// Limited: the token bucket let through at most its burst plus its rate
	// over the flood's time (elapsed is taken after the last reply).
	if max := float64(DefaultPollRate.Burst) + DefaultPollRate.PerSec*elapsed.Seconds(); float64(served.Load()) > max {
		t.Errorf("flood served %d in %v, more than the bucket allows (%.0f)", served.Load(), elapsed, max)
	}
	if frames.Load() <= framesAtFlood {
		t.Errorf("no WebSocket frame read during the flood")
	}
	if st.WebSocket.Active+int64(st.WSDropped) != nWS {
		t.Errorf("%d WebSocket clients connected at the end and %d dropped, want %d in all", st.WebSocket.Active, st.WSDropped, nWS)
	}
	t.Logf("flood from 127.0.0.2, %d clients for %v: %d served, %d refused (429, counted); good host: %d WebSocket (%d frames during the flood), %d long and %d short pollers, 0 refused",
		nFlood, elapsed.Round(time.Millisecond), served.Load(), limited.Load(), nWS, frames.Load()-framesAtFlood, nLong, nShort)
}

// A WebSocket or a waiting long poll holds one of its client's
// ConnsPerClient slots while open: beyond them 429 (counted), another
// client is not affected, and a closed connection frees its slot.
func TestConnsPerClient(t *testing.T) {
	ts := startServer(t, Config{RateLimit: RateLimits{ConnsPerClient: 3, Hold: -1}, LongPollTimeout: 10 * time.Second})
	a, b := newHost(t, "127.0.0.1"), newHost(t, "127.0.0.2")
	var held []*websocket.Conn
	for i := range 2 {
		c, _, err := a.ws.Dial(ts.wsURL, nil)
		if err != nil {
			t.Fatalf("ws %d: %v", i, err)
		}
		defer c.Close()
		held = append(held, c)
	}
	// The third slot: a waiting long poll.
	seq := ts.ring.Seq()
	longDone := make(chan int, 1)
	go func() {
		code, _ := a.get(ts.base + "/api/longPolling?lastSequence=" + strconv.FormatUint(seq, 10))
		longDone <- code
	}()
	waitFor(t, 10*time.Second, "the long poll waiting", func() bool { return ts.Stats().LongPolling.Active == 1 })
	if _, resp, err := a.ws.Dial(ts.wsURL, nil); err == nil || resp == nil || resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") != "1" {
		t.Fatalf("fourth connection: %v %+v", err, resp)
	}
	if code, _ := a.get(ts.base + "/api/longPolling?lastSequence=" + strconv.FormatUint(seq, 10)); code != http.StatusTooManyRequests {
		t.Fatalf("long poll beyond the slots: %d", code)
	}
	if code, _ := a.get(ts.base + "/api/shortPolling"); code != http.StatusOK {
		t.Fatalf("a short poll holds no slot: %d", code)
	}
	c, _, err := b.ws.Dial(ts.wsURL, nil)
	if err != nil {
		t.Fatalf("another client: %v", err)
	}
	c.Close()
	if got := ts.Stats().ConnsPerClientLimited; got != 2 {
		t.Errorf("counted %d, want 2", got)
	}
	appendBatch(t, ts.ring, "logger-01", 1, 1)
	if code := testenv.Recv(t, longDone, 10*time.Second, "the long poll's reply"); code != 200 {
		t.Errorf("long poll: %d", code)
	}
	held[0].Close()
	waitFor(t, 10*time.Second, "a slot freed by a closed WebSocket", func() bool {
		c, _, err := a.ws.Dial(ts.wsURL, nil)
		if err == nil {
			c.Close()
		}
		return err == nil
	})
}

// A long poll answered with the full snapshot (lastSequence out of the
// ring) takes a poll token like a short poll; one that waits takes none.
func TestLongPollSnapshotTakesPollToken(t *testing.T) {
	ts := startServer(t, Config{RateLimit: RateLimits{Poll: Rate{PerSec: 0.01, Burst: 1}, Hold: -1}, LongPollTimeout: 10 * time.Second})
	appendBatch(t, ts.ring, "logger-01", 2, 1)
	ahead := strconv.FormatUint(ts.ring.Seq()+100, 10) // ahead of the ring: a reset
	if code, _, b := ts.get(t, "/api/longPolling?lastSequence="+ahead); code != 200 {
		t.Fatalf("first snapshot: %d %s", code, b)
	}
	if code, _, _ := ts.get(t, "/api/longPolling?lastSequence="+ahead); code != 429 {
		t.Fatalf("second snapshot: %d, want 429", code)
	}
	for range 3 { // not a snapshot: no token
		if r := ts.longPoll(t, ts.ring.Seq()-1); r.Reset || len(r.Samples) != 1 {
			t.Fatalf("long poll %+v", r)
		}
	}
	if st := ts.Stats(); st.RateLimitedPoll != 1 {
		t.Errorf("poll refusals %d, want 1", st.RateLimitedPoll)
	}
}

// X-Forwarded-For: the rightmost address that is not a trusted proxy.
func TestForwardedClient(t *testing.T) {
	trusted := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("2001:db8::/32")}
	peer := netip.MustParseAddr("10.0.0.1")
	for _, tc := range []struct {
		hdr  []string
		want string
	}{
		{nil, "10.0.0.1"},
		{[]string{"192.0.2.7"}, "192.0.2.7"},
		{[]string{"198.51.100.1, 192.0.2.7"}, "192.0.2.7"},             // a client's own entry is left of what the proxy saw
		{[]string{"192.0.2.7, 10.0.0.9"}, "192.0.2.7"},                 // past a second trusted proxy
		{[]string{"198.51.100.1", "192.0.2.7 ,10.1.1.1"}, "192.0.2.7"}, // several headers, in order
		{[]string{"10.0.0.5, 10.0.0.9"}, "10.0.0.5"},                   // all trusted: the leftmost
		{[]string{"garbage, 10.0.0.9"}, "10.0.0.9"},                    // unparsable: stop at the last trusted hop
		{[]string{"192.0.2.7:4711"}, "192.0.2.7"},                      // with a port
		{[]string{"[2001:db8::5]:80, ::ffff:192.0.2.8"}, "192.0.2.8"},
		{[]string{"2001:db8::5"}, "2001:db8::5"},
		{[]string{" , 192.0.2.7,"}, "192.0.2.7"},
	} {
		if got := forwardedClient(peer, tc.hdr, trusted); got.String() != tc.want {
			t.Errorf("%q: %v, want %s", tc.hdr, got, tc.want)
		}
	}
}

// trusted_proxies: limits apply to each client behind the proxy, and a
// peer that is not trusted cannot choose its address by the header.
// allowed_networks: others get 403, counted, the real client checked.
func TestTrustedProxiesAndAllowedNetworks(t *testing.T) {
	ts := startServer(t, Config{RateLimit: RateLimits{Poll: Rate{PerSec: 0.01, Burst: 2}, Hold: -1},
		TrustedProxies:  []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")},
		AllowedNetworks: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/30"), netip.MustParsePrefix("192.0.2.0/24")}})
	proxy, other, outside := newHost(t, "127.0.0.1"), newHost(t, "127.0.0.2"), newHost(t, "127.0.0.5")
	get := func(h *host, xff string) int {
		t.Helper()
		code, _ := status(t, h.client, ts.base+"/api/shortPolling", func(r *http.Request) {
			if xff != "" {
				r.Header.Set("X-Forwarded-For", xff)
			}
		})
		return code
	}
	// Two clients behind the proxy: each has its own bucket.
	for _, xff := range []string{"192.0.2.7", "192.0.2.7", "192.0.2.8", "192.0.2.8"} {
		if code := get(proxy, xff); code != 200 {
			t.Fatalf("via proxy for %s: %d", xff, code)
		}
	}
	if code := get(proxy, "192.0.2.7"); code != 429 {
		t.Errorf("192.0.2.7's third poll: %d, want 429", code)
	}
	// An untrusted peer's header is ignored: its own bucket, whatever it claims.
	for i, want := range []int{200, 200, 429} {
		if code := get(other, fmt.Sprintf("192.0.2.%d", 100+i)); code != want {
			t.Errorf("untrusted peer poll %d: %d, want %d", i, code, want)
		}
	}
	// allowed_networks: 127.0.0.5 is outside, and so is a forwarded 203.0.113.9.
	if code := get(outside, ""); code != 403 {
		t.Errorf("outside peer: %d, want 403", code)
	}
	if code := get(proxy, "203.0.113.9"); code != 403 {
		t.Errorf("forwarded outside client: %d, want 403", code)
	}
	st := ts.Stats()
	if st.Forbidden != 2 || st.RateLimitedPoll != 2 {
		t.Errorf("forbidden %d (want 2), poll limited %d (want 2)", st.Forbidden, st.RateLimitedPoll)
	}
	var status struct {
		Refused struct {
			RateLimited struct {
				Poll uint64 `json:"poll"`
			} `json:"rate_limited"`
			Forbidden uint64 `json:"forbidden"`
		} `json:"refused"`
	}
	code, _, b := ts.get(t, "/api/status")
	if code != 200 || json.Unmarshal(b, &status) != nil || status.Refused.Forbidden != 2 || status.Refused.RateLimited.Poll != 2 {
		t.Errorf("/api/status refused: %d %s", code, b)
	}
	_, _, m := ts.get(t, "/metrics")
	for _, want := range []string{"edgegw_web_forbidden_total 2\n", `edgegw_web_rate_limited_total{class="poll"} 2` + "\n"} {
		if !strings.Contains(string(m), want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
}
