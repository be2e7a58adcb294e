package edge

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"edgegw/ringstore"
	"edgegw/sim"
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

// A reload keeps unchanged devices polling on their schedule (same
// statistics, no missed window, no gap in their samples), stops removed
// ones, starts added ones and restarts changed ones.
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
	stop()
	for _, name := range []string{"a", "d"} {
		sn := after[name].stats.Snapshot()
		if sn.ValidRate() != 1 || sn.Overruns != 0 || sn.Skipped != 0 {
			t.Errorf("%s across the reload: valid %.3f, overruns %d, skipped %d", name, sn.ValidRate(), sn.Overruns, sn.Skipped)
		}
		ts := tsOf(ring.Since(0, nil).Samples, name, "temperature")
		for i := 1; i < len(ts); i++ {
			if gap := time.Duration(ts[i]-ts[i-1]) * time.Microsecond; gap > iv*3/2+10*time.Millisecond {
				t.Errorf("%s: %v between two samples (interval %v)", name, gap, iv)
			}
		}
	}
	for _, smp := range ring.Since(0, nil).Samples {
		if smp.Device == "c" && smp.TS > reloaded {
			t.Fatalf("removed device c polled after the reload: %+v", smp)
		}
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
// comes and goes: the unchanged devices never miss a window.
func TestReloadRepeatedUnderLoad(t *testing.T) {
	f := startFleet(t, sim.Config{Devices: 8, Transport: "udp"})
	iv := 100 * time.Millisecond
	var base []DeviceConfig
	for i := 0; i < 7; i++ {
		base = append(base, devCfg(fmt.Sprintf("u%d", i), TransportUDP, f.Addr(i), iv, 30*time.Millisecond, thTags()))
	}
	extra := devCfg("extra", TransportUDP, f.Addr(7), iv, 30*time.Millisecond, thTags())
	s, err := New(Config{Sink: newRing(t, 1000), Devices: base, UDPListen: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
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
	stop()
	for _, e := range s.Devices()[:7] {
		if sn := e.Stats.Snapshot(); sn.ValidRate() != 1 || sn.Overruns != 0 {
			t.Errorf("%s: valid %.3f overruns %d over 20 reloads", e.Info.Name, sn.ValidRate(), sn.Overruns)
		}
	}
}
