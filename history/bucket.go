package history

import (
	"math"
)

// cell is a closed bucket of one tag, as kept in RAM and on disk (20 bytes).
// Values are float32 (7 significant digits): enough for a trend, not for an
// energy counter's last digit, which the raw window and the ring keep exact.
// good == 0 is a gap (no good poll): min, max, mean and last mean nothing.
type cell struct {
	min, max, mean, last float32
	good, bad            uint16 // polls in the bucket, saturating at 65535
}

func (c cell) empty() bool { return c.good == 0 && c.bad == 0 }

// acc is an open bucket: exact accumulators until it closes.
type acc struct {
	idx                 int64 // bucket index: start / step; noBucket when none is open
	min, max, sum, last float64
	good, bad           uint64
}

const noBucket = math.MinInt64

func newAcc() acc { return acc{idx: noBucket} }

func (a *acc) open() bool { return a.idx != noBucket }

func (a *acc) reset(idx int64) { *a = acc{idx: idx} }

// add records one poll of the tag: its value when good, else a bad poll.
func (a *acc) add(v float64, good bool) {
	if !good || math.IsNaN(v) || math.IsInf(v, 0) {
		a.bad++
		return
	}
	if a.good == 0 || v < a.min {
		a.min = v
	}
	if a.good == 0 || v > a.max {
		a.max = v
	}
	a.sum += v
	a.last = v
	a.good++
}

// merge folds a closed cell into a (the coarse tier from the fine one).
// Exact for min, max, last and the counts; the mean is weighted by good.
func (a *acc) merge(c cell) {
	a.bad += uint64(c.bad)
	if c.good == 0 {
		return
	}
	if a.good == 0 || float64(c.min) < a.min {
		a.min = float64(c.min)
	}
	if a.good == 0 || float64(c.max) > a.max {
		a.max = float64(c.max)
	}
	a.sum += float64(c.mean) * float64(c.good)
	a.last = float64(c.last)
	a.good += uint64(c.good)
}

func sat16(n uint64) uint16 { return uint16(min(n, math.MaxUint16)) }

func (a *acc) cell() cell {
	c := cell{good: sat16(a.good), bad: sat16(a.bad)}
	if a.good > 0 {
		c.min, c.max, c.mean, c.last = float32(a.min), float32(a.max), float32(a.sum/float64(a.good)), float32(a.last)
	}
	return c
}

// hcell is a closed health bucket of one device (16 bytes): scheduled and
// good polls (valid rate = good / sched) and the RTT of its good responses.
// rttN == 0: no response in the bucket, so no RTT (not 0).
type hcell struct {
	sched, good uint32
	rttMeanUS   float32
	rttP99US    float32
}

func (c hcell) empty() bool { return c.sched == 0 && c.good == 0 }

// hacc is an open health bucket.
type hacc struct {
	idx         int64
	sched, good uint64
	rttSumUS    float64 // mean × n of merged cells, or the histogram sum
	rttN        uint64  // weight of rttSumUS: responses, or good polls when merging cells
	rttP99US    float64 // the largest p99 of what was merged
}

func newHacc() hacc { return hacc{idx: noBucket} }

func (a *hacc) open() bool { return a.idx != noBucket }

func (a *hacc) reset(idx int64) { *a = hacc{idx: idx} }

func (a *hacc) merge(c hcell) {
	a.sched += uint64(c.sched)
	a.good += uint64(c.good)
	if c.rttMeanUS > 0 && c.good > 0 {
		a.rttSumUS += float64(c.rttMeanUS) * float64(c.good)
		a.rttN += uint64(c.good)
		a.rttP99US = max(a.rttP99US, float64(c.rttP99US))
	}
}

func sat32(n uint64) uint32 { return uint32(min(n, math.MaxUint32)) }

func (a *hacc) cell() hcell {
	c := hcell{sched: sat32(a.sched), good: sat32(a.good)}
	if a.rttN > 0 {
		c.rttMeanUS = float32(a.rttSumUS / float64(a.rttN))
		c.rttP99US = float32(a.rttP99US)
	}
	return c
}

// tier is a circular array of closed buckets indexed by bucket number:
// bucket i lives at i mod len. Allocated at the first put.
type tier[C interface{ empty() bool }] struct {
	n     int
	cells []C
	head  int64 // newest bucket index stored; noBucket when none
}

func newTier[C interface{ empty() bool }](n int) tier[C] { return tier[C]{n: n, head: noBucket} }

func (t *tier[C]) slot(idx int64) int {
	m := int(idx % int64(t.n))
	if m < 0 {
		m += t.n
	}
	return m
}

// put stores bucket idx. Buckets skipped since head are cleared (gaps stay
// gaps); an idx at or below head overwrites when still in range (loading).
func (t *tier[C]) put(idx int64, c C) {
	if t.cells == nil {
		t.cells = make([]C, t.n)
	}
	if t.head != noBucket && idx <= t.head {
		if idx > t.head-int64(t.n) {
			t.cells[t.slot(idx)] = c
		}
		return
	}
	var zero C
	if t.head != noBucket {
		for i := max(t.head+1, idx-int64(t.n)+1); i < idx; i++ {
			t.cells[t.slot(i)] = zero
		}
	} else {
		clear(t.cells)
	}
	t.cells[t.slot(idx)] = c
	t.head = idx
}

// get returns bucket idx if the tier still holds it.
func (t *tier[C]) get(idx int64) (C, bool) {
	var zero C
	if t.head == noBucket || idx > t.head || idx <= t.head-int64(t.n) {
		return zero, false
	}
	return t.cells[t.slot(idx)], true
}

// oldest is the first bucket index the tier can hold given its head.
func (t *tier[C]) oldest() int64 {
	if t.head == noBucket {
		return noBucket
	}
	return t.head - int64(t.n) + 1
}

// floorDiv is a / b rounded towards minus infinity (b > 0).
func floorDiv(a, b int64) int64 {
	q := a / b
	if (a%b != 0) && (a < 0) {
		q--
	}
	return q
}
