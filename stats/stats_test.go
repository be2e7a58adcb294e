package stats

import (
	"math"
	"sync"
	"testing"
	"time"

	"edgegw/internal/testenv"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestHistogramQuantiles(t *testing.T) {
	var h Histogram
	// 90 fast (about 1 ms) and 10 slow (about 40 ms) round trips.
	for i := 0; i < 90; i++ {
		h.Observe(900 * time.Microsecond)
	}
	for i := 0; i < 10; i++ {
		h.Observe(40 * time.Millisecond)
	}
	s := h.Snapshot()
	if s.N != 100 {
		t.Fatalf("n = %d", s.N)
	}
	if p50 := s.Quantile(0.5); p50 < 750 || p50 > 1000 {
		t.Errorf("p50 = %v µs, want inside the 750..1000 µs bucket", p50)
	}
	if p99 := s.Quantile(0.99); p99 < 30000 || p99 > 50000 {
		t.Errorf("p99 = %v µs, want inside the 30..50 ms bucket", p99)
	}
	if (HistogramSnapshot{}).Quantile(0.5) != 0 {
		t.Error("empty histogram quantile not 0")
	}
	var big Histogram
	big.Observe(time.Minute)
	if got := big.Snapshot(); got.Counts[len(BucketBounds)] != 1 || got.Quantile(1) <= BucketBounds[len(BucketBounds)-1] {
		t.Errorf("a minute is not in +Inf: %+v", got)
	}
}

func TestHistogramConcurrent(t *testing.T) {
	var h Histogram
	var wg sync.WaitGroup
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 1000; i++ {
				h.Observe(time.Duration(i) * time.Microsecond)
			}
		}()
	}
	testenv.Wait(t, time.Minute, "4 goroutines × 1000 observations", wg.Wait)
	s := h.Snapshot()
	var sum uint64
	for _, c := range s.Counts {
		sum += c
	}
	if s.N != 4000 || sum != 4000 {
		t.Fatalf("n=%d sum=%d", s.N, sum)
	}
}

func TestRates(t *testing.T) {
	var d Device
	d.Requests.Store(1000)
	d.Responses.Store(990)
	d.Exceptions.Store(5)
	d.Polls.Store(95)
	d.Overruns.Store(3)
	d.Skipped.Store(2)
	d.GoodPolls.Store(90)
	s := d.Snapshot()
	if got := s.LossRate(); math.Abs(got-0.005) > 1e-12 {
		t.Errorf("loss = %v", got)
	}
	if got := s.ValidRate(); math.Abs(got-0.9) > 1e-12 {
		t.Errorf("valid = %v", got)
	}
	if (Snapshot{}).LossRate() != 0 || (Snapshot{}).ValidRate() != 0 {
		t.Error("rates of nothing not 0")
	}
}

func TestUpstreamSnapshotDefaultsOff(t *testing.T) {
	var u Upstream
	if u.Snapshot().Path != PathOff {
		t.Fatal("zero Upstream is not off")
	}
	u.Path.Store(PathMQTT)
	u.QueueSamples.Store(7)
	if s := u.Snapshot(); s.Path != PathMQTT || s.QueueSamples != 7 {
		t.Fatalf("%+v", s)
	}
}

func BenchmarkHistogramObserve(b *testing.B) {
	var h Histogram
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		h.Observe(2 * time.Millisecond)
	}
}

// UnitIndex finds a tag's unit among devices sorted by name, "" for a
// device or tag it does not know.
func TestUnitIndex(t *testing.T) {
	infos := []Info{
		{Name: "a", Tags: []TagInfo{{Name: "t", Unit: "°C"}, {Name: "h", Unit: "%"}}},
		{Name: "b", Tags: []TagInfo{{Name: "t", Unit: "K"}}},
		{Name: "d", Tags: []TagInfo{{Name: "p"}}},
	}
	unit := UnitIndex(len(infos), func(i int) *Info { return &infos[i] })
	for _, c := range []struct{ dev, tag, want string }{
		{"a", "t", "°C"}, {"a", "h", "%"}, {"b", "t", "K"}, {"d", "p", ""},
		{"b", "h", ""}, {"c", "t", ""}, {"", "t", ""}, {"z", "t", ""},
	} {
		if got := unit(c.dev, c.tag); got != c.want {
			t.Errorf("%s/%s: %q, want %q", c.dev, c.tag, got, c.want)
		}
	}
	if got := UnitIndex(0, nil)("a", "t"); got != "" {
		t.Errorf("no devices: %q", got)
	}
}
