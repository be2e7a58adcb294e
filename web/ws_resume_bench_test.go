package web

import (
	"bytes"
	"fmt"
	"testing"
	"time"
)

// BenchmarkWSResume5760: one client resumes from the start of a full ring
// of 5,760 samples (48 loggers × 2 tags × 60 s) over loopback and reads
// every sample; B/op is what the server allocates for it, and the client's
// message buffers.
func BenchmarkWSResume5760(b *testing.B) {
	const size = 5760
	ring := newRing(b, size)
	ts := startServer(b, Config{Ring: ring})
	for i := 0; i < size/2; i++ {
		appendBatch(b, ring, fmt.Sprintf("logger-%02d", i%48), 2, float64(i))
	}
	first := ring.Seq() - size + 1
	c := dialWS(b, ts.wsURL, nil)
	mustFrame(b, c)
	b.ReportAllocs()
	for b.Loop() {
		if err := c.WriteJSON(map[string]uint64{"lastSequence": first - 1}); err != nil {
			b.Fatal(err)
		}
		for got := 0; got < size; {
			_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
			_, msg, err := c.ReadMessage()
			if err != nil || !bytes.HasPrefix(msg, []byte(`{"type":"samples"`)) {
				b.Fatalf("resume: %.40q after %d samples: %v", msg, got, err)
			}
			got += bytes.Count(msg, []byte(`{"seq":`)) // the client does not decode: B/op is mostly the server's
		}
	}
}
