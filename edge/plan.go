package edge

import (
	"fmt"
	"sort"
	"time"

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
	// DeadbandPercent: a good value is left out unless it moved more than
	// this percentage of the last value kept (of its absolute value).
	DeadbandPercent float64
	// MaxSilence: a good value a deadband would leave out is kept anyway
	// when the last value kept is this old (0: never).
	MaxSilence time.Duration
	// Interval: the tag is polled every Interval, a multiple of its
	// device's (0: at the device's interval).
	Interval time.Duration
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

// MaxRates is how many distinct poll rates the tags of one device may have.
const MaxRates = 8

// rates is a device's tags grouped by poll rate: rate g polls every
// mult[g] windows of the device (mult[0] == 1, ascending); a tag of rate g
// is due at window n when n/mult[g] is a window of its rate not yet polled
// (so a slow tag whose window began during an overrun joins the next poll
// inside its window). plan makes the reads of every set of due rates, by
// mask>>1 (rate 0 is due at every window): the rates due together are read
// together, coalesced as one set of tags, so a fast and a slow tag that are
// adjacent stay one request, covering both when both are due.
type rates struct {
	mult  []int64
	group []uint8 // per tag: its rate
}

// newRates groups tags by their interval (0: the device's, iv); every
// interval is a multiple of iv and some tag is polled at iv.
func newRates(dev string, tags []Tag, iv time.Duration) (rates, error) {
	r := rates{mult: []int64{1}, group: make([]uint8, len(tags))}
	byMult := map[int64]bool{1: true}
	base := false
	for _, t := range tags {
		m := int64(1)
		if t.Interval != 0 {
			if t.Interval < iv || t.Interval%iv != 0 {
				return r, fmt.Errorf("edge: device %q: tag %q: interval %v is not a multiple of the device's interval %v", dev, t.Name, t.Interval, iv)
			}
			m = int64(t.Interval / iv)
		}
		base = base || m == 1
		if !byMult[m] {
			byMult[m] = true
			r.mult = append(r.mult, m)
		}
	}
	if !base {
		return r, fmt.Errorf("edge: device %q: no tag is polled at the device's interval %v", dev, iv)
	}
	if len(r.mult) > MaxRates {
		return r, fmt.Errorf("edge: device %q: %d poll rates, more than %d", dev, len(r.mult), MaxRates)
	}
	sort.Slice(r.mult, func(a, b int) bool { return r.mult[a] < r.mult[b] })
	for i, t := range tags {
		m := int64(1)
		if t.Interval != 0 {
			m = int64(t.Interval / iv)
		}
		for g, x := range r.mult {
			if x == m {
				r.group[i] = uint8(g)
			}
		}
	}
	return r, nil
}

// plan makes the reads of every set of due rates.
func (r *rates) plan(tags []Tag, maxGap, maxRegs, maxBits int) [][]Read {
	plans := make([][]Read, 1<<(len(r.mult)-1))
	for k := range plans {
		plans[k] = r.planMask(tags, uint8(k<<1|1), maxGap, maxRegs, maxBits)
	}
	return plans
}

// planMask coalesces the tags of the rates in mask.
func (r *rates) planMask(tags []Tag, mask uint8, maxGap, maxRegs, maxBits int) []Read {
	if len(r.mult) == 1 {
		return PlanReads(tags, maxGap, maxRegs, maxBits)
	}
	var sub []Tag
	var idx []int
	for i := range tags {
		if mask&(1<<r.group[i]) != 0 {
			sub = append(sub, tags[i])
			idx = append(idx, i)
		}
	}
	reads := PlanReads(sub, maxGap, maxRegs, maxBits)
	for _, rd := range reads {
		for j, ti := range rd.Tags {
			rd.Tags[j] = idx[ti]
		}
	}
	return reads
}

// tickMask is the set of rates due at window n of a run without overruns:
// those whose period divides n.
func (r *rates) tickMask(n int64) uint8 {
	var m uint8
	for g, x := range r.mult {
		if n%x == 0 {
			m |= 1 << g
		}
	}
	return m
}

// RatePlan is the reads of the polls at which the tags of one rate are
// read: every Every, with the faster tags due then.
type RatePlan struct {
	Every time.Duration
	Reads []Read
}
