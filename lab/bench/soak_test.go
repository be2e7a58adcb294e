package bench

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// buildGateway builds the edgegw binary the soak runs as `edgegw run`.
func buildGateway(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "edgegw")
	if out, err := exec.Command("go", "build", "-o", bin, "edgegw").CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	return bin
}

// full reports whether the long versions of the bench package's runs are
// asked for (EDGEGW_FULL=1, make test-full); make test runs the short ones.
func full() bool { return os.Getenv("EDGEGW_FULL") == "1" }

// The compressed soak: the real gateway process against 48 loggers at
// 100 ms with 1% loss each way, loggers restarted, reloads, uplink cuts, a
// slow WebSocket client and a request flood. In make test it runs for 45 s
// with every event period shrunk to fit at least twice (a restart every
// 3 s, a reload every 10 s, the uplink cut every 15 s for 5 s, a flood
// every 15 s for 2 s); EDGEGW_FULL=1 (make test-full) runs the 2-minute
// version at the field periods (10 s, 30 s, 60 s for 10 s, 60 s for 3 s).
// It asserts what the gateway guarantees, with bounds that hold on a shared
// CI machine: still running and exiting cleanly, nothing lost upstream,
// descriptors and memory flat after the warm-up (one full cycle of every
// event), the untouched loggers' valid rate above SoakBound and never a
// whole field interval (1 s) without a good sample.
// Every other reload adds a device that cannot open (an RTU device at a
// missing port, a UDP device at a .invalid name) and the flood is 20
// clients with a wrong Basic password.
func TestSoak(t *testing.T) {
	if testing.Short() {
		t.Skip("the soak runs 45 s")
	}
	bin := buildGateway(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cfg := SoakConfig{
		Duration: 45 * time.Second, Devices: 48, Interval: 100 * time.Millisecond, Loss: 0.01,
		RestartEvery: 3 * time.Second, ReloadEvery: 10 * time.Second,
		UplinkEvery: 15 * time.Second, UplinkDown: 5 * time.Second,
		FloodEvery: 15 * time.Second, FloodFor: 2 * time.Second,
		Flood: FloodWrongPassword, Unopenable: true,
		Gateway: bin, Dir: t.TempDir(),
	}
	if full() {
		cfg.Duration = 2 * time.Minute
		cfg.RestartEvery, cfg.ReloadEvery, cfg.UplinkEvery, cfg.UplinkDown, cfg.FloodEvery, cfg.FloodFor = 0, 0, 0, 0, 0, 0
	}
	rep, err := RunSoak(ctx, cfg)
	if rep != nil {
		var text bytes.Buffer
		rep.WriteText(&text)
		t.Log("\n" + text.String())
	}
	if err != nil {
		t.Fatal(err)
	}

	if !rep.Alive || rep.ExitCode != 0 || rep.Log.Panics != 0 {
		t.Errorf("gateway alive at the end %v, exit %d, %d panics: %s", rep.Alive, rep.ExitCode, rep.Log.Panics, strings.Join(rep.Log.Last, "\n"))
	}
	e := rep.Events
	if e.Restarts < 10 || e.Reloads < 3 || rep.Log.ReloadsApplied != e.Reloads || e.UplinkCuts < 2 || e.SlowClients < 2 || e.Floods < 2 || e.FloodRequests == 0 {
		t.Errorf("events did not all happen: %+v, reloads applied %d", e, rep.Log.ReloadsApplied)
	}
	if n := e.FloodStatus["200"]; n != 0 {
		t.Errorf("%d flood requests (%s) answered 200", n, e.FloodKind)
	}
	if rep.QueueMax == 0 {
		t.Error("the queue never grew: the uplink cuts did not cut")
	}
	if rep.Numbered == 0 || rep.Lost != 0 || rep.Dropped != 0 {
		t.Errorf("numbered %d, received %d after dedup: %d lost; the gateway dropped %d", rep.Numbered, rep.Received, rep.Lost, rep.Dropped)
	}

	// Flat after warm-up. Descriptors: the uplink, one slow client and
	// a socket in transit may differ between two moments. Memory: the Go
	// heap may settle higher once, not grow.
	if rep.FDs.Last > rep.FDs.First+4 {
		t.Errorf("descriptors grew: %v after warm-up, %v at the end (max %v)", rep.FDs.First, rep.FDs.Last, rep.FDs.Max)
	}
	if rep.RSSMiB.Last > rep.RSSMiB.First*1.25+2 {
		t.Errorf("RSS grew: %.1f MiB after warm-up, %.1f at the end (max %.1f)", rep.RSSMiB.First, rep.RSSMiB.Last, rep.RSSMiB.Max)
	}
	if rep.GoroutinesFrom == "go_goroutines" && rep.Goroutine.Last > rep.Goroutine.First+10 {
		t.Errorf("goroutines grew: %v after warm-up, %v at the end", rep.Goroutine.First, rep.Goroutine.Last)
	}

	if rep.Untouched < 30 || rep.UntouchedSched == 0 {
		t.Fatalf("%d untouched loggers, %d windows", rep.Untouched, rep.UntouchedSched)
	}
	if rep.ValidRate < rep.ValidBound {
		t.Errorf("untouched loggers: valid rate %.4f below the bound %.4f (%d good of %d windows)", rep.ValidRate, rep.ValidBound, rep.UntouchedGood, rep.UntouchedSched)
	}
	fieldRate := float64(time.Second / cfg.Interval)
	if rep.MaxGapIntervals >= fieldRate {
		t.Errorf("an untouched logger went %.1f intervals without a good sample: a whole field interval (1 s)", rep.MaxGapIntervals)
	}
	if rep.DoubleMisses > 0 {
		t.Logf("%d gaps of two windows or more in a row (longest %.2f intervals)", rep.DoubleMisses, rep.MaxGapIntervals)
	}
}

// SoakBound: 1% loss each way with one retry loses a window with
// p = 0.0199² ≈ 0.0004; the bound is 1 − (np + 6σ + 1)/n − 0.05.
func TestSoakBound(t *testing.T) {
	if b := SoakBound(0.01, 1, 0); b != 0 {
		t.Errorf("no windows: bound %v", b)
	}
	b := SoakBound(0.01, 1, 43200)
	if b < 0.94 || b > 0.9497 {
		t.Errorf("bound %v, want just under 0.95", b)
	}
	if SoakBound(0.05, 0, 43200) >= SoakBound(0.01, 1, 43200) {
		t.Error("more loss and no retry: the bound should be lower")
	}
	if b := SoakBound(0, 1, 100); b < 0.93 || b > 0.95 {
		t.Errorf("no loss, 100 windows: %v", b)
	}
}

// received counts what the receiver wrote: a sample missing from the
// numbered range is lost, a repeated one a duplicate, and a gap of two
// windows or more between good samples of an untouched logger is seen.
func TestSoakReceived(t *testing.T) {
	var b strings.Builder
	line := func(seq uint64, dev string, ts int64, q string) {
		fmt.Fprintf(&b, `{"gateway":"soak","epoch":"9f3c04e1a2b3c4d5","seq":%d,"device":%q,"tag":"temperature","value":1,"quality":%q,"ts":%d}`+"\n", seq, dev, q, ts)
	}
	const iv = 100_000 // µs
	seq := uint64(0)
	for i := int64(0); i < 20; i++ {
		if i != 5 && i != 6 && i != 12 { // a: two windows in a row, then one
			seq++
			line(seq, "a", i*iv+300, "good")
		}
		seq++
		line(seq, "b", i*iv+500, map[bool]string{true: "timeout", false: "good"}[i == 9])
	}
	line(3, "a", 300, "good") // a duplicate (seq 3 is a's second sample)
	r := &SoakReport{Numbered: seq + 2}
	if err := r.received(strings.NewReader(b.String()), map[string]bool{"a": true, "b": true}, 100*time.Millisecond, 1<<62); err != nil {
		t.Fatal(err)
	}
	if r.Received != seq || r.Lost != 2 || r.Duplicates != 1 || r.Epochs != 1 {
		t.Errorf("received %d lost %d duplicates %d epochs %d, want %d 2 1 1", r.Received, r.Lost, r.Duplicates, r.Epochs, seq)
	}
	if r.DoubleMisses != 1 || r.SingleMisses != 2 || r.MaxGapIntervals != 3 {
		t.Errorf("double %d single %d max gap %v, want 1 2 3", r.DoubleMisses, r.SingleMisses, r.MaxGapIntervals)
	}
	if err := r.received(strings.NewReader("{bad\n"), nil, time.Second, 0); err == nil {
		t.Error("a bad line went unnoticed")
	}
}

func TestSoakFlags(t *testing.T) {
	var out bytes.Buffer
	for _, args := range [][]string{
		{"soak", "-flood", "bogus", "-quiet"},
		{"soak", "-transport", "rtu", "-quiet"},
		{"soak", "-devices", "3", "-quiet"},
	} {
		if err := Main(args, &out); err == nil {
			t.Errorf("%v accepted", args)
		}
	}
}
