package wire

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"edgegw/ringstore"
)

func benchSamples(n int, seq0 uint64) []ringstore.Sample {
	samples := make([]ringstore.Sample, n)
	ts := time.Now().UnixMicro()
	for i := range samples {
		samples[i] = ringstore.Sample{Seq: seq0 + uint64(i), Device: fmt.Sprintf("logger-%02d", i/2%48),
			Tag: []string{"temperature", "humidity"}[i%2], Value: 21.5 + float64(i%7)/10, TS: ts + int64(i/2)*1000}
	}
	return samples
}

// Bytes on the wire per sample: a WebSocket frame, the MQTT batch payload
// (the same bytes) and a per-tag payload.
func BenchmarkBatchFrame(b *testing.B) {
	samples := benchSamples(500, 1795987408427661)
	gw, _ := json.Marshal("gw-01")
	var buf []byte
	b.ReportAllocs()
	for b.Loop() {
		buf = AppendBatch(buf[:0], gw, samples, false, nil)
	}
	b.ReportMetric(float64(len(buf))/float64(len(samples)), "B/sample")
	tag := AppendTagPayload(nil, &samples[0], "", false)
	b.ReportMetric(float64(len(tag)), "pertag-B")
}

// The receiver's batch parse (the hot path of `edgegw receive`).
func BenchmarkParseBatch(b *testing.B) {
	samples := make([]ringstore.Sample, 500)
	for i := range samples {
		samples[i] = ringstore.Sample{Seq: uint64(i + 1), Device: fmt.Sprintf("logger-%02d", i/2%48), Tag: "temperature", Value: 21.5, TS: 1764450000123456}
	}
	frame := AppendBatch(nil, []byte(`"gw-01"`), samples, false, nil)
	b.ReportAllocs()
	b.SetBytes(int64(len(frame)))
	for b.Loop() {
		if _, err := ParseBatch(frame, DefaultMaxBatch); err != nil {
			b.Fatal(err)
		}
	}
}

// A local client's hot path: reading one reply without a JSON decoder.
func BenchmarkParseReply48(b *testing.B) {
	s := make([]ringstore.Sample, 48)
	for i := range s {
		s[i] = ringstore.Sample{Seq: 1764450000000000 + uint64(i), Device: "logger-01", Tag: "temperature", Value: 21.5, TS: 1764450000123456}
	}
	body := AppendWSSamples(nil, s[47].Seq, s)
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	var n int
	for b.Loop() {
		_, rest, err := ReadHead(body)
		if err != nil {
			b.Fatal(err)
		}
		_ = EachSample(rest, func(uint64, int64, int) { n++ })
	}
	if n != 48*b.N {
		b.Fatalf("%d samples, want %d", n, 48*b.N)
	}
}

// Per-tag payloads: one for every tag at each round of MQTT publishing.
func BenchmarkTagPayload(b *testing.B) {
	s := benchSamples(1, 1)
	var buf []byte
	b.ReportAllocs()
	for b.Loop() {
		buf = AppendTagPayload(buf[:0], &s[0], "°C", false)
	}
}
