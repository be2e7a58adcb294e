package bench

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

func TestHistIndexContiguous(t *testing.T) {
	prev := -1
	for v := uint64(0); v < 1<<16; v++ {
		i := histIndex(v)
		if i != prev && i != prev+1 {
			t.Fatalf("index of %d is %d after %d: not contiguous", v, i, prev)
		}
		lo, hi := histBounds(i)
		if v < lo || v >= hi {
			t.Fatalf("%d not in bucket %d [%d,%d)", v, i, lo, hi)
		}
		prev = i
	}
}

func TestHistQuantileRelativeError(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	var h Hist
	vals := make([]int64, 20000)
	for i := range vals {
		vals[i] = int64(math.Exp(r.Float64() * 16)) // 1 µs .. ~9 s, log-uniform
		h.Record(vals[i])
	}
	slices.Sort(vals)
	for _, q := range []float64{0.01, 0.5, 0.9, 0.95, 0.99, 0.999, 1} {
		rank := int(math.Ceil(q*float64(len(vals)))) - 1
		want := float64(vals[rank])
		got := h.Quantile(q)
		if want < 2*histSub {
			if math.Abs(got-want) > 0.5 {
				t.Errorf("q%.3f = %v, want %v (exact range)", q, got, want)
			}
			continue
		}
		if rel := math.Abs(got-want) / want; rel > 1.0/histSub {
			t.Errorf("q%.3f = %v, want %v: relative error %.4f > %.4f", q, got, want, rel, 1.0/histSub)
		}
	}
	if h.N != uint64(len(vals)) || h.Max != uint64(vals[len(vals)-1]) {
		t.Errorf("N %d Max %d, want %d %d", h.N, h.Max, len(vals), vals[len(vals)-1])
	}
}

func TestHistMerge(t *testing.T) {
	var a, b, all Hist
	for i := int64(0); i < 5000; i++ {
		v := i * i % 100003
		all.Record(v)
		if i%3 == 0 {
			a.Record(v)
		} else {
			b.Record(v)
		}
	}
	a.Merge(&b)
	for _, q := range []float64{0.1, 0.5, 0.99} {
		if a.Quantile(q) != all.Quantile(q) {
			t.Errorf("merged q%v = %v, want %v", q, a.Quantile(q), all.Quantile(q))
		}
	}
	if a.N != all.N || a.Max != all.Max || a.Sum != all.Sum {
		t.Errorf("merged N/Max/Sum %d/%d/%v, want %d/%d/%v", a.N, a.Max, a.Sum, all.N, all.Max, all.Sum)
	}
	var empty Hist
	if empty.Quantile(0.5) != 0 || empty.Mean() != 0 {
		t.Error("empty histogram is not 0")
	}
	empty.Record(-5)
	if empty.Quantile(1) != 0 {
		t.Error("negative value not counted as 0")
	}
}
