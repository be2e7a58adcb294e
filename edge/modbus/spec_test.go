package modbus

import (
	"bytes"
	"encoding/hex"
	"errors"
	"strings"
	"testing"

	gb "github.com/goburrow/modbus"
)

func hx(s string) []byte {
	b, err := hex.DecodeString(strings.ReplaceAll(s, " ", ""))
	if err != nil {
		panic(err)
	}
	return b
}

// specCases are the request/response examples of the Modbus Application
// Protocol Specification V1.1b3 (sections 6.1–6.12, 7), shared by every
// transport: the responder checks that the request PDU is the spec's byte
// for byte, answers the spec's response PDU, and the test checks the
// decoded result.
var specCases = []struct {
	name      string
	call      func(p poller) ([]byte, error)
	req, resp []byte
	want      []byte // decoded result (reads)
	exception byte
}{
	{"6.1 read coils 20-38", func(p poller) ([]byte, error) { return p.ReadCoils(19, 19) },
		hx("01 0013 0013"), hx("01 03 CD6B05"), hx("CD6B05"), 0},
	{"6.2 read discrete inputs 197-218", func(p poller) ([]byte, error) { return p.ReadDiscreteInputs(196, 22) },
		hx("02 00C4 0016"), hx("02 03 ACDB35"), hx("ACDB35"), 0},
	{"6.3 read holding 108-110", func(p poller) ([]byte, error) { return p.ReadHoldingRegisters(107, 3) },
		hx("03 006B 0003"), hx("03 06 022B 0000 0064"), hx("022B 0000 0064"), 0},
	{"6.4 read input 9", func(p poller) ([]byte, error) { return p.ReadInputRegisters(8, 1) },
		hx("04 0008 0001"), hx("04 02 000A"), hx("000A"), 0},
	{"6.5 write coil 173 on", func(p poller) ([]byte, error) { return nil, p.WriteSingleCoil(172, true) },
		hx("05 00AC FF00"), hx("05 00AC FF00"), nil, 0},
	{"6.6 write register 2", func(p poller) ([]byte, error) { return nil, p.WriteSingleRegister(1, 3) },
		hx("06 0001 0003"), hx("06 0001 0003"), nil, 0},
	{"6.12 write registers 2-3", func(p poller) ([]byte, error) { return nil, p.WriteMultipleRegisters(1, hx("000A 0102")) },
		hx("10 0001 0002 04 000A 0102"), hx("10 0001 0002"), nil, 0},
	{"7 exception illegal address", func(p poller) ([]byte, error) { return p.ReadCoils(1185, 1) },
		hx("01 04A1 0001"), hx("81 02"), nil, 2},
}

// specReply answers a request PDU from the table (exception 4 if unknown).
func specReply(t testing.TB, req []byte) []byte {
	for _, c := range specCases {
		if bytes.Equal(c.req, req) {
			return c.resp
		}
	}
	t.Errorf("request pdu % x is in no spec case", req)
	return exc(req[0], 4)
}

func runSpecCases(t *testing.T, p poller) {
	t.Helper()
	for _, c := range specCases {
		got, err := c.call(p)
		if c.exception != 0 {
			if code, ok := IsException(err); !ok || code != c.exception {
				t.Errorf("%s: err %v, want exception %d", c.name, err, c.exception)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		if !bytes.Equal(got, c.want) {
			t.Errorf("%s: got % x, want % x", c.name, got, c.want)
		}
	}
}

// TestSpecEncodeGoburrow checks the request bytes goburrow's packagers
// produce for each case (MBAP header and RTU CRC around the spec PDU).
func TestSpecEncodeGoburrow(t *testing.T) {
	for _, c := range specCases {
		pdu := &gb.ProtocolDataUnit{FunctionCode: c.req[0], Data: c.req[1:]}
		tp := gb.NewTCPClientHandler("")
		tp.SlaveId = 0x11
		adu, err := tp.Encode(pdu)
		if err != nil {
			t.Fatal(err)
		}
		if want := append(hx("0001 0000"), byte(0), byte(len(c.req)+1), 0x11); !bytes.Equal(adu[:7], want) || !bytes.Equal(adu[7:], c.req) {
			t.Errorf("%s: mbap % x", c.name, adu)
		}
		rp := gb.NewRTUClientHandler("")
		rp.SlaveId = 0x11
		radu, err := rp.Encode(pdu)
		if err != nil {
			t.Fatal(err)
		}
		if want := rtuFrame(0x11, c.req); !bytes.Equal(radu, want) {
			t.Errorf("%s: rtu % x, want % x", c.name, radu, want)
		}
	}
}

// TestCRC uses the worked examples of Modbus over Serial Line V1.02 (6.2.2:
// "02 07" → 0x1241) and the classic read-holding request of unit 0x11.
func TestCRC(t *testing.T) {
	for _, c := range []struct {
		frame []byte
		want  uint16
	}{
		{hx("02 07"), 0x1241},
		{hx("11 03 006B 0003"), 0x8776},
	} {
		if got := crc16(c.frame); got != c.want {
			t.Errorf("crc16(% x) = %#04x, want %#04x", c.frame, got, c.want)
		}
	}
}

func TestCheckPDU(t *testing.T) {
	for _, c := range []struct {
		req, resp string
		ok        bool
	}{
		{"03 0000 0002", "03 04 0001 0002", true},
		{"03 0000 0002", "03 02 0001", false},           // short payload
		{"03 0000 0002", "03 06 0001 0002 0003", false}, // long payload
		{"03 0000 0002", "03 04 0001 00", false},        // count vs data
		{"03 0000 0002", "04 04 0001 0002", false},      // other function
		{"03 0000 0002", "83 02", true},                 // exception
		{"03 0000 0002", "84 02", false},                // exception of another function
		{"03 0000 0002", "83 02 00", false},
		{"01 0000 0009", "01 02 FF01", true},
		{"01 0000 0009", "01 01 FF", false},
		{"06 0001 0003", "06 0001 0003", true},
		{"06 0001 0003", "06 0001 0004", false}, // echo
		{"10 0001 0002 04 000A 0102", "10 0001 0002", true},
		{"10 0001 0002 04 000A 0102", "10 0001 0001", false},
		{"05 00AC FF00", "05 00AC", false},
	} {
		err := checkPDU(hx(c.req), hx(c.resp))
		var fe *FrameError
		if c.ok != (err == nil) || (err != nil && !errors.As(err, &fe)) {
			t.Errorf("checkPDU(%s, %s) = %v, want ok=%v", c.req, c.resp, err, c.ok)
		}
	}
}
