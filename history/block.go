package history

import (
	"math"
	"math/bits"
)

// A block is blockCells consecutive closed buckets of one tier (bucket
// indices bn*blockCells .. bn*blockCells+blockCells-1), encoded once when
// the tier's head leaves it, in a bit stream written with bitw (most
// significant bit first). Every cell of the block is present (a gap is a
// zero cell). Each cell has two counts (cell: good, bad; hcell: sched, good)
// and nf float32 values (cell: min, max, mean, last; hcell: the RTT mean and
// p99). The layout:
//
//	header, per float column: 3 bits, its form (the one of fewest bits)
//	  0..5   decimal: every value of the column in the block is exactly
//	         float32(float64(k) / 10^form) for an integer k (a Modbus
//	         register × a scale, and min, max and last of such values)
//	  7      XOR: the IEEE 754 bits of each value XOR'd with the previous
//	then per cell:
//	  each count: its change from the previous cell's (0 before the first):
//	              '0' unchanged | '10' + 3 bits | '110' + 6 | '1110' + 9 |
//	              '11110' + 12 | '111110' + 16 | '1111110' + 32 |
//	              '1111111' + 64 (two's complement)
//	  each float column, by its form:
//	    decimal: k's change from the previous cell's k, as a count's
//	    XOR:     x = bits ^ previous bits (0 before the first)
//	             '0' x == 0 | '1' + 5 bits leading zeros + 5 bits (m-1) + m bits
//
// A minute of a steady logger (the same poll counts, each value a tenth of a
// degree off the last one) thus costs 22 bits, against the 20 bytes of a
// cell. The classes were picked on the simulated loggers' week
// (TestRAMSim48x2): tag buckets 1.07 MB with chunk.go's dod classes, 1.01 MB
// with these.
const blockCells = 32

const (
	formMaxDecimal = 5
	formXOR        = 7
)

var pow10 = [...]float64{1, 10, 100, 1000, 1e4, 1e5}

// cols is a cell as columns: the codec's view of cell and hcell.
type cols struct {
	n [2]uint32
	f [4]float32
}

// blockCell is what a tier stores: cell or hcell.
type blockCell interface {
	comparable
	empty() bool
	cols() cols
	nFloats() int
}

func (c cell) cols() cols {
	return cols{n: [2]uint32{uint32(c.good), uint32(c.bad)}, f: [4]float32{c.min, c.max, c.mean, c.last}}
}
func (cell) nFloats() int { return 4 }

func (c hcell) cols() cols {
	return cols{n: [2]uint32{c.sched, c.good}, f: [4]float32{c.rttMeanUS, c.rttP99US}}
}
func (hcell) nFloats() int { return 2 }

// setCols stores k in *dst; false when a count overflows the cell's type.
func setCols[C blockCell](dst *C, k cols) bool {
	switch d := any(dst).(type) {
	case *cell:
		if k.n[0] > math.MaxUint16 || k.n[1] > math.MaxUint16 {
			return false
		}
		*d = cell{good: uint16(k.n[0]), bad: uint16(k.n[1]), min: k.f[0], max: k.f[1], mean: k.f[2], last: k.f[3]}
	case *hcell:
		*d = hcell{sched: k.n[0], good: k.n[1], rttMeanUS: k.f[0], rttP99US: k.f[1]}
	}
	return true
}

// decimalK returns k with float32(k / 10^form) == v bit for bit.
func decimalK(v float32, form int) (int64, bool) {
	p := pow10[form]
	k := math.Round(float64(v) * p)
	if math.IsNaN(k) || math.Abs(k) > 1<<52 {
		return 0, false
	}
	if math.Float32bits(float32(float64(int64(k))/p)) != math.Float32bits(v) { // -0 is not decimal
		return 0, false
	}
	return int64(k), true
}

// columnForm is the form that encodes column j of cs in the fewest bits:
// a decimal form that holds every value, or XOR.
func columnForm[C blockCell](cs []C, j int) int {
	best, bestBits := formXOR, 0
	var prev uint32
	for _, c := range cs {
		v := math.Float32bits(c.cols().f[j])
		bestBits += xorBits(v ^ prev)
		prev = v
	}
form:
	for form := 0; form <= formMaxDecimal; form++ {
		n, prevK := 0, int64(0)
		for _, c := range cs {
			k, ok := decimalK(c.cols().f[j], form)
			if !ok {
				continue form
			}
			n += intBitsOf(k - prevK)
			prevK = k
		}
		if n < bestBits {
			best, bestBits = form, n
		}
	}
	return best
}

// xorBits is the size of an XOR'd value.
func xorBits(x uint32) int {
	if x == 0 {
		return 1
	}
	return 11 + 32 - bits.LeadingZeros32(x) - bits.TrailingZeros32(x)
}

// intBitsOf is the size of a change written by writeInt.
func intBitsOf(d int64) int {
	if d == 0 {
		return 1
	}
	for i, nb := range intBits {
		lim := int64(1) << (nb - 1)
		if d >= -lim && d < lim {
			return i + 2 + int(nb)
		}
	}
	return len(intBits) + 1 + 64
}

// the classes of a change after the '0' (unchanged): prefix ones, then
// value bits; all ones: 64 bits.
var intBits = [...]uint{3, 6, 9, 12, 16, 32}

// writeInt writes a signed change by its class.
func writeInt(w *bitw, d int64) {
	if d == 0 {
		w.bit(false)
		return
	}
	for i, nb := range intBits {
		lim := int64(1) << (nb - 1)
		if d >= -lim && d < lim {
			w.write((1<<(i+1)-1)<<1, uint(i+2))
			w.write(uint64(d), nb)
			return
		}
	}
	w.write(1<<(len(intBits)+1)-1, uint(len(intBits)+1))
	w.write(uint64(d), 64)
}

func readInt(r *bitr) (int64, error) {
	ones := 0
	for ones <= len(intBits) {
		b, err := r.bit()
		if err != nil {
			return 0, err
		}
		if !b {
			break
		}
		ones++
	}
	switch {
	case ones == 0:
		return 0, nil
	case ones > len(intBits):
		u, err := r.read(64)
		return int64(u), err
	default:
		nb := intBits[ones-1]
		u, err := r.read(nb)
		return int64(u<<(64-nb)) >> (64 - nb), err
	}
}

// encodeBlock encodes cs (blockCells cells) into an exact-size slice.
func encodeBlock[C blockCell](cs []C) []byte {
	var z C
	nf := z.nFloats()
	var forms [4]int
	w := bitw{b: make([]byte, 0, 64)}
	for j := range nf {
		forms[j] = columnForm(cs, j)
		w.write(uint64(forms[j]), 3)
	}
	var prev cols
	var prevK [4]int64
	for _, c := range cs {
		k := c.cols()
		for j := range k.n {
			writeInt(&w, int64(k.n[j])-int64(prev.n[j]))
		}
		for j := range nf {
			if forms[j] == formXOR {
				x := math.Float32bits(k.f[j]) ^ math.Float32bits(prev.f[j])
				if x == 0 {
					w.bit(false)
					continue
				}
				lead, trail := uint(bits.LeadingZeros32(x)), uint(bits.TrailingZeros32(x))
				m := 32 - lead - trail
				w.bit(true)
				w.write(uint64(lead), 5)
				w.write(uint64(m-1), 5)
				w.write(uint64(x>>trail), m)
				continue
			}
			kv, _ := decimalK(k.f[j], forms[j])
			writeInt(&w, kv-prevK[j])
			prevK[j] = kv
		}
		prev = k
	}
	return append([]byte(nil), w.b...)
}

// decodeBlock decodes b into out (blockCells cells); errChunk when b is not
// a block this encoder wrote.
func decodeBlock[C blockCell](b []byte, out []C) error {
	var z C
	nf := z.nFloats()
	r := bitr{b: b}
	var forms [4]int
	for j := range nf {
		u, err := r.read(3)
		if err != nil {
			return err
		}
		if u > formMaxDecimal && u != formXOR {
			return errChunk
		}
		forms[j] = int(u)
	}
	var prev cols
	var prevK [4]int64
	for i := range out {
		k := prev
		for j := range k.n {
			d, err := readInt(&r)
			if err != nil {
				return err
			}
			v := int64(k.n[j]) + d
			if v < 0 || v > math.MaxUint32 {
				return errChunk
			}
			k.n[j] = uint32(v)
		}
		for j := range nf {
			if forms[j] == formXOR {
				nz, err := r.bit()
				if err != nil {
					return err
				}
				if !nz {
					continue
				}
				lead, err1 := r.read(5)
				m1, err2 := r.read(5)
				if err1 != nil || err2 != nil || lead+m1+1 > 32 {
					return errChunk
				}
				m := uint(m1) + 1
				x, err := r.read(m)
				if err != nil {
					return err
				}
				k.f[j] = math.Float32frombits(math.Float32bits(k.f[j]) ^ uint32(x)<<(32-uint(lead)-m))
				continue
			}
			d, err := readInt(&r)
			if err != nil {
				return err
			}
			kv := prevK[j] + d
			if kv > 1<<52 || kv < -(1<<52) {
				return errChunk
			}
			k.f[j] = float32(float64(kv) / pow10[forms[j]])
			prevK[j] = kv
		}
		if !setCols(&out[i], k) {
			return errChunk
		}
		prev = k
	}
	return nil
}
