package spool

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"log/slog"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"edgegw/internal/testenv"
	"edgegw/ringstore"
)

// mkBatch makes one poll of device d: n tags, consecutive seqs from first.
func mkBatch(first uint64, d, n int) []ringstore.Sample {
	b := make([]ringstore.Sample, n)
	for i := range b {
		seq := first + uint64(i)
		b[i] = ringstore.Sample{Seq: seq, Device: fmt.Sprintf("logger-%02d", d), Tag: fmt.Sprintf("tag-%d", i),
			Value: float64(seq%1000) / 10, TS: 1764450000000000 + int64(seq/uint64(n))*1000}
	}
	return b
}

// appendN appends samples 1..n in polls of 2 tags.
func appendN(q *Queue, from, n uint64) {
	for s := from; s < from+n; s += 2 {
		k := 2
		if s+1 >= from+n {
			k = int(from + n - s)
		}
		q.Append(mkBatch(s, int(s%48), k))
	}
}

func peekAll(t *testing.T, q *Queue) []ringstore.Sample {
	t.Helper()
	var all []ringstore.Sample
	after := uint64(0)
	for {
		b := q.PeekAfter(after, 333, nil)
		if len(b) == 0 {
			return all
		}
		all = append(all, b...)
		after = b[len(b)-1].Seq
	}
}

func checkSeqs(t *testing.T, got []ringstore.Sample, from, to uint64) {
	t.Helper()
	if uint64(len(got)) != to-from+1 {
		t.Fatalf("got %d samples, want %d (%d..%d)", len(got), to-from+1, from, to)
	}
	for i, s := range got {
		if s.Seq != from+uint64(i) {
			t.Fatalf("sample %d: seq %d, want %d", i, s.Seq, from+uint64(i))
		}
	}
}

// oneSegment is the only segment file in dir and its bytes.
func oneSegment(t *testing.T, dir string) (string, []byte) {
	t.Helper()
	m, _ := filepath.Glob(filepath.Join(dir, "*"+segSuffix))
	if len(m) != 1 {
		t.Fatalf("segments %v", m)
	}
	b, err := os.ReadFile(m[0])
	if err != nil {
		t.Fatal(err)
	}
	return m[0], b
}

// diskOf is q's disk store, for a test's fault or look inside.
func diskOf(q *Queue) *diskStore { return q.st.(*diskStore) }

func openQ(t *testing.T, cfg Config) *Queue {
	t.Helper()
	q, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return q
}

// runQ runs the writer until the test ends (or stop is called).
func runQ(t testing.TB, q *Queue) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- q.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := testenv.Recv(t, done, 10*time.Second, "the queue's Run to return after cancel"); err != nil {
				t.Error(err)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// waitFor is testenv.WaitFor with the queue tests' 10 s limit.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	testenv.WaitFor(t, 10*time.Second, what, cond)
}

func TestQueueRecordRoundTrip(t *testing.T) {
	in := []ringstore.Sample{
		{Seq: 1 << 40, Device: "a", Tag: "t0", Value: 21.5, TS: 1764450000123456},
		{Seq: 1<<40 + 1, Device: "a", Tag: "t1", Value: -3, TS: 1764450000123456},
		{Seq: 1<<40 + 2, Device: "bb", Tag: "t2", Value: 1, Bool: true, TS: 1764450000123000},
		{Seq: 1<<40 + 3, Device: "bb", Tag: "", Value: math.NaN(), Quality: ringstore.Timeout, TS: 0},
		{Seq: 1<<40 + 4, Device: "", Tag: "x\"y", Value: 0.1, Quality: ringstore.Stale, TS: -5},
		{Seq: 1<<40 + 5, Device: "c", Tag: "z", Value: math.Copysign(0, -1), Quality: ringstore.Error, TS: 7},
		{Seq: 1<<40 + 6, Device: "c", Tag: "big", Value: 1 << 60, TS: 7},
		{Seq: 1<<40 + 7, Device: "c", Tag: "inf", Value: math.Inf(-1), TS: 7},
		{Seq: 1<<40 + 8, Device: "c", Tag: "dec", Value: 48.2, TS: 8},
		{Seq: 1<<40 + 9, Device: "c", Tag: "dec4", Value: -0.0001, TS: 9},
		{Seq: 1<<40 + 10, Device: "c", Tag: "f32", Value: float64(float32(21.3)), TS: 10},
		{Seq: 1<<40 + 11, Device: "c", Tag: "f64", Value: math.Pi, TS: 11},
		{Seq: 1<<40 + 12, Device: "c", Tag: "tiny", Value: 1e-300, TS: 12},
	}
	b := appendRecord(nil, in)
	size, first, n, err := recordSpan(b)
	if err != nil || size != len(b) || first != in[0].Seq || n != len(in) {
		t.Fatalf("span: %d %d %d %v", size, first, n, err)
	}
	out, err := decodeRecord(b, 0, 100, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := range in {
		a, o := in[i], out[i]
		same := a.Value == o.Value || (math.IsNaN(a.Value) && math.IsNaN(o.Value))
		if !same || math.Signbit(a.Value) != math.Signbit(o.Value) {
			t.Errorf("%d: value %v, want %v", i, o.Value, a.Value)
		}
		a.Value, o.Value = 0, 0
		if a != o {
			t.Errorf("%d: %+v, want %+v", i, o, a)
		}
	}
	part, _ := decodeRecord(b, in[2].Seq, 2, nil, map[string]string{})
	if len(part) != 2 || part[0].Seq != in[3].Seq {
		t.Fatalf("partial decode: %+v", part)
	}
	for cut := 1; cut < len(b); cut++ {
		if _, _, _, err := recordSpan(b[:cut]); err != errShort {
			t.Fatalf("cut at %d: %v, want errShort", cut, err)
		}
	}
	b[len(b)-1] ^= 1
	if _, _, _, err := recordSpan(b); err == nil {
		t.Fatal("flipped bit not detected")
	}
}

func TestQueueRecordValuesExact(t *testing.T) {
	rnd := rand.New(rand.NewPCG(1, 2))
	in := make([]ringstore.Sample, 0, 256)
	for round := 0; round < 400; round++ {
		in = in[:0]
		for i := 0; i < 256; i++ {
			var v float64
			switch i % 4 {
			case 0:
				v = math.Float64frombits(rnd.Uint64())
			case 1:
				v = float64(rnd.IntN(2000000)-1000000) / pow10[rnd.IntN(5)]
			case 2:
				v = float64(float32(rnd.NormFloat64() * 100))
			default:
				v = rnd.NormFloat64() * 1e6
			}
			in = append(in, ringstore.Sample{Seq: uint64(1000 + i), Device: "d", Tag: "t", Value: v, TS: rnd.Int64N(1 << 52)})
		}
		out, err := decodeRecord(appendRecord(nil, in), 0, 256, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		for i := range in {
			a, b := in[i].Value, out[i].Value
			if math.Float64bits(a) != math.Float64bits(b) && !(math.IsNaN(a) && math.IsNaN(b)) {
				t.Fatalf("value %v (%x) came back as %v (%x)", a, math.Float64bits(a), b, math.Float64bits(b))
			}
			if in[i].TS != out[i].TS {
				t.Fatalf("ts %d came back as %d", in[i].TS, out[i].TS)
			}
		}
	}
}

// A string sample survives the durable queue's codec, and so does the
// float32 kind.
func TestRecordKindsRoundTrip(t *testing.T) {
	text := "Firmware 2.1 ä"
	in := []ringstore.Sample{
		{Seq: 1, Device: "d", Tag: "sn", Kind: ringstore.KindString, Text: &text, TS: 5},
		{Seq: 2, Device: "d", Tag: "f", Kind: ringstore.KindFloat32, Value: float64(float32(123.456)), TS: 5},
		{Seq: 3, Device: "d", Tag: "e", Kind: ringstore.KindString, Quality: ringstore.Error, TS: 5},
		{Seq: 4, Device: "d", Tag: "q", Value: 2, Quality: ringstore.Stale, TS: 5},
	}
	out, err := decodeRecord(appendRecord(nil, in), 0, 10, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := range in {
		if a, b := string(in[i].AppendJSON(nil)), string(out[i].AppendJSON(nil)); a != b {
			t.Errorf("queue codec: %s came back as %s", a, b)
		}
		if in[i].Kind != out[i].Kind || in[i].Quality != out[i].Quality {
			t.Errorf("queue codec: kind/quality %v/%v came back as %v/%v", in[i].Kind, in[i].Quality, out[i].Kind, out[i].Quality)
		}
	}
}

// FuzzDecodeRecord: whatever a damaged disk holds, the reader never panics.
func FuzzDecodeRecord(f *testing.F) {
	f.Add(appendRecord(nil, mkBatch(7, 1, 3))[recordHeader:])
	f.Add(appendRecord(nil, []ringstore.Sample{{Seq: 1, Value: 48.2}, {Seq: 2, Value: math.NaN(), Bool: true}})[recordHeader:])
	f.Fuzz(func(t *testing.T, payload []byte) {
		// a valid header and CRC around any payload: the decoder itself is fuzzed
		b := binary.LittleEndian.AppendUint32(nil, uint32(len(payload)))
		b = binary.LittleEndian.AppendUint32(b, crc32.Checksum(payload, castagnoli))
		b = append(b, payload...)
		if _, _, _, err := recordSpan(b); err != nil {
			return
		}
		_, _ = decodeRecord(b, 0, 1<<20, nil, map[string]string{})
	})
}

func TestQueueReopen(t *testing.T) {
	dir := t.TempDir()
	cfg := Config{Dir: dir, SegmentBytes: 4 << 10}
	q := openQ(t, cfg)
	appendN(q, 1, 1000)
	if err := q.Close(); err != nil { // close without ack and without Run: Close writes
		t.Fatal(err)
	}

	q = openQ(t, cfg)
	all := peekAll(t, q)
	checkSeqs(t, all, 1, 1000)
	want := mkBatch(999, 999%48, 2)
	if all[998] != want[0] || all[999] != want[1] {
		t.Fatalf("content: %+v, want %+v", all[998:], want)
	}
	if st := q.Stats(); st.Samples != 1000 || st.OldestTS != all[0].TS || st.Segments < 2 {
		t.Fatalf("stats after reopen: %+v", st)
	}
	q.Ack(500)
	stop := runQ(t, q)
	appendN(q, 1001, 100)
	waitFor(t, "writer", func() bool { return q.Stats().Unwritten == 0 })
	stop()
	if err := q.Close(); err != nil {
		t.Fatal(err)
	}

	q = openQ(t, cfg)
	checkSeqs(t, peekAll(t, q), 501, 1100)
	if got := q.Peek(10, nil); len(got) != 10 || got[0].Seq != 501 {
		t.Fatalf("Peek: %v", got)
	}
	q.Ack(1100)
	if st := q.Stats(); st.Samples != 0 || st.Bytes != 0 || st.OldestTS != 0 {
		t.Fatalf("after acking all: %+v", st)
	}
	if err := q.Close(); err != nil {
		t.Fatal(err)
	}
	segs, _ := filepath.Glob(filepath.Join(dir, "*"+segSuffix))
	q = openQ(t, cfg)
	defer q.Close()
	if st := q.Stats(); st.Samples != 0 || st.Segments != 0 {
		t.Fatalf("reopen after ack all: %+v (files before: %v)", st, segs)
	}
}

func TestQueueTornTail(t *testing.T) {
	dir := t.TempDir()
	cfg := Config{Dir: dir, SegmentBytes: 1 << 20}
	q := openQ(t, cfg)
	stop := runQ(t, q)
	for s := uint64(1); s <= 100; s += 4 { // 25 records of 4 samples, one per write
		q.Append(mkBatch(s, 1, 4))
		waitFor(t, "write", func() bool { return q.Stats().Unwritten == 0 })
	}
	stop()
	q.Close()
	segs, _ := filepath.Glob(filepath.Join(dir, "*"+segSuffix))
	if len(segs) != 1 {
		t.Fatalf("segments: %v", segs)
	}
	fi, _ := os.Stat(segs[0])
	if err := os.Truncate(segs[0], fi.Size()-5); err != nil { // tear the last record
		t.Fatal(err)
	}
	var logs bytes.Buffer
	cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	q = openQ(t, cfg)
	checkSeqs(t, peekAll(t, q), 1, 96)
	st := q.Stats()
	if st.Recovered == 0 || st.Recovered >= fi.Size()/10 {
		t.Fatalf("recovered %d bytes of %d", st.Recovered, fi.Size())
	}
	if !strings.Contains(logs.String(), "cut segment tail") || !strings.Contains(logs.String(), "torn tail") {
		t.Fatalf("no log line about the torn tail: %q", logs.String())
	}
	// Appending after recovery continues cleanly.
	stop = runQ(t, q)
	q.Append(mkBatch(101, 1, 4))
	waitFor(t, "write", func() bool { return q.Stats().Unwritten == 0 })
	stop()
	q.Close()
	q = openQ(t, Config{Dir: dir})
	defer q.Close()
	got := peekAll(t, q)
	if len(got) != 100 || got[95].Seq != 96 || got[96].Seq != 101 {
		t.Fatalf("after torn tail and append: %d samples", len(got))
	}
	if st := q.Stats(); st.Recovered != 0 {
		t.Fatalf("second open recovered %d", st.Recovered)
	}
}

// checkDrops: the samples present plus the dropped ranges are exactly
// from..to, each once, and the drop counter is the ranges' size.
func checkDrops(t *testing.T, q *Queue, from, to uint64) {
	t.Helper()
	got := peekAll(t, q)
	st := q.Stats()
	seen := make(map[uint64]int)
	for i, s := range got {
		seen[s.Seq]++
		if i > 0 && s.Seq <= got[i-1].Seq {
			t.Fatalf("out of order at %d: %d after %d", i, s.Seq, got[i-1].Seq)
		}
	}
	var dropped uint64
	for _, r := range st.DroppedRanges {
		dropped += r.Last - r.First + 1
		for s := r.First; s <= r.Last; s++ {
			seen[s]++
		}
	}
	if dropped != st.Dropped {
		t.Fatalf("drop counter %d, ranges hold %d: %v", st.Dropped, dropped, st.DroppedRanges)
	}
	for s := from; s <= to; s++ {
		if seen[s] != 1 {
			t.Fatalf("seq %d seen %d times (present or dropped); drops %v", s, seen[s], st.DroppedRanges)
		}
	}
	if uint64(len(seen)) != to-from+1 {
		t.Fatalf("%d seqs known, want %d", len(seen), to-from+1)
	}
	if st.Samples != int64(len(got)) {
		t.Fatalf("Samples %d, peeked %d", st.Samples, len(got))
	}
	if st.Dropped == 0 {
		t.Fatal("nothing dropped: the bound was not exercised")
	}
}

func TestQueueDropOldestDisk(t *testing.T) {
	q := openQ(t, Config{Dir: t.TempDir(), MaxBytes: 32 << 10, SegmentBytes: 4 << 10, Fsync: FsyncNever})
	stop := runQ(t, q)
	for s := uint64(1); s <= 20000; s += 200 {
		appendN(q, s, 200)
		waitFor(t, "write", func() bool { return q.Stats().Unwritten == 0 })
	}
	q.Ack(5) // an ack below the drops changes nothing
	stop()
	st := q.Stats()
	if st.Bytes > 32<<10 || st.Samples < 1000 {
		t.Fatalf("bound not kept or too much dropped: %+v", st)
	}
	checkDrops(t, q, 1, 20000)
	if r := st.DroppedRanges; len(r) != 1 || r[0].First != 1 {
		t.Fatalf("drops not the oldest: %v", r)
	}
	q.Close()
}

func TestQueueDropOldestMemory(t *testing.T) {
	q := openQ(t, Config{MaxBytes: 100 * (64 + 9 + 5)}) // room for 100 samples
	appendN(q, 1, 1000)
	q.Ack(10)
	checkDrops(t, q, 1, 1000)
	if st := q.Stats(); st.Samples != 100 || st.DroppedRanges[0] != (SeqRange{1, 900}) {
		t.Fatalf("memory bound: %+v", st)
	}
	q.Ack(950)
	checkSeqs(t, peekAll(t, q), 951, 1000)
}

// Append writes at once; when the disk fails, the queue keeps to memory
// (mode and health say so), bounded by MaxBytes with the oldest dropped and
// counted, and goes back to disk by itself once writes succeed.
func TestQueueDiskFailsKeepsToMemory(t *testing.T) {
	parent := t.TempDir()
	dir := filepath.Join(parent, "q")
	q := openQ(t, Config{Dir: dir, MaxBytes: 64 << 10, Fsync: FsyncNever})
	runQ(t, q)
	appendN(q, 1, 4)
	if st := q.Stats(); st.Unwritten != 0 || st.Mode != "disk" {
		t.Fatalf("append did not write at once: %+v", st)
	}
	diskOf(q).close()                                   // the next write must open a new segment…
	if err := os.Rename(dir, dir+".away"); err != nil { // …which now fails:
		t.Fatal(err)
	}
	if err := os.WriteFile(dir, nil, 0o600); err != nil { // a file where the directory was
		t.Fatal(err)
	}
	appendN(q, 5, 10)
	st := q.Stats()
	if st.Unwritten != 10 || st.Dropped != 0 || !strings.HasPrefix(st.Mode, "memory (disk: not a directory") {
		t.Fatalf("disk gone: %+v", st)
	}
	if ok, why := q.QueueHealth(); ok || !strings.Contains(why, "not storing") {
		t.Fatalf("health %v %q", ok, why)
	}
	if at, failing, last := q.WriteHealth(); failing == nil || last != failing || at.IsZero() {
		t.Fatalf("write health while failing: %v %v at %v", failing, last, at)
	}
	// Past the bound in memory: the oldest go, counted.
	const n = 4000 // about 77 bytes each in memory: 300 KiB
	appendN(q, 15, n)
	st = q.Stats()
	if st.Dropped == 0 || st.Bytes > 64<<10 {
		t.Fatalf("bound in memory: %+v", st)
	}
	// The disk comes back: Run writes what is held, by itself.
	if err := os.Remove(dir); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(dir+".away", dir); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "back on disk", func() bool { st := q.Stats(); return st.Mode == "disk" && st.Unwritten == 0 })
	if ok, _ := q.QueueHealth(); !ok {
		t.Fatal("health still bad on disk")
	}
	if at, failing, last := q.WriteHealth(); failing != nil || last == nil || at.IsZero() {
		t.Fatalf("write health back on disk: %v, last %v at %v (kept)", failing, last, at)
	}
	checkDrops(t, q, 1, 14+n)
	if r := q.Stats().DroppedRanges; len(r) != 1 || r[0].First != 1 {
		t.Fatalf("drops not the oldest: %v", r)
	}
	q.Close()
}

// TestQueueRingConsumer: the ring hands batches to the queue under its
// lock, a consumer peeks past its in-flight batches and acks them; every
// seq arrives once, in order, and the queue drains to zero.
func TestQueueRingConsumer(t *testing.T) {
	for _, dir := range []string{"", t.TempDir()} {
		t.Run(fmt.Sprintf("disk=%v", dir != ""), func(t *testing.T) {
			seq, _ := ringstore.OpenSequence("")
			ring := ringstore.NewRing(50, seq)
			q := openQ(t, Config{Dir: dir, SegmentBytes: 16 << 10})
			defer q.Close()
			if err := ring.Consume(q.Consumer("queue")); err != nil {
				t.Fatal(err)
			}
			runQ(t, q)
			const polls, producers = 500, 4
			first := seq.Last() + 1
			var wg sync.WaitGroup
			for p := 0; p < producers; p++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := 0; i < polls; i++ {
						ring.Append(mkBatch(0, p, 3))
					}
				}()
			}
			total := polls * producers * 3
			var got []ringstore.Sample
			after := uint64(0)
			var inflight []uint64
			deadline := time.After(20 * time.Second)
			for len(got) < total {
				w := q.Wait()
				b := q.PeekAfter(after, 97, nil)
				if len(b) > 0 {
					got = append(got, b...)
					after = b[len(b)-1].Seq
					inflight = append(inflight, after)
					if len(inflight) > 3 { // ack with a window, like the pusher
						q.Ack(inflight[0])
						inflight = inflight[1:]
					}
					continue
				}
				select {
				case <-w:
				case <-deadline:
					t.Fatalf("stuck after %d of %d samples", len(got), total)
				}
			}
			testenv.Wait(t, 20*time.Second, "the producers' appends", wg.Wait)
			checkSeqs(t, got, first, first+uint64(total)-1)
			q.Ack(after)
			if st := q.Stats(); st.Samples != 0 || st.Dropped != 0 {
				t.Fatalf("not drained: %+v", st)
			}
		})
	}
}

func TestQueueBadConfig(t *testing.T) {
	if _, err := Open(Config{Fsync: "sometimes"}); err == nil || !strings.HasPrefix(err.Error(), "spool:") {
		t.Fatalf("err = %v", err)
	}
}

// TestQueueSIGKILL runs the writer in a child process, kills it with
// SIGKILL once it reports its samples written, and reopens the queue.
func TestQueueSIGKILL(t *testing.T) {
	if os.Getenv("EDGEGW_QUEUE_HELPER") != "" {
		t.Skip("helper process")
	}
	for _, policy := range []string{FsyncAlways, FsyncBatched} {
		t.Run(policy, func(t *testing.T) {
			dir := t.TempDir()
			cmd := exec.Command(os.Args[0], "-test.run=^TestHelperProcess$", "-test.v")
			cmd.Env = append(os.Environ(), "EDGEGW_QUEUE_HELPER="+dir, "EDGEGW_QUEUE_FSYNC="+policy)
			out, err := cmd.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			cmd.Stderr = os.Stderr
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			// A helper that hangs is killed: the read below then ends
			// and the test fails instead of hanging.
			hung := time.AfterFunc(time.Minute, func() { cmd.Process.Kill() })
			defer hung.Stop()
			buf := make([]byte, 4096)
			var seen string
			for strings.Count(seen, "appended ") < 50 {
				n, err := out.Read(buf)
				if err != nil {
					cmd.Process.Kill()
					cmd.Wait()
					t.Fatalf("helper ended: %v: %q", err, seen)
				}
				seen += string(buf[:n])
			}
			// the helper keeps appending; kill it mid-stream
			if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			cmd.Wait()
			// the last complete "appended N" line: Append had returned for
			// every seq up to N before the kill
			var n uint64
			for _, line := range strings.Split(seen, "\n") {
				if f := strings.Fields(line); len(f) == 2 && f[0] == "appended" {
					if v, err := strconv.ParseUint(f[1], 10, 64); err == nil {
						n = v
					}
				}
			}
			q := openQ(t, Config{Dir: dir})
			defer q.Close()
			got := peakAllFrom(t, q)
			// everything appended is there (Append writes into the page
			// cache, which survives SIGKILL), acked 1..100 are not, and what
			// follows is gap-free.
			if len(got) == 0 || got[0].Seq != 101 || got[len(got)-1].Seq < n {
				t.Fatalf("after SIGKILL: %d samples, first %v, want 101..>=%d", len(got), got[:min(1, len(got))], n)
			}
			checkSeqs(t, got, 101, got[len(got)-1].Seq)
		})
	}
}

func peakAllFrom(t *testing.T, q *Queue) []ringstore.Sample { return peekAll(t, q) }

// TestHelperProcess is the child of TestQueueSIGKILL.
func TestHelperProcess(t *testing.T) {
	dir := os.Getenv("EDGEGW_QUEUE_HELPER")
	if dir == "" {
		t.Skip("only run by TestQueueSIGKILL")
	}
	q, err := Open(Config{Dir: dir, SegmentBytes: 8 << 10, Fsync: os.Getenv("EDGEGW_QUEUE_FSYNC"), FsyncInterval: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	go q.Run(context.Background()) //nolint: the process is SIGKILLed
	appendN(q, 1, 2000)
	q.Ack(100)
	waitFor(t, "the samples written and 100 acked", func() bool { st := q.Stats(); return st.Unwritten == 0 && st.Acked == 100 })
	// the ack mark is saved by the writer within FsyncInterval; wait for it
	waitFor(t, "the ack mark saved", func() bool {
		b, _ := os.ReadFile(filepath.Join(dir, ackFile))
		return strings.TrimSpace(string(b)) == "100"
	})
	fmt.Printf("written %d\n", 2000)
	for s := uint64(2001); ; s += 2 { // until killed
		q.Append(mkBatch(s, 1, 2))
		fmt.Printf("appended %d\n", s+1)
	}
}

// appendPolls resets the timer and appends b.N 2-tag polls (HandOff,
// then Persist, as the ring does), calling each after every one.
func appendPolls(b *testing.B, q *Queue, each func(i int, last uint64)) {
	batch := mkBatch(1, 1, 2)
	b.ReportAllocs()
	b.ResetTimer()
	seq := uint64(1)
	for i := 0; i < b.N; i++ {
		batch[0].Seq, batch[1].Seq = seq, seq+1
		seq += 2
		q.HandOff(batch)
		q.Persist(seq - 1)
		each(i, seq-1)
	}
}

func BenchmarkQueueAppendRun(b *testing.B) {
	for _, policy := range []string{FsyncNever, FsyncBatched} {
		b.Run(policy, func(b *testing.B) {
			dir := b.TempDir()
			q, err := Open(Config{Dir: dir, Fsync: policy, MaxBytes: 1 << 30})
			if err != nil {
				b.Fatal(err)
			}
			stop := runQ(b, q)
			appendPolls(b, q, func(i int, _ uint64) {
				for i%1024 == 0 && q.Stats().Unwritten > 1<<15 {
					time.Sleep(10 * time.Microsecond)
				}
			})
			for q.Stats().Unwritten > 0 {
				time.Sleep(10 * time.Microsecond)
			}
			b.StopTimer()
			stop()
			q.Close()
			reportDiskBytes(b, dir, 2*b.N)
		})
	}
}

// reportDiskBytes reports the segment files' bytes per sample written.
func reportDiskBytes(b *testing.B, dir string, samples int) {
	var size int64
	files, _ := filepath.Glob(filepath.Join(dir, "*"+segSuffix))
	for _, f := range files {
		fi, _ := os.Stat(f)
		size += fi.Size()
	}
	b.ReportMetric(float64(size)/float64(samples), "disk-B/sample")
}

func BenchmarkQueuePeekDisk(b *testing.B) {
	q, err := Open(Config{Dir: b.TempDir(), MaxBytes: 1 << 30})
	if err != nil {
		b.Fatal(err)
	}
	appendN(q, 1, 100000)
	q.Close()
	q, _ = Open(Config{Dir: q.cfg.Dir, MaxBytes: 1 << 30})
	defer q.Close()
	dst := make([]ringstore.Sample, 0, 500)
	b.ReportAllocs()
	b.ResetTimer()
	after := uint64(0)
	for i := 0; i < b.N; i++ {
		dst = q.PeekAfter(after, 500, dst[:0])
		if len(dst) == 0 {
			after = 0
			continue
		}
		after = dst[len(dst)-1].Seq
	}
	b.ReportMetric(500, "samples/op")
}

var _ = sort.Ints

// BenchmarkQueueDiskBytes measures disk bytes per sample for 2-tag polls
// (temperature, humidity) of 48 loggers, at a high rate (the writer
// batches many polls per record) and a low rate (one record per poll).
func BenchmarkQueueDiskBytes(b *testing.B) {
	for _, low := range []bool{false, true} {
		b.Run(fmt.Sprintf("one-poll-per-record=%v", low), func(b *testing.B) {
			dir := b.TempDir()
			q, err := Open(Config{Dir: dir, Fsync: FsyncNever, MaxBytes: 1 << 30})
			if err != nil {
				b.Fatal(err)
			}
			stop := runQ(b, q)
			seq := uint64(1795987408427661)
			ts := int64(1764450000000000)
			for i := 0; i < b.N; i++ {
				d := fmt.Sprintf("logger-%02d", i%48)
				q.Append([]ringstore.Sample{{Seq: seq, Device: d, Tag: "temperature", Value: 21.5 + float64(i%9)/10, TS: ts},
					{Seq: seq + 1, Device: d, Tag: "humidity", Value: 40.1 + float64(i%13)/10, TS: ts}})
				seq += 2
				ts += 20833
				for low && q.Stats().Unwritten > 0 {
					time.Sleep(5 * time.Microsecond)
				}
			}
			for q.Stats().Unwritten > 0 {
				time.Sleep(10 * time.Microsecond)
			}
			stop()
			q.Close()
			reportDiskBytes(b, dir, 2*b.N)
		})
	}
}

// Epochs survive the disk (every record carries its samples' epoch) and a
// restart's skip is kept until its jump is acknowledged.
func TestQueueEpochsAndSkips(t *testing.T) {
	dir := t.TempDir()
	q := openQ(t, Config{Dir: dir})
	b1 := mkBatch(1, 1, 4)
	for i := range b1 {
		b1[i].Epoch = 0xaaaa000000000001
	}
	b2 := mkBatch(5, 1, 4)
	for i := range b2 {
		b2[i].Epoch = 0xbbbb000000000002
	}
	q.Append(b1)
	q.Append(b2)
	if got := q.LastSeq(); got != 8 {
		t.Fatalf("LastSeq %d", got)
	}
	q.Resume(0xbbbb000000000002, 100, true)
	q.Close()
	q = openQ(t, Config{Dir: dir})
	got := peekAll(t, q)
	checkSeqs(t, got, 1, 8)
	for i, s := range got {
		want := uint64(0xaaaa000000000001)
		if s.Seq >= 5 {
			want = 0xbbbb000000000002
		}
		if s.Epoch != want {
			t.Fatalf("sample %d: epoch %x, want %x", i, s.Epoch, want)
		}
	}
	want := []ringstore.Skip{{Epoch: 0xbbbb000000000002, First: 9, Last: 99}}
	if k := q.Skips(0xbbbb000000000002, 8, 100); !slices.Equal(k, want) {
		t.Fatalf("skips after reopen %v, want %v", k, want)
	}
	if k := q.Skips(0xbbbb000000000002, 100, 200); len(k) != 0 {
		t.Fatalf("skips past the jump %v", k)
	}
	if k := q.Skips(0xaaaa000000000001, 8, 100); len(k) != 0 {
		t.Fatalf("skips of another epoch %v", k)
	}
	q.Resume(0xbbbb000000000002, 9, true) // no skip: continues at last+1
	q.Resume(0xcccc000000000003, 500, false)
	if k := q.Skips(0xcccc000000000003, 0, 1000); len(k) != 0 {
		t.Fatalf("a new epoch has no skip: %v", k)
	}
	q.Ack(100)
	q.Close()
	q = openQ(t, Config{Dir: dir})
	defer q.Close()
	if k := q.Skips(0xbbbb000000000002, 8, 100); len(k) != 0 {
		t.Fatalf("skip kept after its jump was acknowledged: %v", k)
	}
}

// A queue read that fails (EIO on open, as a failing SD card or EMFILE
// gives) deletes nothing and skips nothing: the reader backs off and reads
// everything once the fault clears.
func TestQueueTransientReadFailureDeletesNothing(t *testing.T) {
	dir := t.TempDir()
	q := openQ(t, Config{Dir: dir, SegmentBytes: 16 << 10, Fsync: FsyncNever})
	const n = 3 * cacheSamples // older samples are on disk only
	appendN(q, 1, n)
	files := func() int {
		m, _ := filepath.Glob(filepath.Join(dir, "*"+segSuffix))
		return len(m)
	}
	before := files()
	var fail sync.Map
	fail.Store("on", true)
	q.rmu.Lock() // the store's reader runs under it
	diskOf(q).open = func(path string) (*os.File, error) {
		if _, on := fail.Load("on"); on {
			return nil, &os.PathError{Op: "open", Path: path, Err: syscall.EIO}
		}
		return os.Open(path)
	}
	q.rmu.Unlock()
	for i := 0; i < 5; i++ {
		if got := q.PeekAfter(0, 100, nil); len(got) != 0 {
			t.Fatalf("read through a failing disk: %d samples from seq %d", len(got), got[0].Seq)
		}
	}
	if st := q.Stats(); st.Dropped != 0 || files() != before || st.Samples != n {
		t.Fatalf("after read failures: %d of %d segment files, stats %+v", files(), before, st)
	}
	fail.Delete("on")
	waitFor(t, "reads again after the backoff", func() bool { return len(q.PeekAfter(0, 1, nil)) == 1 })
	checkSeqs(t, peekAll(t, q), 1, n)
	q.Close()
}

// A record whose checksum fails is skipped, counted and logged; the records
// after it in the same segment are kept.
func TestQueueCorruptRecordSkipped(t *testing.T) {
	dir := t.TempDir()
	q := openQ(t, Config{Dir: dir, Fsync: FsyncNever})
	for s := uint64(1); s <= 30; s += 10 {
		q.Append(mkBatch(s, 1, 10)) // one record each
	}
	q.Close()
	seg, b := oneSegment(t, dir)
	l := int(binary.LittleEndian.Uint32(b) &^ lenEpoch)
	b[recordHeader+l+recordHeader+5] ^= 0xff // inside the second record's payload
	if err := os.WriteFile(seg, b, 0o600); err != nil {
		t.Fatal(err)
	}
	q = openQ(t, Config{Dir: dir})
	defer q.Close()
	got := peekAll(t, q)
	st := q.Stats()
	if st.Corrupt != 1 || st.Recovered != 0 || len(got) != 20 || got[9].Seq != 10 || got[10].Seq != 21 {
		t.Fatalf("corrupt record: %d samples, stats %+v", len(got), st)
	}
}

// A small bound with a healthy uplink (the consumer acks a few batches
// behind) drops nothing: segments follow the bound.
func TestQueueSmallBoundHealthyDropsNothing(t *testing.T) {
	q := openQ(t, Config{Dir: t.TempDir(), MaxBytes: 16 << 10, Fsync: FsyncNever})
	runQ(t, q)
	const n = 40000
	for s := uint64(1); s <= n; s += 2 {
		q.Append(mkBatch(s, int(s%48), 2))
		if s > 200 && s%50 == 1 {
			q.Ack(s - 200) // 200 samples in flight, about 4 KiB
		}
	}
	q.Ack(n)
	st := q.Stats()
	if st.Dropped != 0 {
		t.Fatalf("dropped %d with a healthy consumer: %+v", st.Dropped, st)
	}
	t.Logf("segment size %d bytes, stats %+v", diskOf(q).segSize, st)
}

// BenchmarkQueueAppendMemory: a memory queue (no data_dir) taking 2-tag
// polls as the ring hands them over (HandOff, then Persist) with Run
// going, acked every 1024 polls as a sender keeping up would.
func BenchmarkQueueAppendMemory(b *testing.B) {
	q, err := Open(Config{})
	if err != nil {
		b.Fatal(err)
	}
	stop := runQ(b, q)
	appendPolls(b, q, func(i int, last uint64) {
		if i%1024 == 1023 {
			q.Ack(last)
		}
	})
	b.StopTimer()
	stop()
	q.Close()
}
