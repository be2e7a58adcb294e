package sim

import (
	"bytes"
	"encoding/binary"
	"errors"
	"net"
	"net/netip"
	"os"
	"testing"
	"time"
)

// udpPeer is a raw Modbus UDP master: one unconnected socket, so replies
// from any port are seen.
type udpPeer struct {
	t  testing.TB
	c  *net.UDPConn
	to netip.AddrPort
}

func newUDPPeer(t testing.TB, addr string) *udpPeer {
	t.Helper()
	c, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &udpPeer{t: t, c: c, to: netip.MustParseAddrPort(addr)}
}

func mbap(tid uint16, unit byte, pdu []byte) []byte {
	b := binary.BigEndian.AppendUint16(nil, tid)
	b = append(b, 0, 0)
	b = binary.BigEndian.AppendUint16(b, uint16(len(pdu)+1))
	return append(append(b, unit), pdu...)
}

func (p *udpPeer) send(tid uint16, pdu []byte) {
	p.t.Helper()
	if _, err := p.c.WriteToUDPAddrPort(mbap(tid, 1, pdu), p.to); err != nil {
		p.t.Fatal(err)
	}
}

func (p *udpPeer) sendRaw(b []byte) {
	p.t.Helper()
	if _, err := p.c.WriteToUDPAddrPort(b, p.to); err != nil {
		p.t.Fatal(err)
	}
}

// recv returns the next datagram and its source; it fails the test after d.
func (p *udpPeer) recv(d time.Duration) ([]byte, netip.AddrPort) {
	p.t.Helper()
	b, from, err := p.tryRecv(d)
	if err != nil {
		p.t.Fatalf("no reply: %v", err)
	}
	return b, from
}

func (p *udpPeer) tryRecv(d time.Duration) ([]byte, netip.AddrPort, error) {
	buf := make([]byte, 1024)
	p.c.SetReadDeadline(time.Now().Add(d))
	n, from, err := p.c.ReadFromUDPAddrPort(buf)
	return buf[:n], from, err
}

func TestUDPRaw(t *testing.T) {
	f := startFleet(t, Config{Devices: 2, Transport: "udp", Clock: frozen(), Seed: 9})
	l := f.Logger(1)
	p := newUDPPeer(t, f.Addr(1))
	p.send(0x1234, h(0x03, 0x00, 0x00, 0x00, 0x07))
	b, from := p.recv(2 * time.Second)
	if from != p.to {
		t.Errorf("reply from %s, want %s", from, p.to)
	}
	want := mbap(0x1234, 1, append(h(0x03, 14), u16s(l.Holding(0, 7))...))
	if !bytes.Equal(b, want) {
		t.Fatalf("reply % X, want % X", b, want)
	}
	p.send(1, h(0x10, 0x00, 0x64, 0x00, 0x02, 0x04, 0xCA, 0xFE, 0xBA, 0xBE))
	if b, _ := p.recv(2 * time.Second); !bytes.Equal(b, mbap(1, 1, h(0x10, 0x00, 0x64, 0x00, 0x02))) {
		t.Fatalf("write reply % X", b)
	}
	if got := l.Holding(100, 2); got[0] != 0xCAFE || got[1] != 0xBABE {
		t.Errorf("registers 100..101 = %x", got)
	}
	// Malformed datagrams get no reply and are counted: the next reply is tid 3's.
	p.sendRaw(h(0x00, 0x02, 0x00, 0x00, 0x00, 0x09, 0x01, 0x03))                         // length lies
	p.sendRaw(h(0x00, 0x02, 0x00, 0x07, 0x00, 0x06, 0x01, 0x03, 0x00, 0x00, 0x00, 0x01)) // protocol 7
	p.send(3, h(0x03, 0x00, 0x64, 0x00, 0x01))
	if b, _ := p.recv(2 * time.Second); !bytes.Equal(b, mbap(3, 1, h(0x03, 0x02, 0xCA, 0xFE))) {
		t.Fatalf("reply % X, want tid 3", b)
	}
	if c := l.Counters(); c.Malformed != 2 || c.Requests != 3 || c.Replies != 3 {
		t.Errorf("counters %+v", c)
	}
}

func u16s(v []uint16) []byte {
	var b []byte
	for _, x := range v {
		b = binary.BigEndian.AppendUint16(b, x)
	}
	return b
}

// Each fault knob observably changes what the master sees.
func TestUDPFaults(t *testing.T) {
	f := startFleet(t, Config{Transport: "udp", Clock: frozen(), Seed: 3})
	l := f.Logger(0)
	p := newUDPPeer(t, f.Addr(0))
	read := h(0x03, 0x00, 0x64, 0x00, 0x01)
	l.SetHolding(100, 0x0102)
	good := mbap(7, 1, h(0x03, 0x02, 0x01, 0x02))
	// expectNoReply: a clean request after the faulty one must be the first answer.
	sent := func(t *testing.T, n uint64) { // wait until n requests were counted (their faults decided)
		t.Helper()
		waitFor(t, "requests counted", 2*time.Second, func() bool { return l.Counters().Requests >= n })
	}
	// faulty sends one request with faults set, and clears them once it was counted.
	faulty := func(t *testing.T, fs Faults, pdu []byte) {
		t.Helper()
		n := l.Counters().Requests
		l.SetFaults(fs)
		p.send(7, pdu)
		sent(t, n+1)
		l.SetFaults(Faults{})
	}
	// expectNoReply: a clean request after the faulty one must be the first answer.
	expectNoReply := func(t *testing.T, name string) {
		t.Helper()
		p.send(100, read)
		if b, _ := p.recv(2 * time.Second); !bytes.Equal(b, mbap(100, 1, h(0x03, 0x02, 0x01, 0x02))) {
			t.Fatalf("%s: a reply came: % X", name, b)
		}
	}

	t.Run("drop request", func(t *testing.T) {
		before := l.Counters()
		faulty(t, Faults{DropRequest: 1}, h(0x06, 0x00, 0x64, 0x00, 0x09))
		expectNoReply(t, "drop request")
		if l.Holding(100, 1)[0] != 0x0102 {
			t.Error("a dropped request was executed")
		}
		if c := l.Counters(); c.Dropped != before.Dropped+1 || c.Faults != before.Faults+1 {
			t.Errorf("counters %+v, before %+v", c, before)
		}
	})
	t.Run("drop response", func(t *testing.T) {
		faulty(t, Faults{DropResponse: 1}, h(0x06, 0x00, 0x65, 0x00, 0x09))
		expectNoReply(t, "drop response")
		if l.Holding(101, 1)[0] != 9 {
			t.Error("the request whose response was dropped was not executed")
		}
	})
	t.Run("exception", func(t *testing.T) {
		l.SetFaults(Faults{Exception: 1})
		p.send(7, read)
		if b, _ := p.recv(2 * time.Second); !bytes.Equal(b, mbap(7, 1, h(0x83, 0x04))) {
			t.Errorf("got % X, want exception 4", b)
		}
	})
	t.Run("duplicate", func(t *testing.T) {
		l.SetFaults(Faults{Duplicate: 1})
		p.send(7, read)
		for i := 0; i < 2; i++ {
			if b, _ := p.recv(2 * time.Second); !bytes.Equal(b, good) {
				t.Errorf("copy %d: % X", i, b)
			}
		}
	})
	t.Run("wrong tid", func(t *testing.T) {
		l.SetFaults(Faults{WrongTID: 1})
		p.send(7, read)
		if b, _ := p.recv(2 * time.Second); !bytes.Equal(b, mbap(8, 1, h(0x03, 0x02, 0x01, 0x02))) {
			t.Errorf("got % X, want tid 8", b)
		}
	})
	t.Run("other port", func(t *testing.T) {
		l.SetFaults(Faults{OtherPort: 1})
		p.send(7, read)
		b, from := p.recv(2 * time.Second)
		if !bytes.Equal(b, good) || from.Addr() != p.to.Addr() || from.Port() == p.to.Port() {
			t.Errorf("got % X from %s, want the reply from %s on another port", b, from, p.to.Addr())
		}
	})
	t.Run("truncate", func(t *testing.T) {
		l.SetFaults(Faults{Truncate: 1})
		p.send(7, read)
		if b, _ := p.recv(2 * time.Second); !bytes.Equal(b, good[:len(good)-1]) {
			t.Errorf("got % X, want % X", b, good[:len(good)-1])
		}
	})
	t.Run("bad crc is rtu only", func(t *testing.T) {
		l.SetFaults(Faults{BadCRC: 1})
		p.send(7, read)
		if b, _ := p.recv(2 * time.Second); !bytes.Equal(b, good) {
			t.Errorf("got % X", b)
		}
	})
	t.Run("delay", func(t *testing.T) {
		l.SetFaults(Faults{Delay: 150 * time.Millisecond})
		start := time.Now()
		p.send(7, read)
		b, _ := p.recv(2 * time.Second)
		if el := time.Since(start); el < 150*time.Millisecond || !bytes.Equal(b, good) {
			t.Errorf("reply % X after %v, want after ≥150ms", b, el)
		}
	})
	t.Run("jitter", func(t *testing.T) {
		l.SetFaults(Faults{Jitter: 100 * time.Millisecond})
		var longest time.Duration
		for i := 0; i < 10; i++ {
			start := time.Now()
			p.send(uint16(i), read)
			p.recv(2 * time.Second)
			longest = max(longest, time.Since(start))
		}
		if longest < 5*time.Millisecond { // P = 0.05^10 for a working jitter
			t.Errorf("10 replies all within %v: no jitter", longest)
		}
	})
	t.Run("probability", func(t *testing.T) {
		l.SetFaults(Faults{DropRequest: 0.5})
		before := l.Counters()
		for i := 0; i < 100; i++ { // 100: well inside the default socket buffers
			p.send(uint16(i), read)
		}
		sent(t, before.Requests+100)
		expectNoReplyAfter := func() int { // count replies until the marker
			l.SetFaults(Faults{})
			p.send(9999, read)
			n := 0
			for {
				b, _ := p.recv(2 * time.Second)
				if binary.BigEndian.Uint16(b) == 9999 {
					return n
				}
				n++
			}
		}
		got := expectNoReplyAfter()
		c := l.Counters()
		if got < 20 || got > 80 || c.Dropped-before.Dropped != uint64(100-got) {
			t.Errorf("%d of 100 answered with DropRequest 0.5; counters %+v", got, c)
		}
	})
}

// A delayed reply pending at Stop is discarded; restart reopens the socket.
func TestUDPRestart(t *testing.T) {
	f := startFleet(t, Config{Transport: "udp", Clock: frozen()})
	l := f.Logger(0)
	p := newUDPPeer(t, f.Addr(0))
	fds := countFDs(t)
	l.SetFaults(Faults{Delay: time.Hour, OtherPort: 1})
	p.send(1, h(0x03, 0x00, 0x00, 0x00, 0x01))
	waitFor(t, "request counted", 2*time.Second, func() bool { return l.Counters().Requests == 1 })
	for i := 0; i < 50; i++ {
		if err := l.Restart(); err != nil {
			t.Fatal(err)
		}
	}
	l.SetFaults(Faults{OtherPort: 1})
	p.send(2, h(0x03, 0x00, 0x02, 0x00, 0x01))
	b, from := p.recv(2 * time.Second)
	if binary.BigEndian.Uint16(b) != 2 || from.Port() == p.to.Port() {
		t.Fatalf("reply % X from %s", b, from)
	}
	if got := countFDs(t); got != fds+1 { // +1: the second socket of OtherPort
		t.Errorf("fds %d after restarts, %d before (+1 expected)", got, fds)
	}
	l.Stop()
	if got := countFDs(t); got != fds-1 {
		t.Errorf("fds %d after Stop, %d before (-1 expected)", got, fds)
	}
	p.send(3, h(0x03, 0x00, 0x02, 0x00, 0x01))
	if _, _, err := p.tryRecv(50 * time.Millisecond); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("stopped logger: %v", err)
	}
}

// 1000 UDP loggers on one machine: one request each, from one socket.
func TestUDPFleet1000(t *testing.T) {
	if testing.Short() {
		t.Skip("short")
	}
	f := startFleet(t, Config{Devices: 1000, Transport: "udp", Seed: 1})
	if got := f.Addr(999); netip.MustParseAddrPort(got).Addr() != netip.MustParseAddr("127.0.4.238") {
		t.Fatalf("logger 999 at %s", got)
	}
	c, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetReadBuffer(1 << 20)
	seen := make([]int, f.Len())
	for round := 0; round < 3; round++ {
		for i := 0; i < f.Len(); i++ {
			to := netip.MustParseAddrPort(f.Addr(i))
			if _, err := c.WriteToUDPAddrPort(mbap(uint16(i), 1, h(0x03, 0x00, 0x00, 0x00, 0x07)), to); err != nil {
				t.Fatal(err)
			}
		}
		buf := make([]byte, 512)
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		for got := 0; got < f.Len(); got++ {
			n, from, err := c.ReadFromUDPAddrPort(buf)
			if err != nil {
				t.Fatalf("round %d: %d of %d replies: %v", round, got, f.Len(), err)
			}
			i := int(binary.BigEndian.Uint16(buf))
			if n != 7+2+14 || f.Addr(i) != from.String() {
				t.Fatalf("reply % X from %s", buf[:n], from)
			}
			seen[i]++
		}
	}
	for i, n := range seen {
		if n != 3 {
			t.Fatalf("logger %d answered %d times", i, n)
		}
	}
}

func BenchmarkUDPRoundTrip(b *testing.B) {
	f := startFleet(b, Config{Transport: "udp"})
	c, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(netip.MustParseAddrPort(f.Addr(0))))
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	req := mbap(1, 1, h(0x03, 0x00, 0x00, 0x00, 0x02))
	buf := make([]byte, 512)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := c.Write(req); err != nil {
			b.Fatal(err)
		}
		c.SetReadDeadline(time.Now().Add(2 * time.Second))
		if n, err := c.Read(buf); err != nil || n != 13 {
			b.Fatalf("%d %v", n, err)
		}
	}
}

// One op: a request to each of 1000 UDP loggers and every reply, from one
// client socket (the gateway's shape). ns/op ÷ 1000 is the cost of a request
// for client and simulator together, on this machine.
func BenchmarkUDPFleet1000Round(b *testing.B) {
	f := startFleet(b, Config{Devices: 1000, Transport: "udp", Seed: 1})
	c, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	c.SetReadBuffer(1 << 20)
	to := make([]netip.AddrPort, f.Len())
	for i := range to {
		to[i] = netip.MustParseAddrPort(f.Addr(i))
	}
	req := mbap(1, 1, h(0x03, 0x00, 0x00, 0x00, 0x07))
	buf := make([]byte, 512)
	b.ReportAllocs()
	for b.Loop() {
		for i := range to {
			if _, err := c.WriteToUDPAddrPort(req, to[i]); err != nil {
				b.Fatal(err)
			}
		}
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		for range to {
			if _, _, err := c.ReadFromUDPAddrPort(buf); err != nil {
				b.Fatal(err)
			}
		}
	}
}
