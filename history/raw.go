package history

import "edgegw/ringstore"

// raw is one tag's recent samples, oldest first, in a ring that grows by
// half up to max entries (17 bytes each: time, value, quality).
type raw struct {
	ts    []int64
	v     []float64
	q     []ringstore.Quality
	start int // index of the oldest entry
	n     int
	max   int
	// from is the earliest time the ring is complete from: the first sample
	// after the last one dropped (or the series' first sample).
	from  int64
	first int64 // the first sample's time: from == first while nothing was dropped
}

func (r *raw) at(i int) (int64, float64, ringstore.Quality) {
	j := (r.start + i) % len(r.ts)
	return r.ts[j], r.v[j], r.q[j]
}

// add appends a sample and drops those older than keepFrom, or the oldest
// when the ring is full at its maximum.
func (r *raw) add(ts int64, v float64, q ringstore.Quality, keepFrom int64) {
	for r.n > 0 {
		t, _, _ := r.at(0)
		if t >= keepFrom {
			break
		}
		r.drop()
	}
	if r.n == len(r.ts) {
		if r.n < r.max {
			r.grow(min(r.max, max(16, r.n+r.n/2)))
		} else {
			r.drop()
		}
	}
	if r.n == 0 && r.from == 0 {
		r.from, r.first = ts, ts
	}
	j := (r.start + r.n) % len(r.ts)
	r.ts[j], r.v[j], r.q[j] = ts, v, q
	r.n++
}

func (r *raw) drop() {
	r.from = r.ts[r.start] + 1
	r.start = (r.start + 1) % len(r.ts)
	r.n--
}

func (r *raw) grow(size int) {
	ts, v, q := make([]int64, size), make([]float64, size), make([]ringstore.Quality, size)
	for i := 0; i < r.n; i++ {
		ts[i], v[i], q[i] = r.at(i)
	}
	r.ts, r.v, r.q, r.start = ts, v, q, 0
}
