package mbserver_test

import (
	"context"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"edgegw/internal/testenv"
	"edgegw/mbserver"
	"edgegw/stats"
)

// tcpReader is pymodbus as an independent Modbus TCP master: it reads
// holding registers 0..3 of units 5 and 7 in turn at rate requests a
// second for the given seconds, checks them against the slaves' data
// (unit 5 is RTU unit 1: 100+a; unit 7 is RTU unit 2: 200+a) and prints
// the counts.
const tcpReader = `
import sys, time
from pymodbus.client import ModbusTcpClient
port, secs, rate = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
c = ModbusTcpClient("127.0.0.1", port=port, timeout=3)
c.connect()
want = {5: [100, 101, 102, 103], 7: [200, 201, 202, 203]}
ok = bad = err = 0
end = time.time() + secs
i = 0
while time.time() < end:
    u = 5 if i % 2 == 0 else 7
    i += 1
    r = c.read_holding_registers(0, 4, slave=u)
    if r.isError():
        err += 1
        print("error", u, r, flush=True)
    elif list(r.registers) == want[u]:
        ok += 1
    else:
        bad += 1
        print("bad", u, r.registers, flush=True)
    time.sleep(1.0 / rate)
c.close()
print("RESULT ok=%d bad=%d err=%d" % (ok, bad, err), flush=True)
`

// Two RTU slaves on a pty pair polled at 200 ms, shared with two Modbus TCP
// masters (mbpoll and pymodbus) at about 10 requests a second each: every
// value they read is what the slaves hold; the polls keep their windows
// (losses of the scheduler counted apart from the device's: a timeout of a
// live unit is a stalled machine); pass-through requests wait at most one
// poll (p99 logged).
func TestPassThroughSharesTheBus(t *testing.T) {
	testenv.Need(t, "socat")
	mbpoll := testenv.Need(t, "mbpoll")
	const interval = 200 * time.Millisecond
	line := startSlaves(t)
	ring := newRing(t)
	devs := rtuDevices(line, interval, 40*time.Millisecond)
	s := runSched(t, withControl(t, devs), ring)
	st := new(stats.ModbusServer)
	_, addr := runServer(t, mbserver.Config{Passer: passer{s}, Units: map[uint8]string{5: "meter-1", 7: "meter-2", 9: "dead-3"}, Stats: st})
	_, port, _ := strings.Cut(addr, ":")

	waitPolled(t, s)
	before := snapshots(s.Devices())
	dur := period(15 * time.Second)

	script := filepath.Join(t.TempDir(), "reader.py")
	if err := os.WriteFile(script, []byte(tcpReader), 0o600); err != nil {
		t.Fatal(err)
	}
	py := exec.Command(testenv.Python(t), script, port, strconv.FormatFloat(dur.Seconds(), 'f', 1, 64), "10")
	pyOut := testenv.Start(t, py)
	// mbpoll reads unit 5 or 7 (in turn) every 100 ms: 10 requests a second.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	mb := exec.CommandContext(ctx, mbpoll, "-m", "tcp", "-p", port, "-a", "5,7", "-r", "1", "-c", "4", "-t", "4", "-l", "100", "-o", "2", "127.0.0.1")
	mb.Cancel = func() error { return mb.Process.Signal(syscall.SIGINT) } // mbpoll prints its statistics on ^C
	mbOut := &strings.Builder{}
	mb.Stdout, mb.Stderr = mbOut, mbOut
	if err := mb.Start(); err != nil {
		t.Fatal(err)
	}
	mbDone := make(chan error, 1)
	go func() { mbDone <- mb.Wait() }()

	res := testenv.WaitLine(t, pyOut, "RESULT", dur+30*time.Second)
	cancel()
	testenv.Recv(t, mbDone, stopLimit, "mbpoll to stop")
	after := snapshots(s.Devices())

	// pymodbus: every value read is the slave's; an error is a 0x0B of a
	// live unit that missed its 40 ms timeout on a loaded machine (the
	// polls count the same as device losses), each one among the 0x0B
	// answers the server counted (how many depends on the load: the bound
	// is the count, not a share), and the reads went on (2 a second).
	f := fields(res)
	ok, _ := strconv.Atoi(f["ok"])
	nerr, _ := strconv.Atoi(f["err"])
	if f["bad"] != "0" || uint64(nerr) > st.Snapshot().Exceptions[0x0b] || ok < int(dur.Seconds())*2 {
		t.Errorf("pymodbus through the gateway: %s", res)
	} else {
		t.Logf("pymodbus through the gateway: %s", res)
	}
	// mbpoll: every value printed is the slave's, and both units were read.
	// The poll that ^C interrupted may be cut: values up to the last "-- Polling" only.
	whole := mbOut.String()
	if i := strings.LastIndex(whole, "-- Polling slave"); i > 0 {
		whole = whole[:i]
	}
	vals := regexp.MustCompile(`(?m)^\[(\d+)\]:[ \t]+(-?\d+)$`).FindAllStringSubmatch(whole, -1)
	slave := regexp.MustCompile(`(?m)^-- Polling slave (\d+)`).FindAllStringSubmatch(mbOut.String(), -1)
	if len(vals) < 4*int(dur.Seconds())*4 { // 4 registers, 4 of the 10 requests a second at least
		t.Errorf("mbpoll printed %d values in %v (%d polls of a slave):\n%s", len(vals), dur, len(slave), tail(mbOut.String()))
	}
	for _, v := range vals {
		ref, _ := strconv.Atoi(v[1])
		got, _ := strconv.Atoi(v[2])
		if got != 100+ref-1 && got != 200+ref-1 {
			t.Errorf("mbpoll read %s = %d: no slave holds that", v[1], got)
			break
		}
	}
	if strings.Contains(mbOut.String(), "Connection") && strings.Contains(mbOut.String(), "failed") {
		t.Errorf("mbpoll: %s", tail(mbOut.String()))
	}
	t.Logf("mbpoll: %d values; %s", len(vals), lastLines(mbOut.String(), 3))

	stalls := checkWindows(t, before, after, []string{"meter-1", "meter-2"}, "control-1", "dead-3")
	checkWaits(t, st, interval, stalls)
}

// Writes: refused with 0x01 while writes are off; with writes on, applied
// (read back by the slave's own data through a read) and logged with the
// client's address. A dead unit answers 0x0B within its timeout (plus the
// one poll it may wait for); an unmapped unit 0x0A.
func TestPassThroughWritesAndDeadUnit(t *testing.T) {
	testenv.Need(t, "socat")
	const interval, timeout = 200 * time.Millisecond, 40 * time.Millisecond
	line := startSlaves(t)
	ring := newRing(t)
	s := runSched(t, rtuDevices(line, interval, timeout), ring)
	units := map[uint8]string{5: "meter-1", 7: "meter-2", 9: "dead-3"}
	logs := &testenv.Buffer{}
	stOff, stOn := new(stats.ModbusServer), new(stats.ModbusServer)
	_, off := runServer(t, mbserver.Config{Passer: passer{s}, Units: units, Stats: stOff})
	_, on := runServer(t, mbserver.Config{Passer: passer{s}, Units: units, Writes: true, Stats: stOn, Logger: slog.New(slog.NewTextHandler(logs, nil))})

	waitPolled(t, s)
	write := []byte{6, 0, 3, 0x12, 0x34} // FC6 register 3 = 0x1234
	// A live unit that misses its 40 ms timeout on a busy machine answers
	// 0x0B: such a request (a read, or FC6, which is idempotent) is sent
	// again, up to 5 times (resent counts them).
	resent := uint64(0)
	do := func(c *client, unit byte, pdu []byte) ([]byte, error) {
		t.Helper()
		for k := 0; ; k++ {
			reply, err := c.do(unit, pdu)
			if !isException(err, 0x0b) || k == 4 {
				return reply, err
			}
			resent++
			t.Logf("unit %d: %v (the machine's load: sent again)", unit, err)
		}
	}
	c := dial(t, off)
	if _, err := regs(c.do(5, write)); !isException(err, 0x01) {
		t.Errorf("write with writes off: %v, want exception 0x01", err)
	}
	if got, err := regs(do(c, 5, readPDU(3, 3, 1))); err != nil || got[0] != 103 {
		t.Errorf("register 3 after a refused write: %v %v, want 103", got, err)
	}
	if n := stOff.WritesRefused.Load(); n != 1 {
		t.Errorf("writes refused: %d, want 1", n)
	}

	w := dial(t, on)
	reply, err := do(w, 7, write)
	if err != nil || string(reply) != string(write) {
		t.Fatalf("write with writes on: % x %v, want the echo % x", reply, err, write)
	}
	if got, err := regs(do(w, 7, readPDU(3, 3, 1))); err != nil || got[0] != 0x1234 {
		t.Errorf("register 3 of unit 2 after the write: %v %v, want 0x1234", got, err)
	}
	if got, err := regs(do(w, 5, readPDU(3, 3, 1))); err != nil || got[0] != 103 {
		t.Errorf("register 3 of unit 1 (not written): %v %v, want 103", got, err)
	}
	local := w.c.LocalAddr().String()
	if l := logs.String(); !strings.Contains(l, "pass-through write") || !strings.Contains(l, local) || !strings.Contains(l, "device=meter-2") {
		t.Errorf("the write is not logged with the client address %s:\n%s", local, l)
	}
	if n := stOn.Writes.Load(); n < 1 || n > 1+resent {
		t.Errorf("writes counted: %d, want 1 (+ up to %d sent again)", n, resent)
	}

	// The dead unit: 0x0B, within its timeout plus at most one poll of the line.
	for i := 0; i < 3; i++ {
		start := time.Now()
		_, err := regs(w.do(9, readPDU(3, 0, 2)))
		took := time.Since(start)
		if !isException(err, 0x0B) {
			t.Errorf("dead unit: %v, want exception 0x0b", err)
		}
		t.Logf("dead unit answered 0x0b after %v (timeout %v)", took.Round(time.Millisecond), timeout)
		if limit := timeout + interval + 2*time.Second; took > limit { // 2 s: a loaded machine's stall
			t.Errorf("dead unit answered after %v, more than its timeout + one poll cycle (+2 s)", took)
		}
	}
	if _, err := regs(w.do(11, readPDU(3, 0, 2))); !isException(err, 0x0A) {
		t.Errorf("unmapped unit: %v, want exception 0x0a", err)
	}
	if _, err := regs(w.do(5, []byte{0x2B, 0x0E, 1, 0})); !isException(err, 0x01) {
		t.Errorf("function 43: %v, want exception 0x01", err)
	}
	if n := stOn.Exceptions[0x0B].Load(); n != 3 {
		t.Errorf("0x0b answers counted: %d, want 3", n)
	}
}
