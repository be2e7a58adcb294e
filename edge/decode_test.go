package edge

import (
	"bytes"
	"log/slog"
	"math"
	"testing"
)

// One table for decoder and encoder: wire bytes as a device sends them.
var registerCases = []struct {
	name  string
	typ   Type
	order Order
	bit   int
	wire  []byte
	want  float64
}{
	{"int16 -215 (21.5°C below zero ×0.1)", Int16, ABCD, 0, []byte{0xff, 0x29}, -215},
	{"int16 max", Int16, ABCD, 0, []byte{0x7f, 0xff}, 32767},
	{"int16 min", Int16, ABCD, 0, []byte{0x80, 0x00}, -32768},
	{"int16 byte-swapped", Int16, BADC, 0, []byte{0x29, 0xff}, -215},
	{"uint16 655 (65.5 %RH)", Uint16, ABCD, 0, []byte{0x02, 0x8f}, 655},
	{"uint16 max", Uint16, ABCD, 0, []byte{0xff, 0xff}, 65535},
	{"uint16 DCBA", Uint16, DCBA, 0, []byte{0x8f, 0x02}, 655},
	{"int32 ABCD", Int32, ABCD, 0, []byte{0xff, 0xff, 0xff, 0xfe}, -2},
	{"int32 CDAB", Int32, CDAB, 0, []byte{0xff, 0xfe, 0xff, 0xff}, -2},
	{"uint32 ABCD 0x12345678", Uint32, ABCD, 0, []byte{0x12, 0x34, 0x56, 0x78}, 0x12345678},
	{"uint32 CDAB", Uint32, CDAB, 0, []byte{0x56, 0x78, 0x12, 0x34}, 0x12345678},
	{"uint32 BADC", Uint32, BADC, 0, []byte{0x34, 0x12, 0x78, 0x56}, 0x12345678},
	{"uint32 DCBA", Uint32, DCBA, 0, []byte{0x78, 0x56, 0x34, 0x12}, 0x12345678},
	// 21.5 as IEEE 754 single: 0x41AC0000
	{"float32 ABCD 21.5", Float32, ABCD, 0, []byte{0x41, 0xac, 0x00, 0x00}, 21.5},
	{"float32 CDAB 21.5", Float32, CDAB, 0, []byte{0x00, 0x00, 0x41, 0xac}, 21.5},
	{"float32 BADC 21.5", Float32, BADC, 0, []byte{0xac, 0x41, 0x00, 0x00}, 21.5},
	{"float32 DCBA 21.5", Float32, DCBA, 0, []byte{0x00, 0x00, 0xac, 0x41}, 21.5},
	{"int64 -1", Int64, ABCD, 0, []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, -1},
	{"uint64 ABCD", Uint64, ABCD, 0, []byte{0, 0, 0, 1, 0, 0, 0, 2}, 1<<32 + 2},
	{"uint64 CDAB (words reversed)", Uint64, CDAB, 0, []byte{0, 2, 0, 0, 0, 1, 0, 0}, 1<<32 + 2},
	{"uint64 BADC", Uint64, BADC, 0, []byte{0, 0, 1, 0, 0, 0, 2, 0}, 1<<32 + 2},
	{"uint64 DCBA", Uint64, DCBA, 0, []byte{2, 0, 0, 0, 1, 0, 0, 0}, 1<<32 + 2},
	// 21.5 as IEEE 754 double: 0x4035800000000000
	{"float64 ABCD 21.5", Float64, ABCD, 0, []byte{0x40, 0x35, 0x80, 0, 0, 0, 0, 0}, 21.5},
	{"float64 DCBA 21.5", Float64, DCBA, 0, []byte{0, 0, 0, 0, 0, 0x80, 0x35, 0x40}, 21.5},
	{"bool bit 0 set", Bool, ABCD, 0, []byte{0x00, 0x01}, 1},
	{"bool bit 15 set", Bool, ABCD, 15, []byte{0x80, 0x00}, 1},
	{"bool bit 8 clear", Bool, ABCD, 8, []byte{0xfe, 0xff}, 0},
	{"bool bit 8 set", Bool, ABCD, 8, []byte{0x01, 0x00}, 1},
	// The 8-bit types: one byte of one register, the other byte ignored.
	{"int8_high -2", Int8High, ABCD, 0, []byte{0xfe, 0x05}, -2},
	{"int8_high 127", Int8High, ABCD, 0, []byte{0x7f, 0xff}, 127},
	{"int8_low -2", Int8Low, ABCD, 0, []byte{0x05, 0xfe}, -2},
	{"int8_low -128", Int8Low, ABCD, 0, []byte{0x7f, 0x80}, -128},
	{"uint8_high 254", Uint8High, ABCD, 0, []byte{0xfe, 0x05}, 254},
	{"uint8_low 254", Uint8Low, ABCD, 0, []byte{0x05, 0xfe}, 254},
	{"uint8_low 0 under a full high byte", Uint8Low, ABCD, 0, []byte{0xff, 0x00}, 0},
	// IEEE 754 binary16: sign, 5 exponent bits (bias 15), 10 fraction bits.
	{"float16 1 (0x3c00)", Float16, ABCD, 0, []byte{0x3c, 0x00}, 1},
	{"float16 -2 (0xc000)", Float16, ABCD, 0, []byte{0xc0, 0x00}, -2},
	{"float16 21.5 (0x4d60)", Float16, ABCD, 0, []byte{0x4d, 0x60}, 21.5},
	{"float16 21.5 byte-swapped", Float16, BADC, 0, []byte{0x60, 0x4d}, 21.5},
	{"float16 max 65504 (0x7bff)", Float16, ABCD, 0, []byte{0x7b, 0xff}, 65504},
	{"float16 1/3 rounded (0x3555)", Float16, ABCD, 0, []byte{0x35, 0x55}, 0.333251953125},
	{"float16 smallest normal 2^-14 (0x0400)", Float16, ABCD, 0, []byte{0x04, 0x00}, 0.00006103515625},
	{"float16 smallest subnormal 2^-24 (0x0001)", Float16, ABCD, 0, []byte{0x00, 0x01}, 5.9604644775390625e-08},
	{"float16 largest subnormal (0x03ff)", Float16, ABCD, 0, []byte{0x03, 0xff}, 6.097555160522461e-05},
	{"float16 0", Float16, ABCD, 0, []byte{0x00, 0x00}, 0},
}

func TestDecodeRegisters(t *testing.T) {
	for _, c := range registerCases {
		got, err := DecodeRegisters(c.typ, c.order, c.bit, c.wire)
		if err != nil {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		if got != c.want {
			t.Errorf("%s: got %v, want %v", c.name, got, c.want)
		}
	}
}

func TestEncodeRegistersRoundTrip(t *testing.T) {
	for _, c := range registerCases {
		if c.typ == Bool || !c.typ.Writable() {
			continue
		}
		got, err := EncodeRegisters(c.typ, c.order, c.want)
		if err != nil {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		if !bytes.Equal(got, c.wire) {
			t.Errorf("%s: encoded % x, want % x", c.name, got, c.wire)
		}
	}
}

func TestDecodeErrors(t *testing.T) {
	if _, err := DecodeRegisters(Float32, ABCD, 0, []byte{1, 2}); err == nil {
		t.Error("short float32 decoded")
	}
	if _, err := DecodeRegisters(Bool, ABCD, 16, []byte{1, 2}); err == nil {
		t.Error("bit 16 decoded")
	}
	for _, c := range []struct {
		t Type
		v float64
	}{{Int16, 32768}, {Uint16, -1}, {Uint16, 1.5}, {Int32, math.Inf(1)}, {Uint32, 1 << 32}, {Bool, 1},
		{Float16, 65505}, {Float16, -70000}, {Int8High, 1}, {Uint8Low, 1}, {String, 1}} {
		if b, err := EncodeRegisters(c.t, ABCD, c.v); err == nil {
			t.Errorf("%v %v encoded to % x, want an error", c.t, c.v, b)
		}
	}
}

func TestBitAt(t *testing.T) {
	// FC1 reply data for coils 0..9 = 1,0,1,1,0,0,0,0, 1,0 → 0x0d, 0x01
	packed := []byte{0x0d, 0x01}
	want := []bool{true, false, true, true, false, false, false, false, true, false}
	for i, w := range want {
		if BitAt(packed, i) != w {
			t.Errorf("bit %d: got %v", i, !w)
		}
	}
}

// Halves round to the nearest (ties to even) on the way out.
func TestEncodeFloat16Rounds(t *testing.T) {
	for _, c := range []struct {
		v    float64
		wire []byte
	}{
		{1.0 / 3, []byte{0x35, 0x55}},
		{65504, []byte{0x7b, 0xff}},
		{-0.0001, []byte{0x86, 0x8e}},      // -1.0001659393310547e-04
		{1 + 1.0/2048, []byte{0x3c, 0x00}}, // a tie: to even (0x3c00)
		{1 + 3.0/2048, []byte{0x3c, 0x02}}, // a tie: to even (0x3c02)
		{0x1p-25, []byte{0, 0}},            // half the smallest subnormal: to even, 0
		{0.00006100, []byte{0x03, 0xff}},   // rounds to the largest subnormal
		{0.00006103, []byte{0x04, 0x00}},   // rounds up into the normals
	} {
		got, err := EncodeRegisters(Float16, ABCD, c.v)
		if err != nil || !bytes.Equal(got, c.wire) {
			t.Errorf("float16 %v: % x, %v; want % x", c.v, got, err, c.wire)
		}
	}
}

func FuzzDecodeRegisters(f *testing.F) {
	for _, c := range registerCases {
		f.Add(uint8(c.typ), uint8(c.order), c.bit, c.wire)
	}
	f.Fuzz(func(t *testing.T, typ, order uint8, bit int, wire []byte) {
		types := []Type{Int16, Uint16, Int32, Uint32, Float32, Int64, Uint64, Float64, Bool, Int8High, Int8Low, Uint8High, Uint8Low, Float16}
		ty := types[int(typ)%len(types)]
		o := Order(order % 4)
		v, err := DecodeRegisters(ty, o, bit, wire)
		if err != nil {
			return
		}
		if len(wire) != 2*ty.Words() {
			t.Fatalf("decoded %d bytes as %v", len(wire), ty)
		}
		if ty == Bool || !ty.Writable() || math.IsNaN(v) || math.IsInf(v, 0) {
			return
		}
		// Whatever decodes must encode back to the same wire bytes (except
		// 64-bit integers beyond float64 precision).
		if (ty == Int64 || ty == Uint64) && math.Abs(v) >= 1<<53 {
			return
		}
		back, err := EncodeRegisters(ty, o, v)
		if err != nil {
			t.Fatalf("%v %v: %v", ty, v, err)
		}
		if !bytes.Equal(back, wire) {
			t.Fatalf("%v %v %v: % x -> % x", ty, o, v, wire, back)
		}
	})
}

func TestScaledIsExactForDecimalScales(t *testing.T) {
	cases := []struct {
		scale, offset, raw, want float64
	}{
		{0.1, 0, 559, 55.9}, {0.1, 0, -215, -21.5}, {0.01, 0, 12345, 123.45}, {0.5, 0, 3, 1.5},
		{0.001, 0, 1, 0.001}, {2, 0, 3, 6}, {0.1, -40, 655, 25.5}, {1, 0, 7, 7}, {0.3, 0, 10, 3},
	}
	for _, c := range cases {
		tag := Tag{Type: Int16, Scale: c.scale, Offset: c.offset}
		if got := scaled(&tag, c.raw); got != c.want {
			t.Errorf("%v*%v+%v = %v, want %v", c.raw, c.scale, c.offset, got, c.want)
		}
	}
	if got := scaled(&Tag{Type: Bool, Scale: 0.1}, 1); got != 1 {
		t.Errorf("bool scaled to %v", got)
	}
}

func TestDecodeString(t *testing.T) {
	cases := []struct {
		name  string
		order Order
		loc   Location
		wire  []byte
		want  string
	}{
		{"ABCD high byte first", ABCD, Both, []byte("SN-4711\x00"), "SN-4711"},
		{"BADC swapped in each register", BADC, Both, []byte("NS4-17\x001"), "SN-4711"},
		{"trailing NULs and spaces", ABCD, Both, []byte("AB  \x00\x00 \x00"), "AB"},
		{"inner space and NUL kept", ABCD, Both, []byte("A B\x00C\x00"), "A B\x00C"},
		{"empty", ABCD, Both, []byte{0, 0, 0, 0}, ""},
		{"invalid UTF-8 replaced", ABCD, Both, []byte{0xff, 'A'}, "\uFFFDA"},
		{"UTF-8 kept", ABCD, Both, []byte("Ä12"), "Ä12"},
		{"upper: one character a register, high byte", ABCD, Upper, []byte{'S', 0, 'N', 0, '4', 0, 0, 0}, "SN4"},
		{"upper: the low byte ignored", ABCD, Upper, []byte{'S', 0x7f, 'N', 'x', '4', 0xff}, "SN4"},
		{"lower: one character a register, low byte", ABCD, Lower, []byte{0, 'S', 0, 'N', 0, '4', 0, ' '}, "SN4"},
		{"lower: the high byte ignored", ABCD, Lower, []byte{0xff, 'S', 'x', 'N', 0x7f, '4'}, "SN4"},
	}
	for _, c := range cases {
		got, err := DecodeString(c.order, c.loc, c.wire)
		if err != nil || got != c.want {
			t.Errorf("%s: got %q, %v; want %q", c.name, got, err, c.want)
		}
	}
	for _, c := range []struct {
		name  string
		order Order
		loc   Location
		wire  []byte
	}{
		{"CDAB", CDAB, Both, []byte("ab")},
		{"odd byte count", ABCD, Both, []byte("abc")},
		{"BADC with one character a register", BADC, Lower, []byte("ab")},
	} {
		if s, err := DecodeString(c.order, c.loc, c.wire); err == nil {
			t.Errorf("%s accepted: %q", c.name, s)
		}
	}
}

// Overlapping tags share one read; every tag decodes its own part.
func TestPlanReadsOverlapping(t *testing.T) {
	tags := []Tag{
		{Name: "status", Address: 0, Type: Uint16},
		{Name: "alarm", Address: 0, Type: Bool, Bit: 0},
		{Name: "energy", Address: 1, Type: Uint32},
		{Name: "energy_hi", Address: 1, Type: Uint16},
		{Name: "energy_lo", Address: 2, Type: Uint16},
		{Name: "serial", Address: 0, Type: String, Length: 8},
	}
	reads := PlanReads(tags, 0, 125, 2000)
	if len(reads) != 1 || reads[0].Address != 0 || reads[0].Quantity != 8 || len(reads[0].Tags) != len(tags) {
		t.Fatalf("plan %v", reads)
	}
}

// Decoding a poll of every type, strings of each placement included, makes
// no allocation once the texts are known (a changed text makes two: its
// bytes and the pointer the samples share).
func TestDecodeAllocatesNothing(t *testing.T) {
	tags := []Tag{
		{Name: "i16", Address: 0, Type: Int16}, {Name: "hi", Address: 1, Type: Int8High}, {Name: "lo", Address: 1, Type: Uint8Low},
		{Name: "half", Address: 2, Type: Float16}, {Name: "f32", Address: 3, Type: Float32, Order: CDAB}, {Name: "u64", Address: 5, Type: Uint64},
		{Name: "bit", Address: 0, Type: Bool, Bit: 3}, {Name: "sn", Address: 9, Type: String, Length: 4},
		{Name: "up", Address: 13, Type: String, Length: 3, Location: Upper}, {Name: "low", Address: 16, Type: String, Length: 3, Location: Lower},
	}
	d, err := newDevice(DeviceConfig{Name: "d", Transport: TransportTCP, Address: "127.0.0.1:0", Tags: tags}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	plan := d.currentPlan()
	if len(plan) != 1 || plan[0].Quantity != 19 {
		t.Fatalf("plan %v: want one read of 19 registers", plan)
	}
	data := []byte{0, 8, 0xfe, 0x41, 0x4d, 0x60, 0, 0, 0x41, 0xac, 0, 0, 0, 1, 0, 0, 0, 2,
		'S', 'N', '-', '4', '7', '1', '1', 0, 'A', 0, 'B', 0, 'C', 0, 0, 'x', 0, 'y', 0, 'z'}
	if err := d.decode(plan[0], data); err != nil {
		t.Fatal(err)
	}
	want := []float64{8, -2, 65, 21.5, 21.5, 1<<32 + 2, 1}
	for i, w := range want {
		if d.values[i] != w {
			t.Errorf("%s = %v, want %v", tags[i].Name, d.values[i], w)
		}
	}
	for i, w := range map[int]string{7: "SN-4711", 8: "ABC", 9: "xyz"} {
		if d.texts[i] == nil || *d.texts[i] != w {
			t.Errorf("%s = %v, want %q", tags[i].Name, d.texts[i], w)
		}
	}
	if n := testing.AllocsPerRun(200, func() { _ = d.decode(plan[0], data) }); n != 0 {
		t.Errorf("%v allocations per decode, want 0", n)
	}
	if n := testing.AllocsPerRun(20, func() { data[19]++; _ = d.decode(plan[0], data) }); n != 2 {
		t.Errorf("%v allocations for a changed text, want 2", n)
	}
}
