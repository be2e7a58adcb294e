package web

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

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
