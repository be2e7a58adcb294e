package tagtype

import (
	"math"
	"slices"
	"testing"
)

// The table as the README states it: every type's registers, kind,
// Sparkplug datatype (unscaled, scaled), writability and register kinds.
func TestTable(t *testing.T) {
	hr := []Register{Holding, Input}
	for _, c := range []struct {
		name         string
		typ          Type
		words        int
		kind         Kind
		sp, spScaled uint32
		writable     bool
		regs         []Register
		defaultOrder Order
		orders       int
		lo, hi       float64
	}{
		{"int16", Int16, 1, Number, SparkplugInt16, SparkplugFloat, true, hr, ABCD, 2, -32768, 32767},
		{"uint16", Uint16, 1, Number, SparkplugUInt16, SparkplugFloat, true, hr, ABCD, 2, 0, 65535},
		{"int32", Int32, 2, Number, SparkplugInt32, SparkplugDouble, true, hr, ABCD, 4, math.MinInt32, math.MaxInt32},
		{"uint32", Uint32, 2, Number, SparkplugUInt32, SparkplugDouble, true, hr, ABCD, 4, 0, math.MaxUint32},
		{"float32", Float32, 2, Number, SparkplugFloat, SparkplugFloat, true, hr, ABCD, 4, -math.MaxFloat32, math.MaxFloat32},
		{"int64", Int64, 4, Number, SparkplugInt64, SparkplugDouble, true, hr, ABCD, 4, math.MinInt64, 1 << 63},
		{"uint64", Uint64, 4, Number, SparkplugUInt64, SparkplugDouble, true, hr, ABCD, 4, 0, 1 << 64},
		{"float64", Float64, 4, Number, SparkplugDouble, SparkplugDouble, true, hr, ABCD, 4, -math.MaxFloat64, math.MaxFloat64},
		{"bool", Bool, 1, Boolean, SparkplugBoolean, SparkplugBoolean, true, []Register{Holding, Input, Coil, Discrete}, ABCD, 1, 0, 1},
		{"string", String, 0, Text, SparkplugString, SparkplugString, false, hr, ABCD, 2, 0, 0},
		{"int8_high", Int8High, 1, Number, SparkplugInt8, SparkplugFloat, false, hr, ABCD, 1, -128, 127},
		{"int8_low", Int8Low, 1, Number, SparkplugInt8, SparkplugFloat, false, hr, ABCD, 1, -128, 127},
		{"uint8_high", Uint8High, 1, Number, SparkplugUInt8, SparkplugFloat, false, hr, ABCD, 1, 0, 255},
		{"uint8_low", Uint8Low, 1, Number, SparkplugUInt8, SparkplugFloat, false, hr, ABCD, 1, 0, 255},
		{"float16", Float16, 1, Number, SparkplugFloat, SparkplugFloat, true, hr, ABCD, 2, -65504, 65504},
	} {
		typ, err := Parse(c.name)
		lo, hi := c.typ.Range()
		switch {
		case err != nil || typ != c.typ || typ.String() != c.name:
			t.Errorf("Parse(%q) = %v, %v", c.name, typ, err)
		case typ.Words() != c.words || typ.Kind() != c.kind || typ.Writable() != c.writable:
			t.Errorf("%s: words %d kind %v writable %v", c.name, typ.Words(), typ.Kind(), typ.Writable())
		case typ.Sparkplug(false) != c.sp || typ.Sparkplug(true) != c.spScaled:
			t.Errorf("%s: Sparkplug %d/%d, want %d/%d", c.name, typ.Sparkplug(false), typ.Sparkplug(true), c.sp, c.spScaled)
		case !slices.Equal(typ.Registers(), c.regs) || typ.Orders()[0] != c.defaultOrder || len(typ.Orders()) != c.orders:
			t.Errorf("%s: registers %v orders %v", c.name, typ.Registers(), typ.Orders())
		case lo != c.lo || hi != c.hi:
			t.Errorf("%s: range %v..%v, want %v..%v", c.name, lo, hi, c.lo, c.hi)
		}
	}
	if got := len(Names()); got != 15 {
		t.Errorf("%d names, the table above has 15", got)
	}
}

func TestParse(t *testing.T) {
	for alias, want := range map[string]Type{"int8h": Int8High, "int8l": Int8Low, "uint8h": Uint8High, "uint8l": Uint8Low, "half": Float16} {
		if got, err := Parse(alias); err != nil || got != want {
			t.Errorf("Parse(%q) = %v, %v; want %v", alias, got, err, want)
		}
	}
	for _, bad := range []string{"", "int8", "INT16", "float", "int16 "} {
		if got, err := Parse(bad); err == nil {
			t.Errorf("Parse(%q) = %v, want an error", bad, got)
		}
	}
	for i, n := range []string{"ABCD", "CDAB", "BADC", "DCBA"} {
		if o, err := ParseOrder(n); err != nil || o != Order(i) || o.String() != n {
			t.Errorf("ParseOrder(%q) = %v, %v", n, o, err)
		}
	}
	if o, err := ParseOrder(""); err != nil || o != ABCD {
		t.Errorf(`ParseOrder("") = %v, %v`, o, err)
	}
	if _, err := ParseOrder("ACBD"); err == nil {
		t.Error("ACBD accepted")
	}
	for i, n := range []string{"holding", "input", "coil", "discrete"} {
		if r, err := ParseRegister(n); err != nil || r != Register(i) || r.String() != n || r.Bits() != (i >= 2) || r.Writable() != (i%2 == 0) {
			t.Errorf("ParseRegister(%q) = %v, %v", n, r, err)
		}
	}
	if _, err := ParseRegister("holdin"); err == nil {
		t.Error("holdin accepted")
	}
	for i, n := range []string{"both", "lower", "upper"} {
		if l, err := ParseLocation(n); err != nil || l != Location(i) || l.String() != n || l.Chars() != map[bool]int{true: 2, false: 1}[i == 0] {
			t.Errorf("ParseLocation(%q) = %v, %v", n, l, err)
		}
	}
	if l, err := ParseLocation(""); err != nil || l != Both {
		t.Errorf(`ParseLocation("") = %v, %v`, l, err)
	}
	if _, err := ParseLocation("middle"); err == nil {
		t.Error("middle accepted")
	}
}

func TestSpan(t *testing.T) {
	for _, c := range []struct {
		typ    Type
		r      Register
		length int
		want   int
	}{
		{Int16, Holding, 0, 1}, {Float32, Input, 0, 2}, {Uint64, Holding, 0, 4}, {Bool, Holding, 0, 1},
		{Bool, Coil, 0, 1}, {Bool, Discrete, 0, 1}, {String, Holding, 8, 8}, {Int8Low, Input, 0, 1}, {Float16, Holding, 0, 1},
	} {
		if got := Span(c.typ, c.r, c.length); got != c.want {
			t.Errorf("Span(%v, %v, %d) = %d, want %d", c.typ, c.r, c.length, got, c.want)
		}
	}
	if Type(0).Words() != 0 || Type(99).String() != "type(99)" || Type(0).Sparkplug(false) != 0 || Type(0).Allows(Holding) {
		t.Error("the zero or an unknown Type claims something")
	}
}
