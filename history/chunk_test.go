package history

import (
	"bytes"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"edgegw/ringstore"
)

// point is one raw point as the plain reference keeps it.
type point struct {
	ts int64
	v  uint64 // the value's bits: compared bit for bit
	q  ringstore.Quality
}

func encodeAll(pts []point, boolForm bool) []byte {
	var w bitw
	e := enc{boolForm: boolForm}
	for _, p := range pts {
		e.appendPoint(&w, p.ts, math.Float64frombits(p.v), p.q)
	}
	return w.b
}

func decodeAll(b []byte, n int, boolForm bool) ([]point, error) {
	d := newDec(b, n, boolForm)
	var out []point
	for {
		ts, v, q, ok, err := d.next()
		if err != nil {
			return out, err
		}
		if !ok {
			return out, nil
		}
		out = append(out, point{ts, math.Float64bits(v), q})
	}
}

// A small chunk, byte by byte (the layout in chunk.go):
//
//	p0 1 000 000 µs, good, 1.0: 64 + 8 + 64 bits in full
//	p1 +100 µs (dod 100): '110' 0001100100, same value and quality: '0'
//	p2 +100 µs (dod 0): '0'; changed: '1'; quality same: '0';
//	   x = 1.0^1.5 = 0x0008…: '11', 12 leading zeros 001100, 1 bit (m-1 = 000000), '1'
//	p3 +100 µs: '0'; changed '1'; quality timeout: '1' 00000001; same value '0'
var smallChunk = struct {
	pts  []point
	want []byte
}{
	pts: []point{
		{1_000_000, math.Float64bits(1), ringstore.Good},
		{1_000_100, math.Float64bits(1), ringstore.Good},
		{1_000_200, math.Float64bits(1.5), ringstore.Good},
		{1_000_300, math.Float64bits(1.5), ringstore.Timeout},
	},
	want: []byte{
		0x00, 0x00, 0x00, 0x00, 0x00, 0x0f, 0x42, 0x40, // p0 time
		0x00,                                           // p0 quality
		0x3f, 0xf0, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // p0 value
		// 11000011 00100001 01100110 00000001 01100000 0010(0000)
		0xc3, 0x21, 0x66, 0x01, 0x60, 0x20,
	},
}

func TestChunkBytes(t *testing.T) {
	got := encodeAll(smallChunk.pts, false)
	if !bytes.Equal(got, smallChunk.want) {
		t.Fatalf("encoded\n% x\nwant\n% x", got, smallChunk.want)
	}
	pts, err := decodeAll(smallChunk.want, len(smallChunk.pts), false)
	if err != nil || fmt.Sprint(pts) != fmt.Sprint(smallChunk.pts) {
		t.Fatalf("decoded %v %v, want %v", err, pts, smallChunk.pts)
	}
	// Bool form: a run costs the times and one bit a point.
	bp := []point{{0, 0, ringstore.Good}, {1_000_000, 0, ringstore.Good}, {2_000_000, math.Float64bits(1), ringstore.Good}, {3_000_000, math.Float64bits(1), ringstore.Good}}
	// p1: '111110' + 24-bit dod 1e6, '0'; p2: '0', '1' '0' '1'; p3: '0' '0'
	want := append(make([]byte, 17), 0xf8, 0x3d, 0x09, 0x00, 0xa0)
	got = encodeAll(bp, true)
	if !bytes.Equal(got, want) {
		t.Fatalf("bool chunk\n% x\nwant\n% x", got, want)
	}
	if pts, err := decodeAll(got, 4, true); err != nil || fmt.Sprint(pts) != fmt.Sprint(bp) {
		t.Fatalf("bool chunk decoded %v %v", err, pts)
	}
	// Every truncation is an error, never a panic or a made-up point.
	for n := range len(smallChunk.want) {
		if _, err := decodeAll(smallChunk.want[:n], 4, false); err == nil {
			t.Errorf("%d of %d bytes decoded without an error", n, len(smallChunk.want))
		}
	}
}

// special holds the values that must survive bit for bit.
var special = []uint64{
	0, 1 << 63, // +0, -0
	math.Float64bits(math.Inf(1)), math.Float64bits(math.Inf(-1)),
	math.Float64bits(math.NaN()), 0x7ff0000000000001, 0xfff8deadbeef0001, 0x7ff7ffffffffffff, // NaN payloads, signalling and quiet
	1, math.Float64bits(math.MaxFloat64), math.Float64bits(-math.SmallestNonzeroFloat64),
	math.Float64bits(1), math.Float64bits(21.3), math.Float64bits(21.4), ^uint64(0),
}

// genPoints makes a sequence of one of several shapes: regular polls with
// jitter, irregular and backward times, extreme times, sim-like values, any
// bits, special values, bools, quality changes.
func genPoints(rng *rand.Rand, n int) ([]point, bool) {
	pts := make([]point, n)
	boolForm := rng.IntN(4) == 0
	ts := rng.Int64() - math.MaxInt64/2
	if rng.IntN(8) == 0 {
		ts = []int64{math.MinInt64, math.MaxInt64, 0, -1}[rng.IntN(4)]
	}
	step := []int64{1, 1000, 100_000, 1_000_000, 60_000_000}[rng.IntN(5)]
	v := 20.0 + rng.Float64()
	q := ringstore.Good
	for i := range pts {
		switch rng.IntN(10) {
		case 0:
			ts += rng.Int64() // anything, wrapping
		case 1:
			ts -= rng.Int64N(10 * step) // backwards
		case 2, 3:
			ts += step + rng.Int64N(2000) - 1000 // jitter
		default:
			ts += step
		}
		if rng.IntN(10) == 0 {
			q = ringstore.Quality(rng.IntN(256))
		} else if rng.IntN(5) == 0 {
			q = ringstore.Good
		}
		var bits uint64
		switch {
		case boolForm:
			bits = math.Float64bits(float64(rng.IntN(2)))
			if rng.IntN(3) > 0 && i > 0 {
				bits = pts[i-1].v
			}
		default:
			switch rng.IntN(6) {
			case 0:
				bits = rng.Uint64()
			case 1:
				bits = special[rng.IntN(len(special))]
			case 2:
				if i > 0 {
					bits = pts[i-1].v
				}
			default:
				v += float64(rng.IntN(3)-1) / 10
				bits = math.Float64bits(math.Round(v*10) / 10)
			}
		}
		pts[i] = point{ts, bits, q}
	}
	return pts, boolForm
}

// The same points in, the same points out, bit for bit, for many random
// sequences of every shape.
func TestChunkRoundTrip(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range 3000 {
		pts, bf := genPoints(rng, 1+rng.IntN(300))
		b := encodeAll(pts, bf)
		got, err := decodeAll(b, len(pts), bf)
		if err != nil || len(got) != len(pts) {
			t.Fatalf("case %d: %v, %d of %d points", i, err, len(got), len(pts))
		}
		for j := range pts {
			if got[j] != pts[j] {
				t.Fatalf("case %d point %d: got %+v want %+v", i, j, got[j], pts[j])
			}
		}
	}
}

// The store's raw window against a plain reference: whatever the window,
// the per-tag bound and the RAM budget drop, a raw query returns a suffix
// of what was added, bit for bit (values of points that are not good read
// NaN, as before), and the budget holds.
func TestRawWindowAgainstReference(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for c := range 40 {
		cfg := Config{MaxPoints: 1 << 20, RawWindow: time.Duration(1+rng.IntN(20)) * time.Minute}
		if c%3 == 1 {
			cfg.MaxRAM = int64(4096 + rng.IntN(20000))
		}
		if c%4 == 2 {
			cfg.RawMaxPoints = 20 + rng.IntN(500)
		}
		s := open(t, cfg)
		// the same points without the budget: what the window alone holds
		// (chunk sizes differ by platform), to know when the budget must cut
		free := cfg
		free.MaxRAM = 1 << 30
		sFree := open(t, free)
		refs := map[string][]point{}
		names := []string{"a", "b", "c"}
		ts := at(0)
		for range 3000 + rng.IntN(3000) {
			ts += 50_000 + rng.Int64N(2_000_000)
			for _, tag := range names {
				tts := ts + rng.Int64N(1000)
				if rng.IntN(200) == 0 {
					tts -= rng.Int64N(int64(time.Hour / time.Microsecond)) // a clock step back
				}
				smp := good("d", tag, tts, 20+float64(rng.IntN(50))/10)
				if tag == "c" {
					smp.Bool, smp.Value = true, float64(rng.IntN(2))
				}
				if rng.IntN(20) == 0 {
					smp.Quality = ringstore.Quality(1 + rng.IntN(3))
				}
				if rng.IntN(50) == 0 {
					smp.Value = math.Float64frombits(special[rng.IntN(len(special))])
				}
				s.Add([]ringstore.Sample{smp})
				if cfg.MaxRAM > 0 {
					sFree.Add([]ringstore.Sample{smp})
				}
				refs[tag] = append(refs[tag], point{smp.TS, math.Float64bits(smp.Value), smp.Quality})
			}
		}
		cn := s.Counters()
		s.mu.Lock()
		var sum int64
		sealed := 0
		for _, sr := range s.series {
			sealed += len(sr.raw.sealed)
		}
		if cfg.MaxRAM > 0 && cn.RawBytes > cfg.MaxRAM && sealed > 0 {
			t.Errorf("case %d: %d raw bytes over the budget %d with %d sealed chunks left", c, cn.RawBytes, cfg.MaxRAM, sealed)
		}
		for _, tag := range names {
			sr := s.series[key{"d", tag}]
			r := &sr.raw
			sum += int64(cap(r.head.b))
			for _, ch := range r.sealed {
				sum += ch.size()
			}
			ref := refs[tag]
			want := ref[len(ref)-r.n:]
			var got []point
			it := r.iter()
			for {
				ts, v, q, ok := it.next()
				if !ok {
					break
				}
				got = append(got, point{ts, math.Float64bits(v), q})
			}
			if it.err != nil || len(got) != len(want) {
				t.Fatalf("case %d tag %s: %v, %d points, want %d", c, tag, it.err, len(got), len(want))
			}
			for i := range want {
				if got[i] != want[i] {
					t.Fatalf("case %d tag %s point %d: %+v, want %+v", c, tag, i, got[i], want[i])
				}
			}
			if r.maxPoints > 0 && r.n > r.maxPoints {
				t.Errorf("case %d tag %s: %d points over the bound %d", c, tag, r.n, r.maxPoints)
			}
		}
		if sum != s.rawBytes {
			t.Errorf("case %d: counted %d raw bytes, chunks hold %d", c, s.rawBytes, sum)
		}
		s.mu.Unlock()
		// Through Query: the raw answer from the window's start.
		for _, tag := range names {
			r := &s.series[key{"d", tag}].raw
			ref := refs[tag]
			held := ref[len(ref)-r.n:]
			p := s.rawPoints(s.series[key{"d", tag}], math.MinInt64, math.MaxInt64)
			if p == nil || p.Len() != len(held) {
				t.Fatalf("case %d tag %s: raw query %v, want %d points", c, tag, p, len(held))
			}
			for i, h := range held {
				v := math.Float64frombits(h.v)
				if h.q != ringstore.Good {
					v = math.NaN()
				}
				if p.TS[i] != h.ts || p.Quality[i] != h.q || math.Float64bits(p.Value[i]) != math.Float64bits(v) {
					t.Fatalf("case %d tag %s point %d: %d %v %v, want %+v", c, tag, i, p.TS[i], p.Value[i], p.Quality[i], h)
				}
			}
		}
		if need := sFree.Counters().RawBytes; cfg.MaxRAM > 0 && need > cfg.MaxRAM && cn.RawEvicted == 0 {
			t.Errorf("case %d: budget %d never evicted, though the window alone holds %d bytes", c, cfg.MaxRAM, need)
		}
	}
}

// The decoder takes any bytes and count: an error or points, never a panic;
// points it returns re-encode to a chunk that decodes to the same points.
func FuzzChunkDecode(f *testing.F) {
	f.Add(smallChunk.want, uint16(4), false)
	f.Add([]byte{}, uint16(1), true)
	rng := rand.New(rand.NewPCG(5, 6))
	for range 8 {
		pts, bf := genPoints(rng, 1+rng.IntN(40))
		f.Add(encodeAll(pts, bf), uint16(len(pts)), bf)
	}
	f.Fuzz(func(t *testing.T, b []byte, n uint16, bf bool) {
		pts, err := decodeAll(b, int(n), bf)
		if err != nil {
			return
		}
		if len(pts) != int(n) {
			t.Fatalf("%d points from a count of %d", len(pts), n)
		}
		if bf {
			for _, p := range pts {
				if !fitsBool(math.Float64frombits(p.v)) {
					t.Fatalf("bool chunk gave %x", p.v)
				}
			}
		}
		again, err := decodeAll(encodeAll(pts, bf), len(pts), bf)
		if err != nil || fmt.Sprint(again) != fmt.Sprint(pts) {
			t.Fatalf("re-encoded: %v %v, want %v", err, again, pts)
		}
	})
}
