package modbus

import (
	"context"
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"net"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"edgegw/internal/testenv"
)

const forged = 0xDEAD // the value every forged reply carries

// forgeReplies sends, as the device at r, replies to a read of qty
// registers carrying the forged value under guessed transaction ids: the
// next ids a sequential scheme would use after sent requests (what the
// public request count gives away), then spray random ids. It never looks at
// the request's own id.
func forgeReplies(r *udpResponder, dst netip.AddrPort, sent uint64, spray int, unit byte, qty uint16) {
	pdu := []byte{3, byte(2 * qty)}
	for range qty {
		pdu = binary.BigEndian.AppendUint16(pdu, forged)
	}
	send := func(tid uint16) {
		req := []byte{byte(tid >> 8), byte(tid), 0, 0, 0, 6, unit}
		_, _ = r.conn.WriteToUDPAddrPort(mbap(req, pdu), dst)
	}
	for i := range uint64(8) {
		send(uint16(sent + 1 + i))
	}
	for range spray {
		send(uint16(rand.N(65535) + 1))
	}
}

// TestUDPForgedRepliesLoggerGone: the logger is gone and a forger holds its
// address: on every request (it uses only the arrival, never the id) it
// sends guessed ids — sequential ones from the public request count and a
// spray — with a forged value. No forged value is ever accepted.
func TestUDPForgedRepliesLoggerGone(t *testing.T) {
	const polls, spray = 40, 300
	sl := newSlave()
	genuine := startUDPResponder(t, "127.0.0.1:0", func(r *udpResponder, src netip.AddrPort, req []byte) {
		_, _ = r.conn.WriteToUDPAddrPort(mbap(req, sl.pdu(req[7:])), src)
	})
	s := startSocket(t)
	c, err := s.Device(genuine.addr, 1, 50*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var requests atomic.Uint64 // what /api/devices shows
	read := func(a uint16) ([]byte, error) {
		defer requests.Add(1)
		return c.ReadHoldingRegisters(a, 2)
	}
	for a := range uint16(5) {
		if b, err := read(a); err != nil || u16s(b)[0] != a*7 {
			t.Fatalf("genuine read %d: %v %v", a, u16s(b), err)
		}
	}
	genuine.conn.Close()
	testenv.Wait(t, stopLimit, "the genuine responder to stop", genuine.wg.Wait)
	forger := startUDPResponder(t, genuine.addr, func(r *udpResponder, src netip.AddrPort, req []byte) {
		forgeReplies(r, src, requests.Load(), spray, 1, 2)
	})
	_ = forger
	var timeouts, untrusted int
	for p := range polls {
		b, err := read(uint16(p))
		var fe *FrameError
		switch {
		case err == nil:
			t.Fatalf("poll %d: forged reply accepted: %v", p, u16s(b))
		case errors.Is(err, ErrTimeout):
			timeouts++
		case errors.As(err, &fe) && fe == errUntrusted:
			untrusted++
		default:
			t.Fatalf("poll %d: %v", p, err)
		}
	}
	cn := c.Counters()
	t.Logf("%d polls against the forger: %d timeouts, %d untrusted; device %+v; socket %+v", polls, timeouts, untrusted, cn, s.Counters())
	if cn.Dropped < polls || cn.Untrusted != uint64(untrusted) {
		t.Errorf("device counters %+v: want the forged datagrams dropped and each untrusted reply counted", cn)
	}
}

// TestUDPForgedRepliesBesideLogger: a forger sprays guessed ids from the
// logger's address just before each genuine reply. Requests hit by the
// spray fail (untrusted, counted), none returns the forged value; once the
// spray stops, genuine replies are accepted again.
func TestUDPForgedRepliesBesideLogger(t *testing.T) {
	const polls, spray = 40, 300
	sl := newSlave()
	var forging atomic.Bool
	var requests atomic.Uint64
	forging.Store(true)
	r := startUDPResponder(t, "127.0.0.1:0", func(r *udpResponder, src netip.AddrPort, req []byte) {
		if forging.Load() {
			forgeReplies(r, src, requests.Load(), spray, 1, 2)
		}
		_, _ = r.conn.WriteToUDPAddrPort(mbap(req, sl.pdu(req[7:])), src)
	})
	s := startSocket(t)
	c, err := s.Device(r.addr, 1, 200*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var untrusted, good int
	for p := range polls {
		a := uint16(p)
		b, err := c.ReadHoldingRegisters(a, 2)
		requests.Add(1)
		var fe *FrameError
		switch {
		case err == nil && u16s(b)[0] == a*7:
			good++
		case err == nil:
			t.Fatalf("poll %d: forged reply accepted: %v", p, u16s(b))
		case errors.As(err, &fe) && fe == errUntrusted:
			untrusted++
		case errors.Is(err, ErrTimeout):
		default:
			t.Fatalf("poll %d: %v", p, err)
		}
	}
	forging.Store(false)
	for a := range uint16(5) {
		if b, err := c.ReadHoldingRegisters(a, 2); err != nil || u16s(b)[0] != a*7 {
			t.Fatalf("after the spray, read %d: %v %v", a, u16s(b), err)
		}
	}
	cn := c.Counters()
	t.Logf("%d polls under the spray: %d untrusted, %d good; device %+v", polls, untrusted, good, cn)
	if untrusted < polls/2 || cn.Untrusted != uint64(untrusted) || cn.Dropped < uint64(untrusted) {
		t.Errorf("%d untrusted of %d, counters %+v: the spray came before every genuine reply", untrusted, polls, cn)
	}
}

// TestUDPMismatchDropped: replies under the request's own id but with the
// wrong unit, function or length, from the device's address but another
// port, or from an address that is no device are dropped and counted: per
// device (the other port too), and both foreign endpoints as unknown
// sources on the socket. The request still gets its own reply.
func TestUDPMismatchDropped(t *testing.T) {
	sl := newSlave()
	otherPort, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer otherPort.Close()
	stranger, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 1, 201)})
	if err != nil {
		t.Fatal(err)
	}
	defer stranger.Close()
	s := startSocket(t)
	r := startUDPResponder(t, "127.0.0.1:0", func(r *udpResponder, src netip.AddrPort, req []byte) {
		out := mbap(req, sl.pdu(req[7:]))
		send := func(b []byte) { _, _ = r.conn.WriteToUDPAddrPort(b, src) }
		unit := append([]byte(nil), out...)
		unit[6] = 7
		fn := append([]byte(nil), out...)
		fn[7] = 4
		short := mbap(req, []byte{3, 2, 0xDE, 0xAD}) // one register for two
		long := mbap(req, []byte{3, 6, 0xDE, 0xAD, 0xDE, 0xAD, 0xDE, 0xAD})
		for _, b := range [][]byte{unit, fn, short, long} {
			send(b)
		}
		_, _ = otherPort.WriteToUDPAddrPort(out, src)
		_, _ = stranger.WriteToUDPAddrPort(out, src)
		send(out)
	})
	c, err := s.Device(r.addr, 1, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	const polls = 10
	for a := range uint16(polls) {
		b, err := c.ReadHoldingRegisters(a, 2)
		if err != nil || u16s(b)[0] != a*7 || u16s(b)[1] != (a+1)*7 {
			t.Fatalf("read %d: %v %v", a, u16s(b), err)
		}
	}
	waitFor(t, 2*time.Second, "every mismatch counted", func() bool {
		return c.Counters().Dropped == 5*polls && s.Counters().UnknownSource == 2*polls
	})
	if cn := c.Counters(); cn.Untrusted != 0 || cn.UnknownSource != 0 {
		t.Errorf("device counters %+v", cn)
	}
	if cn := s.Counters(); cn.Dropped != 6*polls {
		t.Errorf("socket counters %+v, want %d dropped", cn, 6*polls)
	}
}

// TestUDPUnknownSourceExported: datagrams from an endpoint that is no
// device also count in the caller's gateway-wide counter.
func TestUDPUnknownSourceExported(t *testing.T) {
	var ext atomic.Uint64
	s, err := NewUDPSocket(UDPConfig{Listen: "127.0.0.1:0", UnknownSource: &ext})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	defer func() { cancel(); testenv.Closed(t, done, stopLimit, "the udp socket's Run to return") }()
	stranger, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 1, 202)})
	if err != nil {
		t.Fatal(err)
	}
	defer stranger.Close()
	for range 3 {
		_, _ = stranger.WriteToUDPAddrPort(mbap(hx("0001 0000 0006 01 03 0000 0001"), hx("03 02 0001")), s.LocalAddr())
	}
	waitFor(t, 2*time.Second, "3 unknown-source datagrams", func() bool { return ext.Load() == 3 })
	if cn := s.Counters(); cn.UnknownSource != 3 || cn.Dropped != 3 {
		t.Errorf("socket counters %+v", cn)
	}
}
