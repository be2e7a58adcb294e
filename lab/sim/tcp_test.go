package sim

import (
	"context"
	"encoding/binary"
	"errors"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/goburrow/modbus"

	"edgegw/internal/testenv"
)

// startFleet runs a fleet until the test ends.
func startFleet(t testing.TB, cfg Config) *Fleet {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = discard()
	}
	f, err := NewFleet(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := testenv.Recv(t, done, 10*time.Second, "the fleet's Run to return after cancel"); err != nil {
			t.Errorf("Run: %v", err)
		}
		f.Close()
	})
	return f
}

func frozen() func() time.Time {
	t0 := time.Date(2026, 6, 1, 12, 0, 0, 0, time.UTC)
	return func() time.Time { return t0 }
}

// testClock stands still until moved; safe for concurrent use.
type testClock struct{ ns atomic.Int64 }

func newTestClock() *testClock {
	c := &testClock{}
	c.ns.Store(time.Date(2026, 6, 1, 12, 0, 0, 0, time.UTC).UnixNano())
	return c
}

func (c *testClock) now() time.Time          { return time.Unix(0, c.ns.Load()) }
func (c *testClock) advance(d time.Duration) { c.ns.Add(int64(d)) }

func tcpClient(t testing.TB, addr string) (modbus.Client, *modbus.TCPClientHandler) {
	t.Helper()
	hd := modbus.NewTCPClientHandler(addr)
	hd.Timeout = 2 * time.Second
	hd.IdleTimeout = 0
	hd.SlaveId = 1
	t.Cleanup(func() { hd.Close() })
	return modbus.NewClient(hd), hd
}

func regs(b []byte) []uint16 {
	out := make([]uint16, len(b)/2)
	for i := range out {
		out[i] = binary.BigEndian.Uint16(b[2*i:])
	}
	return out
}

func equalRegs(a, b []uint16) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestTCPGoburrow(t *testing.T) {
	f := startFleet(t, Config{Devices: 3, Transport: "tcp", Seed: 5, Clock: frozen()})
	for i, want := range []string{"127.0.1.1", "127.0.1.2", "127.0.1.3"} {
		if got := DeviceAddr(i).String(); got != want {
			t.Fatalf("DeviceAddr(%d) = %s", i, got)
		}
	}
	if got := DeviceAddr(254).String(); got != "127.0.2.1" {
		t.Fatalf("DeviceAddr(254) = %s", got)
	}
	for i := 0; i < f.Len(); i++ {
		l := f.Logger(i)
		c, _ := tcpClient(t, f.Addr(i))
		b, err := c.ReadHoldingRegisters(0, 7)
		if err != nil {
			t.Fatalf("logger %d: %v", i, err)
		}
		if got, want := regs(b), l.Holding(0, 7); !equalRegs(got, want) {
			t.Fatalf("logger %d: read %v, bank %v", i, got, want)
		}
		if _, err := c.WriteSingleRegister(10, 0xBEEF); err != nil {
			t.Fatal(err)
		}
		if _, err := c.WriteMultipleRegisters(20, 2, []byte{0x12, 0x34, 0x56, 0x78}); err != nil {
			t.Fatal(err)
		}
		if _, err := c.WriteSingleCoil(0, 0xFF00); err != nil {
			t.Fatal(err)
		}
		if _, err := c.WriteMultipleCoils(8, 3, []byte{0x05}); err != nil {
			t.Fatal(err)
		}
		if got := l.Holding(10, 1)[0]; got != 0xBEEF {
			t.Errorf("register 10 = %#x", got)
		}
		b, err = c.ReadHoldingRegisters(20, 2)
		if err != nil || !equalRegs(regs(b), []uint16{0x1234, 0x5678}) {
			t.Errorf("read back 20..21: % X %v", b, err)
		}
		b, err = c.ReadCoils(0, 11)
		if err != nil || len(b) != 2 || b[0] != 0x01 || b[1] != 0x05 {
			t.Errorf("read coils: % X %v", b, err)
		}
		if b, err = c.ReadInputRegisters(0, 3); err != nil || !equalRegs(regs(b), l.Holding(0, 3)) {
			t.Errorf("input registers % X %v", b, err)
		}
		_, err = c.ReadHoldingRegisters(65535, 2)
		var me *modbus.ModbusError
		if !errors.As(err, &me) || me.ExceptionCode != modbus.ExceptionCodeIllegalDataAddress {
			t.Errorf("read past 65535: %v, want exception 2", err)
		}
		if _, err = c.ReadHoldingRegisters(0, 1); err != nil {
			t.Errorf("read after exception: %v", err)
		}
	}
	if c := f.Logger(0).Counters(); c.Requests != 10 || c.Replies != 10 || c.Dropped != 0 {
		t.Errorf("counters %+v, want 10 requests and replies", c)
	}
}

// Many connections to one logger at once, each served by its own goroutine.
func TestTCPConcurrentConnections(t *testing.T) {
	f := startFleet(t, Config{Transport: "tcp", Clock: frozen()})
	want := f.Logger(0).Holding(0, 7)
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for k := 0; k < 8; k++ {
		c, _ := tcpClient(t, f.Addr(0))
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := 0; j < 25; j++ {
				b, err := c.ReadHoldingRegisters(0, 7)
				if err != nil {
					errs <- err
					return
				}
				if !equalRegs(regs(b), want) {
					errs <- errors.New("wrong values")
					return
				}
			}
		}()
	}
	testenv.Wait(t, time.Minute, "8 connections × 25 reads", wg.Wait)
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if got := f.Logger(0).Counters().Replies; got != 200 {
		t.Errorf("replies %d, want 200", got)
	}
}

func countFDs(t testing.TB) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skipf("no /proc/self/fd: %v", err)
	}
	return len(ents)
}

// waitFor is testenv.WaitFor with the sim tests' argument order.
func waitFor(t testing.TB, what string, d time.Duration, cond func() bool) {
	t.Helper()
	testenv.WaitFor(t, d, what, cond)
}

// A restart is a real one: the listener and every connection close, the
// same address listens again, and nothing leaks across 50 restarts.
func TestTCPRestart(t *testing.T) {
	f := startFleet(t, Config{Devices: 2, Transport: "tcp", Clock: frozen()})
	l := f.Logger(1)
	addr := f.Addr(1)
	read := func() error {
		c, hd := tcpClient(t, addr)
		defer hd.Close()
		_, err := c.ReadHoldingRegisters(0, 3)
		return err
	}
	if err := read(); err != nil {
		t.Fatal(err)
	}
	if err := l.Restart(); err != nil { // settle: server side of the first client closed
		t.Fatal(err)
	}
	fds, gs := countFDs(t), runtime.NumGoroutine()

	old, _ := tcpClient(t, addr)
	if _, err := old.ReadHoldingRegisters(0, 1); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 50; i++ {
		if err := l.Restart(); err != nil {
			t.Fatalf("restart %d: %v", i, err)
		}
		if f.Addr(1) != addr {
			t.Fatalf("address changed: %s → %s", addr, f.Addr(1))
		}
		if err := read(); err != nil {
			t.Fatalf("read after restart %d: %v", i, err)
		}
	}
	if _, err := old.ReadHoldingRegisters(0, 1); err == nil {
		t.Error("a connection from before the restart still works")
	}
	if err := l.Restart(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "goroutines to settle", 5*time.Second, func() bool { return runtime.NumGoroutine() <= gs })
	if got := countFDs(t); got > fds+1 { // +1: the old client's socket, closed at cleanup
		t.Errorf("fds %d after 50 restarts, %d before", got, fds)
	}
	// The other logger never noticed.
	if f.Logger(0).Counters().Requests != 0 {
		t.Error("logger 0 got requests")
	}

	l.Stop()
	if _, err := (&tcpDialer{}).dial(addr); err == nil {
		t.Error("stopped logger accepts connections")
	}
	if err := l.Start(); err != nil {
		t.Fatal(err)
	}
	if err := read(); err != nil {
		t.Fatalf("read after Start: %v", err)
	}
}
