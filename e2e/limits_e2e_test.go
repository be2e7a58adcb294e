package e2e

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"edgegw/internal/testenv"
)

// refusedJSON is /api/status's refused object.
type refusedJSON struct {
	RateLimited map[string]uint64 `json:"rate_limited"`
	ConnsPer    uint64            `json:"connections_per_client"`
	Forbidden   uint64            `json:"forbidden"`
	MaxClients  uint64            `json:"max_clients"`
	MaxConns    uint64            `json:"max_conns"`
}

func (r refusedJSON) total() (n uint64) {
	for _, v := range r.RateLimited {
		n += v
	}
	return n + r.ConnsPer + r.Forbidden + r.MaxClients + r.MaxConns
}

// The real binary on the default limits, 48 UDP loggers, every client from
// one host (127.0.0.1): 1000 WebSocket clients all connected; then 100 long
// pollers and 50 short pollers at 10 Hz beside them with 0 refused; then
// 50 clients from 127.0.0.2 hammer shortPolling with no pause: limited
// (at most burst + rate × time served) and every 429 counted, while the
// first host's clients are still served and no logger misses more than one
// poll window (the gateway's own counters). EDGEGW_LIMITS_BIN=/path runs
// it against another build for its figures only (the one before);
// EDGEGW_LIMITS_WS=N connects N WebSocket clients instead of 1000.
func TestDefaultLimitsE2E(t *testing.T) {
	if testing.Short() {
		t.Skip("-short")
	}
	gwBin := bin
	if b := os.Getenv("EDGEGW_LIMITS_BIN"); b != "" {
		gwBin = b
	}
	const nLong, nShort, nFlood = 100, 50, 50
	nWS := 1000
	if v := os.Getenv("EDGEGW_LIMITS_WS"); v != "" { // another count of WebSocket clients, for figures
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("EDGEGW_LIMITS_WS=%q: want a count", v)
		}
		nWS = n
	}
	testenv.NeedFiles(t, uint64(4*(nWS+nLong+nShort+nFlood)))
	addrs := simFleet(t, 48)
	gw, page := runFleetGateway(t, gwBin, "[http]\nlisten = \"127.0.0.1:0\"\nlong_poll_timeout = \"5s\"\n", addrs, time.Second, 0)
	wsURL := "ws" + strings.TrimPrefix(page, "http") + "api/ws"
	other := httpFrom("127.0.0.3") // the test's own questions: a client IP of their own
	status := func() (r refusedJSON) {
		waitFor(t, 20*time.Second, "/api/status", func() bool {
			var s struct{ Refused refusedJSON }
			err := getJSONWith(other, page+"api/status", "", "", &s)
			r = s.Refused
			return err == nil
		})
		return r
	}

	// 1000 WebSocket clients, 50 dials at once.
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.1")}, Timeout: 30 * time.Second}
	wsd := websocket.Dialer{NetDialContext: d.DialContext, HandshakeTimeout: 30 * time.Second}
	var (
		mu      sync.Mutex
		conns   []*websocket.Conn
		refused = map[int]int{}
		wg      sync.WaitGroup
		sem     = make(chan struct{}, 50)
	)
	for range nWS {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			c, resp, err := wsd.Dial(wsURL, nil)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				code := 0
				if resp != nil {
					code = resp.StatusCode
				}
				refused[code]++
				return
			}
			conns = append(conns, c)
		}()
	}
	wg.Wait()
	var frames atomic.Int64
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
	defer func() {
		for _, c := range conns {
			c.Close()
		}
		rwg.Wait()
	}()
	t.Logf("%d WebSocket clients from one host (binary %s): %d connected, refused by status %v", nWS, gwBin, len(conns), refused)

	// 100 long pollers and 50 short pollers at 10 Hz, until every short
	// poller has 30 replies.
	stop := make(chan struct{})
	var stopOnce sync.Once
	var pwg sync.WaitGroup
	end := func() { stopOnce.Do(func() { close(stop) }); pwg.Wait() }
	defer end()
	var longOK, shortOK, longBad, shortBad atomic.Int64
	// A request that gets no answer in time (a dial or a reply slower than
	// the client's timeout) is the machine's load, not a refusal: counted
	// apart and tried again. What the gateway answers is checked: every
	// answer is a 200, and the gateway counts no refusal.
	var slow atomic.Int64
	pollers := &http.Client{Timeout: time.Minute, Transport: &http.Transport{
		DialContext:         (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.1")}, Timeout: 30 * time.Second}).DialContext,
		MaxIdleConnsPerHost: 200}}
	shortDone := make([]atomic.Int64, nShort)
	poll := func(url string, interval time.Duration, ok, bad *atomic.Int64, mine *atomic.Int64) {
		defer pwg.Done()
		last := "0"
		var tick <-chan time.Time
		if interval > 0 {
			tk := time.NewTicker(interval)
			defer tk.Stop()
			tick = tk.C
		}
		for {
			select {
			case <-stop:
				return
			default:
			}
			u := url
			if interval == 0 {
				u += "?lastSequence=" + last
			}
			resp, err := pollers.Get(u)
			if err != nil {
				if slow.Add(1) <= 3 {
					t.Logf("%s: %v (no answer in time: the machine's load; tried again)", u, err)
				}
				continue
			}
			var r struct{ Seq uint64 }
			if resp.StatusCode == 200 && interval == 0 {
				err = json.NewDecoder(resp.Body).Decode(&r)
				last = fmt.Sprint(r.Seq)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == 200 && isTimeout(err) {
				if slow.Add(1) <= 3 {
					t.Logf("%s: %v (reply cut by the client's timeout: the machine's load; tried again)", u, err)
				}
				continue
			}
			if resp.StatusCode != 200 || err != nil {
				if bad.Add(1) == 1 && gwBin == bin {
					t.Errorf("%s: HTTP %d %v", u, resp.StatusCode, err)
				}
			} else {
				ok.Add(1)
				if mine != nil {
					mine.Add(1)
				}
			}
			if tick != nil {
				select {
				case <-stop:
					return
				case <-tick:
				}
			}
		}
	}
	for range nLong {
		pwg.Add(1)
		go poll(page+"api/longPolling", 0, &longOK, &longBad, nil)
	}
	for i := range nShort {
		pwg.Add(1)
		go poll(page+"api/shortPolling", 100*time.Millisecond, &shortOK, &shortBad, &shortDone[i])
	}
	minShort := func() int64 {
		m := int64(1 << 62)
		for i := range shortDone {
			m = min(m, shortDone[i].Load())
		}
		return m
	}
	mixedAt := time.Now()
	waitFor(t, 240*time.Second, "30 replies to every short poller", func() bool {
		return minShort() >= 30 || gwBin == bin && longBad.Load()+shortBad.Load() > 0 ||
			gwBin != bin && time.Since(mixedAt) > 30*time.Second // another build: 30 s of figures
	})
	mixed := status()
	t.Logf("mixed load from one host beside the WebSocket clients: %d long pollers %d replies, %d refused; %d short pollers at 10 Hz %d replies, %d refused; gateway counted %d refusals; %d requests without an answer in time (load, tried again)",
		nLong, longOK.Load(), longBad.Load(), nShort, shortOK.Load(), shortBad.Load(), mixed.total(), slow.Load())

	// The flood, from 127.0.0.2, while the first host's clients go on.
	devices := func() map[string]devCounts {
		m := map[string]devCounts{}
		waitFor(t, 20*time.Second, "/api/devices", func() bool {
			var d struct{ Devices []devCounts }
			if err := getJSONWith(other, page+"api/devices", "", "", &d); err != nil {
				return false
			}
			for _, x := range d.Devices {
				m[x.Name] = x
			}
			return true
		})
		return m
	}
	before := devices()
	flood := httpFrom("127.0.0.2")
	var served, limited, failed atomic.Int64
	framesAt, shortAt := frames.Load(), minShort()
	t0 := time.Now()
	var fwg sync.WaitGroup
	for range nFlood {
		fwg.Add(1)
		go func() {
			defer fwg.Done()
			for time.Since(t0) < 10*time.Second {
				resp, err := flood.Get(page + "api/shortPolling")
				if isTimeout(err) {
					slow.Add(1) // no answer in time: the machine's load
					continue
				} else if err != nil {
					failed.Add(1)
					continue
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				switch resp.StatusCode {
				case 200:
					served.Add(1)
				case 429:
					limited.Add(1)
				default:
					failed.Add(1)
				}
			}
		}()
	}
	fwg.Wait()
	elapsed := time.Since(t0)
	after := devices()
	polls, good, worst, worstDev := windows(before, after)
	flooded := status()
	shortAfter := minShort()
	end()
	t.Logf("flood of %d clients for %v: %d served, %d refused (429), %d failed, %d requests of all clients without an answer in time; gateway counted poll %d; meanwhile %d WebSocket frames read, every short poller +%d replies; valid sample rate %.2f%% (%d of %d polls), worst device %s missed %d windows",
		nFlood, elapsed.Round(time.Millisecond), served.Load(), limited.Load(), failed.Load(), slow.Load(), flooded.RateLimited["poll"]-mixed.RateLimited["poll"],
		frames.Load()-framesAt, shortAfter-shortAt, 100*float64(good)/float64(max(polls, 1)), good, polls, worstDev, worst)
	if gwBin != bin {
		return // a measurement of another build: figures only
	}
	if len(conns) != nWS {
		t.Errorf("%d of %d WebSocket clients connected (refused %v)", len(conns), nWS, refused)
	}
	if mixed.total() != 0 || longBad.Load()+shortBad.Load() != 0 {
		t.Errorf("mixed load refused: gateway %d (%+v), clients saw %d long and %d short", mixed.total(), mixed, longBad.Load(), shortBad.Load())
	}
	if flooded.RateLimited["poll"] != uint64(limited.Load()) || flooded.total() != flooded.RateLimited["poll"] || failed.Load() != 0 {
		t.Errorf("flood: %d 429s seen, %d failed; gateway counted %+v", limited.Load(), failed.Load(), flooded)
	}
	if max := 1000 + 1000*elapsed.Seconds(); float64(served.Load()) > max {
		t.Errorf("flood served %d in %v: more than the poll bucket allows (%.0f)", served.Load(), elapsed, max)
	}
	if shortAfter <= shortAt || frames.Load() <= framesAt {
		t.Errorf("the first host's clients were not served during the flood: short +%d, frames +%d", shortAfter-shortAt, frames.Load()-framesAt)
	}
	if worst > 1 {
		t.Errorf("device %s missed %d windows during the flood (at most 1 allowed)", worstDev, worst)
	}
	gw.Stop(os.Interrupt, 10*time.Second)
}

// The page on the default limits, against a 48-logger demo: its trends
// come from one /api/trends request, so filling them is never refused
// (before: 12–16 429s while the page filled 96 trends a request each).
func TestPageTrendsWithinLimits(t *testing.T) {
	testenv.Need(t, "chromium")
	_, page := startDemo(t, "-devices", "48", "-interval", "500ms", "-upstream=false", "-data-dir", t.TempDir())
	waitFor(t, 30*time.Second, "history of logger-48", func() bool {
		var h historyJSON
		return getJSON(t, page+"api/history?device=logger-48&tag=humidity&from="+fmt.Sprint(time.Now().Add(-time.Minute).UnixMicro()), &h) == nil && len(h.TS) >= 4
	})
	b := testenv.StartBrowser(t, page, 1280, 900)
	b.WaitJS(30*time.Second, "every trend filled from the history",
		`document.querySelectorAll('tr[data-hist-points]').length === 96 && [...document.querySelectorAll('tr[data-hist-points]')].every(r => +r.dataset.histPoints >= 4)`,
		`document.querySelectorAll('tr[data-hist-points]').length`)
	var s struct{ Refused refusedJSON }
	if err := getJSON(t, page+"api/status", &s); err != nil {
		t.Fatal(err)
	}
	if s.Refused.total() != 0 {
		t.Errorf("the page was refused while filling its trends: %+v", s.Refused)
	}
}

// isTimeout: err is a client's timeout (the reply did not come in time),
// not a wrong answer.
func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
