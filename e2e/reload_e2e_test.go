package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"edgegw/internal/testenv"
	"edgegw/lab/sim"
	"edgegw/ringstore"
)

// wsCollector keeps every sample a /api/ws client receives.
type wsCollector struct {
	mu      sync.Mutex
	samples []ringstore.Sample
	err     error
}

func (c *wsCollector) all() ([]ringstore.Sample, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]ringstore.Sample(nil), c.samples...), c.err
}

func collectWS(t *testing.T, page string) *wsCollector {
	t.Helper()
	conn, _, err := websocket.DefaultDialer.Dial("ws"+strings.TrimPrefix(page, "http")+"api/ws", nil)
	if err != nil {
		t.Fatal(err)
	}
	c := &wsCollector{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			_, msg, err := conn.ReadMessage()
			if err != nil {
				c.mu.Lock()
				c.err = err
				c.mu.Unlock()
				return
			}
			var f struct {
				Type    string             `json:"type"`
				Samples []ringstore.Sample `json:"samples"`
			}
			if err := json.Unmarshal(msg, &f); err != nil {
				t.Errorf("ws frame: %v", err)
				return
			}
			if f.Type == "samples" {
				c.mu.Lock()
				c.samples = append(c.samples, f.Samples...)
				c.mu.Unlock()
			}
		}
	}()
	t.Cleanup(func() { conn.Close(); testenv.Closed(t, done, 10*time.Second, "the websocket collector to end") })
	return c
}

// SIGHUP reloads: a valid config adds, removes and changes devices while
// the unchanged ones keep polling without a gap; an invalid one is refused
// and the running one stays; a WebSocket client stays connected and sees
// the sequence continue without a gap throughout.
func TestReloadOnSIGHUP(t *testing.T) {
	fleet := runFleet(t, sim.Config{Devices: 5, Transport: "udp"})

	config := func(devs ...int) string {
		var b strings.Builder
		b.WriteString("[gateway]\nid = \"reload\"\n[http]\nlisten = \"127.0.0.1:0\"\n[poll]\nudp_listen = \"127.0.0.1:0\"\n")
		b.WriteString("[[profile]]\nname = \"th\"\ntags = [ { name = \"temperature\", address = 0, type = \"int16\", scale = 0.1 } ]\n")
		for _, i := range devs {
			iv := "100ms"
			if i < 0 { // device -i with another interval: a changed device
				i, iv = -i, "200ms"
			}
			fmt.Fprintf(&b, "[[device]]\nname = \"d%d\"\ntransport = \"udp\"\naddress = %q\nprofile = \"th\"\ninterval = %q\ntimeout = \"50ms\"\n", i, fleet.Addr(i), iv)
		}
		return b.String()
	}
	path := filepath.Join(t.TempDir(), "edgegw.toml")
	write := func(s string) {
		if err := os.WriteFile(path, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(config(0, 1, 2, 3))
	gw, page := runGateway(t, path)
	ws := collectWS(t, page)
	samplesOf := func(dev string) []ringstore.Sample {
		all, _ := ws.all()
		var out []ringstore.Sample
		for _, s := range all {
			if s.Device == dev {
				out = append(out, s)
			}
		}
		return out
	}
	waitFor(t, 10*time.Second, "samples of d0..d3", func() bool { return len(samplesOf("d3")) >= 10 })

	// valid: d2 removed, d3 changed, d4 added
	write(config(0, 1, -3, 4))
	_ = gw.Cmd.Process.Signal(syscall.SIGHUP)
	gw.WaitLine("reload: devices applied", 10*time.Second)
	reloaded := time.Now().UnixMicro()
	waitFor(t, 10*time.Second, "samples of the added d4", func() bool { return len(samplesOf("d4")) >= 10 })
	var short struct{ Tags []ringstore.Sample }
	if err := getJSON(t, page+"api/shortPolling", &short); err != nil {
		t.Fatal(err)
	}
	sawD2 := false
	for _, s := range short.Tags {
		sawD2 = sawD2 || s.Device == "d2"
		if (s.Quality == ringstore.Stale) != (s.Device == "d2") {
			t.Errorf("shortPolling after the reload: %s/%s quality %v (stale is for the removed d2 only)", s.Device, s.Tag, s.Quality)
		}
	}
	if !sawD2 {
		t.Errorf("shortPolling after the reload: no d2 (want its tag, stale): %+v", short.Tags)
	}

	// invalid: refused, the running config stays
	write("[[device]]\nname = \"broken\"\n")
	_ = gw.Cmd.Process.Signal(syscall.SIGHUP)
	gw.WaitLine("config invalid; the running one stays", 10*time.Second)
	n := len(samplesOf("d4"))
	waitFor(t, 10*time.Second, "d4 still polled after the refused reload", func() bool { return len(samplesOf("d4")) >= n+10 })
	// The gateway's own count of the windows its scheduler skipped
	// (overruns), for the samples stamped before cut: a poll that ran late
	// counts the windows it ran into just after its sample, long before this.
	waitFor(t, 20*time.Second, "15 samples of d3 at its new interval", func() bool {
		n := 0
		for _, s := range samplesOf("d3") {
			if s.TS > reloaded {
				n++
			}
		}
		return n >= 15
	})
	cut := time.Now().Add(-500 * time.Millisecond).UnixMicro()
	counters := apiDevices(t, gw, page)
	if counters == nil {
		t.Fatal("no /api/devices before the stop")
	}
	if code := gw.Stop(os.Interrupt, 15*time.Second); code != 0 {
		t.Errorf("gateway exited %d", code)
	}

	all, werr := ws.all()
	if werr != nil && !websocket.IsCloseError(werr, websocket.CloseGoingAway) {
		t.Errorf("websocket ended with %v, want a close on shutdown", werr)
	}
	for i := 1; i < len(all); i++ {
		if all[i].Seq != all[i-1].Seq+1 {
			t.Fatalf("websocket stream gap: %d then %d", all[i-1].Seq, all[i].Seq)
		}
	}
	// Unchanged devices: across the reloads, every 100 ms window between
	// their first and last sample (before cut) was polled (a sample, good
	// or timed out) or counted by the scheduler as an overrun (a loaded
	// machine skips windows, and says so); at most 2 more for the ends
	// (a poll may start a little early, and end late). A bus stopped by a
	// reload skips windows without counting them.
	for _, dev := range []string{"d0", "d1"} {
		var got []ringstore.Sample
		for _, s := range samplesOf(dev) {
			if s.TS <= cut {
				got = append(got, s)
			}
		}
		if len(got) < 20 {
			t.Fatalf("%s: %d samples", dev, len(got))
		}
		span := time.Duration(got[len(got)-1].TS-got[0].TS) * time.Microsecond
		windows := int64(span / (100 * time.Millisecond))
		over := int64(counters[dev].Overruns)
		if lost := windows - int64(len(got)-1) - over; lost > 2 {
			t.Errorf("%s: %d windows in %v, %d polled after the first, %d overruns: %d windows neither polled nor counted", dev, windows, span, len(got)-1, over, lost)
		} else {
			t.Logf("%s: %d windows in %v, %d polled after the first, %d overruns", dev, windows, span, len(got)-1, over)
		}
	}
	// d2 removed: not polled after the reload, and its tag's last sample
	// (its only stale one) says so, in the stream as in shortPolling.
	d2 := samplesOf("d2")
	for i, s := range d2 {
		if s.TS > reloaded {
			t.Fatalf("removed d2 polled after the reload: %+v", s)
		}
		if (s.Quality == ringstore.Stale) != (i == len(d2)-1) {
			t.Fatalf("d2 sample %d of %d: quality %v (want stale for the last only)", i+1, len(d2), s.Quality)
		}
	}
	// d3 at its new 200 ms interval: windows start 200 ms apart or more
	// (skipped ones only widen that), so its polls after the reload are on
	// average ≥ 150 ms apart, whatever the lateness of the first (its error
	// shared by all of them); at its old 100 ms, about 100 ms.
	var d3 []ringstore.Sample
	for _, s := range samplesOf("d3") {
		if s.TS > reloaded {
			d3 = append(d3, s)
		}
	}
	if len(d3) < 15 {
		t.Fatalf("d3: %d samples after the reload", len(d3))
	}
	if avg := time.Duration(d3[len(d3)-1].TS-d3[0].TS) * time.Microsecond / time.Duration(len(d3)-1); avg < 150*time.Millisecond {
		t.Errorf("d3 not at its new 200ms interval: %d polls %v apart on average", len(d3), avg)
	}
}
