package history

import (
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"edgegw/ringstore"
	"edgegw/stats"
)

// t0 is a minute boundary: bucket arithmetic below counts from it.
var t0 = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

func at(d time.Duration) int64 { return t0.Add(d).UnixMicro() }

func good(dev, tag string, ts int64, v float64) ringstore.Sample {
	return ringstore.Sample{Device: dev, Tag: tag, Value: v, TS: ts}
}

func bad(dev, tag string, ts int64) ringstore.Sample {
	return ringstore.Sample{Device: dev, Tag: tag, Quality: ringstore.Timeout, TS: ts}
}

func open(t *testing.T, cfg Config) *Store {
	t.Helper()
	s, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func same(a, b float64) bool { return (math.IsNaN(a) && math.IsNaN(b)) || math.Abs(a-b) < 1e-4 }

// Bucket arithmetic: what one minute's polls give as a bucket.
func TestBucketArithmetic(t *testing.T) {
	nan := math.NaN()
	type poll struct {
		sec int     // seconds after t0
		v   float64 // NaN: a bad poll
	}
	cases := []struct {
		name                 string
		polls                []poll
		min, max, mean, last float64
		good, bad            uint32
	}{
		{"one good", []poll{{5, 21.5}}, 21.5, 21.5, 21.5, 21.5, 1, 0},
		{"rising", []poll{{0, 1}, {1, 2}, {2, 3}, {3, 4}}, 1, 4, 2.5, 4, 4, 0},
		{"last is the latest, not the largest", []poll{{0, 9}, {30, -3}, {59, 0}}, -3, 9, 2, 0, 3, 0},
		{"bad polls count but give no value", []poll{{0, 10}, {10, nan}, {20, 20}, {30, nan}}, 10, 20, 15, 20, 2, 2},
		{"only bad polls: a gap", []poll{{0, nan}, {10, nan}}, nan, nan, nan, nan, 0, 2},
		{"negative values", []poll{{0, -1.5}, {1, -0.5}}, -1.5, -0.5, -1, -0.5, 2, 0},
		{"nothing polled: a gap", nil, nan, nan, nan, nan, 0, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := open(t, Config{})
			s.Add([]ringstore.Sample{good("d", "other", at(0), 1)}) // the device exists
			for _, p := range c.polls {
				smp := good("d", "t", at(time.Duration(p.sec)*time.Second), p.v)
				if math.IsNaN(p.v) {
					smp = bad("d", "t", smp.TS)
				}
				s.Add([]ringstore.Sample{smp})
			}
			s.Add([]ringstore.Sample{good("d", "t", at(2*time.Minute), 100)}) // closes the first minute
			p, err := s.Query("d", "t", at(0), at(time.Minute-time.Microsecond), time.Minute)
			if err != nil {
				t.Fatal(err)
			}
			if p.Kind != "buckets" || p.Len() != 1 || p.TS[0] != at(0) {
				t.Fatalf("got %s with %d points %v", p.Kind, p.Len(), p.TS)
			}
			if !same(p.Min[0], c.min) || !same(p.Max[0], c.max) || !same(p.Mean[0], c.mean) || !same(p.Last[0], c.last) ||
				p.Good[0] != c.good || p.Bad[0] != c.bad {
				t.Errorf("min %v max %v mean %v last %v good %d bad %d; want %v %v %v %v %d %d",
					p.Min[0], p.Max[0], p.Mean[0], p.Last[0], p.Good[0], p.Bad[0], c.min, c.max, c.mean, c.last, c.good, c.bad)
			}
		})
	}
}

// Several minutes: every bucket of the range is there, gaps stay gaps, and
// the coarse tier merges the fine buckets exactly (weighted mean).
func TestBucketsGapsAndMerge(t *testing.T) {
	s := open(t, Config{})
	// minute 0: 10 × 1.0; minute 1: nothing (gateway down); minute 2: 5 bad;
	// minute 3: 30 × 4.0; minute 10: one sample (closes the coarse bucket 0..9).
	for i := range 10 {
		s.Add([]ringstore.Sample{good("d", "t", at(time.Duration(i)*time.Second), 1)})
	}
	for i := range 5 {
		s.Add([]ringstore.Sample{bad("d", "t", at(2*time.Minute+time.Duration(i)*time.Second))})
	}
	for i := range 30 {
		s.Add([]ringstore.Sample{good("d", "t", at(3*time.Minute+time.Duration(i)*time.Second), 4)})
	}
	s.Add([]ringstore.Sample{good("d", "t", at(10*time.Minute), 7)})

	p, err := s.Query("d", "t", at(0), at(4*time.Minute-1), time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	wantMean := []float64{1, math.NaN(), math.NaN(), 4}
	wantGood := []uint32{10, 0, 0, 30}
	wantBad := []uint32{0, 0, 5, 0}
	if p.Len() != 4 {
		t.Fatalf("%d points, want 4: %v", p.Len(), p.TS)
	}
	for i := range 4 {
		if p.TS[i] != at(time.Duration(i)*time.Minute) || !same(p.Mean[i], wantMean[i]) || p.Good[i] != wantGood[i] || p.Bad[i] != wantBad[i] {
			t.Errorf("bucket %d: ts %d mean %v good %d bad %d; want %d %v %d %d", i, p.TS[i], p.Mean[i], p.Good[i], p.Bad[i],
				at(time.Duration(i)*time.Minute), wantMean[i], wantGood[i], wantBad[i])
		}
	}
	// Two-minute points merge pairs: (0,1) and (2,3).
	p, err = s.Query("d", "t", at(0), at(4*time.Minute-1), 2*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if p.Len() != 2 || !same(p.Mean[0], 1) || !same(p.Mean[1], 4) || p.Good[1] != 30 || p.Bad[1] != 5 {
		t.Errorf("2-min points: mean %v good %v bad %v", p.Mean, p.Good, p.Bad)
	}
	// The coarse bucket 0..10 min: mean (10×1 + 30×4) / 40 = 3.25.
	p, err = s.Query("d", "t", at(0), at(10*time.Minute-1), 10*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if p.Len() != 1 || !same(p.Mean[0], 3.25) || !same(p.Min[0], 1) || !same(p.Max[0], 4) || !same(p.Last[0], 4) ||
		p.Good[0] != 40 || p.Bad[0] != 5 {
		t.Errorf("coarse: %+v", p)
	}
	// The open bucket (minute 10) is the last point of a range that reaches now.
	p, err = s.Query("d", "t", at(9*time.Minute), at(10*time.Minute+30*time.Second), time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if p.Len() != 2 || !math.IsNaN(p.Mean[0]) || !same(p.Last[1], 7) {
		t.Errorf("open bucket: mean %v last %v", p.Mean, p.Last)
	}
}

// Tick closes the bucket of a tag that stopped getting samples, and keeps
// a late sample out of a closed bucket.
func TestTickClosesAndLate(t *testing.T) {
	s := open(t, Config{})
	s.Add([]ringstore.Sample{good("d", "t", at(10*time.Second), 5)})
	s.Tick(t0.Add(time.Minute + 50*time.Millisecond))
	if c, ok := s.series[key{"d", "t"}].fine.get(floorDiv(at(0), s.step)); !ok || c.good != 1 {
		t.Fatalf("minute 0 not closed by the tick: %+v %v", c, ok)
	}
	s.Add([]ringstore.Sample{good("d", "t", at(20*time.Second), 99)}) // its minute is closed
	if s.Counters().Late != 1 {
		t.Errorf("late = %d, want 1", s.Counters().Late)
	}
	p, _ := s.Query("d", "t", at(0), at(time.Minute-1), time.Minute)
	if p.Good[0] != 1 || !same(p.Max[0], 5) {
		t.Errorf("a late sample changed a closed bucket: %+v", p)
	}
}

// Raw for short ranges, buckets for long ones, and the point bound.
func TestQueryKindsAndBounds(t *testing.T) {
	s := open(t, Config{MaxPoints: 100})
	for i := range 600 { // 10 minutes at 1 s
		s.Add([]ringstore.Sample{good("d", "t", at(time.Duration(i)*time.Second), float64(i))})
	}
	p, err := s.Query("d", "t", at(9*time.Minute), at(10*time.Minute), 0)
	if err != nil || p.Kind != "raw" || p.Len() != 60 || p.Value[0] != 540 {
		t.Fatalf("last minute: %v %s %d", err, p.Kind, p.Len())
	}
	p, err = s.Query("d", "t", at(0), at(10*time.Minute), 0) // 600 raw > 100: buckets
	if err != nil || p.Kind != "buckets" || p.Len() != 11 || p.Step != time.Minute {
		t.Fatalf("10 minutes: %v %+v", err, p)
	}
	p, err = s.Query("d", "t", at(-7*24*time.Hour), at(10*time.Minute), 0) // a week: coarse, within 100 points
	if err != nil || p.Kind != "buckets" || p.Len() > 100 || p.Step%(10*time.Minute) != 0 {
		t.Fatalf("a week: %v %s %d points of %v", err, p.Kind, p.Len(), p.Step)
	}
	for _, c := range []struct {
		from, to int64
		step     time.Duration
		want     error
	}{
		{at(time.Minute), at(0), 0, ErrRange},
		{at(0), at(200 * time.Minute), time.Minute, ErrTooMany},
		{at(0), at(time.Hour), time.Second, ErrBadStep},
		{at(0), at(time.Hour), -time.Minute, ErrBadStep},
	} {
		if _, err := s.Query("d", "t", c.from, c.to, c.step); !errors.Is(err, c.want) {
			t.Errorf("Query(%d, %d, %v) = %v, want %v", c.from, c.to, c.step, err, c.want)
		}
	}
	if _, err := s.Query("d", "nope", at(0), at(1), 0); !errors.Is(err, ErrUnknown) {
		t.Errorf("unknown tag: %v", err)
	}
	// Raw values: a bad sample is NaN with its quality.
	s.Add([]ringstore.Sample{bad("d", "t", at(10*time.Minute+time.Second))})
	p, _ = s.Query("d", "t", at(10*time.Minute), at(11*time.Minute), 0)
	if p.Kind != "raw" || p.Len() != 1 || !math.IsNaN(p.Value[0]) || p.Quality[0] != ringstore.Timeout {
		t.Errorf("bad raw sample: %+v", p)
	}
	// The raw window is bounded in time and in points.
	s2 := open(t, Config{RawMaxPoints: 50, RawWindow: time.Minute})
	for i := range 300 {
		s2.Add([]ringstore.Sample{good("d", "t", at(time.Duration(i)*time.Second), 1)})
	}
	// Whole chunks of a quarter of the bound drop: between 38 and 50 stay.
	if r := s2.series[key{"d", "t"}].raw; r.n > 50 || r.n <= 50-50/4 {
		t.Errorf("raw window holds %d points, want 38..50", r.n)
	}
	r := &s2.series[key{"d", "t"}].raw
	if p, err := s2.Query("d", "t", r.from, at(300*time.Second), 0); err != nil || p.Kind != "raw" || p.Len() != r.n || p.TS[p.Len()-1] != at(299*time.Second) {
		t.Errorf("raw query after drops: %v %+v", err, p)
	}
}

// deviceFake gives Tick device records that the test moves on.
type deviceFake struct{ entries []stats.Entry }

func (f *deviceFake) Devices() []stats.Entry { return f.entries }

func newFleet(n int) *deviceFake {
	f := &deviceFake{}
	for i := range n {
		f.entries = append(f.entries, stats.Entry{Info: stats.Info{Name: fmt.Sprintf("logger-%02d", i+1), Interval: time.Second}, Stats: new(stats.Device)})
	}
	return f
}

// Health per bucket from the device records: valid rate and RTT; a device
// that never answered has no RTT (NaN, not 0).
func TestHealth(t *testing.T) {
	f := newFleet(2)
	s := open(t, Config{Devices: f.Devices})
	s.Tick(t0)
	ok, dead := f.entries[0].Stats, f.entries[1].Stats
	for range 60 {
		ok.Polls.Add(1)
		ok.GoodPolls.Add(1)
		ok.RTT.Observe(400 * time.Microsecond)
		dead.Polls.Add(1)
	}
	ok.Overruns.Add(3)
	s.Tick(t0.Add(time.Minute))
	p, err := s.Health("logger-01", at(0), at(time.Minute-1), 0)
	if err != nil || p.Kind != "health" || p.Len() != 1 {
		t.Fatalf("%v %+v", err, p)
	}
	if p.Polls[0] != 63 || p.Good[0] != 60 || !same(p.ValidRate[0], 60.0/63) || !same(p.RTTMeanUS[0], 400) || p.RTTP99US[0] < 300 || p.RTTP99US[0] > 500 {
		t.Errorf("logger-01: %+v", p)
	}
	p, _ = s.Health("logger-02", at(0), at(time.Minute-1), 0)
	if p.Polls[0] != 60 || p.ValidRate[0] != 0 || !math.IsNaN(p.RTTMeanUS[0]) {
		t.Errorf("logger-02 (dead): %+v", p)
	}
	if _, err := s.Health("nope", at(0), at(1), 0); !errors.Is(err, ErrUnknown) {
		t.Errorf("unknown device: %v", err)
	}
}

// feedHour runs an hour of 48 loggers × 2 tags at 1 s through s, ticking
// and flushing at every minute as Run does; start is a minute boundary.
func feedHour(t *testing.T, s *Store, f *deviceFake, start time.Time) {
	t.Helper()
	batch := make([]ringstore.Sample, 2)
	for sec := range 3600 {
		ts := start.Add(time.Duration(sec)*time.Second + 300*time.Millisecond)
		for _, e := range f.entries {
			batch[0] = good(e.Info.Name, "temperature", ts.UnixMicro(), 20+float64(sec%7))
			batch[1] = good(e.Info.Name, "humidity", ts.UnixMicro(), 40+float64(sec%11))
			s.Add(batch)
			e.Stats.Polls.Add(1)
			e.Stats.GoodPolls.Add(1)
			e.Stats.RTT.Observe(time.Millisecond)
		}
		if sec%60 == 59 {
			s.Tick(start.Add(time.Duration(sec+1) * time.Second))
			if err := s.Flush(); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// BytesPerHour48x2 is the figure the README states for 48 loggers × 2 tags:
// 60 batches of 96 tag buckets (27 B) and 48 health buckets (23 B), 8 B of
// framing each, plus one file header and the id table.
const BytesPerHour48x2 = 60*(96*27+48*23+8) + 16 + 96*25 + 48*14

// A restart with a directory keeps the closed buckets; the bytes written
// in an hour stay within 2× of the stated figure.
func TestRestartKeepsBucketsAndFlashBytes(t *testing.T) {
	dir := t.TempDir()
	f := newFleet(48)
	start := time.Now().Truncate(time.Hour).Add(-2 * time.Hour)
	s, err := Open(Config{Dir: dir, Devices: f.Devices})
	if err != nil {
		t.Fatal(err)
	}
	s.Tick(start)
	feedHour(t, s, f, start)
	written := s.Counters().BytesWritten
	var onDisk int64
	files, _ := filepath.Glob(filepath.Join(dir, "*"))
	for _, name := range files {
		st, err := os.Stat(name)
		if err != nil {
			t.Fatal(err)
		}
		onDisk += st.Size()
	}
	t.Logf("48 loggers × 2 tags at 1 s: %d bytes written in an hour (%d on disk in %d files); stated %d", written, onDisk, len(files), BytesPerHour48x2)
	if int64(written) != onDisk {
		t.Errorf("counted %d bytes written, files hold %d", written, onDisk)
	}
	if written > 2*BytesPerHour48x2 || written < BytesPerHour48x2/2 {
		t.Errorf("%d bytes an hour, not within 2× of the stated %d", written, BytesPerHour48x2)
	}
	before, err := s.Query("logger-07", "humidity", start.UnixMicro(), start.Add(time.Hour-1).UnixMicro(), time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	hBefore, err := s.Health("logger-07", start.UnixMicro(), start.Add(time.Hour-1).UnixMicro(), time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	// A torn batch at the tail (power loss in the middle of a write) is cut.
	if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("h-%d.hist", time.Now().UnixNano())),
		append([]byte(fileMagic+"\x00\x00\x00\x00\x00\x00\x00\x00"), 9, 9, 9), 0o644); err != nil {
		t.Fatal(err)
	}
	s2 := open(t, Config{Dir: dir, Devices: f.Devices})
	after, err := s2.Query("logger-07", "humidity", start.UnixMicro(), start.Add(time.Hour-1).UnixMicro(), time.Minute)
	if err != nil {
		t.Fatalf("after restart: %v", err)
	}
	if after.Len() != 60 || before.Len() != 60 {
		t.Fatalf("%d points before, %d after", before.Len(), after.Len())
	}
	for i := range 60 {
		if after.Good[i] != 60 || after.Good[i] != before.Good[i] || !same(after.Mean[i], before.Mean[i]) ||
			!same(after.Min[i], before.Min[i]) || !same(after.Max[i], before.Max[i]) || !same(after.Last[i], before.Last[i]) {
			t.Fatalf("minute %d: before %v/%v/%v/%d after %v/%v/%v/%d", i, before.Min[i], before.Mean[i], before.Max[i], before.Good[i],
				after.Min[i], after.Mean[i], after.Max[i], after.Good[i])
		}
	}
	hAfter, err := s2.Health("logger-07", start.UnixMicro(), start.Add(time.Hour-1).UnixMicro(), time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 60 {
		if hAfter.Polls[i] != hBefore.Polls[i] || !same(hAfter.RTTMeanUS[i], hBefore.RTTMeanUS[i]) {
			t.Fatalf("health minute %d: before %d/%v after %d/%v", i, hBefore.Polls[i], hBefore.RTTMeanUS[i], hAfter.Polls[i], hAfter.RTTMeanUS[i])
		}
	}
	// The coarse tier is rebuilt from the fine buckets read back.
	c, err := s2.Query("logger-07", "humidity", start.UnixMicro(), start.Add(time.Hour-1).UnixMicro(), 10*time.Minute)
	if err != nil || c.Len() != 6 || c.Good[0] != 600 {
		t.Fatalf("coarse after restart: %v %+v", err, c)
	}
}

// RAM of the history for 48 loggers × 2 tags with every tier full: the raw
// window at 1 s, 6 h of fine and 7 days of coarse buckets per tag and device.
func TestRAMBound48x2(t *testing.T) {
	f := newFleet(48)
	var m0, m1 runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&m0)
	s := open(t, Config{Devices: f.Devices})
	start := t0
	for sec := range 600 {
		ts := start.Add(time.Duration(sec) * time.Second).UnixMicro()
		for _, e := range f.entries {
			s.Add([]ringstore.Sample{good(e.Info.Name, "temperature", ts, 1), good(e.Info.Name, "humidity", ts, 2)})
		}
	}
	s.Tick(start)
	s.Tick(start.Add(time.Minute))
	s.mu.Lock()
	for _, sr := range s.series { // every tier allocated, as after a week
		sr.fine.put(sr.open.idx+1, cell{good: 1})
		sr.coarse.put(sr.open.idx, cell{good: 1})
	}
	for _, d := range s.devices {
		d.coarse.put(1, hcell{sched: 1})
	}
	s.mu.Unlock()
	runtime.GC()
	runtime.ReadMemStats(&m1)
	used := int64(m1.HeapAlloc) - int64(m0.HeapAlloc)
	t.Logf("history RAM for 48 loggers × 2 tags (raw 10 min at 1 s, 6 h fine, 7 d coarse): %.2f MB", float64(used)/1e6)
	if used > 10e6 {
		t.Errorf("history uses %d bytes for 48 × 2, over 10 MB", used)
	}
	runtime.KeepAlive(s)
}

// Add is in every poll's path (through main's tee): one poll of a device
// with 2 tags, against a store holding 48 × 2 series.
func BenchmarkAdd(b *testing.B) {
	s, err := Open(Config{})
	if err != nil {
		b.Fatal(err)
	}
	names := make([]string, 48)
	for i := range names {
		names[i] = fmt.Sprintf("logger-%02d", i+1)
	}
	batch := make([]ringstore.Sample, 2)
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		ts := at(time.Duration(i/48) * time.Second)
		dev := names[i%48]
		batch[0] = good(dev, "temperature", ts, float64(i%100))
		batch[1] = good(dev, "humidity", ts, float64(i%50))
		s.Add(batch)
	}
}

// A directory that cannot be created (here its parent is a file; on site a
// card remounted read-only) does not stop the store: it opens, keeps the
// buckets in RAM, counts the failed writes, and writes again once the
// directory can be made; a restart reads back what was written then.
func TestUnwritableDirKeepsRunning(t *testing.T) {
	base := t.TempDir()
	blocker := filepath.Join(base, "data")
	if err := os.WriteFile(blocker, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(blocker, "history")
	f := newFleet(2)
	start := time.Now().Truncate(time.Hour).Add(-2 * time.Hour)
	s := open(t, Config{Dir: dir, Devices: f.Devices})
	s.Tick(start)
	feed := func(from, to int) error {
		batch := make([]ringstore.Sample, 1)
		for sec := from; sec < to; sec++ {
			for _, e := range f.entries {
				batch[0] = good(e.Info.Name, "temperature", start.Add(time.Duration(sec)*time.Second+300*time.Millisecond).UnixMicro(), float64(sec))
				s.Add(batch)
			}
		}
		s.Tick(start.Add(time.Duration(to) * time.Second))
		return s.Flush()
	}
	if err := feed(0, 60); err == nil {
		t.Fatal("a write under a file succeeded")
	}
	c := s.Counters()
	if c.WriteErrors != 1 || c.Dropped == 0 {
		t.Fatalf("counters after a failed write: %+v", c)
	}
	if q, err := s.Query("logger-01", "temperature", start.UnixMicro(), start.Add(time.Minute-1).UnixMicro(), time.Minute); err != nil || q.Len() != 1 || q.Good[0] != 60 {
		t.Fatalf("RAM lost the minute the disk refused: %v %+v", err, q)
	}
	if err := os.Remove(blocker); err != nil {
		t.Fatal(err)
	}
	if err := feed(60, 120); err != nil {
		t.Fatalf("write once the directory can be made: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s2 := open(t, Config{Dir: dir, Devices: f.Devices})
	q, err := s2.Query("logger-01", "temperature", start.Add(time.Minute).UnixMicro(), start.Add(2*time.Minute-1).UnixMicro(), time.Minute)
	if err != nil || q.Len() != 1 || q.Good[0] != 60 {
		t.Fatalf("minute written after the disk came back, read back: %v %+v", err, q)
	}
}
