package spool

import (
	"context"
	"fmt"
	"os"
	"sort"
	"sync"
	"testing"
	"time"

	"edgegw/internal/testenv"
	"edgegw/ringstore"
)

// BenchmarkPollFsyncAlwaysSlowDisk: 8 pollers append 2-tag polls to a ring
// feeding a disk queue with fsync = "always" on a disk whose fsync takes
// 10 ms (a test hook in front of the real sync; the queue on a tmpfs,
// /dev/shm when there is one, so the hook is the whole cost), while a local reader
// follows the ring (Since, as long polling does). Reported: the poll's
// hand-off p99 (ring and queue, until the samples are synced, as a poll
// waits before its next window) and the reader's p99 (what a slow disk
// costs local clients).
func BenchmarkPollFsyncAlwaysSlowDisk(b *testing.B) {
	seq, _ := ringstore.OpenSequence("")
	ring := ringstore.NewRing(1000, seq)
	dir := b.TempDir()
	if d, err := os.MkdirTemp("/dev/shm", "edgegw-bench"); err == nil { // a tmpfs: the hook is the whole fsync
		dir = d
		defer os.RemoveAll(d)
	}
	q, err := Open(Config{Dir: dir, Fsync: FsyncAlways})
	if err != nil {
		b.Fatal(err)
	}
	diskOf(q).fsync = func(f *os.File) error { time.Sleep(10 * time.Millisecond); return f.Sync() }
	attachForBench(ring, q)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- q.Run(ctx) }()

	const pollers = 8
	lat := make([][]time.Duration, pollers)
	var rlat []time.Duration
	stop := make(chan struct{})
	var rwg sync.WaitGroup
	rwg.Add(1)
	go func() { // the local reader
		defer rwg.Done()
		var dst []ringstore.Sample
		after := ring.Seq()
		for {
			select {
			case <-stop:
				return
			default:
			}
			t0 := time.Now()
			res := ring.Since(after, dst[:0])
			rlat = append(rlat, time.Since(t0))
			if res.Reset || len(res.Samples) == 0 {
				after = res.Seq
				select {
				case <-res.Wait:
				case <-stop:
					return
				}
				continue
			}
			after = res.Samples[len(res.Samples)-1].Seq
			dst = res.Samples
		}
	}()
	b.ResetTimer()
	var wg sync.WaitGroup
	for p := 0; p < pollers; p++ {
		wg.Add(1)
		go func(p int) {
			defer wg.Done()
			dev := fmt.Sprintf("logger-%02d", p)
			for i := p; i < b.N; i += pollers {
				batch := []ringstore.Sample{{Device: dev, Tag: "temperature", Value: 21.5, TS: int64(i)}, {Device: dev, Tag: "humidity", Value: 45, TS: int64(i)}}
				t0 := time.Now()
				if _, _, err := ring.Append(batch); err != nil {
					b.Error(err)
					return
				}
				lat[p] = append(lat[p], time.Since(t0))
			}
		}(p)
	}
	wg.Wait()
	b.StopTimer()
	close(stop)
	rwg.Wait()
	cancel()
	<-done
	q.Close()
	var all []time.Duration
	for _, l := range lat {
		all = append(all, l...)
	}
	b.ReportMetric(p99(all), "poll-p99-ms")
	b.ReportMetric(p99(rlat), "reader-p99-ms")
}

func p99(d []time.Duration) float64 {
	if len(d) == 0 {
		return 0
	}
	sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
	return float64(d[len(d)*99/100]) / float64(time.Millisecond)
}

// attachForBench wires the queue to the ring as the gateway does.
func attachForBench(r *ringstore.Ring, q *Queue) {
	if err := r.Consume(q.Consumer("queue")); err != nil {
		panic(err)
	}
}

// The disk write runs after the ring's lock is released: while a poll's
// fsync hangs, readers see its samples and another device's poll is
// numbered; the hung poll's Append returns only after its sync.
func TestNoDiskIOUnderRingLock(t *testing.T) {
	seq, _ := ringstore.OpenSequence("")
	ring := ringstore.NewRing(100, seq)
	q := openQ(t, Config{Dir: t.TempDir(), Fsync: FsyncAlways})
	entered, release := make(chan struct{}, 16), make(chan struct{})
	var once sync.Once
	t.Cleanup(func() { once.Do(func() { close(release) }); q.Close() })
	diskOf(q).fsync = func(f *os.File) error { entered <- struct{}{}; <-release; return f.Sync() }
	attachForBench(ring, q)
	start := ring.Seq()
	returned := make(chan uint64)
	go func() {
		_, last, _ := ring.Append([]ringstore.Sample{{Device: "a", Tag: "t", Value: 1}})
		returned <- last
	}()
	testenv.Recv(t, entered, 10*time.Second, "the first poll's sync") // it hangs
	res := ring.Since(start, nil)
	if len(res.Samples) != 1 {
		t.Fatalf("reader during the sync: %+v", res)
	}
	other := make(chan struct{})
	go func() { ring.Append([]ringstore.Sample{{Device: "b", Tag: "t", Value: 2}}); close(other) }()
	waitFor(t, "another poll numbered and stored while the disk hangs", func() bool { return ring.Seq() > res.Seq })
	select {
	case <-returned:
		t.Fatal("Append returned before its sync")
	default:
	}
	once.Do(func() { close(release) })
	if last := testenv.Recv(t, returned, 10*time.Second, "the first poll's Append to return after its sync"); last != res.Seq {
		t.Fatalf("last %d, want %d", last, res.Seq)
	}
	testenv.Closed(t, other, 10*time.Second, "the other poll's Append to return")
}
