package e2e

import (
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"edgegw/internal/testenv"
	"edgegw/lab/demo"
	"edgegw/lab/sim"
)

// artifactDir is where page screenshots go: $EDGEGW_ARTIFACTS, else the
// test's temporary directory.
func artifactDir(t *testing.T) string {
	dir := os.Getenv("EDGEGW_ARTIFACTS")
	if dir == "" {
		return t.TempDir()
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

type historyJSON struct {
	Kind  string     `json:"kind"`
	TS    []int64    `json:"ts"`
	Value []*float64 `json:"value"`
}

// The page against `edgegw demo` in a real-time headless Chromium: the
// trends are drawn from /api/history as soon as the page opens, the device
// view has charts with axes, the unit and a hover read-out, and when the
// gateway stops the values turn grey within 5 s and come back when it
// returns. Screenshots (desktop 1280×900 and phone 390×844, overview and
// device view, and the stale page) are kept.
func TestDemoPageHistoryViewsAndStale(t *testing.T) {
	testenv.Need(t, "chromium")
	dataDir := t.TempDir()
	args := []string{"-devices", "6", "-interval", "500ms", "-upstream=false", "-data-dir", dataDir}
	p, page := startDemo(t, args...)
	// Some history first: at least 8 samples of the last tag.
	waitFor(t, 30*time.Second, "8 samples of logger-06/humidity in /api/history", func() bool {
		var h historyJSON
		return getJSON(t, page+"api/history?device=logger-06&tag=humidity&from="+fmt.Sprint(time.Now().Add(-time.Minute).UnixMicro()), &h) == nil &&
			h.Kind == "raw" && len(h.TS) >= 8
	})
	shots := artifactDir(t)
	b := testenv.StartBrowser(t, page, 1280, 900)
	b.Viewport(1280, 900, false)

	// Right after open: every trend filled from the history (not from the
	// live stream, which has given only a second or two by then) and drawn.
	took := b.WaitJS(15*time.Second, "every trend filled from /api/history",
		`document.querySelectorAll('tr[data-hist-points]').length === 12 && [...document.querySelectorAll('tr[data-hist-points]')].every(r => +r.dataset.histPoints >= 8)`,
		`[...document.querySelectorAll('tr')].map(r => r.dataset.tag + ':' + r.dataset.histPoints)`)
	t.Logf("trends filled from history %v after the page opened", took.Round(time.Millisecond))
	b.WaitJS(5*time.Second, "every sparkline drawn as a line", `[...document.querySelectorAll('path.line')].length === 12 && [...document.querySelectorAll('path.line')].every(p => /M[0-9.]+,[0-9.]+ L[0-9.]+,[0-9.]+ L/.test(p.getAttribute('d')))`,
		`[...document.querySelectorAll('path.line')].map(p => p.getAttribute('d').slice(0, 40))`)
	b.WaitJS(5*time.Second, "live", `document.body.dataset.live === 'live'`, `document.body.dataset.live`)
	b.Screenshot(filepath.Join(shots, "page-desktop.png"))

	// The device view: a chart per tag with a time axis and a value axis
	// labelled with the unit, a legend that reads out the value under the
	// pointer, and the health chart.
	if err := b.Eval(`location.hash = '#device=logger-01'`, nil); err != nil {
		t.Fatal(err)
	}
	b.WaitJS(20*time.Second, "the device view of logger-01", `document.body.dataset.viewLoaded === 'logger-01@600'`, `document.body.dataset.viewLoaded`)
	var charts []struct {
		Tag, Head string
		Axes      int
		Canvas    bool
	}
	if err := b.Eval(`[...document.querySelectorAll('#v-charts .chart')].map(c => ({tag: c.dataset.tag, head: c.querySelector('h3').textContent,
		axes: c.querySelectorAll('.u-axis').length, canvas: !!c.querySelector('canvas')}))`, &charts); err != nil {
		t.Fatal(err)
	}
	units := map[string]string{"temperature": "°C", "humidity": "%RH"}
	if len(charts) != 2 {
		t.Fatalf("device view: %d charts, want 2: %+v", len(charts), charts)
	}
	for _, c := range charts {
		if c.Axes < 2 || !c.Canvas || !strings.Contains(c.Head, "("+units[c.Tag]+")") {
			t.Errorf("chart %+v: want 2 axes, a canvas and the unit %s", c, units[c.Tag])
		}
	}
	// Hover: move the pointer over the temperature plot; the legend reads the value with its unit.
	var box struct{ X, Y, W, H float64 }
	if err := b.Eval(`(() => { const r = document.querySelector('#v-charts .chart[data-tag=temperature] .u-over').getBoundingClientRect();
		return {x: r.x, y: r.y, w: r.width, h: r.height}; })()`, &box); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Call("Input.dispatchMouseEvent", map[string]any{"type": "mouseMoved", "x": box.X + box.W*0.97, "y": box.Y + box.H/2}); err != nil {
		t.Fatal(err)
	}
	b.WaitJS(5*time.Second, "a hover read-out with the unit", `[...document.querySelectorAll('#v-charts .chart[data-tag=temperature] .u-legend .u-value')].some(v => v.textContent.endsWith('°C'))`,
		`[...document.querySelectorAll('#v-charts .chart[data-tag=temperature] .u-legend .u-value')].map(v => v.textContent)`)
	var health int
	if err := b.Eval(`document.querySelectorAll('#v-health .u-axis').length`, &health); err != nil || health < 3 {
		t.Errorf("health chart: %d axes (want time, valid %%, RTT ms), %v", health, err)
	}
	b.Screenshot(filepath.Join(shots, "device-desktop.png"))
	// The other ranges come as buckets: 1 h of 1-minute ones, 7 d of 10-minute ones.
	for _, r := range []struct{ secs, note string }{{"3600", "buckets of 60 s"}, {"604800", "buckets of 10 min"}} {
		if err := b.Eval(`document.querySelector('#ranges [data-range="`+r.secs+`"]').click()`, nil); err != nil {
			t.Fatal(err)
		}
		b.WaitJS(20*time.Second, "the "+r.secs+" s range", `document.body.dataset.viewLoaded === 'logger-01@`+r.secs+`' && [...document.querySelectorAll('#v-charts .chart')].every(c => c.querySelectorAll('.u-axis').length >= 2 && c.querySelector('.note').textContent.includes('`+r.note+`'))`,
			`[...document.querySelectorAll('#v-charts .chart .note')].map(n => n.textContent)`)
	}
	if err := b.Eval(`document.querySelector('#ranges [data-range="600"]').click()`, nil); err != nil {
		t.Fatal(err)
	}

	// A short sleep (the connection dropped, as on a phone): the page resumes
	// from its last sequence, without a reset.
	if err := b.Eval(`ws.close()`, nil); err != nil {
		t.Fatal(err)
	}
	b.WaitJS(15*time.Second, "the page resumed", `document.body.dataset.resumes === '1' && document.body.dataset.resets === undefined && document.body.dataset.live === 'live'`,
		`[document.body.dataset.resumes, document.body.dataset.resets, document.body.dataset.live]`)

	// The same on a phone.
	b.Viewport(390, 844, true)
	b.WaitJS(5*time.Second, "the charts resized to the phone", `document.querySelector('#v-charts .chart canvas').getBoundingClientRect().width <= 390`, `document.querySelector('#v-charts .chart canvas').getBoundingClientRect().width`)
	b.Screenshot(filepath.Join(shots, "device-phone.png"))
	if err := b.Eval(`location.hash = ''`, nil); err != nil {
		t.Fatal(err)
	}
	b.WaitJS(5*time.Second, "the overview", `!document.body.classList.contains('viewing')`, "")
	b.Screenshot(filepath.Join(shots, "page-phone.png"))
	b.Viewport(1280, 900, false)

	// The gateway freezes (SIGSTOP: the connection stays open, nothing comes,
	// as when the network goes away silently): within 5 s the page says so.
	b.WaitJS(10*time.Second, "live", `document.body.dataset.live === 'live'`, `document.body.dataset.live`)
	if err := p.Cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	took = b.WaitJS(5*time.Second, "the page to show the values as stale while the gateway is frozen",
		`document.body.dataset.live === 'stale' && !document.getElementById('banner').hidden`, `document.body.dataset.live`)
	t.Logf("stale %v after the gateway froze", took.Round(time.Millisecond))
	if err := p.Cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	took = b.WaitJS(10*time.Second, "the page live again after the freeze", `document.body.dataset.live === 'live' && document.getElementById('banner').hidden`, `document.body.dataset.live`)
	t.Logf("live %v after the gateway thawed", took.Round(time.Millisecond))

	// The gateway goes away: within 5 s every value is shown as old, with the time since.
	u, _ := url.Parse(page)
	p.Stop(os.Interrupt, 15*time.Second)
	stopped := time.Now()
	took = b.WaitJS(5*time.Second, "the page to show the values as stale",
		`document.body.dataset.live === 'stale' && !document.getElementById('banner').hidden && document.getElementById('banner').textContent.includes('gateway unreachable')`,
		`document.body.dataset.live + ' ' + document.getElementById('banner').textContent`)
	var grey bool
	if err := b.Eval(`(() => { const v = document.querySelector('td.value'), s = getComputedStyle(document.body).getPropertyValue('--stale').trim();
		const probe = document.createElement('span'); probe.style.color = s; document.body.append(probe);
		const want = getComputedStyle(probe).color; probe.remove(); return getComputedStyle(v).color === want; })()`, &grey); err != nil || !grey {
		t.Errorf("values are not grey while the gateway is away (%v)", err)
	}
	t.Logf("stale %v after the gateway stopped", took.Round(time.Millisecond))
	b.Screenshot(filepath.Join(shots, "page-stale-desktop.png"))

	// It comes back on the same address: the page is live again by itself.
	startProc(t, append([]string{"demo", "-http", u.Host, "-stats", "0"}, args...)...).WaitLine("page: ", 20*time.Second)
	took = b.WaitJS(30*time.Second, "the page live again", `document.body.dataset.live === 'live' && document.getElementById('banner').hidden`, `document.body.dataset.live`)
	t.Logf("live again %v after the gateway returned (%v after it stopped)", took.Round(time.Millisecond), time.Since(stopped).Round(time.Millisecond))
	// A new process cannot resume the page (its sequence starts above the
	// old one's): the page takes the reset and refills its trends from the
	// history, which kept the closed minutes in data_dir.
	b.WaitJS(10*time.Second, "the reset taken and the trends refilled", `document.body.dataset.resets === '1' && [...document.querySelectorAll('path.line')].every(p => /L/.test(p.getAttribute('d')))`,
		`document.body.dataset.resets`)
	t.Logf("screenshots in %s", shots)
}

type wsFrame struct {
	Type    string `json:"type"`
	Seq     uint64 `json:"seq"`
	Reset   bool   `json:"reset"`
	Samples []struct {
		Seq uint64 `json:"seq"`
	} `json:"samples"`
}

// A WebSocket client that goes away for 30 s (a phone asleep) resumes
// without a reset: the ring is sized to 60 s of samples at the poll rate.
func TestWebSocketResumesAfter30s(t *testing.T) {
	_, page := startDemo(t, "-devices", "6", "-interval", "200ms", "-upstream=false")
	var st struct {
		Ring struct {
			Size          int     `json:"size"`
			ResumeWindowS float64 `json:"resume_window_s"`
		} `json:"ring"`
	}
	if err := getJSON(t, page+"api/status", &st); err != nil || st.Ring.Size != 3600 || st.Ring.ResumeWindowS != 60 {
		t.Fatalf("ring for 6 loggers × 2 tags at 200 ms: %+v %v, want 3600 samples, 60 s", st.Ring, err)
	}
	wsURL := "ws" + strings.TrimPrefix(page, "http") + "api/ws"
	dial := func() *websocket.Conn {
		c, _, err := websocket.DefaultDialer.Dial(wsURL, nil)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	read := func(c *websocket.Conn) wsFrame {
		t.Helper()
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		_, b, err := c.ReadMessage()
		if err != nil {
			t.Fatal(err)
		}
		var f wsFrame
		if err := json.Unmarshal(b, &f); err != nil {
			t.Fatal(err)
		}
		return f
	}
	c := dial()
	last := read(c).Seq // the snapshot
	for i := 0; i < 5; i++ {
		f := read(c)
		if f.Type == "samples" && len(f.Samples) > 0 {
			last = f.Samples[len(f.Samples)-1].Seq
		}
	}
	c.Close()
	// The pause is the scenario: 30 s away.
	<-time.After(30 * time.Second)

	c = dial()
	defer c.Close()
	if f := read(c); f.Type != "snapshot" || f.Seq < last+30*60/2 {
		t.Fatalf("first frame after the pause: %s seq %d (left at %d)", f.Type, f.Seq, last)
	}
	if err := c.WriteJSON(map[string]uint64{"lastSequence": last}); err != nil {
		t.Fatal(err)
	}
	// The answer: every sample since last, in order, in frames of at most
	// 128 (each written before the next is encoded), and no reset. Live
	// frames sent before the request was read may come first or between
	// (the page applies them and the answer's repeats once each).
	const want = 30 * 60 / 2 // 30 s at 60 samples/s, halved for a slow machine
	seen := map[uint64]bool{}
	next, frames := last+1, 0
	for ; next <= last+want; frames++ {
		f := read(c)
		if f.Reset || f.Type != "samples" {
			t.Fatalf("after a 30 s pause: %s reset=%v (seq %d), want the missed samples from %d", f.Type, f.Reset, f.Seq, last+1)
		}
		if frames > 500 {
			t.Fatalf("the resume from %d reached only %d in 500 frames", last, next-1)
		}
		for j, smp := range f.Samples {
			if j > 0 && smp.Seq <= f.Samples[j-1].Seq {
				t.Fatalf("frame out of order: seq %d after %d", smp.Seq, f.Samples[j-1].Seq)
			}
			seen[smp.Seq] = true
		}
		for seen[next] {
			next++
		}
	}
	t.Logf("resumed from %d after 30 s: %d samples without a gap in %d frames, no reset", last, next-1-last, frames)
}

// The page shows trouble first, against the real binary running the demo's
// gateway config (48 loggers over TCP, 1 s, history in data_dir) with one
// logger (logger-41, the 14th row of 16 when sorted by name) killed before
// the page opens. At 1280×900 and at 390×844, without scrolling: the
// header counts 1 down, and the dead logger's card is in the viewport,
// below the header, with the dial's error as its reason and its last good
// values (from /api/history) grey with their age. A click on the count
// shows that card alone. Screenshots go to $EDGEGW_ARTIFACTS (the ones in
// docs/screenshots are these).
func TestDemoPageShowsDownLoggerFirst(t *testing.T) {
	testenv.Need(t, "chromium")
	fleet := runFleet(t, sim.Config{Devices: 48, Transport: "tcp", Seed: 1})
	dir := t.TempDir()
	cfg := filepath.Join(dir, "demo.toml")
	// The demo's config, but the test's own polling of /api/devices comes
	// from the page's loopback address: no read limit for loopback, so
	// what is measured is the page, not the limits.
	text := strings.Replace(demo.Config(fleet, "tcp", "parallel", "127.0.0.1:0", filepath.Join(dir, "data"), time.Second, demo.Upstream{}),
		"[http]\n", "[http]\nexempt_loopback = true\n", 1)
	if err := os.WriteFile(cfg, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	_, page := runGateway(t, cfg)
	type dev struct {
		Name, State, Reason string
		GoodPolls           int `json:"good_polls"`
	}
	devices := func() map[string]dev {
		var out struct{ Devices []dev }
		m := map[string]dev{}
		if err := getJSON(t, page+"api/devices", &out); err != nil {
			t.Logf("/api/devices: %v", err)
		}
		for _, d := range out.Devices {
			m[d.Name] = d
		}
		return m
	}
	var notYet []string
	waitFor(t, 30*time.Second, "48 loggers ok with 5 good polls each", func() bool {
		m := devices()
		notYet = notYet[:0]
		for _, d := range m {
			if d.State != "ok" || d.GoodPolls < 5 {
				notYet = append(notYet, fmt.Sprintf("%s %s %d %s", d.Name, d.State, d.GoodPolls, d.Reason))
			}
		}
		return len(m) == 48 && len(notYet) == 0
	})
	fleet.Logger(40).Stop() // logger-41 powered off: its listener and connection closed
	var dead dev
	waitFor(t, 20*time.Second, "logger-41 down with the dial's error as the reason", func() bool {
		dead = devices()["logger-41"]
		return dead.State == "down" && strings.Contains(dead.Reason, "connection refused")
	})
	t.Logf("logger-41: %s: %s", dead.State, dead.Reason)

	shots := artifactDir(t)
	b := testenv.StartBrowser(t, page, 1280, 900)
	check := func(size, shot string) {
		t.Helper()
		b.WaitJS(20*time.Second, "1 down in the header and logger-41's card first, its last good values filled", `document.getElementById('trouble-text').textContent === '1 down'
			&& document.querySelector('[data-device="logger-41"]').dataset.trouble === 'down'
			&& [...document.querySelectorAll('[data-device="logger-41"] td.value')].every(v => v.dataset.lastGood !== undefined && /[0-9]/.test(v.textContent))
			&& document.querySelectorAll('.device').length === 48 && document.body.dataset.live === 'live'`,
			`[document.getElementById('trouble-text').textContent, document.body.dataset.live, [...document.querySelectorAll('[data-device="logger-41"] td.value')].map(v => v.textContent + (v.dataset.lastGood !== undefined ? ' (last good)' : ''))]`)
		var v struct {
			Count, Card, Reason bool
			CardRect            []float64
			Values, Ages        []string
			PageHeight          float64
		}
		if err := b.Eval(`(() => { const inView = r => r.top >= 0 && r.left >= 0 && r.bottom <= innerHeight && r.right <= innerWidth;
			const h = document.querySelector('header').getBoundingClientRect(), c = document.querySelector('[data-device="logger-41"]');
			const r = c.getBoundingClientRect();
			return {count: inView(document.getElementById('trouble').getBoundingClientRect()), card: inView(r) && r.top >= h.bottom,
				reason: inView(c.querySelector('.reason').getBoundingClientRect()), cardRect: [r.left, r.top, r.right, r.bottom],
				values: [...c.querySelectorAll('td.value')].map(e => e.textContent), ages: [...c.querySelectorAll('td.age')].map(e => e.textContent),
				pageHeight: document.documentElement.scrollHeight}; })()`, &v); err != nil {
			t.Fatal(err)
		}
		if !v.Count || !v.Card || !v.Reason {
			t.Errorf("%s: down count visible %v, logger-41's card visible below the header %v (rect %v), its reason visible %v", size, v.Count, v.Card, v.CardRect, v.Reason)
		}
		t.Logf("%s: page %.0f px tall; logger-41's card at %v; last good values %q, ages %q", size, v.PageHeight, v.CardRect, v.Values, v.Ages)
		b.Screenshot(filepath.Join(shots, shot))
	}
	b.Viewport(1280, 900, false)
	check("1280×900", "page-trouble-desktop.png")
	b.Viewport(390, 844, true)
	check("390×844", "page-trouble-phone.png")

	// The filter: only the device in trouble, then all again.
	shown := `[...document.querySelectorAll('.device')].filter(c => c.offsetParent !== null).map(c => c.dataset.device)`
	if err := b.Eval(`document.getElementById('trouble').click()`, nil); err != nil {
		t.Fatal(err)
	}
	b.WaitJS(5*time.Second, "only logger-41 shown", shown+`.join() === 'logger-41'`, shown)
	b.Screenshot(filepath.Join(shots, "page-trouble-filter-phone.png"))
	if err := b.Eval(`document.getElementById('trouble').click()`, nil); err != nil {
		t.Fatal(err)
	}
	b.WaitJS(5*time.Second, "all 48 shown again", shown+`.length === 48`, shown)
}
