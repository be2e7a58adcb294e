package history

import (
	"encoding/json"
	"math"
	"math/rand/v2"
	"os"
	"runtime"
	"testing"
	"time"
	"unsafe"

	"edgegw/lab/sim"
	"edgegw/ringstore"
)

// simFleet gives the values of the lab's simulated loggers (the demo's
// temperature and humidity models) at any time, without polling.
type simFleet struct {
	f   *sim.Fleet
	now time.Time
}

func newSimFleet(t testing.TB, n int) *simFleet {
	sf := &simFleet{}
	f, err := sim.NewFleet(sim.Config{Devices: n, Seed: 27, Clock: func() time.Time { return sf.now }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	sf.f = f
	return sf
}

// values returns logger i's temperature (°C) and humidity (%RH) at ts, as
// edge decodes them (int16 and uint16 with scale 0.1: raw / 10).
func (sf *simFleet) values(i int, ts time.Time) (float64, float64) {
	sf.now = ts
	r := sf.f.Logger(i).Holding(0, 2)
	return float64(int16(r[0])) / 10, float64(r[1]) / 10
}

// ramFigures is what TestRAMSim48x2 measures.
type ramFigures struct {
	heap          int64 // heap delta of the whole store, every tier full
	rawBytes      int64 // the raw chunks with their overhead
	rawEncoded    int64 // the chunks' encoded bytes alone
	rawPoints     int
	fineCells     int // bytes of fine and coarse tag buckets
	healthCells   int
	series, devrs int
}

// fillSim48x2 builds the history of 48 simulated loggers × 2 tags with
// every tier full: a week at one poll every 30 s (the buckets), then the
// raw window's 10 minutes at 1 s. Times carry the jitter of a real poll
// (edge stamps each sample when its answer is in): the tick plus
// 200..1200 µs. The health records see one RTT of 200..1200 µs a poll.
func fillSim48x2(t testing.TB) (*Store, ramFigures) {
	const n = 48
	sf := newSimFleet(t, n)
	rng := rand.New(rand.NewPCG(27, 1))
	fleet := newFleet(n)
	var m0, m1 runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&m0)
	s, err := Open(Config{Devices: fleet.Devices})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Date(2026, 6, 1, 0, 0, 0, 0, time.UTC)
	end := start.Add(7 * 24 * time.Hour)
	batch := make([]ringstore.Sample, 2)
	poll := func(i int, tick time.Time) {
		jit := time.Duration(200+rng.IntN(1000)) * time.Microsecond
		ts := tick.Add(jit)
		temp, hum := sf.values(i, ts)
		name := fleet.entries[i].Info.Name
		batch[0] = ringstore.Sample{Device: name, Tag: "temperature", Value: temp, TS: ts.UnixMicro()}
		batch[1] = ringstore.Sample{Device: name, Tag: "humidity", Value: hum, TS: ts.UnixMicro()}
		s.Add(batch)
		d := fleet.entries[i].Stats
		d.Polls.Add(1)
		d.GoodPolls.Add(1)
		d.RTT.Observe(jit)
	}
	s.Tick(start)
	rawFrom := end.Add(-DefaultRawWindow)
	for tick := start; tick.Before(end); {
		step := 30 * time.Second
		if !tick.Before(rawFrom) {
			step = time.Second
		}
		for i := range n {
			poll(i, tick)
		}
		next := tick.Add(step)
		if next.Truncate(time.Minute) != tick.Truncate(time.Minute) {
			s.Tick(next.Truncate(time.Minute))
		}
		tick = next
	}
	runtime.GC()
	runtime.ReadMemStats(&m1)
	fg := ramFigures{heap: int64(m1.HeapAlloc) - int64(m0.HeapAlloc)}
	s.mu.Lock()
	fg.rawBytes = s.rawBytes
	for _, sr := range s.series {
		fg.rawPoints += sr.raw.n
		fg.rawEncoded += int64(len(sr.raw.head.b))
		for _, c := range sr.raw.sealed {
			fg.rawEncoded += int64(len(c.b))
		}
		fg.fineCells += sr.fine.bytes() + sr.coarse.bytes()
	}
	for _, d := range s.devices {
		fg.healthCells += d.fine.bytes() + d.coarse.bytes()
	}
	fg.series, fg.devrs = len(s.series), len(s.devices)
	s.mu.Unlock()
	return s, fg
}

// RAM of the history for 48 loggers × 2 tags with every tier full, on the
// simulated loggers' values: `go test -run RAMSim -v ./history` prints the
// figures docs/BENCHMARKS.md quotes. Goals: ≤ 3 bytes a raw point, ≤ 2 MB
// in all (4.1 MB while the buckets were plain cells, 1.7 MB with them in
// encoded blocks).
func TestRAMSim48x2(t *testing.T) {
	s, fg := fillSim48x2(t)
	defer runtime.KeepAlive(s)
	if fg.series != 96 || fg.devrs != 48 {
		t.Fatalf("%d series, %d devices", fg.series, fg.devrs)
	}
	// The raw window holds its whole 10 minutes: 601 or 600 points a tag.
	if fg.rawPoints < 96*600 {
		t.Errorf("raw window holds %d points, want the 10 minutes: ≥ %d", fg.rawPoints, 96*600)
	}
	bpp := float64(fg.rawBytes) / float64(fg.rawPoints)
	t.Logf("raw window: %d points, %d bytes encoded (%.2f bytes a point), %d with chunk overhead (%.2f bytes a point)",
		fg.rawPoints, fg.rawEncoded, float64(fg.rawEncoded)/float64(fg.rawPoints), fg.rawBytes, bpp)
	t.Logf("buckets: tags %d bytes, device health %d bytes", fg.fineCells, fg.healthCells)
	t.Logf("history RAM for 48 loggers × 2 tags, every tier full (heap delta): %.3f MB", float64(fg.heap)/1e6)
	if bpp > 3 {
		t.Errorf("%.2f bytes a raw point, over 3", bpp)
	}
	if fg.heap > 2e6 {
		t.Errorf("history uses %d bytes for 48 × 2, over 2 MB", fg.heap)
	}
	// The figures are what queries read back: a raw minute, a bucketed week.
	now := time.Date(2026, 6, 8, 0, 0, 0, 0, time.UTC)
	p, err := s.Query("logger-07", "temperature", now.Add(-time.Minute).UnixMicro(), now.UnixMicro(), 0)
	if err != nil || p.Kind != "raw" || p.Len() != 60 || math.IsNaN(p.Value[0]) || p.Value[0] < 10 || p.Value[0] > 35 {
		t.Fatalf("raw minute: %v %+v", err, p)
	}
	p, err = s.Query("logger-07", "humidity", now.Add(-7*24*time.Hour).UnixMicro(), now.UnixMicro()-1, 0)
	if err != nil || p.Kind != "buckets" || p.Len() < 500 || p.Good[1] == 0 {
		t.Fatalf("a week: %v %s %d", err, p.Kind, p.Len())
	}
}

// bytes is the RAM of the tier's cells: the hot block, the ring of blocks
// and the encoded blocks.
func (t *tier[C]) bytes() int {
	var z C
	n := cap(t.hot)*int(unsafe.Sizeof(z)) + cap(t.blocks)*int(unsafe.Sizeof(block{}))
	for _, b := range t.blocks {
		n += cap(b.b)
	}
	return n
}

// Bytes a raw point on points a running gateway recorded: set
// EDGEGW_HISTORY_REPLAY to a JSON array of {"device", "tag", "ts", "value",
// "quality"} (the columns of /api/history's raw answers, e.g. of every tag
// of `edgegw demo`). The points go through Add; the raw window must give
// them back and the test prints what they cost.
func TestRAMReplay(t *testing.T) {
	path := os.Getenv("EDGEGW_HISTORY_REPLAY")
	if path == "" {
		t.Skip("EDGEGW_HISTORY_REPLAY is not set")
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var tags []struct {
		Device, Tag string
		TS          []int64
		Value       []*float64
		Quality     []string
	}
	if err := json.Unmarshal(b, &tags); err != nil {
		t.Fatal(err)
	}
	s := open(t, Config{MaxPoints: 1 << 20})
	quality := map[string]ringstore.Quality{"good": ringstore.Good, "timeout": ringstore.Timeout, "error": ringstore.Error, "stale": ringstore.Stale}
	points := 0
	for _, tg := range tags {
		for i, ts := range tg.TS {
			smp := ringstore.Sample{Device: tg.Device, Tag: tg.Tag, TS: ts, Quality: quality[tg.Quality[i]]}
			if tg.Value[i] != nil {
				smp.Value = *tg.Value[i]
			}
			s.Add([]ringstore.Sample{smp})
			points++
		}
	}
	s.mu.Lock()
	var enc int64
	held := 0
	for _, sr := range s.series {
		held += sr.raw.n
		enc += int64(len(sr.raw.head.b))
		for _, c := range sr.raw.sealed {
			enc += int64(len(c.b))
		}
	}
	rb := s.rawBytes
	s.mu.Unlock()
	if held != points {
		t.Fatalf("the raw window holds %d of %d points", held, points)
	}
	for _, tg := range tags {
		p, err := s.Query(tg.Device, tg.Tag, tg.TS[0], tg.TS[len(tg.TS)-1], 0)
		if err != nil || p.Kind != "raw" || p.Len() != len(tg.TS) {
			t.Fatalf("%s/%s: %v, %d of %d points", tg.Device, tg.Tag, err, p.Len(), len(tg.TS))
		}
		for i := range tg.TS {
			if p.TS[i] != tg.TS[i] || (tg.Value[i] != nil && p.Value[i] != *tg.Value[i]) {
				t.Fatalf("%s/%s point %d: %d %v, want %d %v", tg.Device, tg.Tag, i, p.TS[i], p.Value[i], tg.TS[i], *tg.Value[i])
			}
		}
	}
	t.Logf("%d tags, %d points: %.2f bytes a point encoded, %.2f with the chunks' overhead", len(tags), points,
		float64(enc)/float64(points), float64(rb)/float64(points))
}
