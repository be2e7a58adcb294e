package sim

import (
	"bytes"
	"io"
	"net"
	"os"
	"testing"
	"time"
)

// Fault knobs over TCP, seen by a raw MBAP master on one connection.
func TestTCPFaults(t *testing.T) {
	f := startFleet(t, Config{Transport: "tcp", Clock: frozen()})
	l := f.Logger(0)
	l.SetHolding(100, 0x0102)
	c, err := net.DialTimeout("tcp", f.Addr(0), 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	read := h(0x03, 0x00, 0x64, 0x00, 0x01)
	good := func(tid uint16) []byte { return mbap(tid, 1, h(0x03, 0x02, 0x01, 0x02)) }
	send := func(tid uint16) {
		t.Helper()
		if _, err := c.Write(mbap(tid, 1, read)); err != nil {
			t.Fatal(err)
		}
	}
	expect := func(name string, want []byte) {
		t.Helper()
		c.SetReadDeadline(time.Now().Add(2 * time.Second))
		got := make([]byte, len(want))
		if _, err := io.ReadFull(c, got); err != nil || !bytes.Equal(got, want) {
			t.Fatalf("%s: got % X (%v), want % X", name, got, err, want)
		}
	}
	sent := func(n uint64) {
		t.Helper()
		waitFor(t, "requests counted", 2*time.Second, func() bool { return l.Counters().Requests >= n })
	}
	// After each faulty request the knobs are cleared and a clean request
	// (tid 100+i) follows; the stream must hold exactly what the fault made.
	for i, tc := range []struct {
		name   string
		faults Faults
		want   []byte
	}{
		{"drop request", Faults{DropRequest: 1}, nil},
		{"drop response", Faults{DropResponse: 1}, nil},
		{"exception", Faults{Exception: 1}, mbap(7, 1, h(0x83, 0x04))},
		{"wrong tid", Faults{WrongTID: 1}, good(8)},
		{"duplicate", Faults{Duplicate: 1}, append(good(7), good(7)...)},
		{"truncate", Faults{Truncate: 1}, good(7)[:len(good(7))-1]},
		{"delay", Faults{Delay: 50 * time.Millisecond}, good(7)},
	} {
		n := l.Counters().Requests
		l.SetFaults(tc.faults)
		send(7)
		sent(n + 1)
		l.SetFaults(Faults{})
		send(uint16(100 + i))
		expect(tc.name, append(append([]byte{}, tc.want...), good(uint16(100+i))...))
	}
	if got := l.Counters(); got.Faults != 7 || got.Dropped != 2 {
		t.Errorf("counters %+v, want 7 faults, 2 dropped", got)
	}

	// A reply held by a delay is abandoned by Stop: the connection closes at once.
	l.SetFaults(Faults{Delay: time.Hour})
	n := l.Counters().Requests
	send(9)
	sent(n + 1)
	l.Stop()
	c.SetReadDeadline(time.Now().Add(2 * time.Second))
	if n, err := c.Read(make([]byte, 16)); err != io.EOF {
		t.Errorf("after Stop: read %d, %v; want EOF", n, err)
	}
	// A protocol id other than 0 drops the connection (the stream cannot be trusted).
	if err := l.Start(); err != nil {
		t.Fatal(err)
	}
	l.SetFaults(Faults{})
	c2, err := net.DialTimeout("tcp", f.Addr(0), 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	c2.Write(h(0x00, 0x01, 0x00, 0x05, 0x00, 0x06, 0x01, 0x03, 0x00, 0x00, 0x00, 0x01))
	c2.SetReadDeadline(time.Now().Add(2 * time.Second))
	if n, err := c2.Read(make([]byte, 16)); err == nil || os.IsTimeout(err) {
		t.Errorf("bad protocol id: read %d, %v; want the connection closed", n, err)
	}
	if got := l.Counters().Malformed; got != 1 {
		t.Errorf("malformed %d", got)
	}
}

// RTU frames over TCP: length framing on a stream, CRC checked, BadCRC fault.
func TestRTUOverTCP(t *testing.T) {
	f := startFleet(t, Config{Transport: "rtutcp", Clock: frozen()})
	l := f.Logger(0)
	l.SetHolding(100, 0x0A0B)
	c, err := net.DialTimeout("tcp", f.Addr(0), 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	read := appendRTU(nil, 5, h(0x03, 0x00, 0x64, 0x00, 0x01))
	good := appendRTU(nil, 5, h(0x03, 0x02, 0x0A, 0x0B))
	bad := append([]byte{}, read...)
	bad[len(bad)-1] ^= 0x55
	write := appendRTU(nil, 5, h(0x10, 0x00, 0x65, 0x00, 0x01, 0x02, 0x12, 0x34))
	// A bad frame, then a read split in two writes, then a write: two replies.
	c.Write(append(bad, read[:3]...))
	c.Write(append(read[3:], write...))
	want := append(append([]byte{}, good...), appendRTU(nil, 5, h(0x10, 0x00, 0x65, 0x00, 0x01))...)
	got := make([]byte, len(want))
	c.SetReadDeadline(time.Now().Add(2 * time.Second))
	if _, err := io.ReadFull(c, got); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("got % X (%v), want % X", got, err, want)
	}
	if cn := l.Counters(); cn.Malformed != 1 || cn.Requests != 2 || l.Holding(101, 1)[0] != 0x1234 {
		t.Errorf("counters %+v, register 101 %#x", cn, l.Holding(101, 1)[0])
	}
	l.SetFaults(Faults{BadCRC: 1})
	c.Write(read)
	c.SetReadDeadline(time.Now().Add(2 * time.Second))
	if _, err := io.ReadFull(c, got[:len(good)]); err != nil || rtuCRCOK(got[:len(good)]) || !bytes.Equal(got[:len(good)-1], good[:len(good)-1]) {
		t.Errorf("BadCRC fault: % X (%v)", got[:len(good)], err)
	}
}
