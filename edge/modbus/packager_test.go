package modbus

import (
	"errors"
	"net"
	"testing"
	"time"

	gb "github.com/goburrow/modbus"
)

// TestPDUChecksInPackager: goburrow's Packager × Transporter split. The TCP
// transporter hands on a well-framed reply whose PDU does not fit its
// request (the byte count of one register when two were asked); the
// packager's Verify refuses it with a *FrameError counted as dropped, and
// the device's Read and the allocation-free Do give the same refusal.
func TestPDUChecksInPackager(t *testing.T) {
	srv := startTCPServer(t, serveMBAP(func(_ net.Conn, req []byte) []byte {
		return mbap(req, []byte{3, 2, 0, 1}) // one register, whatever was asked
	}))
	c := newTestTCP(srv.addr, time.Second)
	defer c.Close()
	pk := gb.NewTCPClientHandler("")
	pk.SlaveId = 1
	req, err := pk.Encode(&gb.ProtocolDataUnit{FunctionCode: 3, Data: []byte{0, 0, 0, 2}})
	if err != nil {
		t.Fatal(err)
	}
	resp, err := c.t.Send(req)
	if err != nil {
		t.Fatalf("transporter: %v, want the frame (its PDU is the packager's to check)", err)
	}
	v := &pduPackager{Packager: pk, framing: mbapFraming, cnt: &counters{}}
	var fe *FrameError
	if err := v.Verify(req, resp); !errors.As(err, &fe) || v.cnt.dropped.Load() != 1 {
		t.Fatalf("packager: %v, dropped %d; want a *FrameError, counted", err, v.cnt.dropped.Load())
	}
	c.t.fail(fe) // as the device would: the stream goes

	if err := pollUntil(t, 2*time.Second, func() error { _, err := c.ReadHoldingRegisters(0, 2); return err }); !errors.As(err, &fe) {
		t.Errorf("ReadHoldingRegisters: %v, want *FrameError", err)
	}
	r := &Request{Func: 3, Addr: 0, Qty: 2}
	if err := pollUntil(t, 2*time.Second, func() error { c.Do(r); return r.Err }); !errors.As(err, &fe) {
		t.Errorf("Do: %v, want *FrameError", err)
	}
	if cn := c.Counters(); cn.Dropped != 2 {
		t.Errorf("dropped %d, want 2 (Read and Do)", cn.Dropped)
	}
}

// TestPDUChecksRTUFraming: the packager finds the PDU of an RTU frame
// between the unit id and the CRC.
func TestPDUChecksRTUFraming(t *testing.T) {
	v := &pduPackager{Packager: gb.NewRTUClientHandler(""), framing: rtuFraming, cnt: &counters{}}
	req := rtuFrame(1, []byte{3, 0, 0, 0, 2})
	if err := v.Verify(req, rtuFrame(1, []byte{3, 4, 0, 1, 0, 2})); err != nil {
		t.Errorf("good reply: %v", err)
	}
	if err := v.Verify(req, rtuFrame(1, []byte{0x83, 2})); err != nil {
		t.Errorf("exception: %v", err)
	}
	var fe *FrameError
	if err := v.Verify(req, rtuFrame(1, []byte{3, 2, 0, 1})); !errors.As(err, &fe) {
		t.Errorf("one register for two: %v, want *FrameError", err)
	}
	if err := v.Verify(req, rtuFrame(1, []byte{6, 0, 0, 0, 2})); !errors.As(err, &fe) {
		t.Errorf("another function: %v, want *FrameError", err)
	}
	if n := v.cnt.dropped.Load(); n != 2 {
		t.Errorf("dropped %d, want 2", n)
	}
}

// TestRequestEncodeIsPackagers: the allocation-free paths' hand-encoded
// MBAP request is byte for byte what goburrow's TCP packager encodes for
// the same read (its first transaction id is 1).
func TestRequestEncodeIsPackagers(t *testing.T) {
	for _, fc := range []byte{1, 2, 3, 4} {
		for _, c := range []struct {
			unit      byte
			addr, qty uint16
		}{{1, 0, 1}, {247, 0x1234, 125}, {0, 0xffff, 1}, {17, 40000, 2000}} {
			pk := gb.NewTCPClientHandler("")
			pk.SlaveId = c.unit
			want, err := pk.Encode(&gb.ProtocolDataUnit{FunctionCode: fc, Data: []byte{byte(c.addr >> 8), byte(c.addr), byte(c.qty >> 8), byte(c.qty)}})
			if err != nil {
				t.Fatal(err)
			}
			r := &Request{Func: fc, Addr: c.addr, Qty: c.qty}
			if got := r.encode(1, c.unit); string(got) != string(want) {
				t.Errorf("fc %d unit %d addr %d qty %d: encode % x, packager % x", fc, c.unit, c.addr, c.qty, got, want)
			}
		}
	}
}
