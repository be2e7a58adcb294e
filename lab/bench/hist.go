package bench

import (
	"math"
	"math/bits"
)

// Hist is an HDR-style log-linear histogram of non-negative integer values
// (microseconds here): values below 2·histSub are exact, above that every
// power of two is split into histSub buckets, so any value is known within
// 1/histSub (1.6%) relative error. Histograms merge by adding counts. The
// zero value is ready; not safe for concurrent use (each client owns one).
type Hist struct {
	Counts []uint64 `json:"counts"` // grown on demand; index from histIndex
	N      uint64   `json:"n"`
	Max    uint64   `json:"max"`
	Sum    float64  `json:"sum"`
}

const (
	histSubBits = 6
	histSub     = 1 << histSubBits // buckets per power of two
)

// histIndex maps v to its bucket.
func histIndex(v uint64) int {
	if v < 2*histSub {
		return int(v)
	}
	shift := bits.Len64(v) - (histSubBits + 1)
	return (shift+1)*histSub + int(v>>uint(shift)) - histSub
}

// histBounds is the [lo, hi) range of bucket i.
func histBounds(i int) (lo, hi uint64) {
	if i < 2*histSub {
		return uint64(i), uint64(i) + 1
	}
	shift := uint(i/histSub - 1)
	m := uint64(i%histSub + histSub)
	return m << shift, (m + 1) << shift
}

// Record adds one value; negative values count as 0.
func (h *Hist) Record(v int64) {
	u := uint64(max(v, 0))
	i := histIndex(u)
	if i >= len(h.Counts) {
		h.Counts = append(h.Counts, make([]uint64, i+1-len(h.Counts))...)
	}
	h.Counts[i]++
	h.N++
	h.Sum += float64(u)
	h.Max = max(h.Max, u)
}

// Merge adds o's counts to h.
func (h *Hist) Merge(o *Hist) {
	if len(o.Counts) > len(h.Counts) {
		h.Counts = append(h.Counts, make([]uint64, len(o.Counts)-len(h.Counts))...)
	}
	for i, c := range o.Counts {
		h.Counts[i] += c
	}
	h.N += o.N
	h.Sum += o.Sum
	h.Max = max(h.Max, o.Max)
}

// Quantile returns the q-quantile (0..1): the middle of the bucket holding
// that rank, capped at Max. 0 when empty.
func (h *Hist) Quantile(q float64) float64 {
	if h.N == 0 {
		return 0
	}
	rank := uint64(math.Ceil(q * float64(h.N)))
	rank = min(max(rank, 1), h.N)
	var cum uint64
	for i, c := range h.Counts {
		cum += c
		if cum >= rank {
			lo, hi := histBounds(i)
			mid := float64(lo) + float64(hi-lo-1)/2
			return math.Min(mid, float64(h.Max))
		}
	}
	return float64(h.Max)
}

// Mean is the average value, 0 when empty.
func (h *Hist) Mean() float64 {
	if h.N == 0 {
		return 0
	}
	return h.Sum / float64(h.N)
}
