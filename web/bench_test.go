package web

import (
	"context"
	"fmt"
	"net"
	"runtime"
	"sync"
	"testing"
	"time"

	"edgegw/history"
	"edgegw/ringstore"
)

// benchBatch is one poll of a 48-tag device (the study's 48 loggers × 1 tag, or 12 × 4).
func benchBatch(n int) []ringstore.Sample {
	b := make([]ringstore.Sample, n)
	ts := time.Now().UnixMicro()
	for i := range b {
		b[i] = ringstore.Sample{Seq: uint64(1000 + i), Device: fmt.Sprintf("logger-%02d", i/4), Tag: fmt.Sprintf("tag-%d", i%4),
			Value: 20 + float64(i)/10, TS: ts}
	}
	return b
}

// BenchmarkBroadcastEncode: one batch of 48 samples into one PreparedMessage.
func BenchmarkBroadcastEncode(b *testing.B) {
	batch := benchBatch(48)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := newFrame(batch); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkBroadcastFanout1000: encode one batch once and offer it to 1000
// in-memory client queues (what the hub does per ring append).
func BenchmarkBroadcastFanout1000(b *testing.B) {
	batch := benchBatch(48)
	var h hub
	h.clients = make(map[*wsClient]struct{})
	clients := make([]*wsClient, 1000)
	for i := range clients {
		clients[i] = &wsClient{queue: make(chan *frame, 64), gone: make(chan struct{})}
		h.add(clients[i], 0)
	}
	b.ReportAllocs()
	n := 0
	for b.Loop() {
		f, err := newFrame(batch)
		if err != nil {
			b.Fatal(err)
		}
		if d := h.broadcast(f); d != 0 {
			b.Fatalf("%d dropped", d)
		}
		if n++; n%64 == 0 { // the writers' side, amortised: empty the queues
			for _, c := range clients {
				for len(c.queue) > 0 {
					<-c.queue
				}
			}
		}
	}
}

// BenchmarkShortPollingEncode: the shortPolling body of a 192-tag snapshot,
// encoded (cache miss) and served from the cache (hit).
func BenchmarkShortPollingEncode(b *testing.B) {
	ring := newRing(b, 1000)
	for i := range 48 {
		batch := benchBatch(4)
		for j := range batch {
			batch[j].Device = fmt.Sprintf("logger-%02d", i)
		}
		if _, _, err := ring.Append(batch); err != nil {
			b.Fatal(err)
		}
	}
	s := New(Config{Ring: ring})
	b.Run("miss", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			s.short.Store(nil)
			_ = s.shortBody()
		}
		b.SetBytes(int64(len(s.shortBody())))
	})
	b.Run("hit", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_ = s.shortBody()
		}
	})
}

// BenchmarkLongPollWake1000: 1000 parked long polls; one op is one append
// and every waiter woken, answered (encoded) and back.
func BenchmarkLongPollWake1000(b *testing.B) {
	const waiters, per = 1000, 4
	ring := newRing(b, 1000)
	s := New(Config{Ring: ring, LongPollTimeout: time.Minute})
	ctx, cancel := context.WithCancel(context.Background())
	got := make(chan struct{}, waiters)
	var wg sync.WaitGroup
	start := ring.Seq()
	for range waiters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			after := start
			buf := make([]byte, 0, 4096)
			for {
				var ok bool
				buf, ok = s.longPoll(ctx, after, buf[:0])
				if !ok {
					return
				}
				after += per
				got <- struct{}{}
			}
		}()
	}
	batch := benchBatch(per)
	b.ReportAllocs()
	for b.Loop() {
		if _, _, err := ring.Append(batch); err != nil {
			b.Fatal(err)
		}
		for range waiters {
			<-got
		}
	}
	cancel()
	wg.Wait()
}

// BenchmarkLongPollWaiterMemory parks 1000 long polls and reports the heap
// and stack they hold, per waiter (the in-process cost: goroutine + timer;
// an HTTP connection adds net/http's per-connection buffers on top).
func BenchmarkLongPollWaiterMemory(b *testing.B) {
	const waiters = 1000
	ring := newRing(b, 100)
	s := New(Config{Ring: ring, LongPollTimeout: time.Hour})
	var total float64
	for b.Loop() {
		runtime.GC()
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		ctx, cancel := context.WithCancel(context.Background())
		var parked, wg sync.WaitGroup
		parked.Add(waiters)
		seq := ring.Seq()
		for range waiters {
			wg.Add(1)
			go func() {
				defer wg.Done()
				parked.Done()
				s.longPoll(ctx, seq, nil)
			}()
		}
		parked.Wait()
		runtime.Gosched()
		runtime.ReadMemStats(&after)
		total += float64(after.HeapInuse+after.StackInuse) - float64(before.HeapInuse+before.StackInuse)
		cancel()
		wg.Wait()
	}
	b.ReportMetric(total/float64(b.N)/waiters, "B/waiter")
}

// BenchmarkLongPollHTTPWaiterMemory: 1000 long polls waiting over real HTTP
// connections (raw TCP clients that send the request and wait), reported as
// heap+stack per waiter: the server's whole cost (connection goroutine,
// bufio buffers, request, timer) plus a raw client socket's small share.
func BenchmarkLongPollHTTPWaiterMemory(b *testing.B) {
	const waiters = 1000
	ts := startServer(b, Config{LongPollTimeout: time.Hour})
	host := ts.base[len("http://"):]
	var total float64
	for b.Loop() {
		runtime.GC()
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		conns := make([]net.Conn, 0, waiters)
		req := []byte("GET /api/longPolling?lastSequence=" + itoa(ts.ring.Seq()) + " HTTP/1.1\r\nHost: " + host + "\r\n\r\n")
		for range waiters {
			c, err := net.Dial("tcp", host)
			if err != nil {
				b.Fatal(err)
			}
			if _, err := c.Write(req); err != nil {
				b.Fatal(err)
			}
			conns = append(conns, c)
		}
		waitFor(b, 30*time.Second, "1000 waiting long polls", func() bool { return ts.Stats().LongPolling.Active == waiters })
		runtime.ReadMemStats(&after)
		total += float64(after.HeapInuse+after.StackInuse) - float64(before.HeapInuse+before.StackInuse)
		for _, c := range conns {
			c.Close()
		}
		waitFor(b, 30*time.Second, "the waits to end", func() bool { return ts.Stats().LongPolling.Active == 0 })
	}
	b.ReportMetric(total/float64(b.N)/waiters, "B/waiter")
}

// BenchmarkAppendPoints: one history answer's JSON, 1,200 raw points and
// 1,200 buckets (a whole raw window, MaxPoints of buckets).
func BenchmarkAppendPoints(b *testing.B) {
	const n = 1200
	raw := &history.Points{Kind: "raw", From: 0, To: n * 1e6}
	bk := &history.Points{Kind: "buckets", Step: time.Minute, From: 0, To: n * 6e7}
	for i := range n {
		v := 20 + float64(i%97)/10
		raw.TS, raw.Value, raw.Quality = append(raw.TS, int64(i)*1e6), append(raw.Value, v), append(raw.Quality, ringstore.Good)
		bk.TS = append(bk.TS, int64(i)*6e7)
		bk.Min, bk.Max, bk.Mean, bk.Last = append(bk.Min, v-1), append(bk.Max, v+1), append(bk.Mean, v), append(bk.Last, v)
		bk.Good, bk.Bad = append(bk.Good, 60), append(bk.Bad, 0)
	}
	for _, p := range []*history.Points{raw, bk} {
		b.Run("kind="+p.Kind, func(b *testing.B) {
			buf := make([]byte, 0, 256<<10)
			b.ReportAllocs()
			for b.Loop() {
				buf = appendPoints(buf[:0], "logger-01", "temperature", "°C", n, p)
			}
			b.SetBytes(int64(len(buf)))
		})
	}
}
