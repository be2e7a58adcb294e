package history

import (
	"encoding/binary"
	"errors"
	"math"
	"math/bits"

	"edgegw/ringstore"
)

// A chunk is a run of one tag's raw points (time, value, quality) packed in
// a bit stream, most significant bit first: delta-of-delta times and XOR'd
// values, the Gorilla encoding (Pelkonen et al., VLDB 2015) that Prometheus's
// TSDB also uses, with a quality field and a bool form added.
//
// Point 0:
//
//	time     64 bits (two's complement, µs)
//	quality   8 bits
//	value    64 bits (IEEE 754 bits, NaN payloads and -0 kept)
//
// Point i > 0, with d = t[i]-t[i-1], dod = d - d[i-1] (d[0] = 0, so point 1
// writes its delta; wrapping arithmetic, so any int64 times round-trip):
//
//	'0'                 dod == 0
//	'10'    + 7 bits    dod in [-64, 63]
//	'110'   + 10 bits   dod in [-512, 511]
//	'1110'  + 13 bits   dod in [-4096, 4095]
//	'11110' + 16 bits   dod in [-32768, 32767]
//	'111110' + 24 bits  dod in [-8388608, 8388607]
//	'111111' + 64 bits  any other
//
// then the value and the quality:
//
//	'0'                 both as the point before (a run goes on: 1 bit a point)
//	'1'                 then the quality: '0' same | '1' + 8 bits;
//	                    then the value, by the chunk's form:
//	  float form:  x = bits ^ previous bits
//	    '0'             x == 0 (only the quality changed)
//	    '10' + m bits   x's meaningful bits fit the previous window (m bits wide)
//	    '11' + 6 bits leading zeros + 6 bits (m-1) + m bits
//	  bool form (every value of the chunk is exactly 0 or 1):
//	    '0' = 0, '1' = 1
//
// A bool tag's chunk thus costs its times plus one bit a point while the
// value and quality stay (a run length in unary), plus 3 to 11 bits a change.

// chunk limits: a chunk is sealed (copied to an exact-size slice) at
// chunkMaxPoints points, chunkMaxBytes bytes, or when it spans a quarter of
// the raw window; the oldest sealed chunk is the unit the window and the
// RAM budget drop.
const (
	chunkMaxPoints = 256
	chunkMaxBytes  = 2048
)

var errChunk = errors.New("history: corrupt chunk")

// bitw appends bits to b.
type bitw struct {
	b     []byte
	nbits uint // bits used in the last byte (0 = b full: a new byte next)
}

func (w *bitw) bit(v bool) {
	if w.nbits == 0 {
		w.b = append(w.b, 0)
		w.nbits = 8
	}
	w.nbits--
	if v {
		w.b[len(w.b)-1] |= 1 << w.nbits
	}
}

// write appends the low n bits of v (n <= 64), most significant first.
func (w *bitw) write(v uint64, n uint) {
	for n > 0 {
		if w.nbits == 0 {
			w.b = append(w.b, 0)
			w.nbits = 8
		}
		k := min(n, w.nbits)
		chunk := byte((v >> (n - k)) & (1<<k - 1))
		w.nbits -= k
		w.b[len(w.b)-1] |= chunk << w.nbits
		n -= k
	}
}

// bitr reads bits from b.
type bitr struct {
	b   []byte
	pos uint // bit position
}

func (r *bitr) bit() (bool, error) {
	if r.pos >= uint(len(r.b))*8 {
		return false, errChunk
	}
	v := r.b[r.pos/8]>>(7-r.pos%8)&1 == 1
	r.pos++
	return v, nil
}

func (r *bitr) read(n uint) (uint64, error) {
	if r.pos+n > uint(len(r.b))*8 {
		return 0, errChunk
	}
	if i := r.pos / 8; n > 0 && n <= 56 && i+8 <= uint(len(r.b)) {
		// 8 bytes hold the n bits whatever pos's offset in its byte (≤ 7).
		w := binary.BigEndian.Uint64(r.b[i:])
		v := w << (r.pos % 8) >> (64 - n)
		r.pos += n
		return v, nil
	}
	var v uint64
	for n > 0 {
		off := r.pos % 8
		k := min(n, 8-off)
		byt := uint64(r.b[r.pos/8]>>(8-off-k)) & (1<<k - 1)
		v = v<<k | byt
		r.pos += k
		n -= k
	}
	return v, nil
}

// the dod classes after the '0': prefix ones, then value bits.
var dodBits = [...]uint{7, 10, 13, 16, 24}

// enc is the state of the chunk being appended (and of a decoder).
type enc struct {
	n           int
	boolForm    bool
	t, d        int64
	v           uint64
	q           ringstore.Quality
	lead, trail uint8 // the XOR window of the last value written in full
	window      bool  // lead/trail are set
}

// fitsBool reports whether v can go in a bool-form chunk.
func fitsBool(v float64) bool {
	b := math.Float64bits(v)
	return b == 0 || b == math.Float64bits(1)
}

// appendPoint writes one point to w. In a bool-form chunk the value must
// satisfy fitsBool (the caller seals the chunk otherwise).
func (e *enc) appendPoint(w *bitw, ts int64, v float64, q ringstore.Quality) {
	vb := math.Float64bits(v)
	if e.n == 0 {
		w.write(uint64(ts), 64)
		w.write(uint64(q), 8)
		w.write(vb, 64)
		e.t, e.d, e.v, e.q, e.n = ts, 0, vb, q, 1
		return
	}
	d := ts - e.t
	dod := d - e.d
	switch {
	case dod == 0:
		w.bit(false)
	default:
		done := false
		for i, nb := range dodBits {
			lim := int64(1) << (nb - 1)
			if dod >= -lim && dod < lim {
				w.write((1<<(i+1)-1)<<1, uint(i+2)) // i+1 ones and a zero
				w.write(uint64(dod), nb)
				done = true
				break
			}
		}
		if !done {
			w.write(1<<(len(dodBits)+1)-1, uint(len(dodBits)+1))
			w.write(uint64(dod), 64)
		}
	}
	e.t, e.d = ts, d
	if vb == e.v && q == e.q {
		w.bit(false)
		e.n++
		return
	}
	w.bit(true)
	if q == e.q {
		w.bit(false)
	} else {
		w.bit(true)
		w.write(uint64(q), 8)
	}
	if e.boolForm {
		w.bit(vb != 0)
	} else {
		x := vb ^ e.v
		switch {
		case x == 0:
			w.bit(false)
		default:
			lead, trail := uint8(bits.LeadingZeros64(x)), uint8(bits.TrailingZeros64(x))
			if e.window && lead >= e.lead && trail >= e.trail {
				m := 64 - uint(e.lead) - uint(e.trail)
				w.write(0b10, 2)
				w.write(x>>e.trail, m)
			} else {
				m := 64 - uint(lead) - uint(trail)
				w.write(0b11, 2)
				w.write(uint64(lead), 6)
				w.write(uint64(m-1), 6)
				w.write(x>>trail, m)
				e.lead, e.trail, e.window = lead, trail, true
			}
		}
	}
	e.v, e.q = vb, q
	e.n++
}

// dec reads a chunk's points one at a time.
type dec struct {
	r    bitr
	e    enc
	left int // points still to read
}

func newDec(b []byte, n int, boolForm bool) dec {
	return dec{r: bitr{b: b}, e: enc{boolForm: boolForm}, left: n}
}

// next returns the next point; ok is false at the end; err is non-nil when
// the stream is shorter than its count or malformed.
func (dc *dec) next() (ts int64, v float64, q ringstore.Quality, ok bool, err error) {
	if dc.left <= 0 {
		return 0, 0, 0, false, nil
	}
	e, r := &dc.e, &dc.r
	if e.n == 0 {
		t, err1 := r.read(64)
		qq, err2 := r.read(8)
		vb, err3 := r.read(64)
		if err := errors.Join(err1, err2, err3); err != nil {
			return 0, 0, 0, false, errChunk
		}
		if e.boolForm && !fitsBool(math.Float64frombits(vb)) {
			return 0, 0, 0, false, errChunk
		}
		e.t, e.q, e.v, e.n = int64(t), ringstore.Quality(qq), vb, 1
		dc.left--
		return e.t, math.Float64frombits(e.v), e.q, true, nil
	}
	var dod int64
	ones := 0
	for ones <= len(dodBits) {
		b, err := r.bit()
		if err != nil {
			return 0, 0, 0, false, err
		}
		if !b {
			break
		}
		ones++
	}
	switch {
	case ones == 0:
	case ones > len(dodBits):
		u, err := r.read(64)
		if err != nil {
			return 0, 0, 0, false, err
		}
		dod = int64(u)
	default:
		nb := dodBits[ones-1]
		u, err := r.read(nb)
		if err != nil {
			return 0, 0, 0, false, err
		}
		dod = int64(u<<(64-nb)) >> (64 - nb) // sign-extend
	}
	e.d += dod
	e.t += e.d
	changed, err := r.bit()
	if err != nil {
		return 0, 0, 0, false, err
	}
	if changed {
		qc, err := r.bit()
		if err != nil {
			return 0, 0, 0, false, err
		}
		if qc {
			u, err := r.read(8)
			if err != nil {
				return 0, 0, 0, false, err
			}
			e.q = ringstore.Quality(u)
		}
		if e.boolForm {
			b, err := r.bit()
			if err != nil {
				return 0, 0, 0, false, err
			}
			e.v = 0
			if b {
				e.v = math.Float64bits(1)
			}
		} else if err := dc.value(); err != nil {
			return 0, 0, 0, false, err
		}
	}
	e.n++
	dc.left--
	return e.t, math.Float64frombits(e.v), e.q, true, nil
}

func (dc *dec) value() error {
	e, r := &dc.e, &dc.r
	b, err := r.bit()
	if err != nil || !b {
		return err // '0': the same value
	}
	full, err := r.bit()
	if err != nil {
		return err
	}
	if full {
		lead, err1 := r.read(6)
		m1, err2 := r.read(6)
		if err1 != nil || err2 != nil {
			return errChunk
		}
		m := uint(m1) + 1
		if uint(lead)+m > 64 {
			return errChunk
		}
		e.lead, e.trail, e.window = uint8(lead), uint8(64-uint(lead)-m), true
	} else if !e.window {
		return errChunk
	}
	m := 64 - uint(e.lead) - uint(e.trail)
	x, err := r.read(m)
	if err != nil {
		return err
	}
	e.v ^= x << e.trail
	return nil
}
