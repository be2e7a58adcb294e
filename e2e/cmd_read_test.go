package e2e

import (
	"encoding/binary"
	"math"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"edgegw/internal/testenv"
)

// edgegw read of a float32 123.456 stored in CDAB (pymodbus holds the
// registers): the CDAB row shows 123.456, and the other three orders
// show what those byte orders make of the same four bytes, computed here
// with encoding/binary and math; the raw registers and the uint32/int32
// columns agree too. An exception and a refused address exit 1 in words.
func TestReadCommandByteOrders(t *testing.T) {
	var be [4]byte
	binary.BigEndian.PutUint32(be[:], math.Float32bits(123.456))
	wire := []byte{be[2], be[3], be[0], be[1]} // CDAB: low word first
	regs := []uint16{binary.BigEndian.Uint16(wire[0:]), binary.BigEndian.Uint16(wire[2:]), 0x4142, 0x4344}
	port := testenv.PymodbusRegisters(t, regs)
	addr := "127.0.0.1:" + strconv.Itoa(port)
	out, err := exec.Command(bin, "read", "-transport", "tcp", "-address", addr, "-unit", "1", "-timeout", "5s", "holding", "0", "4").CombinedOutput()
	if err != nil {
		t.Fatalf("read: %v\n%s", err, out)
	}
	t.Logf("%s", out)
	text := string(out)
	// What each order makes of the wire bytes w0 w1 w2 w3.
	w := wire
	want := map[string][4]byte{
		"ABCD": {w[0], w[1], w[2], w[3]},
		"CDAB": {w[2], w[3], w[0], w[1]},
		"BADC": {w[1], w[0], w[3], w[2]},
		"DCBA": {w[3], w[2], w[1], w[0]},
	}
	rows := rowsOf(t, text, "0-1")
	for order, b := range want {
		x := binary.BigEndian.Uint32(b[:])
		f := strconv.FormatFloat(float64(math.Float32frombits(x)), 'g', -1, 32)
		r, ok := rows[order]
		if !ok {
			t.Fatalf("no %s row for registers 0-1", order)
		}
		if r[3] != strconv.FormatUint(uint64(x), 10) || r[4] != strconv.FormatInt(int64(int32(x)), 10) || r[5] != f {
			t.Errorf("%s: row %v, want uint32 %d int32 %d float32 %s", order, r, x, int32(x), f)
		}
	}
	if rows["CDAB"][5] != "123.456" {
		t.Errorf("CDAB float32 %q, want 123.456", rows["CDAB"][5])
	}
	for i, r := range regs {
		hex := "0x" + strings.ToUpper(strconv.FormatUint(uint64(r)|0x10000, 16)[1:])
		if !containsFields(text, strconv.Itoa(i), hex, strconv.Itoa(int(r)), strconv.Itoa(int(int16(r)))) {
			t.Errorf("register %d: no row %s %d %d", i, hex, r, int16(r))
		}
	}
	if !strings.Contains(text, "high byte first): \"") || !strings.Contains(text, "ABCD\"\n") {
		t.Errorf("no string interpretation ending in ABCD (registers 2 and 3)")
	}
	if !strings.Contains(text, "round trip ") {
		t.Error("no round-trip time")
	}

	// Beyond the registers: an exception, in words, exit 1.
	out, err = exec.Command(bin, "read", "-address", addr, "-timeout", "5s", "holding", "2", "4").CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 || !strings.Contains(string(out), "exception 2 (illegal data address") {
		t.Errorf("exception: %v\n%s", err, out)
	}
	// A dead UDP device: a timeout, in words, exit 1.
	start := time.Now()
	out, err = exec.Command(bin, "read", "-transport", "udp", "-address", silentUDPAddr(t), "-timeout", "300ms", "input", "0", "1").CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 || !strings.Contains(string(out), "no reply within 300ms (timeout)") {
		t.Errorf("timeout: %v\n%s", err, out)
	}
	if time.Since(start) < 300*time.Millisecond {
		t.Errorf("timed out after %v", time.Since(start))
	}
	// Coils as bits.
	out, err = exec.Command(bin, "read", "-address", addr, "-timeout", "5s", "coil", "0", "1").CombinedOutput()
	if err != nil || !containsFields(string(out), "0", "0") {
		t.Errorf("coil: %v\n%s", err, out)
	}
}

// rowsOf returns the 32-bit table's rows of the registers label ("0-1"),
// by order: the fields of each row, the label first ("" after the first).
func rowsOf(t *testing.T, text, label string) map[string][]string {
	t.Helper()
	rows := map[string][]string{}
	in := false
	for _, l := range strings.Split(text, "\n") {
		f := strings.Fields(l)
		switch {
		case len(f) == 6 && f[0] == label:
			in = true
			rows[f[1]] = f
		case in && len(f) == 5 && len(f[0]) == 4:
			rows[f[0]] = append([]string{""}, f...)
		default:
			if in {
				return rows
			}
		}
	}
	return rows
}

// containsFields reports whether some line of text has exactly these fields first.
func containsFields(text string, fields ...string) bool {
	for _, l := range strings.Split(text, "\n") {
		f := strings.Fields(l)
		if len(f) >= len(fields) && strings.Join(f[:len(fields)], " ") == strings.Join(fields, " ") {
			return true
		}
	}
	return false
}
