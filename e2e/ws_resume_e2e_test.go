package e2e

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/gorilla/websocket"
)

// The slow resumers: how many WebSocket clients resume from the start of a
// full ring and read slowly, and how long they are held. make test runs
// 1000 × 10 s; EDGEGW_WS_RESUME="N,HOLD" runs another size, and
// EDGEGW_WS_RESUME_BIN=/path/to/edgegw runs it against another build (the
// one before: figures only, nothing asserted).
type resumeSpec struct {
	clients int
	hold    time.Duration
}

func resumeFromEnv(t *testing.T) resumeSpec {
	spec := resumeSpec{1000, 10 * time.Second}
	if v := os.Getenv("EDGEGW_WS_RESUME"); v != "" {
		f := strings.Split(v, ",")
		var err1, err2 error
		if len(f) == 2 {
			spec.clients, err1 = strconv.Atoi(f[0])
			spec.hold, err2 = time.ParseDuration(f[1])
		}
		if len(f) != 2 || err1 != nil || err2 != nil || spec.clients < 1 {
			t.Fatalf("EDGEGW_WS_RESUME=%q: want clients,hold", v)
		}
	}
	return spec
}

// procMem reads VmRSS and VmHWM (peak) of pid in bytes.
func procMem(t *testing.T, pid int) (rss, hwm int64) {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		if len(f) == 3 && f[2] == "kB" {
			n, _ := strconv.ParseInt(f[1], 10, 64)
			switch f[0] {
			case "VmRSS:":
				rss = n << 10
			case "VmHWM:":
				hwm = n << 10
			}
		}
	}
	return rss, hwm
}

// raiseNofile lifts the soft descriptor limit to the hard one, and says so
// when that is below need. An explicit Setrlimit is inherited by the
// gateway child (Go restores the original limit for children otherwise).
func raiseNofile(t *testing.T, need uint64) {
	t.Helper()
	var l syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &l); err != nil {
		t.Fatal(err)
	}
	if l.Max < need {
		t.Fatalf("RLIMIT_NOFILE hard limit %d: this test needs %d descriptors", l.Max, need)
	}
	l.Cur = l.Max
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &l); err != nil {
		t.Fatal(err)
	}
}

// deviceCounts reads /api/devices through get, retried until it answers.
func deviceCounts(t *testing.T, what string, get func(v any) error) map[string]devCounts {
	t.Helper()
	var m map[string]devCounts
	waitFor(t, 20*time.Second, what, func() bool {
		var d struct{ Devices []devCounts }
		if get(&d) != nil {
			return false
		}
		m = map[string]devCounts{}
		for _, x := range d.Devices {
			m[x.Name] = x
		}
		return true
	})
	return m
}

// errRefused: the gateway closed the connection with 1013 (over its queue
// budget) instead of sending the snapshot.
var errRefused = errors.New("closed with 1013 try again later")

// slowResumer upgrades a raw loopback connection with a 4 KiB receive
// buffer, reads the snapshot and sends {"lastSequence":N} in a masked
// frame, N = back samples before the snapshot's seq.
func slowResumer(host string, back uint64) (net.Conn, error) {
	d := net.Dialer{Timeout: 10 * time.Second, Control: func(_, _ string, rc syscall.RawConn) error {
		var serr error
		if err := rc.Control(func(fd uintptr) {
			serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096)
		}); err != nil {
			return err
		}
		return serr
	}}
	c, err := d.Dial("tcp", host)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(c, "GET /api/ws HTTP/1.1\r\nHost: %s\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"+
		"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n", host)
	_ = c.SetReadDeadline(time.Now().Add(20 * time.Second))
	// Read the reply byte by byte up to its blank line: what follows is
	// the stream, read slowly by the caller.
	var head []byte
	one := make([]byte, 1)
	for !strings.HasSuffix(string(head), "\r\n\r\n") {
		if _, err := c.Read(one); err != nil {
			c.Close()
			return nil, fmt.Errorf("upgrade reply %q: %w", head, err)
		}
		head = append(head, one[0])
	}
	if !strings.HasPrefix(string(head), "HTTP/1.1 101") {
		c.Close()
		return nil, fmt.Errorf("upgrade refused: %q", head)
	}
	// The snapshot: one unmasked text frame (16-bit or 64-bit length).
	hdr := make([]byte, 2, 10)
	if _, err := io.ReadFull(c, hdr); err != nil {
		c.Close()
		return nil, fmt.Errorf("snapshot header: %w", err)
	}
	size := uint64(hdr[1] & 0x7f)
	switch size {
	case 126:
		hdr = hdr[:4]
		_, err = io.ReadFull(c, hdr[2:])
		size = uint64(binary.BigEndian.Uint16(hdr[2:]))
	case 127:
		hdr = hdr[:10]
		_, err = io.ReadFull(c, hdr[2:])
		size = binary.BigEndian.Uint64(hdr[2:])
	}
	if err == nil && hdr[0] == 0x88 && size >= 2 && size < 126 { // a close frame instead
		b := make([]byte, size)
		if _, err := io.ReadFull(c, b); err == nil && binary.BigEndian.Uint16(b) == websocket.CloseTryAgainLater {
			c.Close()
			return nil, errRefused
		}
	}
	if err != nil || hdr[0] != 0x81 || size > 1<<20 {
		c.Close()
		return nil, fmt.Errorf("snapshot header %x: %v", hdr, err)
	}
	body := make([]byte, size)
	var snap struct{ Seq uint64 }
	if _, err := io.ReadFull(c, body); err != nil || json.Unmarshal(body, &snap) != nil || snap.Seq < back {
		c.Close()
		return nil, fmt.Errorf("snapshot %.80q: %v", body, err)
	}
	msg := []byte(`{"lastSequence":` + strconv.FormatUint(snap.Seq-back, 10) + `}`)
	mask := [4]byte{7, 1, 8, 2}
	frame := append([]byte{0x81, 0x80 | byte(len(msg))}, mask[:]...) // FIN + text, masked, length < 126
	for i, b := range msg {
		frame = append(frame, b^mask[i%4])
	}
	if _, err := c.Write(frame); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

type wsStatus struct {
	Seq     uint64 `json:"seq"`
	Clients struct {
		WS        int64           `json:"websocket"`
		WSDropped uint64          `json:"ws_dropped"`
		DropBy    json.RawMessage `json:"ws_dropped_by"`
		Queued    int64           `json:"ws_queued_bytes"`
	} `json:"clients"`
	Ring struct {
		Size uint64 `json:"size"`
	} `json:"ring"`
}

// 1000 WebSocket clients resume from the start of a full ring (48 UDP
// loggers × 2 tags, 5,760 samples) and read 1 KiB every 100 ms, on real
// loopback sockets against the real binary: the gateway's peak RSS
// (VmHWM, so no moment is missed) stays within 64 MiB above its idle RSS
// with the ring full, every logger keeps ≥ 99.9% of its polls valid, and
// well-behaved clients that resumed from far back too get every sample,
// in order, up to the gateway's last. exempt_loopback = true: the load
// comes from loopback, beyond the per-client rate limit.
func TestWebSocketResumeMemoryE2E(t *testing.T) {
	spec := resumeFromEnv(t)
	gwBin := bin
	if b := os.Getenv("EDGEGW_WS_RESUME_BIN"); b != "" {
		gwBin = b
	}
	raiseNofile(t, uint64(2*spec.clients+512))
	addrs := simFleet(t, 48)
	const ringSize = 5760
	head := fmt.Sprintf("[http]\nlisten = \"127.0.0.1:0\"\nexempt_loopback = true\n[ring]\nsize = %d\n", ringSize)
	gw, page := runFleetGateway(t, gwBin, head, addrs, 200*time.Millisecond, 150*time.Millisecond)
	// The control: the same gateway polling 48 loggers of its own, which
	// no client touches, on the same machine at the same time. What a busy
	// machine costs (every process descheduled past a poll's timeout) it
	// loses too; what the resumes cost the gateway, only the gateway does.
	ctrl, ctrlPage := runFleetGateway(t, gwBin, head, simFleet(t, 48), 200*time.Millisecond, 150*time.Millisecond)
	ctrlDevices := func() map[string]devCounts {
		return deviceCounts(t, "/api/devices", func(v any) error { return getJSON(t, ctrlPage+"api/devices", v) })
	}
	host := strings.TrimSuffix(strings.TrimPrefix(page, "http://"), "/")
	wsURL := "ws://" + host + "/api/ws"
	pid := gw.Cmd.Process.Pid
	status := func() (st wsStatus) {
		waitFor(t, 20*time.Second, "/api/status", func() bool { return getJSON(t, page+"api/status", &st) == nil })
		return st
	}
	devices := func() map[string]devCounts {
		return deviceCounts(t, "/api/devices", func(v any) error { return getJSON(t, page+"api/devices", v) })
	}
	// A full ring, and then some: the oldest samples are being overwritten.
	start := status().Seq // the first seq is derived from the clock: not 0
	waitFor(t, 60*time.Second, "a full ring", func() bool { return status().Seq >= start+ringSize+960 })
	idle, _ := procMem(t, pid)
	before, ctrlBefore := devices(), ctrlDevices()

	// Well-behaved clients resume from far back too, and read everything.
	const goodN = 4
	type goodClient struct {
		conn   *websocket.Conn
		cursor atomic.Uint64
		err    atomic.Pointer[error]
		done   chan struct{}
	}
	goods := make([]*goodClient, goodN)
	for i := range goods {
		d := websocket.Dialer{HandshakeTimeout: 10 * time.Second}
		c, _, err := d.Dial(wsURL, nil)
		if err != nil {
			t.Fatal(err)
		}
		g := &goodClient{conn: c, done: make(chan struct{})}
		goods[i] = g
		t.Cleanup(func() { c.Close(); <-g.done })
		var snap struct{ Seq uint64 }
		_ = c.SetReadDeadline(time.Now().Add(20 * time.Second))
		if err := c.ReadJSON(&snap); err != nil {
			t.Fatal(err)
		}
		from := snap.Seq - ringSize + 960 // well inside the ring when it arrives
		if err := c.WriteJSON(map[string]uint64{"lastSequence": from}); err != nil {
			t.Fatal(err)
		}
		g.cursor.Store(from)
		go func() {
			defer close(g.done)
			resumed := false
			for {
				var f struct {
					Type    string
					Samples []struct{ Seq uint64 }
				}
				_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
				if err := c.ReadJSON(&f); err != nil {
					g.err.CompareAndSwap(nil, &err)
					return
				}
				if !resumed { // live frames after the snapshot may come before the resume's reply
					if len(f.Samples) == 0 || f.Samples[0].Seq != from+1 {
						continue
					}
					resumed = true
				}
				for _, s := range f.Samples {
					if want := g.cursor.Load() + 1; f.Type != "samples" || s.Seq != want {
						err := fmt.Errorf("%s message: seq %d, want %d", f.Type, s.Seq, want)
						g.err.CompareAndSwap(nil, &err)
						return
					}
					g.cursor.Store(s.Seq)
				}
			}
		}()
	}
	caughtUp := func(what string) {
		target := status().Seq
		waitFor(t, 30*time.Second, what, func() bool {
			for _, g := range goods {
				if e := g.err.Load(); e != nil {
					t.Fatalf("a well-behaved client: %v", *e)
				}
				if g.cursor.Load() < target {
					return false
				}
			}
			return true
		})
	}
	caughtUp("the well-behaved clients caught up")

	// The slow resumers, each from the start of the ring as its snapshot
	// shows it, less one second of polls (480 samples) for its message to
	// arrive while the ring moves on.
	const back = ringSize - 480
	var (
		mu      sync.Mutex
		slow    []net.Conn
		dialErr []error
		refused int // closed with 1013 at the snapshot: over the budget
		wg      sync.WaitGroup
		stop    = make(chan struct{})
	)
	jobs := make(chan int)
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range jobs {
				c, err := slowResumer(host, back)
				mu.Lock()
				switch {
				case errors.Is(err, errRefused):
					refused++
				case err != nil:
					dialErr = append(dialErr, err)
				default:
					slow = append(slow, c)
				}
				mu.Unlock()
			}
		}()
	}
	t0 := time.Now()
	for i := range spec.clients {
		jobs <- i
	}
	close(jobs)
	wg.Wait()
	dialT := time.Since(t0)
	if len(dialErr) > 0 {
		t.Fatalf("%d of %d slow clients not connected, first: %v", len(dialErr), spec.clients, dialErr[0])
	}
	var readers sync.WaitGroup
	var slowBytes atomic.Int64
	for _, c := range slow {
		readers.Add(1)
		go func() {
			defer readers.Done()
			defer c.Close()
			buf := make([]byte, 1024)
			tick := time.NewTicker(100 * time.Millisecond) // the pace of a slow reader, not a wait
			defer tick.Stop()
			for {
				select {
				case <-stop:
					return
				case <-tick.C:
				}
				_ = c.SetReadDeadline(time.Now().Add(time.Second))
				n, err := c.Read(buf)
				slowBytes.Add(int64(n))
				if err != nil && !os.IsTimeout(err) {
					return // dropped by the gateway
				}
			}
		}()
	}
	// Hold, sampling RSS for the log; VmHWM is the assertion.
	var peakSampled int64
	holdEnd := time.Now().Add(spec.hold)
	for tick := time.NewTicker(200 * time.Millisecond); time.Now().Before(holdEnd); <-tick.C {
		if rss, _ := procMem(t, pid); rss > peakSampled {
			peakSampled = rss
		}
	}
	_, hwm := procMem(t, pid)
	during := status()
	close(stop)
	readers.Wait()
	caughtUp("the well-behaved clients up to the gateway's last")
	after, ctrlAfter := devices(), ctrlDevices()

	polls, good, worst, _ := windows(before, after)
	valid := float64(good) / float64(max(polls, 1))
	cPolls, cGood, cWorst, _ := windows(ctrlBefore, ctrlAfter)
	cValid := float64(cGood) / float64(max(cPolls, 1))
	const mib = 1 << 20
	t.Logf("%d slow resumers %d samples back (binary %s, connected in %v, %d refused with 1013, held %v): idle RSS %.1f MiB, peak RSS %.1f MiB (VmHWM; sampled %.1f), "+
		"%.1f MiB above idle (%.1f KiB a client); clients at the end of the hold %d, dropped %d %s, queued %d B; slow clients read %d KiB; "+
		"valid %.3f%% (%d of %d polls, at most %d missed by a logger); the control gateway beside it %.3f%% (%d of %d, at most %d)",
		spec.clients, back, gwBin, dialT.Round(time.Millisecond), refused, spec.hold, float64(idle)/mib, float64(hwm)/mib, float64(peakSampled)/mib,
		float64(hwm-idle)/mib, float64(hwm-idle)/1024/float64(spec.clients), during.Clients.WS, during.Clients.WSDropped, string(during.Clients.DropBy),
		during.Clients.Queued, slowBytes.Load()>>10, 100*valid, good, polls, worst, 100*cValid, cGood, cPolls, cWorst)
	if gwBin != bin {
		return // a measurement of another build: figures only
	}
	var by struct {
		QueueBudget uint64 `json:"queue_budget"`
	}
	if err := json.Unmarshal(during.Clients.DropBy, &by); err != nil || by.QueueBudget < uint64(refused) {
		t.Errorf("%d clients refused with 1013, ws_dropped_by %s (%v)", refused, during.Clients.DropBy, err)
	}
	if hwm-idle > 64*mib {
		t.Errorf("peak RSS %.1f MiB above idle with %d slow resumers, want ≤ 64 MiB", float64(hwm-idle)/mib, spec.clients)
	}
	// One missed window per logger is what a stall of this shared machine
	// (every process descheduled past the timeout) costs at 200 ms: 2% of
	// a 10 s hold; a busier machine costs the control as much. More than
	// both is the resumes' doing.
	if valid < 0.999 && worst > cWorst+1 {
		t.Errorf("valid sample rate %.3f%% during the resumes (a logger missed %d windows; the control beside it %.3f%%, at most %d), want ≥ 99.9%% or no worse than the control",
			100*valid, worst, 100*cValid, cWorst)
	}
	gw.Stop(os.Interrupt, 20*time.Second)
	ctrl.Stop(os.Interrupt, 20*time.Second)
}
