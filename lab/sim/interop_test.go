package sim

import (
	"context"
	"fmt"
	"math"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"edgegw/internal/testenv"
)

// mbpoll prints "[ref]: 	value", and for 16-bit values above 32767 the
// signed reading after it: "[2]: 	43210 (-22326)".
var mbpollLine = regexp.MustCompile(`(?m)^\[(\d+)\]:\s+(-?[0-9.eE+-]+)(?: \((-\d+)\))?`)

// mbpollValues parses "[ref]: value" lines of mbpoll's output.
func mbpollValues(t *testing.T, out string) map[int]string {
	t.Helper()
	vals := map[int]string{}
	for _, m := range mbpollLine.FindAllStringSubmatch(out, -1) {
		ref, _ := strconv.Atoi(m[1])
		vals[ref] = m[2]
		if m[3] != "" {
			vals[-1-ref] = m[3] // signed reading, kept apart
		}
	}
	return vals
}

func runMbpoll(t *testing.T, args ...string) string {
	t.Helper()
	bin := testenv.Need(t, "mbpoll")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("mbpoll %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	t.Logf("mbpoll %s\n%s", strings.Join(args, " "), out)
	return string(out)
}

// checkMbpoll compares mbpoll's 0-based register dump with want.
func checkMbpoll(t *testing.T, out string, want []uint16) {
	t.Helper()
	vals := mbpollValues(t, out)
	for i, w := range want {
		if exp := strconv.Itoa(int(w)); vals[i] != exp {
			t.Errorf("register %d: mbpoll printed %q, bank has %s\n%s", i, vals[i], exp, out)
		}
		if int16(w) < 0 && vals[-1-i] != strconv.Itoa(int(int16(w))) {
			t.Errorf("register %d: mbpoll's signed reading %q, bank has %d", i, vals[-1-i], int16(w))
		}
	}
}

// mbpoll (libmodbus, an independent C master) reads the TCP simulator.
func TestInteropMbpollTCP(t *testing.T) {
	testenv.Need(t, "mbpoll")
	clk := newTestClock()
	f := startFleet(t, Config{Transport: "tcp", Clock: clk.now, Seed: 11})
	clk.advance(4321 * time.Second) // uptime and sequence counter non-zero
	l := f.Logger(0)
	host, port, _ := strings.Cut(f.Addr(0), ":")
	// -0: 0-based references (PDU addresses); -t 4: holding registers, signed decimal.
	out := runMbpoll(t, "-m", "tcp", "-a", "1", "-0", "-r", "0", "-c", "3", "-1", "-p", port, host)
	checkMbpoll(t, out, l.Holding(0, 3))
	// Without -0 the reference is 1-based: -r 1 is address 0.
	out = runMbpoll(t, "-m", "tcp", "-a", "1", "-r", "1", "-c", "1", "-1", "-p", port, host)
	if v := mbpollValues(t, out)[1]; v != strconv.Itoa(int(l.Holding(0, 1)[0])) {
		t.Errorf("1-based -r 1 printed %q\n%s", v, out)
	}
	// The float at 5..6 (ABCD, -B big endian words) is the temperature.
	out = runMbpoll(t, "-m", "tcp", "-a", "1", "-0", "-r", "5", "-c", "1", "-t", "4:float", "-B", "-1", "-p", port, host)
	fv, err := strconv.ParseFloat(mbpollValues(t, out)[5], 64)
	if want := float64(int16(l.Holding(0, 1)[0])) / 10; err != nil || math.Abs(fv-want) > 1e-4 {
		t.Errorf("float: %v %v, want %v\n%s", fv, err, want, out)
	}
	// A write from mbpoll lands in the bank.
	runMbpoll(t, "-m", "tcp", "-a", "1", "-0", "-r", "40", "-1", "-p", port, host, "4242")
	if got := l.Holding(40, 1)[0]; got != 4242 {
		t.Errorf("mbpoll write: register 40 = %d", got)
	}
}

// mbpoll reads the RTU simulator through a socat pty pair.
func TestInteropMbpollRTU(t *testing.T) {
	testenv.Need(t, "mbpoll")
	clk := newTestClock()
	bus, path := startBus(t, RTUConfig{Units: []uint8{1, 7}, Clock: clk.now, Seed: 12})
	clk.advance(1234500 * time.Millisecond)
	for _, unit := range []uint8{7, 1} {
		out := runMbpoll(t, "-m", "rtu", "-b", "9600", "-P", "none", "-a", strconv.Itoa(int(unit)),
			"-0", "-r", "0", "-c", "3", "-1", "-o", "2", path)
		checkMbpoll(t, out, bus.Logger(unit).Holding(0, 3))
	}
	// Input registers mirror 0..2.
	out := runMbpoll(t, "-m", "rtu", "-b", "9600", "-P", "none", "-a", "1", "-t", "3",
		"-0", "-r", "0", "-c", "3", "-1", "-o", "2", path)
	checkMbpoll(t, out, bus.Logger(1).Input(0, 3))
}

// pymodbus (an independent Python master) reads the UDP simulator.
func TestInteropPymodbusUDP(t *testing.T) {
	py := testenv.Python(t)
	clk := newTestClock()
	f := startFleet(t, Config{Devices: 2, Transport: "udp", Clock: clk.now, Seed: 13})
	clk.advance(98765 * time.Millisecond)
	host, port, _ := strings.Cut(f.Addr(1), ":")
	script := fmt.Sprintf(`
from pymodbus.client import ModbusUdpClient
c = ModbusUdpClient(%q, port=%s, timeout=2, retries=1)
c.connect()
r = c.read_holding_registers(0, 7, slave=1)
assert not r.isError(), r
print("HR", *r.registers)
w = c.write_registers(50, [11, 22, 33], slave=1)
assert not w.isError(), w
r = c.read_input_registers(0, 3, slave=1)
print("IR", *r.registers)
r = c.read_holding_registers(65535, 2, slave=1)
print("EXC", r.exception_code if r.isError() else "none")
c.close()
`, host, port)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, py, "-c", script).CombinedOutput()
	if err != nil {
		t.Fatalf("pymodbus: %v\n%s", err, out)
	}
	t.Logf("pymodbus:\n%s", out)
	l := f.Logger(1)
	want := "HR" + fmtRegs(l.Holding(0, 7)) + "\nIR" + fmtRegs(l.Input(0, 3)) + "\nEXC 2"
	if got := strings.TrimSpace(string(out)); !strings.Contains(got, want) {
		t.Errorf("pymodbus printed\n%s\nwant\n%s", got, want)
	}
	if got := l.Holding(50, 3); !equalRegs(got, []uint16{11, 22, 33}) {
		t.Errorf("pymodbus write: %v", got)
	}
}

func fmtRegs(v []uint16) string {
	var b strings.Builder
	for _, x := range v {
		fmt.Fprintf(&b, " %d", x)
	}
	return b.String()
}
