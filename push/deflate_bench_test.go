package push

import (
	"compress/flate"
	"fmt"
	"io"
	"testing"

	"edgegw/ringstore"
	"edgegw/wire"
)

// BenchmarkDeflateBatch is the CPU a batch of one second of the soak's
// load (48 loggers × 2 tags) costs to deflate alone, as gorilla does per
// message without context takeover, at its default level (1) and at the
// level the uplink sets (flate.BestCompression).
func BenchmarkDeflateBatch(b *testing.B) {
	var s []ringstore.Sample
	for d := range 48 {
		for k, tag := range []string{"temperature", "humidity"} {
			s = append(s, ringstore.Sample{Seq: uint64(1_000_000 + 2*d + k), Epoch: 0x9f3c04e1a2b3c4d5, Device: fmt.Sprintf("logger-%02d", d+1),
				Tag: tag, Value: float64(200+d*3+k*171) / 10, TS: 1764450000000000 + int64(d)*1500})
		}
	}
	frame := wire.AppendBatch(nil, []byte(`"gw-01"`), s, false, nil)
	for _, level := range []int{1, flate.BestCompression} {
		b.Run(fmt.Sprintf("level%d", level), func(b *testing.B) {
			w, _ := flate.NewWriter(io.Discard, level)
			b.SetBytes(int64(len(frame)))
			b.ReportAllocs()
			for b.Loop() {
				w.Reset(io.Discard)
				_, _ = w.Write(frame)
				_ = w.Flush()
			}
		})
	}
}
