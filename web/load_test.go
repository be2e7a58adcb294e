package web

import (
	"encoding/json"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"edgegw/internal/testenv"

	"github.com/gorilla/websocket"
)

// 1000 clients of one method in one process: each connection is two file
// descriptors here (client and server side).
const loadClients = 1000

// stream appends n batches of 3 samples at 10 Hz and returns the last seq.
func stream(t *testing.T, ts *testServer, n int) uint64 {
	t.Helper()
	tick := time.NewTicker(100 * time.Millisecond) // the load: a 10 Hz poll stream
	defer tick.Stop()
	var last uint64
	for i := range n {
		<-tick.C
		_, last = appendBatch(t, ts.ring, "logger-01", 3, float64(i))
	}
	return last
}

// needFiles is testenv.NeedFiles.
var needFiles = testenv.NeedFiles

func TestThousandLongPollers(t *testing.T) {
	if testing.Short() {
		t.Skip("-short")
	}
	needFiles(t, 3*loadClients)
	ring := newRing(t, 1000) // 90 samples: no client may fall out of the ring
	// The write timeout is the server's bound on a slow response (it closes
	// the connection): far above what a loaded machine may take here, so
	// that this test is about delivery.
	ts := startServer(t, Config{Ring: ring, LongPollTimeout: 10 * time.Second, WriteTimeout: 3 * time.Minute, RateLimit: defaultLimits}) // loopback limited like any host: the default limits serve 1000 long pollers
	const batches = 30
	start := ring.Seq()
	final := start + 3*batches

	var (
		wg     sync.WaitGroup
		failed atomic.Int32
		polls  atomic.Int64
		errs   = make(chan error, loadClients)
	)
	for i := range loadClients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			chk := seqChecker{next: start + 1}
			last := start
			deadline := time.Now().Add(3 * time.Minute)
			for last < final && time.Now().Before(deadline) && failed.Load() == 0 {
				resp, err := ts.client.Get(ts.base + "/api/longPolling?lastSequence=" + itoa(last))
				if err != nil {
					errs <- fmt.Errorf("client %d: %v", i, err)
					failed.Add(1)
					return
				}
				var r longReply
				err = json.NewDecoder(resp.Body).Decode(&r)
				resp.Body.Close()
				polls.Add(1)
				if err == nil && resp.StatusCode != http.StatusOK {
					err = fmt.Errorf("HTTP %d %s", resp.StatusCode, r.Error)
				}
				if err == nil && r.Reset {
					err = fmt.Errorf("reset at %d", last)
				}
				if err == nil {
					err = chk.add(r.Samples)
				}
				if err != nil {
					errs <- fmt.Errorf("client %d: %v", i, err)
					failed.Add(1)
					return
				}
				last = r.Seq
			}
			if chk.n != 3*batches {
				errs <- fmt.Errorf("client %d: got %d samples, want %d", i, chk.n, 3*batches)
				failed.Add(1)
			}
		}()
	}
	waitFor(t, 30*time.Second, "1000 waiting long polls", func() bool {
		return ts.Stats().LongPolling.Active == loadClients || failed.Load() > 0
	})
	t0 := time.Now()
	stream(t, ts, batches)
	testenv.Wait(t, 4*time.Minute, "the long-pollers to receive the stream", wg.Wait)
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	t.Logf("%d long-pollers × %d samples: %d polls, all delivered %v after the stream started; server %+v",
		loadClients, 3*batches, polls.Load(), time.Since(t0).Round(time.Millisecond), ts.Stats())
}

func TestThousandWebSockets(t *testing.T) {
	if testing.Short() {
		t.Skip("-short")
	}
	needFiles(t, 3*loadClients)
	ring := newRing(t, 1000)
	// The queue (64 frames) holds the whole stream (30 batches); a write
	// timeout and a ping deadline far above what a loaded machine may take:
	// the drops of slow clients (TestSlowWebSocketClientDropped) cannot
	// happen by design here, so any drop, gap or closure is a fault.
	ts := startServer(t, Config{Ring: ring, WSWriteTimeout: time.Minute, WSPingInterval: time.Minute, RateLimit: defaultLimits}) // loopback limited like any host
	const batches = 30
	var (
		ready, wg sync.WaitGroup
		failed    atomic.Int32
		errs      = make(chan error, loadClients)
		conns     = make([]*websocket.Conn, loadClients)
		snaps     = make([]uint64, loadClients)
	)
	d := websocket.Dialer{HandshakeTimeout: 30 * time.Second}
	for i := range conns {
		c, _, err := d.Dial(ts.wsURL, nil)
		if err != nil {
			t.Fatalf("dial %d: %v", i, err)
		}
		conns[i] = c
		f := mustFrame(t, c)
		snaps[i] = f.Seq
	}
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	waitFor(t, 10*time.Second, "1000 clients registered", func() bool { return ts.hub.count() == loadClients })
	start := ring.Seq()
	final := start + 3*batches
	for i, c := range conns {
		if snaps[i] != start {
			t.Fatalf("client %d: snapshot at %d, ring at %d", i, snaps[i], start)
		}
		ready.Add(1)
		wg.Add(1)
		go func() {
			defer wg.Done()
			chk := seqChecker{next: start + 1}
			ready.Done()
			for chk.next <= final && failed.Load() == 0 {
				f, err := readFrame(c, 30*time.Second)
				if err == nil && f.Type != "samples" {
					err = fmt.Errorf("frame type %q", f.Type)
				}
				if err == nil {
					err = chk.add(f.Samples)
				}
				if err != nil {
					errs <- fmt.Errorf("client %d: %v", i, err)
					failed.Add(1)
					return
				}
			}
		}()
	}
	testenv.Wait(t, time.Minute, "the websocket readers to start", ready.Wait)
	t0 := time.Now()
	stream(t, ts, batches)
	testenv.Wait(t, 3*time.Minute, "the websocket clients to receive the stream", wg.Wait)
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	st := ts.Stats()
	if st.WSDropped != 0 {
		t.Errorf("%d clients dropped", st.WSDropped)
	}
	t.Logf("%d websocket clients × %d samples: %d frames sent, delivered %v after the stream started; server %+v",
		loadClients, 3*batches, st.WSFramesSent, time.Since(t0).Round(time.Millisecond), st)
}
