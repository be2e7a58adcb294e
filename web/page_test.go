package web

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"edgegw/history"
	"edgegw/internal/testenv"
	"edgegw/ringstore"
	"edgegw/stats"
)

func TestPageIsSelfContained(t *testing.T) {
	ts := startServer(t, Config{})
	code, h, b := ts.get(t, "/")
	if code != 200 || !strings.HasPrefix(h.Get("Content-Type"), "text/html") {
		t.Fatalf("GET /: %d %q", code, h.Get("Content-Type"))
	}
	// No external URL: no CDN, no web fonts, no remote script or style.
	if m := regexp.MustCompile(`(?i)(src|href)\s*=\s*["']?(https?:)?//|@import|url\(\s*["']?https?:`).Find(b); m != nil {
		t.Fatalf("page references an external resource: %s", m)
	}
	// Every script and style the page loads is embedded and served here (uPlot, offline).
	for _, m := range regexp.MustCompile(`(?:src|href)="(/[^"]+)"`).FindAllSubmatch(b, -1) {
		if code, _, body := ts.get(t, string(m[1])); code != 200 || len(body) < 1000 {
			t.Errorf("page loads %s: %d, %d bytes", m[1], code, len(body))
		}
	}
	for _, want := range []string{`name="viewport"`, `/api/ws`, `/api/devices`, `/api/status`, `/api/history`, `data-device`, `data-tag`, `lastSequence`, `/assets/uplot-1.6.32.min.js`} {
		if !bytes.Contains(b, []byte(want)) {
			t.Errorf("page lacks %q", want)
		}
	}
	if code, _, _ := ts.get(t, "/nothing-here"); code != 404 {
		t.Errorf("unknown path: %d", code)
	}
}

// chromium runs headless Chromium plus args with the flags a test machine
// needs: no sandbox (containers forbid its namespaces), no GPU, no QUIC and no
// background traffic (only 127.0.0.1 is reachable), a scratch profile each
// run, /tmp instead of a small /dev/shm, and a virtual-time budget so script
// that waits on a WebSocket gets to run before the DOM is dumped.
func chromium(t *testing.T, args ...string) []byte {
	t.Helper()
	bin := testenv.Need(t, "chromium")
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	base := []string{"--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
		"--disable-background-networking", "--disable-component-update", "--disable-sync",
		"--disable-dev-shm-usage", "--user-data-dir=" + t.TempDir(), "--virtual-time-budget=5000"}
	cmd := exec.CommandContext(ctx, bin, append(base, args...)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("chromium %v: %v\n%s", args, err, stderr.Bytes())
	}
	return stdout.Bytes()
}

// TestPageInChromium loads the page in headless Chromium against a server
// fed with samples and device stats: the DOM shows every device and tag with
// its value, quality and health; a screenshot is kept as an artifact.
func TestPageInChromium(t *testing.T) {
	testenv.Need(t, "chromium")
	up := &stats.Upstream{}
	up.Path.Store(stats.PathBuffering)
	up.QueueSamples.Store(7)
	up.OldestUnackUS.Store(time.Now().Add(-3 * time.Minute).UnixMicro())
	// A serial device that never answered: polled, demoted, with the reason.
	dead := &stats.Device{}
	dead.Polls.Add(5)
	dead.Requests.Add(5)
	dead.Errors.Add(5)
	dead.Demoted.Store(true)
	dead.SetReason("modbus: cannot open /dev/ttyUSB0: no such file or directory")
	devs := append(someDevices(), stats.Entry{
		Info: stats.Info{Name: "meter-07", Transport: "rtu", Address: "/dev/ttyUSB0", Unit: 7, Interval: time.Second,
			Tags: []stats.TagInfo{{Name: "supply_air_temperature-setpoint", Unit: "°C"}}},
		Stats: dead,
	})
	ts := startServer(t, Config{Devices: devs, Upstream: up, GatewayID: "gw-page", Version: "9.9.9"})
	ts0 := time.Now().Add(-2 * time.Minute)
	for i := range 60 { // a trend for the sparklines
		batch := []ringstore.Sample{
			{Device: "logger-01", Tag: "t00", Value: 20 + float64(i%7)/2, TS: ts0.Add(time.Duration(i) * 2 * time.Second).UnixMicro()},
			{Device: "logger-01", Tag: "t01", Value: 40 + float64(i%5), TS: ts0.Add(time.Duration(i) * 2 * time.Second).UnixMicro()},
		}
		if _, _, err := ts.ring.Append(batch); err != nil {
			t.Fatal(err)
		}
	}
	serial := "SN-4711 <b>"
	last := []ringstore.Sample{
		{Device: "logger-01", Tag: "t00", Value: 21.5, TS: time.Now().UnixMicro()},
		{Device: "logger-01", Tag: "t01", Value: 45.25, TS: time.Now().UnixMicro()},
		{Device: "logger-02", Tag: "t00", Value: 1, Bool: true, TS: time.Now().UnixMicro()},
		{Device: "logger-02", Tag: "t01", Quality: ringstore.Timeout, TS: time.Now().UnixMicro()},
		{Device: "logger-02", Tag: "serial", Kind: ringstore.KindString, Text: &serial, TS: time.Now().UnixMicro()},
	}
	if _, _, err := ts.ring.Append(last); err != nil {
		t.Fatal(err)
	}

	// A live stream while the browser runs, so the sparklines get points from
	// the WebSocket (bounded: it stops when the browser is done, or after 600 batches).
	feed := func(run func() []byte) []byte {
		stop, done := make(chan struct{}), make(chan struct{})
		go func() {
			defer close(done)
			tick := time.NewTicker(20 * time.Millisecond) // the load: a 50 Hz stream
			defer tick.Stop()
			for i := 0; i < 600; i++ {
				select {
				case <-stop:
					return
				case <-tick.C:
				}
				v := 21.5
				if i%2 == 1 {
					v = 22.5
				}
				_, _, _ = ts.ring.Append([]ringstore.Sample{{Device: "logger-01", Tag: "t00", Value: v, TS: time.Now().UnixMicro()}})
			}
		}()
		out := run()
		close(stop)
		testenv.Closed(t, done, 10*time.Second, "the feeding goroutine to stop")
		return out
	}
	dom := string(feed(func() []byte { return chromium(t, "--dump-dom", ts.base+"/") }))
	row := func(dev, tag string) string {
		re := regexp.MustCompile(`<tr[^>]*data-device="` + regexp.QuoteMeta(dev) + `"[^>]*data-tag="` + tag + `"[^>]*>(.*?)</tr>`)
		m := re.FindStringSubmatch(dom)
		if m == nil {
			t.Fatalf("no row for %s/%s in the DOM:\n%s", dev, tag, dom)
		}
		return m[1]
	}
	for _, c := range []struct{ dev, tag, want string }{
		{"logger-01", "t00", `data-quality="good"`},
		{"logger-01", "t00", `<span class="unit">°C</span>`},
		{"logger-01", "t00", `.5</span><span class="unit">°C</span>`}, // 21.5 or 22.5 from the live stream
		{"logger-01", "t01", `<span class="num">45.25</span>`},
		{"logger-02", "t00", `<span class="num">true</span>`},
		{"logger-02", "t01", `data-quality="timeout"`},
		{"logger-02", "serial", `<span class="num">SN-4711 &lt;b&gt;</span>`},
		{"logger-01", "t00", `<path class="line" d="M`},
	} {
		if r := row(c.dev, c.tag); !strings.Contains(r, c.want) {
			t.Errorf("%s/%s: want %q in row %s", c.dev, c.tag, c.want, r)
		}
	}
	// A line somewhere in the path: a stall of the loaded machine longer than
	// 3 usual spacings is drawn as a gap (a new M), which is right.
	if !regexp.MustCompile(`<path class="line" d="[^"]*M[0-9.]+,[0-9.]+ L[0-9.]+,[0-9.]+`).MatchString(row("logger-01", "t00")) {
		t.Errorf("logger-01/t00 sparkline has no line: %s", row("logger-01", "t00"))
	}
	for _, want := range []string{
		`data-device="logger-01"`, `data-device="logger-02"`, `data-device="odd &quot;name&quot;\` + "\n" + `"`,
		`id="gateway" data-gateway="gw-page">gw-page<`, `id="conn" data-state="open"`,
		`id="upstream" data-path="buffering"`, `<b id="up-queue">7</b>`, `<span id="up-buffer"> · queue 3 min old</span>`,
		`class="state" data-state="ok">ok<`, `class="state" data-state="down">down<`,
		// The dead serial device: down (not just demoted), demoted shown apart, the reason, no RTT.
		`<span class="chip">demoted: polled less often</span>`,
		`never answered: modbus: cannot open /dev/ttyUSB0: no such file or directory</div>`,
		`RTT p50/p99 <b>no answer yet</b>`,
		// Names break after _ and -, never inside a word.
		`<td class="tag">supply_<wbr>air_<wbr>temperature-<wbr>setpoint<wbr></td>`,
	} {
		if !strings.Contains(dom, want) {
			t.Errorf("DOM lacks %q", want)
		}
	}
	if t.Failed() {
		t.Logf("DOM:\n%s", dom)
	}

	dir := os.Getenv("EDGEGW_ARTIFACTS")
	if dir == "" {
		dir = t.TempDir()
	} else if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	png := filepath.Join(dir, "web-page.png")
	_ = os.Remove(png)
	feed(func() []byte {
		return chromium(t, "--screenshot="+png, "--window-size=1200,900", "--hide-scrollbars", ts.base+"/")
	})
	b, err := os.ReadFile(png)
	if err != nil {
		t.Fatalf("screenshot: %v", err)
	}
	if len(b) < 1000 || !bytes.HasPrefix(b, []byte("\x89PNG\r\n\x1a\n")) {
		t.Fatalf("screenshot %s: %d bytes, not a PNG", png, len(b))
	}
	t.Logf("screenshot: %s (%d bytes)", png, len(b))
}

// The page shows trouble first, in real-time Chromium against a server
// with 30 devices: one goes down while the page is open (its card comes
// first and the header counts it; its values stay, grey, with their age),
// one has been down for 40 minutes (its last good values come from further
// back in the history), one has samples that stopped (stale), one is
// demoted and one has a tag in error for 5 minutes (degraded), one was
// never polled (pending, not a green ok). A click on the count shows only
// those, a second click all. A sparkline of 0.1 °C noise at 21.5 °C does
// not fill its height.
func TestPageShowsTroubleFirst(t *testing.T) {
	testenv.Need(t, "chromium")
	now := time.Now()
	tags := []stats.TagInfo{{Name: "temperature", Unit: "°C"}, {Name: "humidity", Unit: "%RH"}}
	var devs fakeDevices
	rec := map[string]*stats.Device{}
	for i := 1; i <= 30; i++ {
		name := fmt.Sprintf("logger-%02d", i)
		d := &stats.Device{}
		iv := time.Minute
		switch name {
		case "logger-28": // pending: not polled yet
		case "logger-29": // down for 40 minutes
			d.Polls.Add(50)
			d.GoodPolls.Add(40)
			d.LastGoodUS.Store(now.Add(-40 * time.Minute).UnixMicro())
		case "logger-20": // polled well by the gateway's account, but its samples stopped 10 s ago
			iv = time.Second
			d.Polls.Add(50)
			d.GoodPolls.Add(50)
			d.LastGoodUS.Store(now.Add(time.Hour).UnixMicro())
		default:
			d.Polls.Add(50)
			d.GoodPolls.Add(50)
			d.LastGoodUS.Store(now.UnixMicro())
			d.Demoted.Store(name == "logger-12")
		}
		rec[name] = d
		devs = append(devs, stats.Entry{Info: stats.Info{Name: name, Transport: "tcp", Address: fmt.Sprintf("127.0.1.%d:502", i),
			Unit: 1, Interval: iv, Tags: tags}, Stats: d})
	}
	// logger-29's history: good from 60 to 40 minutes ago, then a timeout
	// now; the page's 10-minute trend holds no good value of it.
	h, err := history.Open(history.Config{})
	if err != nil {
		t.Fatal(err)
	}
	for at := now.Add(-time.Hour); at.Before(now.Add(-40 * time.Minute)); at = at.Add(10 * time.Second) {
		h.Add([]ringstore.Sample{{Device: "logger-29", Tag: "temperature", Value: 23.75, TS: at.UnixMicro()},
			{Device: "logger-29", Tag: "humidity", Value: 61.5, TS: at.UnixMicro()}})
	}
	gone := []ringstore.Sample{{Device: "logger-29", Tag: "temperature", Quality: ringstore.Timeout, TS: now.Add(-time.Second).UnixMicro()},
		{Device: "logger-29", Tag: "humidity", Quality: ringstore.Timeout, TS: now.Add(-time.Second).UnixMicro()}}
	h.Add(gone)
	ts := startServer(t, Config{Devices: devs, GatewayID: "gw-trouble", History: h})
	first := gone
	for _, e := range devs {
		if e.Info.Name == "logger-28" || e.Info.Name == "logger-29" {
			continue
		}
		at, temp := now, 21.55
		if e.Info.Name == "logger-27" {
			temp = 19.25 // what the page must keep showing when it goes down
		}
		if e.Info.Name == "logger-20" {
			at = now.Add(-10 * time.Second)
		}
		first = append(first,
			ringstore.Sample{Device: e.Info.Name, Tag: "temperature", Value: temp, TS: at.Add(-90 * time.Second).UnixMicro()},
			ringstore.Sample{Device: e.Info.Name, Tag: "humidity", Value: 45.5, TS: at.UnixMicro()})
	}
	// logger-05's humidity probe has been in error for 5 minutes; logger-06
	// lost one reply just now (not trouble: it is not counted).
	first = append(first, ringstore.Sample{Device: "logger-05", Tag: "humidity", Quality: ringstore.Error, TS: now.Add(-5 * time.Minute).UnixMicro()},
		ringstore.Sample{Device: "logger-06", Tag: "humidity", Quality: ringstore.Timeout, TS: now.UnixMicro()})
	if _, _, err := ts.ring.Append(first); err != nil {
		t.Fatal(err)
	}
	b := testenv.StartBrowser(t, ts.base+"/", 1280, 900)
	b.Viewport(1280, 900, false)
	b.WaitJS(15*time.Second, "30 cards, live, 1 down, 1 stale and 2 degraded counted",
		`document.querySelectorAll('.device').length === 30 && document.body.dataset.live === 'live' && document.getElementById('trouble-text').textContent === '1 down · 1 stale · 2 degraded'`,
		`document.getElementById('trouble-text').textContent + ' ' + document.body.dataset.live`)
	// 0.1 °C of noise at 21.5 °C over the last 2 minutes for logger-01's
	// sparkline, live (the server has no history to fill it from).
	var noise []ringstore.Sample
	for i := 0; i < 60; i++ {
		noise = append(noise, ringstore.Sample{Device: "logger-01", Tag: "temperature", Value: 21.5 + float64(i%2)/10,
			TS: now.Add(time.Duration(i-60) * 2 * time.Second).UnixMicro()})
	}
	if _, _, err := ts.ring.Append(noise); err != nil {
		t.Fatal(err)
	}
	var st struct {
		Pending, PendingBG, Good string
		Seq                      bool
	}
	if err := b.Eval(`(() => { const s = document.querySelector('[data-device="logger-28"] .state');
		const p = document.createElement('span'); p.style.background = getComputedStyle(document.body).getPropertyValue('--good'); document.body.append(p);
		const good = getComputedStyle(p).backgroundColor; p.remove();
		return {pending: s.textContent + '/' + s.dataset.state, pendingBG: getComputedStyle(s).backgroundColor, good,
			seq: /\bseq\b/.test(document.querySelector('header').textContent)}; })()`, &st); err != nil {
		t.Fatal(err)
	}
	if st.Pending != "pending/pending" || st.PendingBG == st.Good {
		t.Errorf("device not polled yet: badge %q, background %s (green is %s): want pending, not green", st.Pending, st.PendingBG, st.Good)
	}
	if st.Seq {
		t.Errorf("the header shows a seq")
	}

	// logger-27 goes down while the page is open.
	d := rec["logger-27"]
	d.LastGoodUS.Store(now.Add(-5 * time.Minute).UnixMicro())
	d.Polls.Add(5)
	d.SetReason("modbus: tcp 127.0.1.27:502 unit 1: read holding 0+2: dial tcp 127.0.1.27:502: connect: connection refused (next try in 9.7 s)")
	if _, _, err := ts.ring.Append([]ringstore.Sample{
		{Device: "logger-27", Tag: "temperature", Quality: ringstore.Timeout, TS: time.Now().UnixMicro()},
		{Device: "logger-27", Tag: "humidity", Quality: ringstore.Timeout, TS: time.Now().UnixMicro()},
	}); err != nil {
		t.Fatal(err)
	}
	b.WaitJS(15*time.Second, "logger-27 down and counted", `document.getElementById('trouble-text').textContent === '2 down · 1 stale · 2 degraded'`,
		`document.getElementById('trouble-text').textContent`)
	var down struct {
		Visible       bool
		Order         []string
		Value, Age    string
		LastGood, Old bool
	}
	if err := b.Eval(`(() => { const c = document.querySelector('[data-device="logger-27"]'), r = c.getBoundingClientRect(),
		h = document.querySelector('header').getBoundingClientRect(), v = c.querySelector('tr[data-tag=temperature] td.value');
		const grey = document.createElement('span'); grey.style.color = getComputedStyle(document.body).getPropertyValue('--stale'); document.body.append(grey);
		const g = getComputedStyle(grey).color; grey.remove();
		const cards = [...document.querySelectorAll('.device')].sort((a, b) => a.getBoundingClientRect().top - b.getBoundingClientRect().top || a.getBoundingClientRect().left - b.getBoundingClientRect().left);
		return {visible: r.top >= h.bottom && r.bottom <= innerHeight && r.left >= 0 && r.right <= innerWidth,
			order: cards.slice(0, 5).map(c => c.dataset.device), value: v.textContent,
			age: c.querySelector('tr[data-tag=temperature] td.age').textContent,
			lastGood: v.dataset.lastGood !== undefined && getComputedStyle(v).color === g}; })()`, &down); err != nil {
		t.Fatal(err)
	}
	if !down.Visible {
		t.Errorf("the down device's card is not in the 1280×900 viewport")
	}
	if want := []string{"logger-27", "logger-29", "logger-20", "logger-05", "logger-12"}; !slices.Equal(down.Order, want) {
		t.Errorf("first cards %v, want %v (down, stale, degraded first)", down.Order, want)
	}
	if down.Value != "19.25°C" || !down.LastGood {
		t.Errorf("down device's temperature %q (last good shown grey: %v), want 19.25°C grey", down.Value, down.LastGood)
	}
	var secs int
	if _, err := fmt.Sscanf(down.Age, "%d s", &secs); (err != nil || secs < 90 || !strings.HasSuffix(down.Age, " s")) && !strings.HasSuffix(down.Age, " min") {
		t.Errorf("down device's temperature age %q, want the age of its last good value (≥ 90 s)", down.Age)
	}

	// Down for 40 minutes: the last good value from further back in the
	// history, grey, at least 40 minutes old.
	b.WaitJS(10*time.Second, "logger-29's last good temperature", `document.querySelector('[data-device="logger-29"] tr[data-tag=temperature] td.value').textContent === '23.75°C'`,
		`document.querySelector('[data-device="logger-29"] tr[data-tag=temperature]').textContent`)
	var old struct{ Age string }
	if err := b.Eval(`({age: document.querySelector('[data-device="logger-29"] tr[data-tag=temperature] td.age').textContent})`, &old); err != nil {
		t.Fatal(err)
	}
	var mins int
	if _, err := fmt.Sscanf(old.Age, "%d min", &mins); err != nil || mins < 40 || mins > 60 {
		t.Errorf("logger-29's temperature age %q, want 40 to 60 min (its last good value's)", old.Age)
	}
	t.Logf("down 40 min: last good temperature 23.75 °C shown, age %q", old.Age)

	// The filter: a click shows the 5 in trouble, another click all 30.
	shown := `[...document.querySelectorAll('.device')].filter(c => c.offsetParent !== null).length`
	if err := b.Eval(`document.getElementById('trouble').click()`, nil); err != nil {
		t.Fatal(err)
	}
	b.WaitJS(5*time.Second, "only the 5 devices in trouble shown", shown+` === 5`, shown)
	if err := b.Eval(`document.getElementById('trouble').click()`, nil); err != nil {
		t.Fatal(err)
	}
	b.WaitJS(5*time.Second, "all 30 shown again", shown+` === 30`, shown)

	// 0.1 °C of noise at 21.5 °C: the line spans at most 0.1/0.215 of the height.
	var ys []float64
	b.WaitJS(5*time.Second, "logger-01's sparkline drawn", `(document.querySelector('tr[data-device="logger-01"][data-tag=temperature] path.line').getAttribute('d').match(/L/g) || []).length >= 10`, "")
	if err := b.Eval(`[...document.querySelector('tr[data-device="logger-01"][data-tag=temperature] path.line').getAttribute('d').matchAll(/,([0-9.]+)/g)].map(m => +m[1])`, &ys); err != nil {
		t.Fatal(err)
	}
	if len(ys) < 10 {
		t.Fatalf("logger-01 temperature sparkline: %d points", len(ys))
	}
	if span := slices.Max(ys) - slices.Min(ys); span > 16*0.1/0.215+0.1 || span < 1 {
		t.Errorf("0.1 °C of noise spans %.2f of the sparkline's 16 units, want about %.2f (1%% of 21.5 as the minimum span)", span, 16*0.1/0.215)
	}
	dir := os.Getenv("EDGEGW_ARTIFACTS")
	if dir == "" {
		dir = t.TempDir()
	} else if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	b.Screenshot(filepath.Join(dir, "web-page-trouble.png"))
}
