package bench

import (
	"testing"

	"edgegw/ringstore"
)

// The clients' hot path: reading one reply without a JSON decoder.
func BenchmarkParseReply48(b *testing.B) {
	s := make([]ringstore.Sample, 48)
	for i := range s {
		s[i] = ringstore.Sample{Seq: uint64(1764450000000000 + i), Device: "logger-01", Tag: "temperature", Value: 21.5, TS: 1764450000123456}
	}
	body := appendFrame(nil, s[47].Seq, s)
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	var n int
	for b.Loop() {
		_, rest, err := parseHead(body)
		if err != nil {
			b.Fatal(err)
		}
		_ = eachSample(rest, func(uint64, int64, int) { n++ })
	}
	if n != 48*b.N {
		b.Fatalf("%d samples, want %d", n, 48*b.N)
	}
}

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
