package modbus

import (
	"bytes"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	gb "github.com/goburrow/modbus"

	"edgegw/internal/testenv"
)

// asciiCases are ASCII frames as characters on the line: the Modbus over
// Serial Line example (read holding 0x006B, 3 registers: request LRC 0x8E,
// reply 022B 0000 0064 with LRC 0x65), an exception, lower-case hex, and
// broken frames. frame is what readASCIIFrame returns ("" for an error),
// bytes what decodeASCII makes of it.
var asciiCases = []struct {
	name, line, frame string
	bytes             string // hex; "" when decodeASCII refuses
	err               string // part of the error
}{
	{"spec request", ":0103006B00038E\r\n", ":0103006B00038E\r\n", "0103006B00038E", ""},
	{"spec reply", ":010306022B0000006465\r\n", ":010306022B0000006465\r\n", "010306022B0000006465", ""},
	{"exception", ":0183027A\r\n", ":0183027A\r\n", "0183027A", ""},
	{"lower-case hex", ":010306022b0000006465\r\n", ":010306022b0000006465\r\n", "010306022B0000006465", ""},
	{"noise before the start", "\x00\xff:0183027A\r\n", ":0183027A\r\n", "0183027A", ""},
	{"a second ':' restarts", ":0103:0183027A\r\n", ":0183027A\r\n", "0183027A", ""},
	{"bytes after CRLF stay", ":0183027A\r\n:01", ":0183027A\r\n", "0183027A", ""},
	{"bad lrc", ":0183027B\r\n", ":0183027B\r\n", "", "lrc 0x7b, want 0x7a"},
	{"not hex", ":01830G7A\r\n", ":01830G7A\r\n", "", "not hex"},
	{"odd", ":0183027\r\n", ":0183027\r\n", "", "odd"},
	{"too short", ":017E\r\n", ":017E\r\n", "", "want ':'"},
	{"LF without CR goes on", ":0183027A\n\r\n", ":0183027A\n\r\n", "", "odd"},
	{"cut: no CRLF", ":0183027A", "", "", "timeout"},
	{"nothing", "", "", "", "timeout"},
}

func TestASCIIFrameTable(t *testing.T) {
	for _, c := range asciiCases {
		var buf [asciiMaxFrame]byte
		f, err := readASCIIFrame(sliceReader([]byte(c.line)), time.Now().Add(-time.Second), time.Millisecond, buf[:])
		if c.frame == "" {
			if err == nil || !errors.Is(err, ErrTimeout) {
				t.Errorf("%s: frame %q err %v, want a timeout", c.name, f, err)
			}
			continue
		}
		if err != nil || string(f) != c.frame {
			t.Errorf("%s: frame %q err %v, want %q", c.name, f, err, c.frame)
			continue
		}
		b, err := decodeASCII(nil, f)
		switch {
		case c.bytes == "" && (err == nil || !strings.Contains(err.Error(), c.err)):
			t.Errorf("%s: decoded % x err %v, want an error with %q", c.name, b, err, c.err)
		case c.bytes != "" && (err != nil || !bytes.Equal(b, hx(c.bytes))):
			t.Errorf("%s: decoded % x err %v, want %s", c.name, b, err, c.bytes)
		}
		var fe *FrameError
		if c.bytes == "" && !errors.As(err, &fe) {
			t.Errorf("%s: %v is not a FrameError", c.name, err)
		}
	}
	// A frame longer than 513 characters is refused before it ends.
	long := ":" + strings.Repeat("00", 300) + "\r\n"
	var buf [asciiMaxFrame]byte
	if _, err := readASCIIFrame(sliceReader([]byte(long)), time.Now().Add(-time.Second), time.Millisecond, buf[:]); err == nil || !strings.Contains(err.Error(), "longer") {
		t.Errorf("long frame: %v", err)
	}
}

// goburrow's ASCII packager encodes what the table says the line carries,
// and the checks (unit, LRC, PDU) accept the spec reply to it.
func TestASCIIPackagerMatchesTable(t *testing.T) {
	pk := gb.NewASCIIClientHandler("")
	pk.SlaveId = 1
	req, err := pk.Encode(&gb.ProtocolDataUnit{FunctionCode: 3, Data: hx("006B 0003")})
	if err != nil || string(req) != asciiCases[0].line {
		t.Fatalf("encode: %q %v, want %q", req, err, asciiCases[0].line)
	}
	resp := []byte(asciiCases[1].frame)
	if err := checkASCII(req, resp); err != nil {
		t.Fatal(err)
	}
	p := &pduPackager{Packager: pk, framing: asciiFraming, cnt: &counters{}}
	if err := p.Verify(req, resp); err != nil {
		t.Fatal(err)
	}
	pdu, err := p.Decode(resp)
	if err != nil || pdu.FunctionCode != 3 || !bytes.Equal(pdu.Data, hx("06 022B 0000 0064")) {
		t.Fatalf("decode: %+v %v", pdu, err)
	}
	// A reply of another unit, or a byte count that does not match the
	// quantity, is a frame error counted dropped.
	if err := checkASCII(req, []byte(":02830279\r\n")); err == nil || !strings.Contains(err.Error(), "unit 2") {
		t.Errorf("other unit: %v", err)
	}
	short := ":01030400010002F5\r\n" // 2 registers for a request of 3
	if err := p.Verify(req, []byte(short)); err == nil || p.cnt.dropped.Load() != 1 {
		t.Errorf("short reply: %v dropped %d", err, p.cnt.dropped.Load())
	}
}

func FuzzASCIIFrame(f *testing.F) {
	for _, c := range asciiCases {
		f.Add([]byte(c.line))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var buf [asciiMaxFrame]byte
		fr, err := readASCIIFrame(sliceReader(data), time.Now().Add(-time.Second), time.Millisecond, buf[:])
		if err != nil {
			return
		}
		if !bytes.Contains(data, fr) || fr[0] != ':' || !bytes.HasSuffix(fr, []byte("\r\n")) || len(fr) > asciiMaxFrame {
			t.Fatalf("frame %q from %q", fr, data)
		}
		b, err := decodeASCII(nil, fr)
		if err != nil {
			return
		}
		if lrc(b[:len(b)-1]) != b[len(b)-1] || len(b) < 3 {
			t.Fatalf("accepted %q: % x", fr, b)
		}
		pk := gb.NewASCIIClientHandler("")
		pk.SlaveId = b[0]
		req, _ := pk.Encode(&gb.ProtocolDataUnit{FunctionCode: b[1] & 0x7F, Data: []byte{0, 0, 0, 1}})
		_ = checkASCII(req, fr)
		_ = (&pduPackager{Packager: pk, framing: asciiFraming, cnt: &counters{}}).Verify(req, fr)
	})
}

// ASCII against an independent implementation: pymodbus's ASCII framer on
// a pty (serial) and over TCP. 100 polls on an unhurried loop (a second
// of timeout for a reply that takes milliseconds), every one good: a
// protocol that is right answers every time; plus an exception and the
// identification functions.
func TestInteropPymodbusASCII(t *testing.T) {
	a, b := testenv.PTYPair(t)
	testenv.PymodbusSerial(t, testenv.SerialSlave{Framer: "ascii", TTY: b, Baud: 19200, Units: []uint8{5},
		Vendor: "Acme", Product: "AS-1", Revision: "2.1"})
	p, err := OpenASCII(SerialConfig{Path: a, Baud: 19200, Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	tcpPort := testenv.FreePort(t)
	testenv.PymodbusSerial(t, testenv.SerialSlave{Framer: "ascii", TCP: tcpPort, Units: []uint8{5}})
	pt := NewASCIIOverTCP(TCPConfig{Address: "127.0.0.1:" + strconv.Itoa(tcpPort), Timeout: time.Second})
	defer pt.Close()

	for name, c := range map[string]*RTUConn{"ascii": p.Unit(5, 0), "ascii-tcp": pt.Unit(5, 0)} {
		good := 0
		for i := 0; i < 100; i++ {
			addr := uint16(i % 90)
			b, err := c.ReadHoldingRegisters(addr, 10)
			if err == nil && u16s(b)[0] == 1000+addr && u16s(b)[9] == 1009+addr {
				good++
			} else {
				t.Logf("%s poll %d: %v %v", name, i, u16s(b), err)
			}
		}
		if good != 100 {
			t.Errorf("%s: %d of 100 polls good", name, good)
		}
		if b, err := c.ReadCoils(0, 10); err != nil || b[0] != 0b01001001 || b[1] != 0b10 {
			t.Errorf("%s coils: %08b %v", name, b, err)
		}
		if err := c.WriteSingleRegister(20, 4242); err != nil {
			t.Errorf("%s write: %v", name, err)
		}
		if b, err := c.ReadInputRegisters(20, 1); err != nil || u16s(b)[0] != 2020 {
			t.Errorf("%s input: %v %v", name, u16s(b), err)
		}
		if _, err := c.ReadHoldingRegisters(99, 5); err == nil {
			t.Errorf("%s: read beyond the data block succeeded", name)
		} else if _, ok := IsException(err); !ok {
			t.Errorf("%s: beyond the block: %v, want an exception", name, err)
		}
		if n := c.Counters(); n.Dropped != 0 {
			t.Errorf("%s: counters %+v", name, n)
		}
	}
	// No answer from a unit that is not there: a timeout, the line stays good.
	start := time.Now()
	if _, err := p.Unit(6, 50*time.Millisecond).ReadHoldingRegisters(0, 1); !errors.Is(err, ErrTimeout) {
		t.Errorf("unit 6: %v, want a timeout", err)
	}
	if time.Since(start) < 50*time.Millisecond {
		t.Errorf("timeout after %v", time.Since(start))
	}
	id, err := p.Unit(5, 0).ReadDeviceIdentification()
	if err != nil || id.Objects[ObjVendorName] != "Acme" || id.Objects[ObjProductCode] != "AS-1" || id.Objects[ObjMajorMinorRevision] != "2.1" {
		t.Errorf("device identification: %+v %v", id, err)
	}
	if sid, err := p.Unit(5, 0).ReportServerID(); err != nil || !bytes.Contains(sid, []byte("Acme")) {
		t.Errorf("server id: %q %v", sid, err)
	}
}
