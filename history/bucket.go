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

// tier holds the last n closed buckets of a series, indexed by bucket
// number: the block of the head (the newest bucket stored) as plain cells,
// the older ones encoded (block.go), in a ring of blocks where block bn
// lives at bn mod len(blocks). A block never written, or skipped whole, is
// a gap: zero cells. Allocated at the first put.
type tier[C blockCell] struct {
	n      int
	hot    []C     // block hotBn's cells, plain
	blocks []block // sealed blocks
	head   int64   // newest bucket index stored; noBucket when none
}

type block struct {
	bn int64  // block number: bucket index / blockCells
	b  []byte // encoded; nil with bn == noBucket: none
}

func newTier[C blockCell](n int) tier[C] { return tier[C]{n: n, head: noBucket} }

func blockOf(idx int64) int64 { return floorDiv(idx, blockCells) }

func cellOf(idx int64) int { return int(idx - blockOf(idx)*blockCells) }

func (t *tier[C]) slot(bn int64) *block {
	m := int(bn % int64(len(t.blocks)))
	if m < 0 {
		m += len(t.blocks)
	}
	return &t.blocks[m]
}

// seal encodes the hot block (the head's) into its slot.
func (t *tier[C]) seal() {
	var zero C
	bn := blockOf(t.head)
	all := true // a block of gaps is stored as none
	for _, c := range t.hot {
		all = all && c == zero
	}
	sl := t.slot(bn)
	if all {
		*sl = block{bn: noBucket}
		return
	}
	*sl = block{bn: bn, b: encodeBlock(t.hot)}
}

// put stores bucket idx. Buckets skipped since head are cleared (gaps stay
// gaps); an idx at or below head overwrites when still in range (loading).
func (t *tier[C]) put(idx int64, c C) {
	if t.hot == nil {
		t.hot = make([]C, blockCells)
		t.blocks = make([]block, (t.n+blockCells-1)/blockCells+1)
		for i := range t.blocks {
			t.blocks[i].bn = noBucket
		}
	}
	if t.head != noBucket && idx <= t.head {
		if idx > t.head-int64(t.n) {
			t.overwrite(idx, c)
		}
		return
	}
	// The hot block's cells above head are zero (it is cleared when the
	// head enters it), so the buckets skipped in it stay gaps.
	switch {
	case t.head == noBucket:
		for i := range t.blocks {
			t.blocks[i] = block{bn: noBucket}
		}
		clear(t.hot)
	case blockOf(idx) == blockOf(t.head):
	default:
		t.seal()
		// The blocks skipped whole are gaps (a slot whose bn differs reads
		// as zero cells); their slots are cleared to free the blocks that
		// fell out of the window.
		for bn, k := blockOf(t.head)+1, 0; bn < blockOf(idx) && k < len(t.blocks); bn, k = bn+1, k+1 {
			*t.slot(bn) = block{bn: noBucket}
		}
		*t.slot(blockOf(idx)) = block{bn: noBucket}
		clear(t.hot)
	}
	t.hot[cellOf(idx)] = c
	t.head = idx
}

// overwrite replaces bucket idx (in the window, at or below head).
func (t *tier[C]) overwrite(idx int64, c C) {
	bn := blockOf(idx)
	if bn == blockOf(t.head) {
		t.hot[cellOf(idx)] = c
		return
	}
	var buf [blockCells]C
	sl := t.slot(bn)
	if sl.bn == bn {
		if err := decodeBlock(sl.b, buf[:]); err != nil {
			panic("history: a block this tier encoded does not decode: " + err.Error())
		}
	}
	buf[cellOf(idx)] = c
	*sl = block{bn: bn, b: encodeBlock(buf[:])}
}

// get returns bucket idx if the tier still holds it (decoding its block:
// a query reads through a reader instead).
func (t *tier[C]) get(idx int64) (C, bool) {
	r := t.reader()
	return r.get(idx)
}

// reader reads a tier's buckets, decoding one block at a time.
type reader[C blockCell] struct {
	t   *tier[C]
	bn  int64 // the block in buf; noBucket when none
	buf [blockCells]C
}

func (t *tier[C]) reader() *reader[C] { return &reader[C]{t: t, bn: noBucket} }

func (r *reader[C]) get(idx int64) (C, bool) {
	t := r.t
	var zero C
	if t.head == noBucket || idx > t.head || idx <= t.head-int64(t.n) {
		return zero, false
	}
	bn := blockOf(idx)
	if bn == blockOf(t.head) {
		return t.hot[cellOf(idx)], true
	}
	if bn != r.bn {
		sl := t.slot(bn)
		if sl.bn != bn {
			return zero, true // a gap
		}
		if err := decodeBlock(sl.b, r.buf[:]); err != nil {
			panic("history: a block this tier encoded does not decode: " + err.Error())
		}
		r.bn = bn
	}
	return r.buf[cellOf(idx)], true
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
