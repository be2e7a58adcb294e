package sim

import (
	"errors"
	"net/netip"
	"os"
	"strconv"
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
	// What a failed NewFleet could leak is a socket on the port: count this
	// process's sockets there (the whole-process descriptor count also
	// moves with the runtime and earlier tests' connections closing).
	socks := socketsOn(t, port)
	if socks != 3 {
		t.Fatalf("%d sockets on port %d with 3 loggers listening", socks, port)
	}
	for i := 0; i < 3; i++ {
		if _, err := NewFleet(Config{Devices: 5, Transport: "tcp", Port: port}); err == nil {
			t.Fatal("second fleet on the same port bound")
		}
	}
	if got := socketsOn(t, port); got != socks {
		t.Errorf("failed NewFleet leaked sockets on port %d: %d → %d", port, socks, got)
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

// socketsOn counts this process's TCP sockets whose local port is port:
// the inodes of /proc/self/fd that /proc/net/tcp lists on that port.
func socketsOn(t *testing.T, port int) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skipf("no /proc/self/fd: %v", err)
	}
	mine := map[string]bool{}
	for _, e := range ents {
		l, err := os.Readlink("/proc/self/fd/" + e.Name())
		if err == nil && strings.HasPrefix(l, "socket:[") {
			mine[strings.TrimSuffix(strings.TrimPrefix(l, "socket:["), "]")] = true
		}
	}
	b, err := os.ReadFile("/proc/net/tcp")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, line := range strings.Split(string(b), "\n")[1:] {
		f := strings.Fields(line)
		if len(f) < 10 || !mine[f[9]] {
			continue
		}
		if i := strings.LastIndexByte(f[1], ':'); i > 0 {
			if p, _ := strconv.ParseUint(f[1][i+1:], 16, 16); int(p) == port {
				n++
			}
		}
	}
	return n
}
