package edge

import (
	"context"
	"testing"
	"time"

	"edgegw/edge/modbus"
	"edgegw/internal/testenv"
	"edgegw/sim"
)

// Three units on one RTU bus (a socat pty pair, the simulator on the other
// end): one bus goroutine polls them fairly; a dead unit is demoted and
// does not stop the others, which stay at 100% valid.
func TestRTUBusDeadUnitDoesNotStopOthers(t *testing.T) {
	a, b := testenv.PTYPair(t)
	bus, err := sim.NewRTUBus(sim.RTUConfig{Path: b, Baud: 19200, Units: []uint8{1, 2, 3}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- bus.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	bus.Logger(3).Stop() // unit 3 is dead

	var devs []DeviceConfig
	for u := uint8(1); u <= 3; u++ {
		dc := devCfg("unit-"+string('0'+rune(u)), TransportRTU, a, 150*time.Millisecond, 40*time.Millisecond, thTags())
		dc.Unit = u
		dc.Serial = modbus.SerialConfig{Baud: 19200}
		devs = append(devs, dc)
	}
	ring := newRing(t, 1000)
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
	for _, d := range s.devices[:2] {
		sn := d.stats.Snapshot()
		if sn.ValidRate() != 1 || sn.Errors != 0 {
			t.Errorf("%s: valid %.3f, errors %d, timeouts %d, overruns %d", d.cfg.Name, sn.ValidRate(), sn.Errors, sn.Timeouts, sn.Overruns)
		}
	}
	p0, p1 := s.devices[0].stats.Polls.Load(), s.devices[1].stats.Polls.Load()
	if p0 > p1+2 || p1 > p0+2 {
		t.Errorf("unfair: unit 1 polled %d times, unit 2 %d", p0, p1)
	}
	if sn := s.devices[2].stats.Snapshot(); sn.GoodPolls != 0 || sn.Skipped == 0 {
		t.Errorf("dead unit: %+v", sn)
	}
}
