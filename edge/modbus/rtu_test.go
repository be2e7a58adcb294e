package modbus

import (
	"encoding/binary"
	"errors"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"edgegw/internal/testenv"
)

// rtuResponder answers RTU requests read from a stream (the far end of a
// pty pair, or a TCP connection). handle returns the frames to write.
type rtuResponder struct {
	wg sync.WaitGroup
}

// readRTURequest frames one request: FC1–6 are 8 bytes, FC16 9+n.
func readRTURequest(r io.Reader) ([]byte, error) {
	b := make([]byte, 7, 260)
	if _, err := io.ReadFull(r, b[:2]); err != nil {
		return nil, err
	}
	need := 8
	if b[1] == 16 {
		if _, err := io.ReadFull(r, b[2:7]); err != nil {
			return nil, err
		}
		need = 9 + int(b[6])
	}
	b = b[:need]
	start := 2
	if b[1] == 16 {
		start = 7
	}
	if _, err := io.ReadFull(r, b[start:]); err != nil {
		return nil, err
	}
	if crc16(b[:need-2]) != uint16(b[need-2])|uint16(b[need-1])<<8 {
		return nil, errors.New("request crc")
	}
	return b, nil
}

func serveRTU(t testing.TB, rw io.ReadWriter, handle func(req []byte) [][]byte) *rtuResponder {
	r := &rtuResponder{}
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		for {
			req, err := readRTURequest(rw)
			if err != nil {
				if !errors.Is(err, os.ErrClosed) && !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) && !errors.Is(err, syscall.EIO) {
					t.Errorf("responder: %v", err)
				}
				return
			}
			for _, f := range handle(req) {
				if _, err := rw.Write(f); err != nil {
					return
				}
			}
		}
	}()
	return r
}

// waitLine waits until n bytes wait in the input queue of the tty at path
// (our side of the pty pair: the queue is the tty's, whoever reads it).
func waitLine(t *testing.T, path string, n int, what string) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOCTTY|syscall.O_NONBLOCK, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := ttyQueued(f.Fd()); errors.Is(err, errors.ErrUnsupported) {
		t.Skip("the input queue of a tty cannot be read here")
	}
	waitFor(t, 10*time.Second, what, func() bool {
		q, err := ttyQueued(f.Fd())
		return err == nil && q >= n
	})
}

// rtuBus opens a pty pair: our port on one end (its path is returned too),
// a responder on the other.
func rtuBus(t *testing.T, handle func(req []byte) [][]byte) (*RTUPort, string) {
	t.Helper()
	a, b := testenv.PTYPair(t)
	f, err := os.OpenFile(b, os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Fatal(err)
	}
	r := serveRTU(t, f, handle)
	t.Cleanup(func() { f.Close(); testenv.Wait(t, stopLimit, "the rtu responder to stop", r.wg.Wait) })
	p, err := OpenRTU(SerialConfig{Path: a, Baud: 19200, Timeout: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p, a
}

func TestRTUSpec(t *testing.T) {
	p, _ := rtuBus(t, func(req []byte) [][]byte {
		return [][]byte{rtuFrame(req[0], specReply(t, req[1:len(req)-2]))}
	})
	c := p.Unit(0x11, 0)
	runSpecCases(t, c)
	if cn := c.Counters(); cn != (Counters{}) {
		t.Errorf("counters %+v, want zero (exceptions must be framed as 5 bytes, nothing left over)", cn)
	}
}

// TestRTUFaults: two units share the bus; unit 3 is dead. A late reply that
// is on the line before the next request is drained, never taken as its
// answer; a bad CRC is a FrameError, a reply from another unit is skipped
// as a late one (counted; the request times out saying so); the dead unit
// does not stop the others.
func TestRTUFaults(t *testing.T) {
	sl := newSlave()
	lateOut := make(chan struct{}, 1)
	var slowOnce atomic.Bool
	p, line := rtuBus(t, func(req []byte) [][]byte {
		unit, pdu := req[0], req[1:len(req)-2]
		if unit == 3 {
			return nil // dead unit
		}
		out := rtuFrame(unit, sl.pdu(pdu))
		switch binary.BigEndian.Uint16(pdu[1:]) {
		case 7: // too late once: after the request timed out
			if !slowOnce.CompareAndSwap(false, true) {
				break
			}
			time.Sleep(1500 * time.Millisecond) // the slow device: past the 1 s timeout
			defer func() { lateOut <- struct{}{} }()
			return [][]byte{rtuFrame(unit, []byte{3, 2, 0xDE, 0xAD})}
		case 8: // bad CRC
			out[len(out)-1] ^= 0xFF
		case 9: // a reply from another unit
			out = rtuFrame(unit+10, sl.pdu(pdu))
		}
		return [][]byte{out}
	})
	// 1 s: a reply relayed by socat on a busy machine may still come
	// late; such a timeout is tried again (up to 5 times) and counted in
	// retries, since its reply, when it comes, is a late frame of its own.
	u1, u2, dead := p.Unit(1, time.Second), p.Unit(2, time.Second), p.Unit(3, 50*time.Millisecond)
	retries := map[*RTUConn]int{}
	read := func(c *RTUConn, a uint16) ([]byte, error) {
		t.Helper()
		for k := 0; ; k++ {
			b, err := c.ReadHoldingRegisters(a, 1)
			if !errors.Is(err, ErrTimeout) || k == 4 {
				return b, err
			}
			retries[c]++
			t.Logf("addr %d: %v (the machine's load: tried again)", a, err)
		}
	}
	want := func(c *RTUConn, a uint16) {
		t.Helper()
		b, err := read(c, a)
		if err != nil {
			t.Fatalf("addr %d: %v", a, err)
		}
		if v := binary.BigEndian.Uint16(b); v != a*7 {
			t.Fatalf("addr %d: got %#x, want %#x", a, v, a*7)
		}
	}
	want(u1, 1)
	if _, err := u1.ReadHoldingRegisters(7, 1); !errors.Is(err, ErrTimeout) {
		t.Fatalf("slow reply: %v, want timeout", err)
	}
	// The late reply is handed to the responder's write, then relayed by
	// socat: it is on the line once it waits in our side's input queue.
	testenv.Closed(t, lateOut, 10*time.Second, "the late reply handed to the responder")
	waitLine(t, line, 7, "the late reply (7 bytes) on the line")
	want(u1, 7)
	want(u2, 7)
	var fe *FrameError
	if _, err := read(u1, 8); !errors.As(err, &fe) {
		t.Fatalf("bad crc: %v, want *FrameError", err)
	}
	want(u2, 2)
	// a reply from another unit alone: skipped as a late one, so the
	// request times out, saying what came instead
	if _, err := u2.ReadHoldingRegisters(9, 1); !errors.Is(err, ErrTimeout) || !strings.Contains(err.Error(), "skipped as late: reply from unit 12, want 2") {
		t.Fatalf("other unit: %v, want a timeout naming the skipped frame", err)
	}
	for i := range 3 {
		if _, err := dead.ReadHoldingRegisters(1, 1); !errors.Is(err, ErrTimeout) {
			t.Fatalf("dead unit: %v", err)
		}
		want(u1, uint16(20+i))
		want(u2, uint16(30+i))
	}
	if err := u2.WriteSingleRegister(40, 0xBEEF); err != nil {
		t.Fatal(err)
	}
	if b, err := u1.ReadHoldingRegisters(40, 1); err != nil || binary.BigEndian.Uint16(b) != 0xBEEF {
		t.Fatalf("read back: %x %v", b, err)
	}
	// Each retry's reply may come as one more late frame (or a bad CRC's
	// as one more dropped one, after it was timed out).
	if c, r := u1.Counters(), uint64(retries[u1]); c.Late < 1 || c.Late > 1+r || c.Dropped < 1 || c.Dropped > 1+r {
		t.Errorf("unit 1 counters %+v, want 1 late, 1 dropped (+ up to %d for the retries)", c, r)
	}
	if c, r := u2.Counters(), uint64(retries[u2]); c.Late < 1 || c.Late > 1+r || c.Dropped != 0 {
		t.Errorf("unit 2 counters %+v, want 1 late (the other unit's frame, while unit 2 was the last asked; + up to %d for the retries), 0 dropped", c, r)
	}
}

// TestRTULateReplyOfAnotherFunction: the unit asked answers first for
// another function (the late reply to its previous request, e.g. a coil
// read answered after its timeout while a register write waits), then
// ours: the stray frame is skipped as late and counted, ours is taken.
// A stray frame and nothing after it: a timeout that says what came.
func TestRTULateReplyOfAnotherFunction(t *testing.T) {
	sl := newSlave()
	p, _ := rtuBus(t, func(req []byte) [][]byte {
		unit, pdu := req[0], req[1:len(req)-2]
		stray := rtuFrame(unit, []byte{1, 1, 0x01}) // a coil read's reply
		if binary.BigEndian.Uint16(pdu[1:]) == 13 {
			return [][]byte{stray}
		}
		return [][]byte{stray, rtuFrame(unit, sl.pdu(pdu))}
	})
	u := p.Unit(1, time.Second)
	if err := u.WriteSingleRegister(12, 0xBEEF); err != nil {
		t.Fatalf("write after a stray reply of another function: %v", err)
	}
	b, err := u.ReadHoldingRegisters(12, 1)
	if err != nil || binary.BigEndian.Uint16(b) != 0xBEEF {
		t.Fatalf("read back: %x %v", b, err)
	}
	if _, err := u.ReadHoldingRegisters(13, 1); !errors.Is(err, ErrTimeout) || !strings.Contains(err.Error(), "skipped as late: reply with function 0x01, want 0x03") {
		t.Fatalf("a stray frame alone: %v, want a timeout naming it", err)
	}
	if c := u.Counters(); c.Late != 3 || c.Dropped != 0 {
		t.Errorf("counters %+v, want 3 late (the stray frames), 0 dropped", c)
	}
}

// TestRTUOverTCP: RTU frames over a TCP stream, with the TCP rules (a bad
// CRC drops the stream; the next poll reconnects).
func TestRTUOverTCP(t *testing.T) {
	sl := newSlave()
	srv := startTCPServer(t, func(c net.Conn) {
		r := serveRTU(t, c, func(req []byte) [][]byte {
			out := rtuFrame(req[0], sl.pdu(req[1:len(req)-2]))
			if binary.BigEndian.Uint16(req[2:]) == 8 {
				out[len(out)-3] ^= 1
			}
			return [][]byte{out}
		})
		testenv.Wait(t, stopLimit, "the rtu-over-tcp responder to stop", r.wg.Wait)
	})
	p := NewRTUOverTCP(TCPConfig{Address: srv.addr, Timeout: time.Second, BackoffMin: time.Millisecond, BackoffMax: 2 * time.Millisecond})
	defer p.Close()
	c := p.Unit(5, 0)
	b, err := c.ReadInputRegisters(3, 2)
	if err != nil || u16s(b)[0] != 3^0x5A5A || u16s(b)[1] != 4^0x5A5A {
		t.Fatalf("%x %v", b, err)
	}
	var fe *FrameError
	if _, err := c.ReadHoldingRegisters(8, 1); !errors.As(err, &fe) {
		t.Fatalf("bad crc: %v", err)
	}
	if err := pollUntil(t, 2*time.Second, func() error { _, err := c.ReadCoils(0, 10); return err }); err != nil {
		t.Fatal(err)
	}
	if cn := c.Counters(); cn.Reconnects != 1 || cn.Dropped != 1 {
		t.Errorf("counters %+v", cn)
	}
}

// TestRTUHighFD: goburrow/serial's select(2) cannot watch fd >= 1024;
// OpenRTU refuses such a descriptor with a clear error.
func TestRTUHighFD(t *testing.T) {
	a, _ := testenv.PTYPair(t)
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil || lim.Cur < 1100 {
		t.Skipf("RLIMIT_NOFILE %d too low", lim.Cur)
	}
	var held []int
	defer func() {
		for _, fd := range held {
			syscall.Close(fd)
		}
	}()
	for len(held) < 1100 {
		fd, err := syscall.Dup(0)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, fd)
		if fd >= 1030 {
			break
		}
	}
	// free one low slot? no: all below 1024 are taken, the port gets >= 1024
	_, err := OpenRTU(SerialConfig{Path: a})
	if err == nil {
		t.Fatal("OpenRTU with fd >= 1024 succeeded")
	}
	t.Log(err)
}

// A whole frame from another unit that comes while a request waits (the
// late reply to an earlier request, after the drain) is skipped and counted
// Late, and the request takes its own reply behind it; when none follows,
// the timeout says what was skipped. Before, the request failed with "reply
// from unit 9, want 5" and its own reply was left on the line.
func TestRTULateReplyFromAnotherUnitSkipped(t *testing.T) {
	sl := newSlave()
	p, _ := rtuBus(t, func(req []byte) [][]byte {
		own := rtuFrame(req[0], sl.pdu(req[1:len(req)-2]))
		other := rtuFrame(9, sl.pdu(req[1:len(req)-2]))
		switch binary.BigEndian.Uint16(req[2:]) {
		case 20:
			return [][]byte{other, own}
		case 21:
			return [][]byte{other}
		}
		return [][]byte{own}
	})
	c := p.Unit(5, 0)
	b, err := c.ReadInputRegisters(20, 2)
	if err != nil || u16s(b)[0] != 20^0x5A5A || u16s(b)[1] != 21^0x5A5A {
		t.Fatalf("read behind another unit's frame: %x %v", b, err)
	}
	if cn := c.Counters(); cn.Late != 1 || cn.Dropped != 0 {
		t.Errorf("counters after the skipped frame: %+v", cn)
	}
	_, err = c.ReadInputRegisters(21, 1)
	var fe *FrameError
	if err == nil || errors.As(err, &fe) || !strings.Contains(err.Error(), "timeout") || !strings.Contains(err.Error(), "skipped as late: reply from unit 9, want 5") {
		t.Fatalf("only another unit's frame: %v", err)
	}
	if b, err := c.ReadInputRegisters(3, 1); err != nil || u16s(b)[0] != 3^0x5A5A {
		t.Fatalf("the next request: %x %v", b, err)
	}
}
