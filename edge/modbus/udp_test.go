package modbus

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"edgegw/internal/testenv"
)

// udpResponder is an in-test Modbus UDP slave on addr; handle gets every
// datagram and a send function (usable from other goroutines until stop).
type udpResponder struct {
	conn *net.UDPConn
	wg   sync.WaitGroup
	addr string
}

func startUDPResponder(t testing.TB, addr string, handle func(r *udpResponder, src netip.AddrPort, req []byte)) *udpResponder {
	t.Helper()
	la, err := net.ResolveUDPAddr("udp", addr)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := net.ListenUDP("udp", la)
	if err != nil {
		t.Fatal(err)
	}
	r := &udpResponder{conn: conn, addr: conn.LocalAddr().String()}
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		buf := make([]byte, 1024)
		for {
			n, src, err := conn.ReadFromUDPAddrPort(buf)
			if err != nil {
				return
			}
			handle(r, src, append([]byte(nil), buf[:n]...))
		}
	}()
	t.Cleanup(func() { conn.Close(); testenv.Wait(t, stopLimit, "the udp responder to stop", r.wg.Wait) })
	return r
}

// later sends b to dst after d from a goroutine the responder waits for.
func (r *udpResponder) later(d time.Duration, dst netip.AddrPort, b []byte) {
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		time.Sleep(d) // the simulated device's reply delay
		_, _ = r.conn.WriteToUDPAddrPort(b, dst)
	}()
}

// startSocket runs a UDP socket on 127.0.0.1:0 until the test ends.
func startSocket(t testing.TB) *UDPSocket {
	t.Helper()
	return startSocketCfg(t, false)
}

func TestUDPSpecAndBuffers(t *testing.T) {
	r := startUDPResponder(t, "127.0.0.1:0", func(r *udpResponder, src netip.AddrPort, req []byte) {
		_, _ = r.conn.WriteToUDPAddrPort(mbap(req, specReply(t, req[7:])), src)
	})
	s := startSocket(t)
	rcv, snd := s.Buffers()
	t.Logf("SO_RCVBUF %d SO_SNDBUF %d granted for 4 MiB asked", rcv, snd)
	if rcv < 1<<20 || snd < 1<<20 {
		t.Errorf("buffers not raised: rcv %d snd %d", rcv, snd)
	}
	c, err := s.Device(r.addr, 1, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	runSpecCases(t, c)
}

// TestUDPCrossTalk: 48 devices on 127.0.1.1–48 answer after random delays
// (so replies cross), all polled concurrently through one socket.
func TestUDPCrossTalk(t *testing.T) {
	const devices, polls = 48, 40
	s := startSocket(t)
	conns := make([]*UDPConn, devices)
	for i := range devices {
		id := uint16(i + 1)
		r := startUDPResponder(t, fmt.Sprintf("127.0.1.%d:0", i+1), func(r *udpResponder, src netip.AddrPort, req []byte) {
			a := binary.BigEndian.Uint16(req[8:])
			r.later(time.Duration(rand.N(3000))*time.Microsecond, src, mbap(req, []byte{3, 4, byte(id >> 8), byte(id), byte(a >> 8), byte(a)}))
		})
		c, err := s.Device(r.addr, 1, time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		conns[i] = c
	}
	var wg sync.WaitGroup
	var bad, ok atomic.Int64
	for i, c := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for p := range polls {
				a := uint16(p*7 + i)
				b, err := c.ReadHoldingRegisters(a, 2)
				if err != nil {
					t.Errorf("device %d poll %d: %v", i+1, p, err)
					return
				}
				if v := u16s(b); v[0] != uint16(i+1) || v[1] != a {
					bad.Add(1)
					t.Errorf("device %d poll %d: got reply %v of another request", i+1, p, v)
				}
				ok.Add(1)
			}
		}()
	}
	testenv.Wait(t, 2*time.Minute, "every device's polls", wg.Wait)
	if ok.Load() != devices*polls || bad.Load() != 0 {
		t.Errorf("%d good, %d cross-matched", ok.Load(), bad.Load())
	}
	if cn := s.Counters(); cn != (Counters{}) {
		t.Errorf("socket counters %+v, want zero", cn)
	}
}

// TestUDPWraparound: >70,000 requests to one device use more transaction
// ids than there are, so ids come round again (random ids: every id is
// reused about once); the device holds back the replies to some requests
// (every 10,000th, and whenever the id is 65535, 1, 2 or 300) and sends them
// once the next request has arrived. No late reply is ever delivered, every
// delivered reply is the one asked for, tid 0 is never used, and no id is
// reused while it is among the last 64 of the device.
func TestUDPWraparound(t *testing.T) {
	const total = 70_500
	special := map[uint16]bool{65535: true, 1: true, 2: true, 300: true}
	var mu sync.Mutex
	var pending []struct {
		dst netip.AddrPort
		b   []byte
	}
	var sawZero, reused atomic.Bool
	var held atomic.Int64
	seen := map[uint16]bool{}
	var last [recentN]uint16
	n := 0
	r := startUDPResponder(t, "127.0.0.1:0", func(r *udpResponder, src netip.AddrPort, req []byte) {
		mu.Lock()
		defer mu.Unlock()
		tid := binary.BigEndian.Uint16(req)
		if tid == 0 {
			sawZero.Store(true)
		}
		for _, l := range last {
			if l == tid {
				reused.Store(true)
			}
		}
		last[n%recentN] = tid
		seen[tid] = true
		a := binary.BigEndian.Uint16(req[8:])
		out := mbap(req, []byte{3, 2, byte(a >> 8), byte(a)})
		// the held replies go out after the next request arrived: their
		// requests have given up by then
		for _, p := range pending {
			_, _ = r.conn.WriteToUDPAddrPort(p.b, p.dst)
		}
		pending = pending[:0]
		hold := (n%10_000 == 5_000 || special[tid]) && n < total-1
		n++
		if hold {
			held.Add(1)
			pending = append(pending, struct {
				dst netip.AddrPort
				b   []byte
			}{src, out})
			return
		}
		_, _ = r.conn.WriteToUDPAddrPort(out, src)
	})
	s := startSocket(t)
	c, err := s.Device(r.addr, 1, 20*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var timeouts, good int
	start := time.Now()
	for i := range total {
		a := uint16(i)
		b, err := c.ReadHoldingRegisters(a, 1)
		switch {
		case errors.Is(err, ErrTimeout):
			timeouts++
		case err != nil:
			t.Fatalf("request %d: %v", i, err)
		case binary.BigEndian.Uint16(b) != a:
			t.Fatalf("request %d (addr %d): got the reply for addr %d", i, a, binary.BigEndian.Uint16(b))
		default:
			good++
		}
	}
	waitFor(t, 2*time.Second, "the last held reply counted late", func() bool { return c.Counters().Late >= uint64(held.Load()) })
	cn := c.Counters()
	mu.Lock()
	distinct := len(seen)
	mu.Unlock()
	t.Logf("%d requests in %v: %d distinct ids, %d good, %d timeouts, %d held, counters %+v", total, time.Since(start), distinct, good, timeouts, held.Load(), cn)
	if sawZero.Load() || reused.Load() {
		t.Errorf("tid 0 used %v, an id reused among the last %d: %v", sawZero.Load(), recentN, reused.Load())
	}
	if distinct < 40_000 {
		t.Errorf("only %d distinct ids in %d requests: ids do not cover the space", distinct, total)
	}
	// (a reply slower than 20 ms on a busy machine is one more timeout, and late)
	if h := int(held.Load()); h < 7 || timeouts < h || cn.Late < uint64(h) || cn.Late > uint64(timeouts) || cn.Dropped != 0 || cn.Untrusted != 0 {
		t.Errorf("%d held, %d timeouts, counters %+v; want every held reply a timeout and counted late, nothing dropped", h, timeouts, cn)
	}
	// A timeout whose reply came after all (the held ones, and any the
	// machine delayed past 20 ms) is counted late: the others, replies lost
	// or not matched, are at most 100.
	if lost := timeouts - min(timeouts, int(cn.Late)); lost > 100 {
		t.Errorf("only %d of %d good: %d timeouts, %d of them without a late reply", good, total, timeouts, lost)
	}
}

// TestUDPStrayDatagrams: duplicated, late, foreign-unit, unknown-source and
// malformed datagrams are counted and never delivered.
func TestUDPStrayDatagrams(t *testing.T) {
	sl := newSlave()
	stranger, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 1, 200)})
	if err != nil {
		t.Fatal(err)
	}
	defer stranger.Close()
	s := startSocket(t)
	sock := s.LocalAddr()
	lateSent := make(chan struct{}, 1)
	r := startUDPResponder(t, "127.0.0.1:0", func(r *udpResponder, src netip.AddrPort, req []byte) {
		out := mbap(req, sl.pdu(req[7:]))
		send := func(b []byte) { _, _ = r.conn.WriteToUDPAddrPort(b, src) }
		switch binary.BigEndian.Uint16(req[8:]) {
		case 1: // duplicate
			send(out)
			send(out)
		case 2: // late: after the request gave up
			r.wg.Add(1)
			go func() {
				defer r.wg.Done()
				time.Sleep(60 * time.Millisecond) // longer than the 20ms timeout
				send(mbap(req, []byte{3, 2, 0xBA, 0xD0}))
				lateSent <- struct{}{}
			}()
		case 3: // first a reply for another unit, a malformed one, then the right one
			wrong := append([]byte(nil), out...)
			wrong[6] = 9
			send(wrong)
			send(out[:5])
			bad := append([]byte(nil), out...)
			bad[7] = 4 // another function
			send(bad)
			send(out)
		case 4: // a stranger answers first with a well-formed reply
			_, _ = stranger.WriteToUDPAddrPort(mbap(req, []byte{3, 2, 0xBA, 0xD0}), sock)
			send(out)
		default:
			send(out)
		}
	})
	c, err := s.Device(r.addr, 1, 20*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	read := func(a uint16) ([]byte, error) { return c.ReadHoldingRegisters(a, 1) }

	want := func(a uint16) {
		t.Helper()
		b, err := read(a)
		if err != nil {
			t.Fatalf("addr %d: %v", a, err)
		}
		if v := binary.BigEndian.Uint16(b); v != a*7 {
			t.Fatalf("addr %d: got %#x, want %#x", a, v, a*7)
		}
	}
	want(1)
	if _, err := read(2); !errors.Is(err, ErrTimeout) {
		t.Fatalf("addr 2: %v, want timeout", err)
	}
	testenv.Closed(t, lateSent, 10*time.Second, "the late reply to be sent")
	want(3)
	want(4)
	want(5)
	waitFor(t, 2*time.Second, "counters", func() bool {
		cn := c.Counters()
		return cn.Duplicates == 1 && cn.Late == 1 && cn.Dropped == 3
	})
	if cn := s.Counters(); cn.Dropped != 4 || cn.Late != 1 || cn.Duplicates != 1 {
		t.Errorf("socket counters %+v, want 4 dropped (3 + stranger), 1 late, 1 duplicate", cn)
	}
}

// TestUDPTimeoutMessage: a device that never answers (a socket of the
// test's own that reads nothing), and no reader on our side: a request
// times out cleanly, and the error names the device.
func TestUDPTimeoutMessage(t *testing.T) {
	mute, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer mute.Close()
	addr := mute.LocalAddr().String()
	s, err := NewUDPSocket(UDPConfig{Listen: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	c, err := s.Device(addr, 1, 30*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.ReadHoldingRegisters(0, 2)
	if !errors.Is(err, ErrTimeout) || err.Error() != "modbus: udp "+addr+" unit 1: read holding 0+2: timeout after 30ms" {
		t.Fatalf("%v", err)
	}
}
