package edge

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"edgegw/lab/sim"
	"edgegw/ringstore"
)

// tsOf returns the acquisition times of one tag's good samples, in order.
func tsOf(samples []ringstore.Sample, dev, tag string) []int64 {
	var ts []int64
	for _, s := range samples {
		if s.Device == dev && s.Tag == tag && s.Quality == ringstore.Good {
			ts = append(ts, s.TS)
		}
	}
	return ts
}

// A reload keeps unchanged devices polling on their schedule (same device,
// statistics and connection, no window lost by the reload), stops removed
// ones, starts added ones and restarts changed ones. Not "100% valid": a
// loaded machine costs windows (a reply or the bus goroutine descheduled
// past a window's end), counted apart by whom they were lost to; what the
// reload must never do is reopen a kept device's connection, restart its
// schedule (a window polled twice, or lost without being counted) or reset
// its statistics.
func TestReloadKeepsUnchangedDevicesWithoutGap(t *testing.T) {
	tcp := startFleet(t, sim.Config{Devices: 3, Transport: "tcp"})
	udp := startFleet(t, sim.Config{Devices: 2, Transport: "udp"})
	iv := 100 * time.Millisecond
	a := devCfg("a", TransportTCP, tcp.Addr(0), iv, 40*time.Millisecond, thTags())
	b := devCfg("b", TransportTCP, tcp.Addr(1), iv, 40*time.Millisecond, thTags())
	c := devCfg("c", TransportTCP, tcp.Addr(2), iv, 40*time.Millisecond, thTags())
	d := devCfg("d", TransportUDP, udp.Addr(0), iv, 40*time.Millisecond, thTags())
	e := devCfg("e", TransportUDP, udp.Addr(1), iv, 40*time.Millisecond, thTags())
	ring := newRing(t, 100000)
	s, err := New(Config{Sink: ring, Devices: []DeviceConfig{a, b, c, d}, UDPListen: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	from := time.Now()
	stop := runSched(t, s)
	byName := func() map[string]*device {
		m := map[string]*device{}
		s.mu.RLock()
		defer s.mu.RUnlock()
		for _, d := range s.devices {
			m[d.cfg.Name] = d
		}
		return m
	}
	before := byName()
	waitFor(t, 10*time.Second, "10 polls of a", func() bool { return before["a"].stats.Polls.Load() >= 10 })

	b2 := b
	b2.Interval = 2 * iv // changed
	res, err := s.Reload(context.Background(), []DeviceConfig{a, b2, d, e})
	if err != nil {
		t.Fatal(err)
	}
	reloaded := time.Now().UnixMicro()
	if !slices.Equal(res.Kept, []string{"a", "d"}) || !slices.Equal(res.Changed, []string{"b"}) ||
		!slices.Equal(res.Added, []string{"e"}) || !slices.Equal(res.Removed, []string{"c"}) {
		t.Fatalf("reload result %+v", res)
	}
	after := byName()
	if after["a"] != before["a"] || after["d"] != before["d"] {
		t.Fatal("unchanged devices were replaced")
	}
	if _, ok := after["c"]; ok {
		t.Fatal("removed device still listed")
	}
	if after["b"] == before["b"] || after["b"].cfg.Interval != 2*iv {
		t.Fatal("changed device not replaced")
	}
	polls := before["a"].stats.Polls.Load()
	waitFor(t, 10*time.Second, "20 more polls of a and polls of e", func() bool {
		return after["a"].stats.Polls.Load() >= polls+20 && after["e"].stats.GoodPolls.Load() >= 5 && after["b"].stats.GoodPolls.Load() >= 5
	})
	to := time.Now()
	stop()
	for _, name := range []string{"a", "d"} {
		checkKept(t, ring, after[name], from, to)
	}
	for _, smp := range ring.Since(0, nil).Samples {
		if smp.Device == "c" && smp.TS > reloaded {
			t.Fatalf("removed device c polled after the reload: %+v", smp)
		}
	}
}

// checkKept asserts that d, kept across reloads in a run from from to to,
// kept its schedule (checkSchedule: the grid's windows, each polled once or
// counted lost), its statistics (its polls count from the run's start:
// more than its good samples before and after the reloads) and its
// connection (a redial only after a failed request).
func checkKept(t *testing.T, ring *ringstore.Ring, d *device, from, to time.Time) {
	t.Helper()
	sn := d.stats.Snapshot()
	byDevice, bySched := lostWindows(d)
	t.Logf("%s: polls %d valid %.3f; windows lost %d by the device (timeouts %d, errors %d), %d by the scheduler (overruns %d, skipped %d)",
		d.cfg.Name, sn.Polls, sn.ValidRate(), byDevice, sn.Timeouts, sn.Errors, bySched, sn.Overruns, sn.Skipped)
	checkSchedule(t, ring, d, "temperature", from, to)
	if good := uint64(len(tsOf(ring.Since(0, nil).Samples, d.cfg.Name, "temperature"))); sn.Polls < good {
		t.Errorf("%s: %d polls counted for %d good samples: statistics reset by a reload", d.cfg.Name, sn.Polls, good)
	}
	if sn.Reconnects > sn.Timeouts+sn.Errors {
		t.Errorf("%s: %d reconnects after %d failed requests: a reload reopened its connection", d.cfg.Name, sn.Reconnects, sn.Timeouts+sn.Errors)
	}
}

// An invalid device set is refused and the running one stays; Reload
// without Run fails instead of hanging.
func TestReloadInvalidKeepsRunningSet(t *testing.T) {
	f := startFleet(t, sim.Config{Devices: 1, Transport: "tcp"})
	a := devCfg("a", TransportTCP, f.Addr(0), 50*time.Millisecond, 40*time.Millisecond, thTags())
	s, err := New(Config{Sink: newRing(t, 100), Devices: []DeviceConfig{a}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := s.Reload(ctx, []DeviceConfig{a}); err == nil {
		t.Fatal("reload without Run succeeded")
	}
	runSched(t, s)
	noTags := devCfg("x", TransportTCP, f.Addr(0), time.Second, time.Second, nil)
	for _, bad := range [][]DeviceConfig{{a, a}, {a, noTags}} {
		if _, err := s.Reload(context.Background(), bad); err == nil {
			t.Fatalf("reload %v accepted", bad)
		}
	}
	if n := len(s.Devices()); n != 1 {
		t.Fatalf("%d devices after refused reloads", n)
	}
	st := s.Devices()[0].Stats
	p := st.Polls.Load()
	waitFor(t, 5*time.Second, "polls go on", func() bool { return st.Polls.Load() > p+3 })
}

// Twenty reloads while seven UDP devices poll every 100 ms and an eighth
// comes and goes: the unchanged devices keep their schedule, statistics
// and connection (checkKept).
func TestReloadRepeatedUnderLoad(t *testing.T) {
	f := startFleet(t, sim.Config{Devices: 8, Transport: "udp"})
	iv := 100 * time.Millisecond
	var base []DeviceConfig
	for i := 0; i < 7; i++ {
		base = append(base, devCfg(fmt.Sprintf("u%d", i), TransportUDP, f.Addr(i), iv, 30*time.Millisecond, thTags()))
	}
	extra := devCfg("extra", TransportUDP, f.Addr(7), iv, 30*time.Millisecond, thTags())
	ring := newRing(t, 100000)
	s, err := New(Config{Sink: ring, Devices: base, UDPListen: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	kept := slices.Clone(s.devices)
	from := time.Now()
	stop := runSched(t, s)
	for i := 0; i < 20; i++ {
		set := base
		if i%2 == 0 {
			set = append(append([]DeviceConfig(nil), base...), extra)
		}
		if _, err := s.Reload(context.Background(), set); err != nil {
			t.Fatal(err)
		}
		p := s.Devices()[0].Stats.Polls.Load()
		waitFor(t, 5*time.Second, "a poll between reloads", func() bool { return s.Devices()[0].Stats.Polls.Load() > p })
	}
	to := time.Now()
	stop()
	s.mu.RLock()
	now := s.devices
	s.mu.RUnlock()
	for i, d := range kept {
		if now[i] != d {
			t.Fatalf("%s replaced by a reload", d.cfg.Name)
		}
		checkKept(t, ring, d, from, to)
	}
}
