package modbus

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

// Read Device Identification replies (Modbus Application Protocol V1.1b3,
// 6.21) as byte literals: the data after function code 0x2B.
var deviceIDCases = []struct {
	name string
	data string // hex
	more bool
	next byte
	objs map[byte]string
	err  string
}{
	{"basic, one reply", "0E 01 01 00 00 03 00 04 41636D65 01 02 4131 02 03 312E30", false, 0,
		map[byte]string{0: "Acme", 1: "A1", 2: "1.0"}, ""},
	{"more follows from object 2", "0E 01 81 FF 02 02 00 04 41636D65 01 02 4131", true, 2,
		map[byte]string{0: "Acme", 1: "A1"}, ""},
	{"no objects", "0E 01 01 00 00 00", false, 0, map[byte]string{}, ""},
	{"object cut short", "0E 01 01 00 00 01 00 05 41636D", false, 0, nil, "cut short"},
	{"bytes after the objects", "0E 01 01 00 00 01 00 01 41 FF", false, 0, nil, "after the objects"},
	{"other MEI type", "0D 01 01 00 00 00", false, 0, nil, "device identification reply"},
	{"too short", "0E 01", false, 0, nil, "device identification reply"},
}

func TestParseDeviceID(t *testing.T) {
	for _, c := range deviceIDCases {
		id := DeviceID{Objects: map[byte]string{}}
		more, next, err := parseDeviceID(hx(c.data), &id)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%s: %v, want an error with %q", c.name, err, c.err)
			}
			continue
		}
		if err != nil || more != c.more || next != c.next || len(id.Objects) != len(c.objs) {
			t.Errorf("%s: more %v next %d objects %v err %v", c.name, more, next, id.Objects, err)
			continue
		}
		for k, v := range c.objs {
			if id.Objects[k] != v {
				t.Errorf("%s: object %d = %q, want %q", c.name, k, id.Objects[k], v)
			}
		}
	}
}

// The RTU framer frames function 17 by its byte count and 43/14 by its
// objects, and the CRC after them.
func TestRTUFrameIdentification(t *testing.T) {
	for _, c := range []struct{ name, pdu string }{
		{"report server id", "11 05 41636D65 FF"},
		{"device identification", "2B " + deviceIDCases[0].data},
		{"identification, no objects", "2B 0E 01 01 00 00 00"},
	} {
		f := rtuFrame(7, hx(c.pdu))
		line := append(append([]byte(nil), f...), 0xAA) // a byte after the frame stays on the line
		var buf [rtuMaxFrame]byte
		got, err := readRTUFrame(sliceReader(line), time.Now().Add(-time.Second), time.Millisecond, buf[:])
		if err != nil || !bytes.Equal(got, f) {
			t.Errorf("%s: % x %v, want % x", c.name, got, err, f)
		}
	}
	bad := rtuFrame(7, hx("2B 0D 01 01 00 00 00"))
	var buf [rtuMaxFrame]byte
	if _, err := readRTUFrame(sliceReader(bad), time.Now().Add(-time.Second), time.Millisecond, buf[:]); err == nil {
		t.Error("mei type 0x0D framed")
	}
}

func FuzzParseDeviceID(f *testing.F) {
	for _, c := range deviceIDCases {
		f.Add(hx(c.data))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		id := DeviceID{Objects: map[byte]string{}}
		if _, _, err := parseDeviceID(b, &id); err == nil && (len(b) < 6 || b[0] != MEIDeviceID) {
			t.Fatalf("accepted % x", b)
		}
	})
}
