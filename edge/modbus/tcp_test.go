package modbus

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

func newTestTCP(addr string, timeout time.Duration) *TCPConn {
	return NewTCP(TCPConfig{Address: addr, Unit: 1, Timeout: timeout, BackoffMin: time.Millisecond, BackoffMax: 5 * time.Millisecond})
}

// pollUntil repeats fn while it fails with ErrBackoff (bounded by d).
func pollUntil(t *testing.T, d time.Duration, fn func() error) error {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		err := fn()
		if !errors.Is(err, ErrBackoff) || time.Now().After(deadline) {
			return err
		}
		time.Sleep(time.Millisecond) // wait out the backoff (a condition poll with a deadline)
	}
}

func TestTCPSpec(t *testing.T) {
	srv := startTCPServer(t, serveMBAP(func(_ net.Conn, req []byte) []byte { return mbap(req, specReply(t, req[7:])) }))
	c := newTestTCP(srv.addr, time.Second)
	defer c.Close()
	runSpecCases(t, c)
	if n := srv.acceptedCount(); n != 1 {
		t.Errorf("%d connections, want 1 (an exception must not reconnect)", n)
	}
}

// TestTCPStaleReply: the device answers the first request too late, and
// writes that late answer with the transaction id the NEXT request will
// carry. On a reused stream (goburrow's trap) the next poll would return it.
func TestTCPStaleReply(t *testing.T) {
	sl := newSlave()
	var n atomic.Int32
	srv := startTCPServer(t, serveMBAP(func(c net.Conn, req []byte) []byte {
		if n.Add(1) == 1 {
			time.Sleep(80 * time.Millisecond) // the device is slow once
			stale := mbap(req, []byte{3, 2, 0xDE, 0xAD})
			binary.BigEndian.PutUint16(stale, binary.BigEndian.Uint16(req)+1)
			return stale
		}
		return mbap(req, sl.pdu(req[7:]))
	}))
	c := newTestTCP(srv.addr, 30*time.Millisecond)
	defer c.Close()
	_, err := c.ReadHoldingRegisters(10, 1)
	if !errors.Is(err, ErrTimeout) {
		t.Fatalf("first poll: %v, want ErrTimeout", err)
	}
	if !strings.Contains(err.Error(), "modbus: tcp "+srv.addr+" unit 1: read holding 10+1: timeout after 30ms") {
		t.Errorf("message %q", err)
	}
	for i := range 5 {
		var b []byte
		err := pollUntil(t, 2*time.Second, func() (err error) { b, err = c.ReadHoldingRegisters(10, 1); return })
		if err != nil {
			t.Fatalf("poll %d: %v", i, err)
		}
		if v := binary.BigEndian.Uint16(b); v != 70 {
			t.Fatalf("poll %d: got %#04x, want 70 (stale reply taken)", i, v)
		}
	}
	if got := c.Counters().Reconnects; got != 1 {
		t.Errorf("Reconnects %d, want 1", got)
	}
}

func TestTCPWrongTidAndPayload(t *testing.T) {
	sl := newSlave()
	srv := startTCPServer(t, serveMBAP(func(_ net.Conn, req []byte) []byte {
		out := mbap(req, sl.pdu(req[7:]))
		switch binary.BigEndian.Uint16(req[8:]) { // register address selects the fault
		case 1: // wrong transaction id
			binary.BigEndian.PutUint16(out, binary.BigEndian.Uint16(req)+5)
		case 2: // one register short, byte count consistent
			out = mbap(req, []byte{3, 2, 0, 1})
		case 3: // one register too many
			out = mbap(req, []byte{3, 6, 0, 1, 0, 2, 0, 3})
		case 4: // byte count vs payload
			out = mbap(req, []byte{3, 4, 0, 1, 0})
		case 5: // another unit
			out[6]++
		case 6: // another function
			out[7] = 4
		case 7: // MBAP length header beyond 254
			out = append(out[:7:7], make([]byte, 300)...)
			binary.BigEndian.PutUint16(out[4:], 301)
		}
		return out
	}))
	c := newTestTCP(srv.addr, time.Second)
	defer c.Close()
	for addr := uint16(1); addr <= 7; addr++ {
		_, err := c.ReadHoldingRegisters(addr, 2)
		var fe *FrameError
		if !errors.As(err, &fe) {
			t.Errorf("fault %d: %v, want *FrameError", addr, err)
		}
		if _, ok := IsException(err); ok {
			t.Errorf("fault %d: taken as exception: %v", addr, err)
		}
		// the stream was dropped: the next good poll reconnects
		if err := pollUntil(t, 2*time.Second, func() error { _, err := c.ReadHoldingRegisters(100, 2); return err }); err != nil {
			t.Fatalf("after fault %d: %v", addr, err)
		}
	}
	cn := c.Counters()
	if cn.Reconnects != 7 || cn.Dropped != 7 {
		t.Errorf("counters %+v, want 7 reconnects and 7 dropped", cn)
	}
	if n := srv.acceptedCount(); n != 8 {
		t.Errorf("%d connections accepted, want 8", n)
	}
}

func TestTCPWriteEchoAndLimits(t *testing.T) {
	sl := newSlave()
	srv := startTCPServer(t, serveMBAP(func(_ net.Conn, req []byte) []byte {
		out := mbap(req, sl.pdu(req[7:]))
		if binary.BigEndian.Uint16(req[8:]) == 9 {
			out[len(out)-1]++ // wrong echo
		}
		return out
	}))
	c := newTestTCP(srv.addr, time.Second)
	defer c.Close()
	if err := c.WriteSingleRegister(8, 0x1234); err != nil {
		t.Fatal(err)
	}
	if err := c.WriteMultipleRegisters(20, []byte{0, 1, 0, 2, 0, 3}); err != nil {
		t.Fatal(err)
	}
	if err := c.WriteSingleCoil(30, true); err != nil {
		t.Fatal(err)
	}
	b, err := c.ReadHoldingRegisters(20, 3)
	if err != nil || fmt.Sprint(u16s(b)) != "[1 2 3]" {
		t.Fatalf("read back %v %v", b, err)
	}
	if b, err := c.ReadCoils(30, 1); err != nil || b[0] != 1 {
		t.Fatalf("coil read back %v %v", b, err)
	}
	var fe *FrameError
	if err := c.WriteSingleRegister(9, 1); !errors.As(err, &fe) {
		t.Errorf("wrong echo: %v, want *FrameError", err)
	}
	before := srv.acceptedCount()
	for _, err := range []error{
		func() error { _, err := c.ReadHoldingRegisters(0, 126); return err }(),
		func() error { _, err := c.ReadInputRegisters(0, 0); return err }(),
		func() error { _, err := c.ReadCoils(0, 2001); return err }(),
		func() error { _, err := c.ReadDiscreteInputs(65535, 2); return err }(),
		c.WriteMultipleRegisters(0, make([]byte, 248)),
		c.WriteMultipleRegisters(0, []byte{1}),
	} {
		if !errors.Is(err, ErrRequest) {
			t.Errorf("limit: %v, want ErrRequest", err)
		}
	}
	if srv.acceptedCount() != before {
		t.Error("a refused request reached the device")
	}
}

// TestTCPBackoff: a refused dial is a transport error; until the backoff
// passes, calls fail at once with ErrBackoff without dialling.
func TestTCPBackoff(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now
	c := NewTCP(TCPConfig{Address: addr, Timeout: time.Second, BackoffMin: time.Hour})
	defer c.Close()
	_, err = c.ReadHoldingRegisters(0, 1)
	if err == nil || errors.Is(err, ErrTimeout) || errors.Is(err, ErrBackoff) {
		t.Fatalf("first: %v, want a dial error", err)
	}
	start := time.Now()
	for range 1000 {
		if _, err = c.ReadHoldingRegisters(0, 1); !errors.Is(err, ErrBackoff) {
			t.Fatalf("during backoff: %v", err)
		}
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("1000 calls during backoff took %v", d)
	}
}

func countFDs(t *testing.T) int {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skip("no /proc/self/fd")
	}
	return len(ents)
}

// closeWait counts sockets in CLOSE_WAIT whose peer port is port.
func closeWait(t *testing.T, port int) int {
	f, err := os.Open("/proc/net/tcp")
	if err != nil {
		return 0
	}
	defer f.Close()
	n := 0
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) < 4 || fs[3] != "08" {
			continue
		}
		if i := strings.LastIndexByte(fs[2], ':'); i > 0 {
			if p, _ := strconv.ParseUint(fs[2][i+1:], 16, 16); int(p) == port {
				n++
			}
		}
	}
	return n
}

// TestTCPDeviceRestart: the device closes every connection and listens
// again, 200 times; each time the connection comes back within the backoff
// and no descriptor or socket is left behind.
func TestTCPDeviceRestart(t *testing.T) {
	sl := newSlave()
	srv := startTCPServer(t, serveMBAP(func(_ net.Conn, req []byte) []byte { return mbap(req, sl.pdu(req[7:])) }))
	_, ps, _ := net.SplitHostPort(srv.addr)
	port, _ := strconv.Atoi(ps)
	c := newTestTCP(srv.addr, time.Second)
	if _, err := c.ReadHoldingRegisters(0, 1); err != nil {
		t.Fatal(err)
	}
	fds := countFDs(t)
	failures := 0
	for i := range 200 {
		srv.restart()
		deadline := time.Now().Add(2 * time.Second)
		for {
			_, err := c.ReadHoldingRegisters(0, 1)
			if err == nil {
				break
			}
			if errors.Is(err, ErrTimeout) {
				t.Fatalf("restart %d: %v", i, err)
			}
			failures++
			if time.Now().After(deadline) {
				t.Fatalf("restart %d: not back within 2s: %v", i, err)
			}
			if errors.Is(err, ErrBackoff) {
				time.Sleep(500 * time.Microsecond) // wait out the backoff (bounded by the deadline)
			}
		}
	}
	if got := c.Counters().Reconnects; got != 200 {
		t.Errorf("Reconnects %d, want 200", got)
	}
	if n := countFDs(t); n > fds {
		t.Errorf("fds %d after 200 restarts, %d before", n, fds)
	}
	if n := closeWait(t, port); n != 0 {
		t.Errorf("%d sockets in CLOSE_WAIT to the device", n)
	}
	c.Close()
	t.Logf("200 restarts: %d failed polls (first failure + backoff refusals)", failures)
}

// A stream that had answered and then broke (a device restart, a timeout)
// is redialled at once, without backoff; but when that redial fails the
// backoff starts as for any dead device.
func TestTCPRedialAtOnceAfterGoodStreamThenBackoff(t *testing.T) {
	s := newSlave()
	srv := startTCPServer(t, serveMBAP(func(_ net.Conn, req []byte) []byte { return mbap(req, s.pdu(req[7:])) }))
	c := NewTCP(TCPConfig{Address: srv.addr, Unit: 1, Timeout: time.Second, BackoffMin: time.Hour})
	defer c.Close()
	if _, err := c.ReadHoldingRegisters(0, 1); err != nil {
		t.Fatal(err)
	}
	srv.restart()
	if _, err := c.ReadHoldingRegisters(0, 1); err == nil {
		t.Fatal("read on the broken stream succeeded")
	}
	// no backoff: the very next call redials and is answered
	if _, err := c.ReadHoldingRegisters(0, 1); err != nil {
		t.Fatalf("after a restart: %v, want an answer at once", err)
	}
	if got := c.Counters().Reconnects; got != 1 {
		t.Errorf("reconnects = %d", got)
	}
	srv.stop() // now the device is gone for good
	if _, err := c.ReadHoldingRegisters(0, 1); err == nil {
		t.Fatal("read on the closed stream succeeded")
	}
	if _, err := c.ReadHoldingRegisters(0, 1); err == nil || errors.Is(err, ErrBackoff) {
		t.Fatalf("first redial: %v, want a dial error", err)
	}
	if _, err := c.ReadHoldingRegisters(0, 1); !errors.Is(err, ErrBackoff) {
		t.Fatalf("after a failed redial: %v, want ErrBackoff", err)
	}
}

// TestTCPSplitAndDoubledReplies: a reply that arrives in pieces is read
// whole; a reply sent twice (the second copy in the same read or not)
// puts the stream out of step: the next request fails with a frame error
// instead of taking the copy as its answer, and the one after redials at
// once and is answered.
func TestTCPSplitAndDoubledReplies(t *testing.T) {
	sl := newSlave()
	srv := startTCPServer(t, func(c net.Conn) {
		for {
			req, err := readMBAP(c)
			if err != nil {
				return
			}
			out := mbap(req, sl.pdu(req[7:]))
			switch binary.BigEndian.Uint16(req[8:]) { // register address selects the behaviour
			case 20: // in three pieces, a slow gateway's segments
				for _, part := range [][]byte{out[:3], out[3:9], out[9:]} {
					if _, err := c.Write(part); err != nil {
						return
					}
					time.Sleep(5 * time.Millisecond) // the device's pace, not synchronisation
				}
				continue
			case 21: // twice in one write
				out = append(out, out...)
			}
			if _, err := c.Write(out); err != nil {
				return
			}
		}
	})
	c := newTestTCP(srv.addr, time.Second)
	defer c.Close()
	for i := range 3 {
		b, err := c.ReadHoldingRegisters(20, 2)
		if err != nil {
			t.Fatalf("split reply %d: %v", i, err)
		}
		if got := u16s(b); len(got) != 2 || got[0] != 20*7 || got[1] != 21*7 {
			t.Fatalf("split reply %d: %v", i, got)
		}
	}
	want, err := c.ReadHoldingRegisters(100, 2)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.ReadHoldingRegisters(21, 2); err != nil {
		t.Fatalf("doubled reply: the first copy is the answer: %v", err)
	}
	_, err = c.ReadHoldingRegisters(100, 2)
	var fe *FrameError
	if !errors.As(err, &fe) {
		t.Fatalf("after a doubled reply: %v, want a frame error (the copy must not be an answer)", err)
	}
	got, err := c.ReadHoldingRegisters(100, 2) // redialled at once: the stream had carried good replies
	if err != nil {
		t.Fatalf("after the frame error: %v", err)
	}
	if string(got) != string(want) {
		t.Errorf("read %v after the redial, want %v", u16s(got), u16s(want))
	}
	if cn := c.Counters(); cn.Reconnects != 1 || cn.Dropped != 1 {
		t.Errorf("counters %+v, want 1 reconnect and 1 dropped", cn)
	}
	if n := srv.acceptedCount(); n != 2 {
		t.Errorf("%d connections accepted, want 2", n)
	}
}
