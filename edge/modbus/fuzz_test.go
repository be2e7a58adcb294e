package modbus

import (
	"bytes"
	"encoding/binary"
	"net/netip"
	"testing"
	"time"

	gb "github.com/goburrow/modbus"
)

// sliceReader feeds a byte slice to the RTU framer; when it runs dry the
// (past) deadline makes the framer give up.
func sliceReader(data []byte) readFunc {
	return func(b []byte, _ time.Time) (int, error) {
		n := copy(b, data)
		data = data[n:]
		return n, nil
	}
}

func FuzzRTUFrame(f *testing.F) {
	f.Add(rtuFrame(1, hx("03 04 0001 0002")))
	f.Add(rtuFrame(1, hx("83 02")))
	f.Add(rtuFrame(1, hx("06 0001 0003")))
	f.Add(rtuFrame(1, hx("01 FF")))
	f.Add(hx("01 03 04 00"))
	f.Fuzz(func(t *testing.T, data []byte) {
		var buf [rtuMaxFrame]byte
		fr, err := readRTUFrame(sliceReader(data), time.Now().Add(-time.Second), time.Millisecond, buf[:])
		if err != nil {
			return
		}
		if !bytes.HasPrefix(data, fr) {
			t.Fatalf("frame % x is not the start of the input", fr)
		}
		n := len(fr)
		want := 8
		switch fc := fr[1]; {
		case fc&0x80 != 0:
			want = 5
		case fc >= 1 && fc <= 4, fc == FuncReportServerID:
			want = 5 + int(fr[2])
		case fc == FuncEncapsulated: // framed by its objects
			want = n
		}
		if n != want || crc16(fr[:n-2]) != uint16(fr[n-2])|uint16(fr[n-1])<<8 {
			t.Fatalf("accepted frame % x: length %d want %d or bad crc", fr, n, want)
		}
		// checkSerialReply and the packager's checks against a matching request
		// never panic
		req := rtuFrame(fr[0], []byte{fr[1] & 0x7F, 0, 0, 0, 1})
		_ = checkSerialReply(req, fr)
		_ = (&pduPackager{Packager: gb.NewRTUClientHandler(""), framing: rtuFraming, cnt: &counters{}}).Verify(req, fr)
	})
}

// FuzzUDPDemux feeds arbitrary datagrams from a known and an unknown source
// to the matcher: it never panics and never hands a datagram to a request
// whose (source, tid, unit, function) it does not match.
func FuzzUDPDemux(f *testing.F) {
	f.Add(false, mbap(hx("000A 0000 0006 01 03 0000 0001"), hx("03 02 0007")))
	f.Add(false, mbap(hx("000B 0000 0006 02 03 0000 0001"), hx("83 02")))
	f.Add(false, mbap(hx("0009 0000 0006 01 03 0000 0001"), hx("03 02 0007")))
	f.Add(true, mbap(hx("000A 0000 0006 01 03 0000 0001"), hx("03 02 0007")))
	f.Add(false, hx("000A 0000"))
	f.Fuzz(func(t *testing.T, stranger bool, dg []byte) {
		known := netip.MustParseAddrPort("127.0.1.7:502")
		src := known
		if stranger {
			src = netip.MustParseAddrPort("127.0.1.8:502")
		}
		s := newTestSocket()
		d := &udpDest{addr: known, refs: 2}
		s.dests[known] = d
		mk := func(unit, fc byte, tid uint16) *udpTransport {
			tr := &udpTransport{s: s, dst: known, dest: d, cnt: &counters{}, w: newWaiter()}
			tr.buf = append(tr.buf, fc, 0, 0, 0, 1)
			tr.pend = udpPending{tr: tr, dest: d, unit: unit, fc: fc, req: tr.buf, resp: tr.resp[:], w: tr.w}
			s.mu.Lock()
			if err := s.register(&tr.pend); err != nil {
				t.Fatal(err)
			}
			d.remove(&tr.pend) // the fixed tid instead of the random one
			tr.pend.tid = tid
			d.pend = append(d.pend, &tr.pend)
			s.mu.Unlock()
			return tr
		}
		a, b := mk(1, 3, 10), mk(2, 4, 11)
		d.remember(a, 9, false) // expired
		d.remember(b, 8, true)  // answered
		s.dispatch(src, dg)
		for tid, tr := range map[uint16]*udpTransport{10: a, 11: b} {
			select {
			case <-tr.w.ch:
				got := tr.pend.resp[:tr.pend.n]
				if stranger || tr.pend.state != pendAnswered || len(got) < 8 || binary.BigEndian.Uint16(got) != tid || got[6] != tr.pend.unit ||
					(got[7] != tr.pend.fc && got[7] != tr.pend.fc|0x80) || !bytes.Equal(got, dg) || checkPDU(tr.pend.req, got[7:]) != nil {
					t.Fatalf("datagram % x from %v delivered to tid %d unit %d fc %d", dg, src, tid, tr.pend.unit, tr.pend.fc)
				}
				if d.pending(tid) != nil {
					t.Fatal("delivered entry still pending")
				}
			default:
			}
		}
		total := s.cnt.snapshot()
		if total.Late+total.Duplicates+total.Dropped > 1 {
			t.Fatalf("one datagram counted %+v", total)
		}
	})
}

func BenchmarkMBAPEncodeDecode(b *testing.B) {
	p := gb.NewTCPClientHandler("")
	p.SlaveId = 1
	pdu := &gb.ProtocolDataUnit{FunctionCode: 3, Data: hx("006B 0003")}
	resp := mbap(hx("0001 0000 0006 01 03 006B 0003"), hx("03 06 022B 0000 0064"))
	b.ReportAllocs()
	for b.Loop() {
		req, _ := p.Encode(pdu)
		binary.BigEndian.PutUint16(resp, binary.BigEndian.Uint16(req))
		if err := checkMBAP(req, resp); err != nil {
			b.Fatal(err)
		}
		if err := checkPDU(req[mbapHeader:], resp[mbapHeader:]); err != nil {
			b.Fatal(err)
		}
		if _, err := p.Decode(resp); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkUDPMatch(b *testing.B) {
	known := netip.MustParseAddrPort("127.0.1.7:502")
	s := newTestSocket()
	d := &udpDest{addr: known, refs: 1}
	s.dests[known] = d
	tr := &udpTransport{s: s, dst: known, dest: d, cnt: &counters{}, w: newWaiter()}
	tr.buf = append(tr.buf, 3, 0, 0, 0, 2)
	tr.pend = udpPending{tr: tr, dest: d, unit: 1, fc: 3, req: tr.buf, resp: tr.resp[:], w: tr.w}
	dg := mbap(hx("0000 0000 0006 01 03 0000 0002"), hx("03 04 0001 0002"))
	b.ReportAllocs()
	stuck := time.NewTimer(stopLimit) // the whole loop's deadline: no timer per dispatch
	defer stuck.Stop()
	for b.Loop() {
		s.mu.Lock()
		if err := s.register(&tr.pend); err != nil {
			b.Fatal(err)
		}
		s.mu.Unlock()
		binary.BigEndian.PutUint16(dg, tr.pend.tid)
		s.dispatch(known, dg)
		select {
		case <-tr.w.ch:
		case <-stuck.C:
			b.Fatalf("dispatch did not wake the waiter within %v", stopLimit)
		}
	}
}

func BenchmarkRTUCRC256(b *testing.B) {
	frame := make([]byte, 256)
	for i := range frame {
		frame[i] = byte(i * 31)
	}
	b.SetBytes(int64(len(frame)))
	b.ReportAllocs()
	var sink uint16
	for b.Loop() {
		sink ^= crc16(frame)
	}
	_ = sink
}
