package edge

import (
	"encoding/json"
	"math"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"edgegw/edge/modbus"
	"edgegw/internal/testenv"
	"edgegw/ringstore"
)

// The gateway polls an independent Modbus slave (pymodbus) over TCP, UDP
// and RTU and gets the right decoded values.
func TestGatewayPollsPymodbus(t *testing.T) {
	ptyA, ptyB := testenv.PTYPair(t)
	tcpPort, udpPort := testenv.Pymodbus(t, ptyB) // holding a = 1000+a, input a = 2000+a, coil a%3==0, discrete a%2==1
	tags := []Tag{
		{Name: "h10", Register: Holding, Address: 10, Type: Uint16},
		{Name: "h10_u32", Register: Holding, Address: 10, Type: Uint32},
		{Name: "h12_cdab", Register: Holding, Address: 12, Type: Uint32, Order: CDAB},
		{Name: "i5", Register: Input, Address: 5, Type: Int16, Scale: 0.1, Offset: -100},
		{Name: "c3", Register: Coil, Address: 3, Type: Bool},
		{Name: "c4", Register: Coil, Address: 4, Type: Bool},
		{Name: "d5", Register: Discrete, Address: 5, Type: Bool},
	}
	want := map[string]float64{
		"h10": 1010, "h10_u32": 1010<<16 | 1011, "h12_cdab": 1013<<16 | 1012,
		"i5": 2005*0.1 - 100, "c3": 1, "c4": 0, "d5": 1,
	}
	rtu := devCfg("rtu", TransportRTU, ptyA, 200*time.Millisecond, 150*time.Millisecond, tags)
	rtu.Serial = modbus.SerialConfig{Baud: 19200}
	devs := []DeviceConfig{
		devCfg("tcp", TransportTCP, "127.0.0.1:"+strconv.Itoa(tcpPort), 200*time.Millisecond, 150*time.Millisecond, tags),
		devCfg("udp", TransportUDP, "127.0.0.1:"+strconv.Itoa(udpPort), 200*time.Millisecond, 150*time.Millisecond, tags),
		rtu,
	}
	ring := newRing(t, 1000)
	s, err := New(Config{Sink: ring, Devices: devs, UDPListen: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	runSched(t, s)
	waitFor(t, 10*time.Second, "a good poll of each device", func() bool {
		for _, d := range s.devices {
			if d.stats.GoodPolls.Load() == 0 {
				return false
			}
		}
		return true
	})
	for _, d := range devs {
		got := latest(ring, d.Name)
		for name, w := range want {
			if g := got[name]; g.Quality != ringstore.Good || g.Value != w {
				t.Errorf("%s %s: got %v (%v), want %v", d.Name, name, g.Value, g.Quality, w)
			}
		}
	}
}

// Strings, overlapping tags and the number encodings against pymodbus: one
// read for a status word, its bits, a uint32 and its halves, two strings, a
// float32 and a NaN, and the JSON each sample gives.
func TestStringsAndOverlapsAgainstPymodbus(t *testing.T) {
	text := func(s string, swap bool) []uint16 {
		var out []uint16
		for i := 0; i < len(s); i += 2 {
			hi, lo := s[i], s[i+1]
			if swap {
				hi, lo = lo, hi
			}
			out = append(out, uint16(hi)<<8|uint16(lo))
		}
		return out
	}
	f := math.Float32bits(123.456)
	regs := []uint16{0x0005, 0xB2D0, 0x5E00}                      // status; 3000000000
	regs = append(regs, text("SN-4711\x00  \x00\x00", false)...)  // 3..8
	regs = append(regs, text("Hi!!", true)...)                    // 9..10 BADC
	regs = append(regs, uint16(f>>16), uint16(f), 0x7FC0, 0x0000) // 11..12 float32, 13..14 NaN
	regs = append(regs, 0xFF41)                                   // 15: not UTF-8
	port := testenv.PymodbusRegisters(t, regs)
	tags := []Tag{
		{Name: "status", Address: 0, Type: Uint16},
		{Name: "alarm", Address: 0, Type: Bool, Bit: 0},
		{Name: "door", Address: 0, Type: Bool, Bit: 1},
		{Name: "pump", Address: 0, Type: Bool, Bit: 2},
		{Name: "energy", Address: 1, Type: Uint32},
		{Name: "energy_hi", Address: 1, Type: Uint16},
		{Name: "energy_lo", Address: 2, Type: Uint16},
		{Name: "serial", Address: 3, Type: String, Length: 6},
		{Name: "name", Address: 9, Type: String, Length: 2, Order: BADC},
		{Name: "temp", Address: 11, Type: Float32},
		{Name: "broken", Address: 13, Type: Float32},
		{Name: "garbled", Address: 15, Type: String, Length: 1},
		{Name: "counter", Register: Input, Address: 1, Type: Uint32, Order: ABCD},
	}
	want := map[string]string{
		"status": `5,"quality":"good"`, "alarm": `true,"quality":"good"`, "door": `false,"quality":"good"`,
		"pump": `true,"quality":"good"`, "energy": `3000000000,"quality":"good"`, "energy_hi": `45776,"quality":"good"`,
		"energy_lo": `24064,"quality":"good"`, "serial": `"SN-4711","quality":"good"`, "name": `"Hi!!","quality":"good"`,
		"temp": `123.456,"quality":"good"`, "broken": `null,"quality":"error"`, "garbled": "\"\uFFFDA\",\"quality\":\"good\"",
		"counter": `3000000000,"quality":"good"`,
	}
	ring := newRing(t, 1000)
	s, err := New(Config{Sink: ring, Devices: []DeviceConfig{
		devCfg("py", TransportTCP, "127.0.0.1:"+strconv.Itoa(port), 200*time.Millisecond, 150*time.Millisecond, tags)}})
	if err != nil {
		t.Fatal(err)
	}
	if plan := s.Plan()["py"]; len(plan) != 2 || plan[0].Quantity != 16 || len(plan[0].Tags) != 12 {
		t.Fatalf("plan %v: want one holding read of 16 registers for 12 tags and one input read", plan)
	}
	runSched(t, s)
	// A NaN register is the tag's error, not the device's: polls stay good.
	waitFor(t, 10*time.Second, "two good polls", func() bool { return s.devices[0].stats.GoodPolls.Load() >= 2 })
	if n := s.devices[0].stats.Errors.Load(); n != 0 {
		t.Errorf("device errors %d: a NaN register counted against the device", n)
	}
	got := latest(ring, "py")
	for name, w := range want {
		g, ok := got[name]
		if !ok {
			t.Errorf("%s: no sample", name)
			continue
		}
		j := string(g.AppendJSON(nil))
		if !strings.Contains(j, `"tag":"`+name+`","value":`+w+`,`) {
			t.Errorf("%s: %s, want value %s", name, j, w)
		}
	}
}

// newTypesExpect computes, in Python with its own struct module (an
// encoder and decoder independent of this package), the registers of the
// 8-bit, float16 and string-placement tags below and the value each must
// decode to: {"regs": [...], "want": {tag: value}}.
const newTypesExpect = `
import json, struct
regs, want = [], {}
def reg(b):
    regs.append(struct.unpack('>H', b)[0])
b = struct.pack('>bB', -2, 0x41); reg(b)                     # 0
want.update(i8h=struct.unpack('>b', b[:1])[0], u8l=b[1], u8h=b[0], i8l=struct.unpack('>b', b[1:])[0])
b = struct.pack('>Bb', 0x7f, -128); reg(b)                   # 1
want.update(u8h_1=b[0], i8l_1=struct.unpack('>b', b[1:])[0])
for i, v in enumerate([21.5, -0.0001, 65504.0, 1/3]):        # 2..5: halves, rounded by struct
    b = struct.pack('>e', v); reg(b); want['f16_%d' % i] = struct.unpack('>e', b)[0]
b = struct.pack('<e', 3.5); reg(b); want['f16_badc'] = struct.unpack('<e', b)[0]   # 6: bytes swapped
for c in 'SN4': reg(bytes([ord(c), 0x7f]))                   # 7..9: one character a register, high byte
for c in 'AB ': reg(bytes([0xee, ord(c)]))                   # 10..12: low byte, padded with a space
reg(b'Hi'); reg(b'!\x00')                                    # 13..14: two a register
want.update(upper='SN4', lower='AB', both='Hi!')
print(json.dumps({'regs': regs, 'want': want}))
`

// The types Telegraf has (INT8 high/low, FLOAT16, string placements) read
// from pymodbus registers: edge's values against Python's struct module.
func TestNewTypesAgainstPymodbus(t *testing.T) {
	out, err := exec.Command(testenv.Python(t), "-c", newTypesExpect).Output()
	if err != nil {
		t.Fatalf("python: %v", err)
	}
	var exp struct {
		Regs []uint16
		Want map[string]any
	}
	if err := json.Unmarshal(out, &exp); err != nil {
		t.Fatalf("python said %q: %v", out, err)
	}
	port := testenv.PymodbusRegisters(t, exp.Regs)
	tags := []Tag{
		{Name: "i8h", Address: 0, Type: Int8High}, {Name: "u8l", Address: 0, Type: Uint8Low},
		{Name: "u8h", Address: 0, Type: Uint8High}, {Name: "i8l", Address: 0, Type: Int8Low},
		{Name: "u8h_1", Address: 1, Type: Uint8High}, {Name: "i8l_1", Register: Input, Address: 1, Type: Int8Low},
		{Name: "f16_0", Address: 2, Type: Float16}, {Name: "f16_1", Address: 3, Type: Float16},
		{Name: "f16_2", Address: 4, Type: Float16}, {Name: "f16_3", Register: Input, Address: 5, Type: Float16},
		{Name: "f16_badc", Address: 6, Type: Float16, Order: BADC},
		{Name: "upper", Address: 7, Type: String, Length: 3, Location: Upper},
		{Name: "lower", Address: 10, Type: String, Length: 3, Location: Lower},
		{Name: "both", Address: 13, Type: String, Length: 2},
	}
	for i := range tags {
		tags[i].Scale = 1
	}
	if len(exp.Want) != len(tags) {
		t.Fatalf("python computed %d values for %d tags", len(exp.Want), len(tags))
	}
	ring := newRing(t, 1000)
	s, err := New(Config{Sink: ring, Devices: []DeviceConfig{
		devCfg("py", TransportTCP, "127.0.0.1:"+strconv.Itoa(port), 200*time.Millisecond, 150*time.Millisecond, tags)}})
	if err != nil {
		t.Fatal(err)
	}
	runSched(t, s)
	waitFor(t, 10*time.Second, "a good poll", func() bool { return s.devices[0].stats.GoodPolls.Load() >= 1 })
	got := latest(ring, "py")
	for _, tag := range tags {
		g, ok := got[tag.Name]
		switch w := exp.Want[tag.Name].(type) {
		case string:
			if !ok || g.Quality != ringstore.Good || g.Text == nil || *g.Text != w {
				t.Errorf("%s: got %+v, want %q", tag.Name, g, w)
			}
		case float64:
			if !ok || g.Quality != ringstore.Good || g.Value != w {
				t.Errorf("%s: got %v (%v), want %v", tag.Name, g.Value, g.Quality, w)
			}
		default:
			t.Errorf("%s: python gave %T %v", tag.Name, w, w)
		}
	}
}
