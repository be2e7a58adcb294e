package ringstore

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"edgegw/internal/testenv"
)

func memRing(t testing.TB, size int) *Ring {
	t.Helper()
	seq, err := OpenSequence(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return NewRing(size, seq)
}

func batch(dev string, tags ...string) []Sample {
	b := make([]Sample, len(tags))
	for i, tg := range tags {
		b[i] = Sample{Device: dev, Tag: tg, Value: float64(i), TS: 1}
	}
	return b
}

func TestRingSinceInOrderNoGaps(t *testing.T) {
	r := memRing(t, 10)
	if r.Seq() != 0 {
		t.Fatalf("fresh ring seq %d", r.Seq())
	}
	first, last, err := r.Append(batch("d1", "a", "b", "c"))
	if err != nil || first != 1 || last != 3 {
		t.Fatalf("append: %d..%d %v", first, last, err)
	}
	r.Append(batch("d2", "a", "b"))
	res := r.Since(0, nil)
	if res.Reset || res.Seq != 5 || len(res.Samples) != 5 {
		t.Fatalf("since 0: %+v", res)
	}
	for i, s := range res.Samples {
		if s.Seq != uint64(i+1) {
			t.Fatalf("sample %d has seq %d", i, s.Seq)
		}
	}
	res = r.Since(3, nil)
	if len(res.Samples) != 2 || res.Samples[0].Seq != 4 || res.Samples[0].Device != "d2" {
		t.Fatalf("since 3: %+v", res.Samples)
	}
	res = r.Since(5, nil)
	if len(res.Samples) != 0 || res.Reset || res.Wait == nil {
		t.Fatalf("since last: %+v", res)
	}
}

func TestRingOverflowResets(t *testing.T) {
	r := memRing(t, 4)
	for i := 0; i < 5; i++ {
		r.Append(batch("d", "a", "b")) // seqs 1..10, ring holds 7..10
	}
	if res := r.Since(5, nil); !res.Reset {
		t.Fatalf("since 5 after overflow: want reset, got %d samples", len(res.Samples))
	}
	res := r.Since(6, nil) // exactly the oldest kept is 7: no gap
	if res.Reset || len(res.Samples) != 4 || res.Samples[0].Seq != 7 || res.Samples[3].Seq != 10 {
		t.Fatalf("since 6: %+v", res)
	}
	if res := r.Since(11, nil); !res.Reset {
		t.Fatal("since a seq ahead of the ring: want reset")
	}
}

// SinceN returns the oldest n of what Since would, across the ring's wrap,
// and all of it when fewer are newer.
func TestRingSinceNChunks(t *testing.T) {
	r := memRing(t, 4)
	for i := 0; i < 3; i++ {
		r.Append(batch("d", "a", "b")) // seqs 1..6, ring holds 3..6 (wrapped)
	}
	var got []uint64
	for after := uint64(2); after < 6; {
		res := r.SinceN(after, 3, nil)
		if res.Reset || len(res.Samples) == 0 || len(res.Samples) > 3 || res.Seq != 6 {
			t.Fatalf("sinceN(%d, 3): %+v", after, res)
		}
		for _, s := range res.Samples {
			got = append(got, s.Seq)
		}
		after = res.Samples[len(res.Samples)-1].Seq
	}
	if fmt.Sprint(got) != "[3 4 5 6]" {
		t.Fatalf("chunks gave seqs %v, want [3 4 5 6]", got)
	}
	if res := r.SinceN(1, 3, nil); !res.Reset {
		t.Fatal("sinceN from before the ring: want reset")
	}
	if res := r.SinceN(3, 0, nil); len(res.Samples) != 3 {
		t.Fatalf("sinceN with n 0: %d samples, want all 3", len(res.Samples))
	}
}

func TestRingSnapshotLatestPerTag(t *testing.T) {
	r := memRing(t, 4)
	r.Append([]Sample{{Device: "b", Tag: "x", Value: 1}, {Device: "a", Tag: "y", Value: 2}})
	s1 := r.Snapshot()
	r.Append([]Sample{{Device: "b", Tag: "x", Value: 3}})
	s2 := r.Snapshot()
	if s1 == s2 || len(s1.Latest) != 2 || s1.Latest[1].Value != 1 {
		t.Fatalf("first snapshot changed or wrong: %+v", s1)
	}
	if s2.Seq != 3 || len(s2.Latest) != 2 || s2.Latest[0].Device != "a" || s2.Latest[1].Value != 3 || s2.Latest[1].Seq != 3 {
		t.Fatalf("second snapshot: %+v", s2)
	}
	if r.Snapshot() != s2 {
		t.Fatal("snapshot rebuilt without an append")
	}
}

// A waiter that found nothing new and then waits must be woken by the very
// next append, however the two interleave: the channel comes from the same
// locked section as the check.
func TestRingNoLostWakeup(t *testing.T) {
	const rounds = 2000
	r := memRing(t, rounds) // the reader never falls out: this test is about wake-ups
	var wg sync.WaitGroup
	wg.Add(1)
	errc := make(chan error, 1)
	go func() {
		defer wg.Done()
		var last uint64
		for last < rounds {
			res := r.Since(last, nil)
			if res.Reset {
				errc <- fmt.Errorf("reset at %d", last)
				return
			}
			if len(res.Samples) == 0 {
				select {
				case <-res.Wait:
				case <-time.After(5 * time.Second):
					errc <- fmt.Errorf("lost wake-up after seq %d (ring at %d)", last, r.Seq())
					return
				}
				continue
			}
			for _, s := range res.Samples {
				if s.Seq != last+1 {
					errc <- fmt.Errorf("gap: %d after %d", s.Seq, last)
					return
				}
				last = s.Seq
			}
		}
		errc <- nil
	}()
	for i := 0; i < rounds; i++ {
		r.Append(batch("d", "a"))
	}
	testenv.Wait(t, time.Minute, "the reader to read every round", wg.Wait)
	if err := testenv.Recv(t, errc, time.Second, "the reader's verdict"); err != nil {
		t.Fatal(err)
	}
}

// The ring's consumers each see every batch once, in sequence order, in
// the order they were added: HandOff under the ring's lock, After once it
// is released (so After may read the ring) with the batch's last seq; a
// second consumer of one name is refused, never a silent replacement.
func TestRingConsumersSeeBatchesInOrder(t *testing.T) {
	r := memRing(t, 8)
	var handed, after []uint64
	var order []string
	var mu sync.Mutex // After runs in each appender's goroutine
	if err := r.Consume(Consumer{Name: "a", HandOff: func(b []Sample) {
		for _, s := range b {
			handed = append(handed, s.Seq)
		}
		order = append(order, "a")
	}}); err != nil {
		t.Fatal(err)
	}
	if err := r.Consume(Consumer{Name: "b", HandOff: func([]Sample) { order = append(order, "b") },
		After: func(b []Sample, last uint64) {
			if snap := r.Snapshot(); snap.Seq < last { // would deadlock under the ring's lock
				t.Errorf("After: snapshot at %d before its batch's last %d", snap.Seq, last)
			}
			if b[len(b)-1].Seq != last {
				t.Errorf("After: last %d, batch ends at %d", last, b[len(b)-1].Seq)
			}
			mu.Lock()
			after = append(after, last)
			mu.Unlock()
		}}); err != nil {
		t.Fatal(err)
	}
	if err := r.Consume(Consumer{Name: "a"}); err == nil || !strings.Contains(err.Error(), `"a" added twice`) {
		t.Fatalf("second consumer a: %v", err)
	}
	if err := r.Consume(Consumer{}); err == nil {
		t.Fatal("a consumer with no name was accepted")
	}
	var wg sync.WaitGroup
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 100; i++ {
				r.Append(batch("d", "a", "b"))
			}
		}()
	}
	testenv.Wait(t, time.Minute, "4 appenders × 100 batches", wg.Wait)
	if len(handed) != 800 || len(after) != 400 || len(order) != 800 {
		t.Fatalf("handed %d samples, After saw %d batches, %d hand-offs (want 800, 400, 800)", len(handed), len(after), len(order))
	}
	for i, s := range handed {
		if s != uint64(i+1) {
			t.Fatalf("HandOff saw seq %d at %d", s, i)
		}
	}
	for i := 0; i < len(order); i += 2 {
		if order[i] != "a" || order[i+1] != "b" {
			t.Fatalf("hand-off %d went to %s then %s, not in the order added", i/2, order[i], order[i+1])
		}
	}
	slices.Sort(after)
	for i, last := range after {
		if last != uint64(2*i+2) {
			t.Fatalf("After's lasts: %d at %d", last, i)
		}
	}
}

func TestSequenceSurvivesRestart(t *testing.T) {
	dir := t.TempDir()
	s1, err := OpenSequence(dir)
	if err != nil {
		t.Fatal(err)
	}
	first, _ := s1.Reserve(10)
	if first != 1 {
		t.Fatalf("first = %d", first)
	}
	s2, err := OpenSequence(dir) // as after a crash: no close
	if err != nil {
		t.Fatal(err)
	}
	next, _ := s2.Reserve(1)
	if next <= 10 {
		t.Fatalf("after restart got %d, not above 10", next)
	}
	if e1, e2 := s1.Epoch(), s2.Epoch(); e1 != e2 {
		t.Fatalf("epoch changed across a restart: %x then %x", e1, e2)
	}
	if err := os.WriteFile(filepath.Join(dir, hwmFile), []byte("garbage"), 0o600); err != nil {
		t.Fatal(err)
	}
	s3, err := OpenSequence(dir)
	if err != nil {
		t.Fatalf("corrupt mark: %v", err)
	}
	if e, _, cont := s3.First(); cont || e == s2.Epoch() {
		t.Fatalf("corrupt mark: epoch %x continued %v, want a new epoch", e, cont)
	}
}

// Every way the numbering cannot be proven to continue gives a new epoch;
// a clean reopen keeps it and starts above the mark.
func TestSequenceEpochs(t *testing.T) {
	dir := t.TempDir()
	s1, _ := OpenSequence(dir)
	e1, first, cont := s1.First()
	if cont || first != 1 || e1 == 0 {
		t.Fatalf("fresh dir: epoch %x first %d continued %v", e1, first, cont)
	}
	s1.Reserve(5)
	s2, _ := OpenSequence(dir)
	if e, first, cont := s2.First(); e != e1 || !cont || first != SeqBlock+1 {
		t.Fatalf("reopen: epoch %x first %d continued %v, want %x %d true", e, first, cont, e1, SeqBlock+1)
	}
	// Wiped: a new epoch from 1.
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	s3, _ := OpenSequence(dir)
	if e, first, cont := s3.First(); e == e1 || cont || first != 1 {
		t.Fatalf("wiped: epoch %x first %d continued %v", e, first, cont)
	}
	// The queue holds numbers above the mark (they were given under an
	// epoch that never reached the disk): a new epoch above them.
	s4, _ := OpenSequenceConfig(SequenceConfig{Dir: dir, Floor: 5 * SeqBlock})
	if e, first, cont := s4.First(); e == s3.Epoch() || cont || first != 5*SeqBlock+1 {
		t.Fatalf("floor above mark: epoch %x first %d continued %v", e, first, cont)
	}
	// A mark from an older version (no epoch line): numbers continue, new epoch.
	if err := os.WriteFile(filepath.Join(dir, hwmFile), []byte("77\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	s5, _ := OpenSequence(dir)
	if e, first, cont := s5.First(); e == s4.Epoch() || cont || first != 78 {
		t.Fatalf("old mark: epoch %x first %d continued %v", e, first, cont)
	}
	// Memory-only: a new epoch every time.
	m1, _ := OpenSequence("")
	m2, _ := OpenSequence("")
	if m1.Epoch() == m2.Epoch() {
		t.Fatal("two memory-only sequences share an epoch")
	}
}

// A block used up while the disk refuses the next mark: numbering goes on,
// under a new epoch, and strictly increasing.
func TestSequenceBlockExhaustedOnFailingDisk(t *testing.T) {
	parent := t.TempDir()
	dir := filepath.Join(parent, "data")
	s, _ := OpenSequence(dir)
	e1 := s.Epoch()
	first, _ := s.Reserve(SeqBlock - 10)
	// The disk goes away: the directory is replaced by a file.
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dir, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	n, e2 := s.ReserveEpoch(100)
	if n != first+SeqBlock-10 || e2 == e1 {
		t.Fatalf("after the block: seq %d epoch %x (was %x), want seq %d under a new epoch", n, e2, e1, first+SeqBlock-10)
	}
	if ok, err := s.Durable(); ok || err == nil {
		t.Fatalf("durable %v err %v", ok, err)
	}
}

func TestSequenceMemoryOnlyStartsAtClock(t *testing.T) {
	before := uint64(time.Now().UnixMicro())
	s, _ := OpenSequence("")
	n, _ := s.Reserve(1)
	if n <= before {
		t.Fatalf("memory-only seq %d not above the clock %d", n, before)
	}
}

// The child process appends as fast as it can and prints each last seq; the
// parent SIGKILLs it mid-stream three times. Every run's numbers must be
// above everything any earlier run printed.
func TestSequenceStrictlyIncreasingAcrossSIGKILL(t *testing.T) {
	if os.Getenv("EDGEGW_SEQ_CHILD") != "" {
		seq, err := OpenSequence(os.Getenv("EDGEGW_SEQ_CHILD"))
		if err != nil {
			fmt.Println("error", err)
			os.Exit(1)
		}
		r := NewRing(16, seq)
		for i := 0; ; i++ {
			_, last, err := r.Append(batch("d", "a", "b"))
			if err != nil {
				fmt.Println("error", err)
				os.Exit(1)
			}
			if i%100 == 0 {
				fmt.Println(last)
			}
		}
	}
	dir := t.TempDir()
	var high uint64
	for run := 0; run < 3; run++ {
		cmd := exec.Command(os.Args[0], "-test.run=^TestSequenceStrictlyIncreasingAcrossSIGKILL$")
		cmd.Env = append(os.Environ(), "EDGEGW_SEQ_CHILD="+dir)
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		// A child that prints too little is killed: the read below ends.
		late := time.AfterFunc(time.Minute, func() { _ = cmd.Process.Kill() })
		buf := make([]byte, 64<<10)
		var text string
		for lines := 0; lines < 20; {
			n, err := out.Read(buf)
			if err != nil {
				t.Fatalf("child: %v (%d lines; killed after a minute: %v)", err, lines, !late.Stop())
			}
			text += string(buf[:n])
			lines = strings.Count(text, "\n")
		}
		late.Stop()
		cmd.Process.Signal(syscall.SIGKILL)
		cmd.Wait()
		first := true
		for _, line := range strings.Split(strings.TrimSpace(text), "\n") {
			v, err := strconv.ParseUint(strings.TrimSpace(line), 10, 64)
			if err != nil {
				continue // a line cut by the kill
			}
			if v <= high {
				t.Fatalf("run %d: seq %d not above %d seen before", run, v, high)
			}
			if first && run > 0 && v <= high {
				t.Fatalf("run %d restarted at %d", run, v)
			}
			first = false
			high = v
		}
	}
}

func BenchmarkRingAppend(b *testing.B) {
	r := memRing(b, DefaultRingSize)
	bt := batch("logger-01", "temperature", "humidity")
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		r.Append(bt)
	}
}

// BenchmarkRingAppendFleet appends one poll of each of 500 devices in
// turn, as a fleet's buses do: 2 tags a poll, or 40 (a meter).
func BenchmarkRingAppendFleet(b *testing.B) {
	for _, tags := range []int{2, 40} {
		b.Run(fmt.Sprintf("tags=%d", tags), func(b *testing.B) {
			names := make([]string, tags)
			for i := range names {
				names[i] = fmt.Sprintf("tag-%02d", i)
			}
			polls := make([][]Sample, 500)
			for d := range polls {
				polls[d] = batch(fmt.Sprintf("logger-%04d", d), names...)
			}
			r := memRing(b, 1<<16)
			b.ReportAllocs()
			for i := 0; i < b.N; i++ {
				r.Append(polls[i%len(polls)])
			}
		})
	}
}

func BenchmarkRingSince(b *testing.B) {
	r := memRing(b, DefaultRingSize)
	for i := 0; i < 200; i++ {
		r.Append(batch("logger-01", "temperature", "humidity"))
	}
	dst := make([]Sample, 0, DefaultRingSize)
	after := r.Seq() - 96 // one 48-logger cycle behind
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		res := r.Since(after, dst[:0])
		if len(res.Samples) != 96 {
			b.Fatal(len(res.Samples))
		}
	}
}

func BenchmarkSampleAppendJSON(b *testing.B) {
	s := Sample{Seq: 123456, Device: "logger-01", Tag: "temperature", Value: 21.5, TS: 1764450000123456}
	buf := make([]byte, 0, 256)
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		buf = s.AppendJSON(buf[:0])
	}
}

// With Run running, the next mark is written when half the block is used,
// by Run; a disk that refuses it costs nothing until the block is used up,
// then numbering goes on under a new epoch, which Run writes once the disk
// is back.
func TestSequenceReservesAhead(t *testing.T) {
	parent := t.TempDir()
	dir := filepath.Join(parent, "data")
	s, _ := OpenSequence(dir)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	defer func() { cancel(); testenv.Recv(t, done, 10*time.Second, "the sequence's Run to return after cancel") }()
	testenv.WaitFor(t, 10*time.Second, "Run started", func() bool { s.mu.Lock(); defer s.mu.Unlock(); return s.running })
	e1 := s.Epoch()
	s.Reserve(SeqBlock/2 + 1)
	testenv.WaitFor(t, 10*time.Second, "the next mark written ahead", func() bool {
		m, e, err := readMark(filepath.Join(dir, hwmFile))
		return err == nil && e == e1 && m == SeqBlock/2+1+SeqBlock
	})
	// The disk goes away.
	if err := os.Rename(dir, dir+".away"); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dir, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	s.Reserve(SeqBlock) // crosses the half of the block: Run fails to write, retries
	n, e2 := s.ReserveEpoch(SeqBlock)
	if e2 == e1 || n != SeqBlock/2+2+SeqBlock {
		t.Fatalf("block used up on a failing disk: seq %d epoch %x (was %x)", n, e2, e1)
	}
	// The disk comes back: Run writes the new epoch by itself.
	if err := os.Remove(dir); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(dir+".away", dir); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 20*time.Second, "the new epoch written", func() bool {
		_, e, err := readMark(filepath.Join(dir, hwmFile))
		ok, _ := s.Durable()
		return err == nil && e == e2 && ok
	})
}

// A device whose batch changes its tags' order, a device whose tags were
// first seen in two batches, and devices sharing tag names: every sample
// read back, and every latest value, keeps its own device and tag. append
// tries the entry after the previous sample's before its map, so this
// holds the guess to its check.
func TestRingLatestAcrossTagOrders(t *testing.T) {
	r := memRing(t, 64)
	polls := [][]Sample{
		{{Device: "d1", Tag: "a", Value: 1}, {Device: "d1", Tag: "b", Value: 2}, {Device: "d1", Tag: "c", Value: 3}},
		{{Device: "d2", Tag: "a", Value: 4}},
		{{Device: "d2", Tag: "b", Value: 5}, {Device: "d2", Tag: "a", Value: 6}},
		{{Device: "d1", Tag: "c", Value: 7}, {Device: "d1", Tag: "a", Value: 8}, {Device: "d1", Tag: "b", Value: 9}},
		{{Device: "d1", Tag: "b", Value: 10}, {Device: "d2", Tag: "a", Value: 11}, {Device: "d2", Tag: "b", Value: 12}},
		{{Device: "d1", Tag: "a", Value: 13}, {Device: "d1", Tag: "c", Value: 14}},
	}
	var want []Sample
	latest := map[key]float64{}
	for _, p := range polls {
		if _, _, err := r.Append(p); err != nil {
			t.Fatal(err)
		}
		for _, s := range p {
			want = append(want, s)
			latest[key{s.Device, s.Tag}] = s.Value
		}
	}
	got := r.Since(0, nil).Samples
	if len(got) != len(want) {
		t.Fatalf("%d samples read back, want %d", len(got), len(want))
	}
	for i := range want {
		if got[i].Device != want[i].Device || got[i].Tag != want[i].Tag || got[i].Value != want[i].Value {
			t.Errorf("sample %d: %s/%s = %v, want %s/%s = %v", i+1, got[i].Device, got[i].Tag, got[i].Value, want[i].Device, want[i].Tag, want[i].Value)
		}
	}
	snap := r.Snapshot()
	if len(snap.Latest) != len(latest) {
		t.Fatalf("%d latest values, want %d", len(snap.Latest), len(latest))
	}
	for _, s := range snap.Latest {
		if v := latest[key{s.Device, s.Tag}]; s.Value != v {
			t.Errorf("latest %s/%s = %v, want %v", s.Device, s.Tag, s.Value, v)
		}
	}
}
