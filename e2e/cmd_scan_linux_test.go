package e2e

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"edgegw/internal/testenv"
)

// A pty ignores baud rate and parity: every setting would reach pymodbus.
// lineEmulator is the wire between the scanner and the slaves' pty: the
// scanner opens the slave side of a pty whose master the test holds, and
// bytes cross (both ways) only while the scanner's line settings — read
// from its termios through the master — are the slaves' (a UART at another
// baud rate or parity receives no valid byte; they are dropped, counted).
type lineEmulator struct {
	path    string // the scanner's serial path
	master  *os.File
	far     *os.File // the socat pty end the slaves are not on
	want    uint32   // line bits of the slaves' setting (setting)
	dropped atomic.Uint64
	wg      sync.WaitGroup
}

// The line bits the emulator compares. A pty keeps c_cflag's baud rate,
// stop bits and PARODD but clears PARENB and forces CS8 (the kernel's
// pty_set_termios), so parity on is read from c_iflag's INPCK, which
// goburrow/serial sets with PARENB; the data bits cannot be seen.
const (
	cbaud    = 0o010017 // CBAUD: the baud-rate bits of c_cflag
	lineMask = cbaud | syscall.PARODD | syscall.CSTOPB
	inpck    = 1 << 31 // INPCK, moved out of the way of the c_cflag bits
)

func newLineEmulator(t *testing.T, far string, want uint32) *lineEmulator {
	t.Helper()
	m, err := os.OpenFile("/dev/ptmx", os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Fatal(err)
	}
	var unlock int32
	if _, _, e := syscall.Syscall(syscall.SYS_IOCTL, m.Fd(), syscall.TIOCSPTLCK, uintptr(unsafe.Pointer(&unlock))); e != 0 {
		t.Fatal(e)
	}
	var n uint32
	if _, _, e := syscall.Syscall(syscall.SYS_IOCTL, m.Fd(), syscall.TIOCGPTN, uintptr(unsafe.Pointer(&n))); e != 0 {
		t.Fatal(e)
	}
	f, err := os.OpenFile(far, os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Fatal(err)
	}
	e := &lineEmulator{path: fmt.Sprintf("/dev/pts/%d", n), master: m, far: f, want: want}
	e.wg.Add(2)
	go e.pump(m, f)
	go e.pump(f, m)
	t.Cleanup(func() {
		m.Close()
		f.Close()
		testenv.Wait(t, 10*time.Second, "the line emulator's pumps to end", e.wg.Wait)
	})
	return e
}

// setting is the scanner's current line bits (TCGETS on the master
// returns the slave side's termios).
func (e *lineEmulator) setting() uint32 {
	var tio syscall.Termios
	if _, _, err := syscall.Syscall(syscall.SYS_IOCTL, e.master.Fd(), syscall.TCGETS, uintptr(unsafe.Pointer(&tio))); err != 0 {
		return 0
	}
	set := tio.Cflag & lineMask
	if tio.Iflag&syscall.INPCK != 0 {
		set |= inpck
	}
	return set
}

func (e *lineEmulator) pump(from, to *os.File) {
	defer e.wg.Done()
	buf := make([]byte, 512)
	for {
		n, err := from.Read(buf)
		if n > 0 {
			if e.setting() == e.want {
				if _, err := to.Write(buf[:n]); err != nil {
					return
				}
			} else {
				e.dropped.Add(uint64(n))
			}
		}
		switch {
		case err == nil, errors.Is(err, syscall.EINTR), errors.Is(err, syscall.EAGAIN):
		case errors.Is(err, syscall.EIO): // the scanner closed the slave side: wait for its next open
			time.Sleep(5 * time.Millisecond) // poll interval of a hung-up pty, not a synchronisation
		default: // closed at the test's end
			return
		}
	}
}

// edgegw scan on one RS-485 line (a socat pty pair behind the line
// emulator, which makes it a 19200 8E1 line) with pymodbus RTU slaves at
// units 1, 7 and 42:
// trying 9600 and 19200 with parity N and E over units 1-50 finds exactly
// those three, at 19200 8E1 only; it prints pymodbus's identification
// (vendor and product) for each, and [[device]] snippets that edgegw
// check accepts.
func TestScanFindsUnitsAndSettings(t *testing.T) {
	a, b := testenv.PTYPair(t)
	// The line is 19200 8E1: the emulator passes bytes at that setting
	// only. pymodbus opens its pty 19200 8N1: a pty carries no parity (the
	// kernel clears PARENB on it), and pymodbus 3.0rc1's serial server here
	// does not answer on a pty opened with parity E.
	testenv.PymodbusSerial(t, testenv.SerialSlave{Framer: "rtu", TTY: b, Baud: 19200, Parity: "N", Units: []uint8{1, 7, 42},
		Vendor: "Acme Meters", Product: "EM-42", Revision: "3.1"})
	line := newLineEmulator(t, a, syscall.B19200|inpck) // 19200, parity even

	var stderr strings.Builder
	cmd := exec.Command(bin, "scan", "-transport", "rtu", "-address", line.path, "-baud", "9600,19200", "-parity", "N,E",
		"-units", "1-50", "-timeout", "300ms") // pymodbus answers in 10-30 ms: room for a loaded machine
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	t.Logf("%s\nstderr:\n%s\n(line emulator dropped %d bytes sent at other settings)", out, stderr.String(), line.dropped.Load())
	if err != nil {
		t.Fatalf("scan: %v", err)
	}
	text := string(out)
	if !strings.Contains(text, "50 units × 4 settings, 300ms timeout: at most ") {
		t.Errorf("no bound printed up front")
	}
	var found []string
	// "unit 7   19200 8E1  answers: …": unit, baud, data/parity/stop.
	for _, l := range strings.Split(text, "\n") {
		f := strings.Fields(l)
		if len(f) >= 5 && f[0] == "unit" && f[4] == "answers:" {
			found = append(found, f[1]+" "+f[2]+" "+f[3])
		}
	}
	want := []string{"1 19200 8E1", "7 19200 8E1", "42 19200 8E1"}
	if strings.Join(found, ", ") != strings.Join(want, ", ") {
		t.Errorf("found %q, want %q", found, want)
	}
	for _, s := range []string{"9600 8N1: 0 of 50", "9600 8E1: 0 of 50", "19200 8N1: 0 of 50", "19200 8E1: 3 of 50"} {
		if !strings.Contains(text, s) {
			t.Errorf("no summary %q", s)
		}
	}
	if n := strings.Count(text, `vendor "Acme Meters", product code "EM-42", revision "3.1"`); n != 3 {
		t.Errorf("identification printed %d times, want 3", n)
	}
	if line.dropped.Load() == 0 {
		t.Error("the line emulator dropped nothing: the other settings were not tried")
	}
	// The snippets, as one config, pass check.
	i := strings.Index(text, "# [[device]] snippets")
	if i < 0 {
		t.Fatal("no snippets")
	}
	path := filepath.Join(t.TempDir(), "scan.toml")
	if err := os.WriteFile(path, []byte(text[i:]), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(bin, "check", "-config", path).CombinedOutput(); err != nil {
		t.Errorf("check of the snippets: %v\n%s", err, out)
	} else if !strings.Contains(string(out), "ok (3 devices)") {
		t.Errorf("check: %s", out)
	}
}
