package history

import (
	"math"
	"math/rand/v2"
	"testing"
)

// refTier is the plain tier the blocks replaced: a circular array of cells,
// bucket i at i mod n. The reference of the property test.
type refTier[C blockCell] struct {
	n     int
	cells []C
	head  int64
}

func (t *refTier[C]) slot(idx int64) int {
	m := int(idx % int64(t.n))
	if m < 0 {
		m += t.n
	}
	return m
}

func (t *refTier[C]) put(idx int64, c C) {
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

func (t *refTier[C]) get(idx int64) (C, bool) {
	var zero C
	if t.head == noBucket || idx > t.head || idx <= t.head-int64(t.n) {
		return zero, false
	}
	return t.cells[t.slot(idx)], true
}

// sameBits compares cells bit for bit (NaN payloads, -0).
func sameBits[C blockCell](a, b C) bool {
	ka, kb := a.cols(), b.cols()
	if ka.n != kb.n {
		return false
	}
	for j := range ka.f {
		if math.Float32bits(ka.f[j]) != math.Float32bits(kb.f[j]) {
			return false
		}
	}
	return true
}

// genFloat gives the values buckets hold: register values × a decimal
// scale, means of them, and any float32 bits now and then (NaN, -0, Inf
// from a hand-edited file).
func genFloat(rng *rand.Rand, base float64) float32 {
	switch rng.IntN(10) {
	case 0:
		return math.Float32frombits(rng.Uint32())
	case 1:
		return float32([]float64{0, math.Copysign(0, -1), math.Inf(1), math.NaN(), 1e-45, -3.4e38}[rng.IntN(6)])
	case 2, 3:
		return float32((base + float64(rng.IntN(7)-3)) / 10 * float64(rng.IntN(3)+1) / 3)
	default:
		return float32((base + float64(rng.IntN(9)-4)) / math.Pow(10, float64(rng.IntN(3))))
	}
}

func genCell(rng *rand.Rand, base float64) cell {
	if rng.IntN(8) == 0 {
		return cell{}
	}
	n := func() uint16 {
		if rng.IntN(6) == 0 {
			return uint16(rng.Uint32())
		}
		return uint16(rng.IntN(3))
	}
	return cell{min: genFloat(rng, base), max: genFloat(rng, base), mean: genFloat(rng, base), last: genFloat(rng, base), good: n(), bad: n()}
}

func genHcell(rng *rand.Rand, base float64) hcell {
	if rng.IntN(8) == 0 {
		return hcell{}
	}
	n := func() uint32 {
		if rng.IntN(6) == 0 {
			return rng.Uint32()
		}
		return uint32(rng.IntN(3))
	}
	return hcell{sched: n(), good: n(), rttMeanUS: genFloat(rng, base), rttP99US: genFloat(rng, base)}
}

// checkTier drives a tier and the reference with the same puts (in order,
// with gaps of any length, overwrites below head, and a clock step back)
// and compares every bucket of the window, and around it, after each put.
func checkTier[C blockCell](t *testing.T, rng *rand.Rand, gen func(*rand.Rand, float64) C) {
	n := 1 + rng.IntN(3*blockCells)
	tt, ref := newTier[C](n), refTier[C]{n: n, head: noBucket}
	idx := int64(rng.IntN(1000) - 500)
	base := float64(rng.IntN(4000) - 2000)
	for op := range 400 {
		switch r := rng.IntN(20); {
		case r < 12:
			idx++
		case r < 15:
			idx += int64(rng.IntN(3 * blockCells))
		case r < 16:
			idx += int64(rng.IntN(5 * n))
		default:
			idx -= int64(rng.IntN(n + 2))
		}
		base += float64(rng.IntN(5) - 2)
		c := gen(rng, base)
		tt.put(idx, c)
		ref.put(idx, c)
		if tt.head != ref.head || tt.oldest() != ref.head-int64(n)+1 {
			t.Fatalf("op %d: head %d oldest %d, reference head %d (n %d)", op, tt.head, tt.oldest(), ref.head, n)
		}
		rd := tt.reader()
		for i := ref.head - int64(n) - 2; i <= ref.head+2; i++ {
			want, wok := ref.get(i)
			got, ok := rd.get(i)
			if ok != wok || !sameBits(got, want) {
				t.Fatalf("op %d (put %d, n %d): bucket %d = %+v %v, reference %+v %v", op, idx, n, i, got, ok, want, wok)
			}
		}
		i := ref.head - int64(rng.IntN(n+2))
		want, wok := ref.get(i)
		if got, ok := tt.get(i); ok != wok || !sameBits(got, want) {
			t.Fatalf("op %d (put %d, n %d): get(%d) = %+v %v, reference %+v %v", op, idx, n, i, got, ok, want, wok)
		}
	}
}

// The tier of encoded blocks holds what the plain tier held, bit for bit,
// under any sequence of puts.
func TestTierMatchesPlain(t *testing.T) {
	rng := rand.New(rand.NewPCG(27, 2))
	for range 100 {
		checkTier(t, rng, genCell)
		checkTier(t, rng, genHcell)
	}
}

// A block decodes to the cells encoded, bit for bit, whatever their values.
func TestBlockRoundTrip(t *testing.T) {
	rng := rand.New(rand.NewPCG(27, 3))
	for c := range 2000 {
		base := float64(rng.IntN(1 << 20))
		var cs [blockCells]cell
		var hs [blockCells]hcell
		for i := range cs {
			cs[i], hs[i] = genCell(rng, base), genHcell(rng, base)
			base += float64(rng.IntN(3) - 1)
		}
		var got [blockCells]cell
		var goth [blockCells]hcell
		if err := decodeBlock(encodeBlock(cs[:]), got[:]); err != nil {
			t.Fatalf("case %d: %v", c, err)
		}
		if err := decodeBlock(encodeBlock(hs[:]), goth[:]); err != nil {
			t.Fatalf("case %d: %v", c, err)
		}
		for i := range cs {
			if !sameBits(got[i], cs[i]) || !sameBits(goth[i], hs[i]) {
				t.Fatalf("case %d cell %d: %+v %+v, want %+v %+v", c, i, got[i], goth[i], cs[i], hs[i])
			}
		}
	}
}

// A steady logger's minute (same counts, each value a tenth off the last)
// costs under 3 bytes, not the cell's 20.
func TestBlockSteadyIsSmall(t *testing.T) {
	var cs [blockCells]cell
	for i := range cs {
		v := float32(float64(215+i%3) / 10)
		cs[i] = cell{min: v, max: v, mean: v, last: v, good: 2}
	}
	b := encodeBlock(cs[:])
	if len(b) > blockCells*3 {
		t.Errorf("a steady block takes %d bytes for %d cells, over 3 a cell", len(b), blockCells)
	}
	var trunc [blockCells]cell
	if err := decodeBlock(b[:len(b)-1], trunc[:]); err == nil {
		t.Error("a block one byte short decodes")
	}
}

// The decoder takes any bytes: an error or cells, never a panic; cells it
// returns re-encode to a block that decodes to the same cells.
func FuzzBlockDecode(f *testing.F) {
	rng := rand.New(rand.NewPCG(27, 4))
	for range 6 {
		var cs [blockCells]cell
		var hs [blockCells]hcell
		for i := range cs {
			cs[i], hs[i] = genCell(rng, 215), genHcell(rng, 500)
		}
		f.Add(encodeBlock(cs[:]), false)
		f.Add(encodeBlock(hs[:]), true)
	}
	f.Add([]byte{}, false)
	f.Fuzz(func(t *testing.T, b []byte, health bool) {
		if health {
			fuzzBlock[hcell](t, b)
		} else {
			fuzzBlock[cell](t, b)
		}
	})
}

func fuzzBlock[C blockCell](t *testing.T, b []byte) {
	var got, again [blockCells]C
	if decodeBlock(b, got[:]) != nil {
		return
	}
	if err := decodeBlock(encodeBlock(got[:]), again[:]); err != nil {
		t.Fatalf("re-encoded: %v", err)
	}
	for i := range got {
		if !sameBits(got[i], again[i]) {
			t.Fatalf("cell %d re-encoded: %+v, want %+v", i, again[i], got[i])
		}
	}
}
