package sim

import (
	"errors"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/goburrow/modbus"

	"edgegw/internal/testenv"
)

func TestFleetConfig(t *testing.T) {
	for _, tc := range []struct {
		cfg  Config
		want string
	}{
		{Config{Transport: "rtu"}, `sim: transport "rtu": want tcp, udp or rtutcp`},
		{Config{Registers: 70000}, "sim: registers 70000 > 65536"},
		{Config{Port: 70000}, "sim: port 70000 out of range"},
	} {
		if _, err := NewFleet(tc.cfg); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("NewFleet(%+v) = %v, want %q", tc.cfg, err, tc.want)
		}
	}
	f, err := NewFleet(Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if f.Len() != 1 || !strings.HasPrefix(f.Addr(0), "127.0.1.1:") || f.cfg.Transport != "tcp" || f.cfg.MaxRead != 125 || f.cfg.Registers != 65536 || f.cfg.Tick != 100*time.Millisecond {
		t.Errorf("defaults: %d loggers at %s, %+v", f.Len(), f.Addr(0), f.cfg)
	}
	if _, err := NewRTUBus(RTUConfig{}); err == nil {
		t.Error("NewRTUBus without a path succeeded")
	}
}

// One port for every logger (each on its own address); a second fleet on
// the same addresses and port fails and releases what it bound.
func TestFleetSamePort(t *testing.T) {
	port := testenv.FreePort(t)
	f := startFleet(t, Config{Devices: 3, Transport: "tcp", Port: port, MaxRead: 10, Registers: 1000})
	for i := 0; i < 3; i++ {
		ap := netip.MustParseAddrPort(f.Addr(i))
		if int(ap.Port()) != port || ap.Addr() != DeviceAddr(i) {
			t.Fatalf("logger %d at %s", i, ap)
		}
	}
	// The first failed attempt may leave one-time descriptors of the
	// runtime or the net package open; measure the leak on the next ones.
	if _, err := NewFleet(Config{Devices: 5, Transport: "tcp", Port: port}); err == nil || !strings.Contains(err.Error(), "sim-0001") {
		t.Errorf("second fleet on the same port: %v", err)
	}
	fds := countFDs(t)
	for i := 0; i < 3; i++ {
		if _, err := NewFleet(Config{Devices: 5, Transport: "tcp", Port: port}); err == nil {
			t.Fatal("second fleet on the same port bound")
		}
	}
	if got := countFDs(t); got > fds {
		t.Errorf("failed NewFleet leaked fds: %d → %d", fds, got)
	}
	c, _ := tcpClient(t, f.Addr(2))
	if _, err := c.ReadHoldingRegisters(0, 10); err != nil {
		t.Fatal(err)
	}
	var me *modbus.ModbusError
	if _, err := c.ReadHoldingRegisters(0, 11); !errors.As(err, &me) || me.ExceptionCode != 2 {
		t.Errorf("read of 11 with MaxRead 10: %v, want exception 2", err)
	}
	if _, err := c.ReadHoldingRegisters(999, 2); !errors.As(err, &me) || me.ExceptionCode != 2 {
		t.Errorf("read past Registers: %v, want exception 2", err)
	}
}
