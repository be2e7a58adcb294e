package e2e

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"edgegw/internal/testenv"
)

// max_bytes = "16KiB" with a healthy uplink: segments follow the bound, so
// nothing unacknowledged is dropped (it was: a 64 KiB segment minimum made
// every roll drop the previous segment).
func TestSmallQueueHealthyUplinkDropsNothing(t *testing.T) {
	r := newEpochRig(t, 8)
	r.startReceiver()
	gw := r.startGateway(r.config("small", filepath.Join(r.dir, "data"), "[buffer]\nmax_bytes = \"16KiB\"\n"))
	start := time.Now()
	n := gw.status(t).Seq
	// 8 loggers x 2 tags at 20 Hz: 320 samples/s; 10 s is about 3,200
	// samples, 60 KiB on disk: four times the bound.
	testenv.WaitFor(t, 60*time.Second, "10 s and 3,000 samples", func() bool {
		return time.Since(start) >= 10*time.Second && gw.status(t).Seq >= n+3000
	})
	_, last := r.waitDelivered(gw, 1, 30*time.Second)
	st := gw.status(t)
	gw.term(20 * time.Second)
	r.stopReceiver()
	if st.Upstream.Dropped != 0 {
		t.Fatalf("dropped %d of %d with a healthy uplink", st.Upstream.Dropped, last)
	}
	t.Logf("%d samples through a 16 KiB queue, 0 dropped", last)
}

// needRoot skips a test that mounts file systems, with a message, when not
// root and CI is unset; under CI it fails.
func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		testenv.Missing(t, "mounting a tmpfs needs root")
	}
}

// mountTmpfs mounts a tmpfs of size at dir until the test ends.
func mountTmpfs(t *testing.T, dir, size string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o750); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size="+size, "tmpfs", dir).CombinedOutput(); err != nil {
		testenv.Missing(t, fmt.Sprintf("mount -t tmpfs: %v: %s", err, out))
	}
	t.Cleanup(func() {
		if out, err := exec.Command("umount", dir).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v: %s", dir, err, out)
		}
	})
}

func remount(t *testing.T, dir, how string) {
	t.Helper()
	if out, err := exec.Command("mount", "-o", "remount,"+how, dir).CombinedOutput(); err != nil {
		t.Fatalf("remount %s %s: %v: %s", how, dir, err, out)
	}
}

type queueStatus struct {
	Seq      uint64 `json:"seq"`
	Epoch    string `json:"epoch"`
	Upstream struct {
		QueueSamples int64  `json:"queue_samples"`
		Dropped      uint64 `json:"dropped"`
	} `json:"upstream"`
	Queue struct {
		Mode string `json:"mode"`
	} `json:"queue"`
}

func (g *runningGW) queue(t *testing.T) queueStatus {
	var s queueStatus
	if err := getJSON(t, g.page+"api/status", &s); err != nil {
		t.Logf("status: %v", err)
	}
	return s
}

// localFollowers follow the gateway's long polling and WebSocket from now
// on and record every seq each one gets.
type localFollowers struct {
	long, ws seqLog
	from     uint64 // the first seq both must get
	stop     chan struct{}
	done     sync.WaitGroup
	t        *testing.T
}

func followLocal(t *testing.T, page string) *localFollowers {
	f := &localFollowers{stop: make(chan struct{}), t: t}
	base := strings.TrimSuffix(page, "/")
	c, _, err := (&websocket.Dialer{HandshakeTimeout: 5 * time.Second}).Dial("ws"+strings.TrimPrefix(base, "http")+"/api/ws", nil)
	if err != nil {
		t.Fatal(err)
	}
	var first struct {
		Seq uint64 `json:"seq"`
	}
	if err := c.ReadJSON(&first); err != nil {
		t.Fatal(err)
	}
	f.from = first.Seq + 1
	f.done.Add(2)
	go func() {
		defer f.done.Done()
		for {
			var m struct {
				Type    string `json:"type"`
				Samples []struct {
					Seq uint64 `json:"seq"`
				} `json:"samples"`
			}
			if err := c.ReadJSON(&m); err != nil {
				return
			}
			if m.Type != "samples" {
				t.Errorf("websocket: %s frame while following", m.Type)
				return
			}
			for _, s := range m.Samples {
				f.ws.add(s.Seq)
			}
		}
	}()
	go func() {
		defer f.done.Done()
		defer c.Close()
		after := first.Seq
		for {
			select {
			case <-f.stop:
				return
			default:
			}
			var r struct {
				Seq     uint64 `json:"seq"`
				Reset   bool   `json:"reset"`
				Samples []struct {
					Seq uint64 `json:"seq"`
				} `json:"samples"`
			}
			err := getJSON(t, fmt.Sprintf("%s/api/longPolling?lastSequence=%d", base, after), &r)
			if err != nil && strings.Contains(err.Error(), "429") {
				// A client following 8 loggers at 50 ms asks more often
				// than the read limit allows: the refusal was held 500 ms,
				// ask again from the same seq (nothing is lost).
				continue
			}
			if err != nil {
				t.Errorf("long poll: %v", err)
				return
			}
			if r.Reset {
				t.Errorf("long poll after %d: reset", after)
				return
			}
			for _, s := range r.Samples {
				f.long.add(s.Seq)
			}
			after = r.Seq
		}
	}()
	t.Cleanup(f.end)
	return f
}

func (f *localFollowers) end() {
	select {
	case <-f.stop:
	default:
		close(f.stop)
	}
	testenv.Wait(f.t, time.Minute, "the local followers (long poll, websocket) to end", f.done.Wait)
}

// contiguous fails unless seqs are consecutive and cover [from, to].
func contiguous(t *testing.T, name string, seqs []uint64, from, to uint64) {
	t.Helper()
	for i := 1; i < len(seqs); i++ {
		if seqs[i] != seqs[i-1]+1 {
			t.Fatalf("%s: seq %d after %d", name, seqs[i], seqs[i-1])
		}
	}
	if len(seqs) == 0 || seqs[0] > from || seqs[len(seqs)-1] < to {
		t.Fatalf("%s: %d seqs, want every one of %d..%d", name, len(seqs), from, to)
	}
}

// checkLocalThrough waits until both followers reach seq to and checks they
// got every seq from their start, in order.
func checkLocalThrough(t *testing.T, f *localFollowers, to uint64) {
	t.Helper()
	testenv.WaitFor(t, 20*time.Second, fmt.Sprintf("local clients reach seq %d", to), func() bool {
		l, w := f.long.snapshot(), f.ws.snapshot()
		return len(l) > 0 && len(w) > 0 && l[len(l)-1] >= to && w[len(w)-1] >= to
	})
	contiguous(t, "long polling", f.long.snapshot(), f.from, to)
	contiguous(t, "websocket", f.ws.snapshot(), f.from, to)
}

// waitExact waits until the queue is back on disk and every seq the
// gateway numbered is either at the receiver or counted as dropped, and
// returns the last seq, the drop count and how many the receiver holds.
func (r *epochRig) waitExact(g *runningGW, what string) (last, dropped, got uint64) {
	r.t.Helper()
	st := g.queue(r.t)
	testenv.WaitFor(r.t, 60*time.Second, what, func() bool {
		st = g.queue(r.t)
		got = 0
		top := uint64(0)
		for _, s := range seqsOf(r.t, received(r.t, r.recvOut), st.Epoch) {
			if s <= st.Seq {
				got++
				top = s
			}
		}
		// top == Seq: the receiver has seen the end, so every hole below is known to it
		return st.Queue.Mode == "disk" && top == st.Seq && got+st.Upstream.Dropped >= st.Seq
	})
	return st.Seq, st.Upstream.Dropped, got
}

// data_dir on a 256 KiB tmpfs filled by an outage: local delivery (long
// polling, WebSocket) goes on with every sample, /api/status says the
// queue keeps to memory because the disk is full, the memory bound drops
// the oldest (counted), the uplink's return drains what fit and the queue
// goes back to disk by itself; the receiver misses exactly what was
// counted as dropped.
func TestFullDiskKeepsLocalDelivery(t *testing.T) {
	needRoot(t)
	r := newEpochRig(t, 16)
	data := filepath.Join(r.dir, "data")
	mountTmpfs(t, data, "256k")
	// Other files take most of the card: about 60 KiB stay for the queue,
	// below max_bytes, so the disk fills before the bound is reached.
	if err := os.WriteFile(filepath.Join(data, "other"), make([]byte, 192<<10), 0o600); err != nil {
		t.Fatal(err)
	}
	r.startReceiver()
	gw := r.startGateway(r.config("tmpfs", data, "[buffer]\nmax_bytes = \"96KiB\"\n"))
	r.waitDelivered(gw, 1, 30*time.Second)

	r.stopReceiver() // the outage
	waitMode := func(what, mode string) {
		t.Helper()
		testenv.WaitFor(t, 60*time.Second, what, func() bool {
			if gw.queue(t).Queue.Mode == mode {
				return true
			}
			select {
			case <-gw.done:
				t.Fatalf("gateway exited:\n%s", gw.log())
			default:
			}
			return false
		})
	}
	waitMode("the queue fills the disk and keeps to memory", "memory (disk: no space left on device)")
	f := followLocal(t, gw.page)
	testenv.WaitFor(t, 30*time.Second, "the memory bound drops the oldest", func() bool { return gw.queue(t).Upstream.Dropped > 0 })
	st := gw.queue(t)
	checkLocalThrough(t, f, st.Seq+500)
	if !strings.Contains(gw.log(), "keeping samples in memory") {
		t.Errorf("no log line for the change to memory:\n%s", gw.log())
	}
	var metrics strings.Builder
	if err := getText(gw.page+"metrics", &metrics); err != nil || !strings.Contains(metrics.String(), "edgegw_upstream_queue_degraded 1") {
		t.Errorf("metrics: %v\n%s", err, metrics.String())
	}

	r.startReceiver() // the uplink returns
	last, dropped, got := r.waitExact(gw, "the receiver holds all but what was dropped, queue back on disk")
	f.end()
	gw.term(20 * time.Second)
	_, missing := r.stopReceiverGaps()
	lost := r.receiverLost()
	// Every seq is at the receiver or reported lost: the drops at the
	// bound reach the receiver as loss ranges (no gap, no silent loss). The
	// gateway may count a few more drops than the receiver lacks: samples
	// the receiver stored whose ack it never sent because it was stopped
	// (at most the batches in flight, 4 x 500).
	if dropped == 0 || missing != 0 || lost != last-got || lost > dropped || dropped-lost > 4*500 {
		t.Fatalf("%d numbered, receiver holds %d, reports %d lost at the gateway and %d missing (gaps); gateway dropped %d (counted)", last, got, lost, missing, dropped)
	}
	t.Logf("%d samples, %d dropped at the bound (counted; %d of them stored before the outage, ack lost), the receiver reports %d lost, 0 missing", last, dropped, dropped-lost, lost)
}

// A read-only data_dir (a card mounted read-only after errors): the
// gateway starts, numbers in memory under a new epoch, local delivery gets
// every sample, the queue keeps to memory and says so, the uplink drains
// it; when the file system is writable again the queue and the sequence go
// back to disk by themselves. A SIGTERM while the disk refuses writes
// counts and logs what could not be written.
func TestReadOnlyDiskKeepsLocalDelivery(t *testing.T) {
	needRoot(t)
	r := newEpochRig(t, 8)
	data := filepath.Join(r.dir, "data")
	mountTmpfs(t, data, "16m")
	remount(t, data, "ro")
	r.startReceiver()
	cfg := r.config("ro", data, "")
	gw := r.startGateway(cfg)
	testenv.WaitFor(t, 30*time.Second, "the queue keeps to memory", func() bool {
		return gw.queue(t).Queue.Mode == "memory (disk: read-only file system)"
	})
	f := followLocal(t, gw.page)
	checkLocalThrough(t, f, f.from+1000)
	f.end()
	r.waitDelivered(gw, 1, 30*time.Second) // the uplink drains memory while the disk is read-only

	remount(t, data, "rw")
	last, dropped, _ := r.waitExact(gw, "back on disk, everything delivered")
	if dropped != 0 {
		t.Fatalf("dropped %d below the bound", dropped)
	}
	testenv.WaitFor(t, 30*time.Second, "the sequence's epoch written", func() bool {
		b, err := os.ReadFile(filepath.Join(data, "seq.hwm"))
		return err == nil && strings.Contains(string(b), gw.queue(t).Epoch)
	})
	gw.term(20 * time.Second)

	// Read-only again, the receiver away, then SIGTERM: counted and logged.
	r.stopReceiver()
	remount(t, data, "ro")
	gw = r.startGateway(cfg)
	testenv.WaitFor(t, 30*time.Second, "samples held in memory", func() bool { return gw.queue(t).Upstream.QueueSamples > 100 })
	gw.term(20 * time.Second)
	if !strings.Contains(gw.log(), "samples not written at shutdown") {
		t.Fatalf("no count of what could not be written at shutdown:\n%s", gw.log())
	}
	remount(t, data, "rw")
	t.Logf("%d samples delivered from a read-only data_dir, 0 dropped", last)
}

func getText(url string, b *strings.Builder) error {
	resp, err := http.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	_, err = io.Copy(b, resp.Body)
	return err
}
