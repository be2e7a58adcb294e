package bench

import (
	"testing"
)

func BenchmarkHistRecord(b *testing.B) {
	var h Hist
	h.Record(1 << 30) // grown once
	b.ReportAllocs()
	v := int64(1)
	for b.Loop() {
		h.Record(v)
		v = (v*31 + 7) & (1<<24 - 1)
	}
}
