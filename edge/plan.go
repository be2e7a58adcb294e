package edge

import (
	"fmt"
	"sort"

	"edgegw/tagtype"
)

// Protocol limits per read (Modbus application protocol v1.1b3, 6.1–6.4).
const (
	MaxReadRegisters = 125
	MaxReadBits      = 2000
)

// Tag is one decoded value of a device.
type Tag struct {
	Name     string
	Register Register
	Address  uint16
	Type     Type
	Order    Order
	Bit      int      // bit of a register for Bool on holding/input; ignored otherwise
	Length   int      // registers of a String tag; ignored otherwise
	Location Location // where a String's characters sit in each register (Both: two a register)
	Scale    float64
	Offset   float64
	Unit     string
	Deadband float64
	Writable bool
	Min, Max *float64
}

// span is the number of registers (or bits) the tag covers.
func (t *Tag) span() int { return tagtype.Span(t.Type, t.Register, max(1, t.Length)) }

// Read is one request of a poll: a contiguous range of one register kind
// covering one or more tags. Tags may overlap (a status word and bool tags
// on its bits, a uint32 and its two uint16 halves): they share the read,
// and each decodes its own part of the reply.
type Read struct {
	Register Register
	Address  uint16
	Quantity uint16
	Tags     []int // indices into the device's tags
}

func (r Read) String() string {
	return fmt.Sprintf("%s %d+%d (%d tags)", r.Register, r.Address, r.Quantity, len(r.Tags))
}

// PlanReads coalesces tags into reads: tags of one register kind whose
// ranges are at most maxGap registers apart (bits: 16*maxGap) join one read
// while it stays within maxRegs registers (bits: maxBits). The gap is read
// and thrown away: one round trip costs more than a few registers.
func PlanReads(tags []Tag, maxGap, maxRegs, maxBits int) []Read {
	if maxRegs <= 0 || maxRegs > MaxReadRegisters {
		maxRegs = MaxReadRegisters
	}
	if maxBits <= 0 || maxBits > MaxReadBits {
		maxBits = MaxReadBits
	}
	if maxGap < 0 {
		maxGap = 0
	}
	idx := make([]int, len(tags))
	for i := range idx {
		idx[i] = i
	}
	sort.SliceStable(idx, func(a, b int) bool {
		ta, tb := &tags[idx[a]], &tags[idx[b]]
		if ta.Register != tb.Register {
			return ta.Register < tb.Register
		}
		return ta.Address < tb.Address
	})
	var reads []Read
	for _, i := range idx {
		t := &tags[i]
		limit, gap := maxRegs, maxGap
		if t.Register.Bits() {
			limit, gap = maxBits, 16*maxGap
		}
		start, end := int(t.Address), int(t.Address)+t.span() // [start, end)
		if n := len(reads); n > 0 {
			r := &reads[n-1]
			rEnd := int(r.Address) + int(r.Quantity)
			if r.Register == t.Register && start <= rEnd+gap && max(end, rEnd)-int(r.Address) <= limit {
				r.Quantity = uint16(max(end, rEnd) - int(r.Address))
				r.Tags = append(r.Tags, i)
				continue
			}
		}
		reads = append(reads, Read{Register: t.Register, Address: uint16(start), Quantity: uint16(end - start), Tags: []int{i}})
	}
	return reads
}
