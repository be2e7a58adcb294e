package mbserver_test

import (
	"encoding/binary"
	"math"
	"net"
	"net/netip"
	"testing"
	"time"

	"edgegw/edge"
	"edgegw/internal/testenv"
	"edgegw/mbserver"
	"edgegw/ringstore"
	"edgegw/stats"
)

func rawOf(tag edge.Tag) func(float64) ([]byte, error) {
	return func(v float64) ([]byte, error) { return edge.TagRegisters(&tag, v) }
}

// mirrorRing holds dev-1/t = 21.5 (good), dev-1/h = 40.25 (good) and
// dev-2/t (timeout).
func mirrorRing(t *testing.T) *ringstore.Ring {
	t.Helper()
	r := newRing(t)
	if _, _, err := r.Append([]ringstore.Sample{
		{Device: "dev-1", Tag: "t", Value: 21.5, TS: 1}, {Device: "dev-1", Tag: "h", Value: 40.25, TS: 1},
		{Device: "dev-2", Tag: "t", Quality: ringstore.Timeout, TS: 1},
	}); err != nil {
		t.Fatal(err)
	}
	return r
}

// The mirror's layouts and answers: float32 ABCD, int16 × multiplier, a
// read outside the map (0x02), over a bad tag (0x04 or bad_value with the
// quality registers), and refused writes and functions.
func TestMirrorAnswers(t *testing.T) {
	ring := mirrorRing(t)
	st := new(stats.ModbusServer)
	_, addr := runServer(t, mbserver.Config{Ring: ring, Stats: st, Mirror: &mbserver.Mirror{Unit: 1, QualityAddress: 100, Slots: []mbserver.Slot{
		{Address: 10, Device: "dev-1", Tag: "t", Format: mbserver.FormatFloat32},
		{Address: 12, Device: "dev-1", Tag: "h", Format: mbserver.FormatInt16, Multiplier: 100},
		{Address: 13, Device: "dev-2", Tag: "t", Format: mbserver.FormatInt16},
		{Address: 14, Device: "dev-3", Tag: "t", Format: mbserver.FormatUint16},
		{Address: 15, Device: "dev-1", Tag: "t", Format: mbserver.FormatRaw, RawWords: 1, Encode: rawOf(edge.Tag{Name: "t", Register: edge.Holding, Type: edge.Int16, Scale: 0.1})},
		{Address: 16, Device: "dev-1", Tag: "h", Format: mbserver.FormatRaw, RawWords: 2, Encode: rawOf(edge.Tag{Name: "h", Register: edge.Holding, Type: edge.Float32, Order: edge.CDAB, Scale: 1})},
	}}})
	_, lenient := runServer(t, mbserver.Config{Ring: ring, Mirror: &mbserver.Mirror{Unit: 1, OnBad: mbserver.OnBadValue, BadValue: -1, QualityAddress: -1, Slots: []mbserver.Slot{
		{Address: 0, Device: "dev-1", Tag: "h", Format: mbserver.FormatInt16, Multiplier: 100},
		{Address: 1, Device: "dev-2", Tag: "t", Format: mbserver.FormatInt16},
		{Address: 2, Device: "dev-2", Tag: "t", Format: mbserver.FormatFloat32},
	}}})
	c := dial(t, addr)
	got, err := regs(c.do(1, readPDU(3, 10, 3)))
	if err != nil || math.Float32frombits(uint32(got[0])<<16|uint32(got[1])) != 21.5 || got[2] != 4025 {
		t.Errorf("registers 10..12: %v %v, want float32 21.5 and 4025", got, err)
	}
	raw, err := regs(c.do(1, readPDU(3, 15, 3)))
	if b := math.Float32bits(40.25); err != nil || raw[0] != 215 || raw[1] != uint16(b) || raw[2] != uint16(b>>16) {
		t.Errorf("raw registers 15..17: %v %v, want 215 (21.5 at scale 0.1) and 40.25 as float32 CDAB", raw, err)
	}
	if got, err := regs(c.do(1, readPDU(4, 11, 2))); err != nil || got[1] != 4025 {
		t.Errorf("FC4 11..12: %v %v", got, err)
	}
	for _, r := range []struct {
		pdu  []byte
		code byte
	}{
		{readPDU(3, 9, 2), 0x02},       // before the map
		{readPDU(3, 103, 4), 0x02},     // past the quality registers' end
		{readPDU(3, 12, 2), 0x04},      // dev-2/t timed out
		{readPDU(3, 14, 1), 0x04},      // dev-3/t has no sample
		{readPDU(3, 10, 126), 0x03},    // too many
		{readPDU(1, 10, 1), 0x01},      // coils
		{[]byte{6, 0, 10, 0, 1}, 0x01}, // a write to the mirror
		{[]byte{3, 0, 10}, 0x03},       // short
	} {
		if _, err := regs(c.do(1, r.pdu)); !isException(err, r.code) {
			t.Errorf("% x: %v, want exception %#x", r.pdu, err, r.code)
		}
	}
	if q, err := regs(c.do(1, readPDU(3, 100, 6))); err != nil || q[0] != 0 || q[1] != 0 || q[2] != mbserver.QualityTimeout || q[3] != mbserver.QualityNone || q[4] != 0 || q[5] != 0 {
		t.Errorf("quality registers: %v %v", q, err)
	}
	if _, err := regs(c.do(2, readPDU(3, 10, 1))); !isException(err, 0x0A) {
		t.Errorf("unit 2 (nothing): %v, want 0x0a", err)
	}
	l := dial(t, lenient)
	got, err = regs(l.do(1, readPDU(3, 0, 4)))
	if err != nil || got[0] != 4025 || got[1] != 0xFFFF || !math.IsNaN(float64(math.Float32frombits(uint32(got[2])<<16|uint32(got[3])))) {
		t.Errorf("on_bad value: %v %v, want 4025, -1 and NaN", got, err)
	}
	if n := st.WritesRefused.Load(); n != 1 {
		t.Errorf("writes refused: %d", n)
	}
}

// Access: a client outside allowed_networks and one past max_connections
// are closed at accept and counted; a malformed MBAP header closes the
// connection; an idle connection is closed after idle_timeout.
func TestServerAccess(t *testing.T) {
	ring := mirrorRing(t)
	mirror := &mbserver.Mirror{Unit: 1, QualityAddress: -1, Slots: []mbserver.Slot{{Address: 0, Device: "dev-1", Tag: "h", Format: mbserver.FormatInt16}}}
	st := new(stats.ModbusServer)
	_, addr := runServer(t, mbserver.Config{Ring: ring, Stats: st, Mirror: mirror, MaxConns: 2, IdleTimeout: 300 * time.Millisecond,
		AllowedNetworks: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/24")}})
	closed := func(c net.Conn, what string) {
		t.Helper()
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		_, err := c.Read(make([]byte, 1))
		if ne, ok := err.(net.Error); err == nil || ok && ne.Timeout() {
			t.Errorf("%s: read %v, want EOF or a reset (closed by the server)", what, err)
		}
	}
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 5, 1)}}
	out, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	closed(out, "a client outside allowed_networks")

	a, b := dial(t, addr), dial(t, addr)
	for _, c := range []*client{a, b} {
		if _, err := regs(c.do(1, readPDU(3, 0, 1))); err != nil {
			t.Fatal(err)
		}
	}
	third := dial(t, addr)
	closed(third.c, "a third connection (max_connections 2)")
	testenv.WaitFor(t, 5*time.Second, "two refusals counted", func() bool { return st.ConnsRefused.Load() == 2 })

	hdr := binary.BigEndian.AppendUint16([]byte{0, 1}, 1) // protocol 1
	hdr = append(hdr, 0, 6, 1)
	if _, err := a.c.Write(append(hdr, 3, 0, 0, 0, 1)); err != nil {
		t.Fatal(err)
	}
	closed(a.c, "a frame with protocol id 1")
	closed(b.c, "an idle connection")
	testenv.WaitFor(t, 5*time.Second, "no connection open", func() bool { return st.Connections.Load() == 0 })
}
