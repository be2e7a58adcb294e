package edge

import (
	"fmt"
	"testing"
)

func TestPlanReads(t *testing.T) {
	u16 := func(a uint16) Tag { return Tag{Register: Holding, Address: a, Type: Uint16} }
	f32 := func(a uint16) Tag { return Tag{Register: Holding, Address: a, Type: Float32} }
	coil := func(a uint16) Tag { return Tag{Register: Coil, Address: a, Type: Bool} }
	in := func(a uint16) Tag { return Tag{Register: Input, Address: a, Type: Int16} }
	cases := []struct {
		name            string
		tags            []Tag
		gap, regs, bits int
		want            string
	}{
		{"contiguous", []Tag{u16(0), u16(1)}, 8, 125, 2000, "[holding 0+2 (2 tags)]"},
		{"unsorted, gap filled", []Tag{u16(10), u16(0), f32(4)}, 8, 125, 2000, "[holding 0+11 (3 tags)]"},
		{"gap too wide", []Tag{u16(0), u16(20)}, 8, 125, 2000, "[holding 0+1 (1 tags) holding 20+1 (1 tags)]"},
		{"no gap filling", []Tag{u16(0), u16(2)}, 0, 125, 2000, "[holding 0+1 (1 tags) holding 2+1 (1 tags)]"},
		{"adjacent with gap 0", []Tag{u16(0), u16(1)}, 0, 125, 2000, "[holding 0+2 (2 tags)]"},
		{"register limit", []Tag{u16(0), u16(124), u16(125)}, 200, 125, 2000, "[holding 0+125 (2 tags) holding 125+1 (1 tags)]"},
		{"device limit", []Tag{u16(0), u16(1), u16(2), u16(3)}, 8, 2, 2000, "[holding 0+2 (2 tags) holding 2+2 (2 tags)]"},
		{"float32 spans the limit", []Tag{u16(0), f32(1)}, 8, 2, 2000, "[holding 0+1 (1 tags) holding 1+2 (1 tags)]"},
		{"kinds never mix", []Tag{u16(0), in(1), coil(2)}, 8, 125, 2000, "[holding 0+1 (1 tags) input 1+1 (1 tags) coil 2+1 (1 tags)]"},
		{"coils gap in bits (16 per register)", []Tag{coil(0), coil(100), coil(300)}, 8, 125, 2000, "[coil 0+101 (2 tags) coil 300+1 (1 tags)]"},
		{"coil limit", []Tag{coil(0), coil(9)}, 8, 125, 5, "[coil 0+1 (1 tags) coil 9+1 (1 tags)]"},
		{"two bits of one register", []Tag{{Register: Holding, Address: 5, Type: Bool, Bit: 0}, {Register: Holding, Address: 5, Type: Bool, Bit: 3}}, 0, 125, 2000, "[holding 5+1 (2 tags)]"},
	}
	for _, c := range cases {
		if got := fmt.Sprint(PlanReads(c.tags, c.gap, c.regs, c.bits)); got != c.want {
			t.Errorf("%s: got %s, want %s", c.name, got, c.want)
		}
	}
}

func BenchmarkPlanReads48Tags(b *testing.B) {
	var tags []Tag
	for a := uint16(0); a < 48; a++ {
		tags = append(tags, Tag{Register: Holding, Address: a * 3, Type: Uint16})
	}
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		PlanReads(tags, 8, 125, 2000)
	}
}
