package history

import (
	"testing"
	"time"
)

// A week of a tag's 10-minute buckets, 6 hours of its 1-minute ones and a
// week of a device's health, on the store of TestRAMSim48x2: what a query
// costs to decode.
func BenchmarkQueryBuckets(b *testing.B) {
	s, _ := fillSim48x2(b)
	now := time.Date(2026, 6, 8, 0, 0, 0, 0, time.UTC).UnixMicro()
	week, six := (7 * 24 * time.Hour).Microseconds(), (6 * time.Hour).Microseconds()
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		if p, err := s.Query("logger-07", "temperature", now-week, now-1, 0); err != nil || p.Len() < 500 {
			b.Fatalf("week: %v", err)
		}
		if p, err := s.Query("logger-07", "humidity", now-six, now-1, time.Minute); err != nil || p.Len() != 360 {
			b.Fatalf("6 h: %v", err)
		}
		if p, err := s.Health("logger-07", now-week, now-1, 0); err != nil || p.Len() < 500 {
			b.Fatalf("health: %v", err)
		}
	}
}
