package edge

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"edgegw/edge/modbus"
	"edgegw/internal/testenv"
	"edgegw/lab/sim"
)

// A device whose transport cannot be opened — an RTU device at a serial
// port that does not exist, a UDP device at a name that does not resolve —
// is down with the reason, at start-up and when a reload adds it; the good
// device keeps polling (no window lost to the others' reopens: what a
// loaded machine costs it is bounded, see schedulerLoss); when the port appears (a
// socat pty linked at that path) the RTU device recovers by itself.
func TestDownTransportRecoversWithoutRestart(t *testing.T) {
	udp := startFleet(t, sim.Config{Devices: 1, Transport: "udp"})
	dir := t.TempDir()
	missing := filepath.Join(dir, "ttyUSB9")
	iv := 100 * time.Millisecond
	good := devCfg("good", TransportUDP, udp.Addr(0), iv, 40*time.Millisecond, thTags())
	rtu := devCfg("rtu", TransportRTU, missing, iv, 40*time.Millisecond, thTags())
	rtu.Serial = modbus.SerialConfig{Baud: 19200}
	bad := devCfg("unresolvable", TransportUDP, "nope.invalid:502", iv, 40*time.Millisecond, thTags())
	ring := newRing(t, 10000)
	s, err := New(Config{Sink: ring, Devices: []DeviceConfig{good, rtu}, UDPListen: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	from := time.Now()
	start := takeLostAll(s.devices[:1])
	stop := runSched(t, s)
	dev := func(name string) *device {
		s.mu.RLock()
		defer s.mu.RUnlock()
		for _, d := range s.devices {
			if d.cfg.Name == name {
				return d
			}
		}
		return nil
	}
	waitFor(t, 10*time.Second, "good polled and rtu down", func() bool {
		return dev("good").stats.GoodPolls.Load() >= 5 && dev("rtu").stats.Down.Load()
	})
	if r := dev("rtu").stats.Reason(); !strings.Contains(r, missing) || !strings.Contains(r, "no such file or directory") {
		t.Errorf("rtu reason %q", r)
	}

	// A reload adding an unresolvable UDP device: no error, the device is down.
	if _, err := s.Reload(context.Background(), []DeviceConfig{good, rtu, bad}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "unresolvable down", func() bool { return dev("unresolvable").stats.Down.Load() })
	if r := dev("unresolvable").stats.Reason(); !strings.Contains(r, "nope.invalid") {
		t.Errorf("unresolvable reason %q", r)
	}
	if dev("unresolvable").stats.Polls.Load() == 0 && dev("unresolvable").stats.Skipped.Load() == 0 {
		// windows of a down device are accounted for (polls that failed to open, or skipped in backoff)
		waitFor(t, 10*time.Second, "windows of the down device counted", func() bool {
			sn := dev("unresolvable").stats.Snapshot()
			return sn.Polls+sn.Skipped > 0
		})
	}

	// The port appears: the RTU device recovers without a restart.
	a, b := testenv.PTYPair(t)
	startRTUBus(t, sim.RTUConfig{Path: b, Baud: 19200, Units: []uint8{1}})
	if err := os.Symlink(a, missing); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 60*time.Second, "rtu recovered", func() bool {
		return !dev("rtu").stats.Down.Load() && dev("rtu").stats.GoodPolls.Load() >= 3
	})
	if r := dev("rtu").stats.Reason(); r != "" {
		t.Errorf("recovered rtu still has reason %q", r)
	}
	to := time.Now()
	stop()
	schedulerLoss(t, "beside the down devices", []*device{dev("good")}, start)
	checkSchedule(t, ring, dev("good"), "temperature", from, to)
	if us := dev("unresolvable").stats.Snapshot(); us.GoodPolls != 0 || !us.Down {
		t.Errorf("unresolvable: %+v", us)
	}
}

// The UDP socket's address is in use: the UDP devices are down with that
// reason, the TCP device polls; once the address is free they recover.
func TestDownUDPListenInUseRecovers(t *testing.T) {
	blocker, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer blocker.Close()
	udp := startFleet(t, sim.Config{Devices: 1, Transport: "udp"})
	tcp := startFleet(t, sim.Config{Devices: 1, Transport: "tcp"})
	iv := 100 * time.Millisecond
	u := devCfg("u", TransportUDP, udp.Addr(0), iv, 40*time.Millisecond, thTags())
	c := devCfg("c", TransportTCP, tcp.Addr(0), iv, 40*time.Millisecond, thTags())
	s, err := New(Config{Sink: newRing(t, 1000), Devices: []DeviceConfig{u, c}, UDPListen: blocker.LocalAddr().String()})
	if err != nil {
		t.Fatal(err)
	}
	runSched(t, s)
	waitFor(t, 10*time.Second, "c polled, u down", func() bool {
		return s.devices[1].stats.GoodPolls.Load() >= 5 && s.devices[0].stats.Down.Load()
	})
	if r := s.devices[0].stats.Reason(); !strings.Contains(r, "address already in use") {
		t.Errorf("reason %q", r)
	}
	blocker.Close()
	waitFor(t, 60*time.Second, "u recovered", func() bool {
		return !s.devices[0].stats.Down.Load() && s.devices[0].stats.GoodPolls.Load() >= 3
	})
}
