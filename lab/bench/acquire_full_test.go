package bench

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"edgegw/conf"
	"edgegw/lab/sim"
)

// TestAcquireFull: `bench acquire -full` runs the shipped gateway build
// (built here from build/gateway.flags, as it does without -gateway) with
// the default config against the loggers, reads its polls from
// /api/devices and its usage from /proc, and takes both profiles from its
// -pprof listener. No timing figure is asserted.
func TestAcquireFull(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	dir := t.TempDir()
	rep, err := RunAcquire(ctx, AcquireConfig{
		Devices: 4, Interval: 100 * time.Millisecond, Duration: 2 * time.Second, Warmup: 500 * time.Millisecond,
		Modes: []string{ModeFull}, Telegraf: "off", Profile: dir,
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Modes) != 2 || rep.Modes[0].Mode != ModeFull || rep.Modes[1].Mode != "telegraf" {
		t.Fatalf("modes %+v: want full, then telegraf (skipped)", rep.Modes)
	}
	m := rep.Modes[0]
	if m.Skipped != "" || m.Polls == 0 || m.Requests == 0 || m.SimRequests == 0 {
		t.Fatalf("full: %+v: want polls, requests and logger requests > 0", m)
	}
	if m.GoodPolls > m.Polls || m.Polls > m.Scheduled || m.Responses > m.Requests {
		t.Errorf("full: good %d ≤ polls %d ≤ scheduled %d, responses %d ≤ requests %d broken", m.GoodPolls, m.Polls, m.Scheduled, m.Responses, m.Requests)
	}
	// The gateway's own count and the loggers' agree within what one
	// window edge can hold (4 loggers, a poll or two each).
	if d := int64(m.Requests) - int64(m.SimRequests); d > 12 || d < -12 {
		t.Errorf("full: the gateway counted %d requests, the loggers %d", m.Requests, m.SimRequests)
	}
	if m.ValidRate <= 0 || m.ValidRate > 1 || m.RSSMiB <= 0 || m.Seconds <= 0 {
		t.Errorf("full: valid %v, rss %v MiB, window %v s: want valid in (0,1], rss and window > 0", m.ValidRate, m.RSSMiB, m.Seconds)
	}
	if m.RSSAnonMiB <= 0 || m.RSSFileMiB <= 0 || m.RSSAnonMiB+m.RSSFileMiB > m.RSSMiB+4 {
		t.Errorf("full: rss %.1f MiB = anonymous %.1f + file %.1f (+ shared): want both parts > 0 and within the total", m.RSSMiB, m.RSSAnonMiB, m.RSSFileMiB)
	}
	var text strings.Builder
	rep.WriteText(&text)
	if !strings.Contains(text.String(), "edgegw run") {
		t.Errorf("report does not say what full measured:\n%s", text.String())
	}
	for _, name := range []string{"full-cpu.pprof", "full-heap.pprof"} {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil || len(b) == 0 {
			t.Errorf("%s: %d bytes, %v", name, len(b), err)
		}
	}
}

func TestAcquireFullBadGateway(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err := RunAcquire(ctx, AcquireConfig{
		Devices: 1, Duration: time.Second, Modes: []string{ModeFull}, Telegraf: "off",
		Gateway: filepath.Join(t.TempDir(), "no-such-edgegw"),
	})
	if err == nil || !strings.Contains(err.Error(), "no-such-edgegw") {
		t.Fatalf("err %v: want the missing binary named", err)
	}
}

// -full-config's sections reach the measured gateway's config, which the
// gateway's own parser reads: a site's ring and history sizes, or a clear
// refusal when they collide with what the bench writes itself.
func TestFullConfigAddsSections(t *testing.T) {
	f, err := sim.NewFleet(sim.Config{Devices: 2, Transport: "tcp", Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	plain, err := conf.Parse("plain.toml", []byte(fullConfig(f, time.Second, 500*time.Millisecond, "127.0.0.1:0", "")))
	if err != nil {
		t.Fatal(err)
	}
	extra := "[ring]\nmax_bytes = \"2MiB\"\n\n[history]\nmax_ram = \"1MiB\"\n"
	c, err := conf.Parse("extra.toml", []byte(fullConfig(f, time.Second, 500*time.Millisecond, "127.0.0.1:0", extra)))
	if err != nil {
		t.Fatal(err)
	}
	if c.Ring.MaxBytes != 2<<20 || c.History.MaxRAM != 1<<20 {
		t.Errorf("ring max_bytes %d, history max_ram %d: want 2 MiB and 1 MiB", c.Ring.MaxBytes, c.History.MaxRAM)
	}
	if plain.Ring.MaxBytes == c.Ring.MaxBytes || plain.History.MaxRAM == c.History.MaxRAM {
		t.Errorf("the defaults (%d, %d) are what -full-config set", plain.Ring.MaxBytes, plain.History.MaxRAM)
	}
	if len(c.Devices) != 2 || len(plain.Devices) != 2 {
		t.Errorf("%d and %d devices: want the fleet's 2", len(c.Devices), len(plain.Devices))
	}
	if got := tomlHeaders(extra); strings.Join(got, " ") != "[ring] [history]" {
		t.Errorf("headers %q", got)
	}
	_, err = conf.Parse("twice.toml", []byte(fullConfig(f, time.Second, 500*time.Millisecond, "127.0.0.1:0", "[http]\nlisten = \"127.0.0.1:0\"\n")))
	if err == nil || !strings.Contains(err.Error(), "http") {
		t.Errorf("a second [http]: err %v, want it refused by name", err)
	} else {
		t.Logf("a second [http]: %v", err)
	}
}
