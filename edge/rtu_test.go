package edge

import (
	"testing"
	"time"

	"edgegw/edge/modbus"
	"edgegw/internal/testenv"
	"edgegw/lab/sim"
	"edgegw/ringstore"
)

// Three units on one RTU bus (a socat pty pair, the simulator on the other
// end): one bus goroutine polls them fairly; a dead unit is demoted and
// does not stop the others: their polls get their answers, with no frame
// error but after a stall of the machine. (Not "100% valid": on a loaded
// machine a poll may end after its window; the live units' timeout is far
// above any reply time so that only the dead unit times out, but for a
// stall longer than a second, which is counted apart.)
func TestRTUBusDeadUnitDoesNotStopOthers(t *testing.T) {
	a, b := testenv.PTYPair(t)
	bus := startRTUBus(t, sim.RTUConfig{Path: b, Baud: 19200, Units: []uint8{1, 2, 3}})
	bus.Logger(3).Stop() // unit 3 is dead

	var devs []DeviceConfig
	for u := uint8(1); u <= 3; u++ {
		timeout := time.Second
		if u == 3 {
			timeout = 40 * time.Millisecond
		}
		dc := devCfg("unit-"+string('0'+rune(u)), TransportRTU, a, 150*time.Millisecond, timeout, thTags())
		dc.Unit = u
		dc.Serial = modbus.SerialConfig{Baud: 19200}
		devs = append(devs, dc)
	}
	ring := newRing(t, 10000)
	s, err := New(Config{Sink: ring, Devices: devs})
	if err != nil {
		t.Fatal(err)
	}
	if len(s.buses) != 1 {
		t.Fatalf("%d buses for one serial port", len(s.buses))
	}
	stop := runSched(t, s)
	waitFor(t, 30*time.Second, "20 polls of the live units and the dead one demoted", func() bool {
		return s.devices[0].stats.Polls.Load() >= 20 && s.devices[1].stats.Polls.Load() >= 20 && s.devices[2].stats.Demoted.Load()
	})
	stop()
	res := ring.Since(0, nil)
	if res.Reset {
		t.Fatal("ring overflowed")
	}
	// The live units' timeout (1 s) is far above any reply time: a timeout
	// is a machine that stalled, and its late reply may then spoil the next
	// exchange on the line (a frame error, of either unit). A dead unit that
	// disturbed the others would cost them every cycle, not one in ten.
	var errs, timeouts uint64
	for _, d := range s.devices[:2] {
		sn := d.stats.Snapshot()
		errs, timeouts = errs+sn.Errors, timeouts+sn.Timeouts
		failed := sn.Errors + sn.Timeouts
		if sn.Responses+failed != sn.Requests || 10*failed > sn.Requests+20 {
			t.Errorf("%s: requests %d responses %d errors %d timeouts %d (valid %.3f, overruns %d)", d.cfg.Name, sn.Requests, sn.Responses, sn.Errors, sn.Timeouts, sn.ValidRate(), sn.Overruns)
		}
		n, bad := 0, uint64(0)
		for _, smp := range res.Samples {
			if smp.Device != d.cfg.Name {
				continue
			}
			n++
			if smp.Quality != ringstore.Good {
				bad++
				t.Logf("%s: sample %+v", d.cfg.Name, smp)
			}
		}
		if bad > 2*failed { // 2 tags in one read: a failed request spoils both
			t.Errorf("%s: %d samples not good after %d failed requests", d.cfg.Name, bad, failed)
		}
		if n != 2*int(sn.Polls) {
			t.Errorf("%s: %d samples for %d polls of 2 tags", d.cfg.Name, n, sn.Polls)
		}
	}
	if errs > timeouts {
		t.Errorf("live units: %d errors after %d timeouts: frame errors without a late reply", errs, timeouts)
	}
	// Fair: both units' windows are accounted for (polled, overrun or
	// skipped) at the same pace; a loaded machine turns polls into overruns,
	// not into one unit starving the other.
	w0, w1 := s.devices[0].stats.Snapshot(), s.devices[1].stats.Snapshot()
	p0, p1 := w0.Polls+w0.Overruns+w0.Skipped, w1.Polls+w1.Overruns+w1.Skipped
	if p0 > p1+2 || p1 > p0+2 {
		t.Errorf("unfair: unit 1 had %d windows (%d polls), unit 2 %d (%d polls)", p0, w0.Polls, p1, w1.Polls)
	}
	if sn := s.devices[2].stats.Snapshot(); sn.GoodPolls != 0 || sn.Skipped == 0 {
		t.Errorf("dead unit: %+v", sn)
	}
}
