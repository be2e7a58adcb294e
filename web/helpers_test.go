package web

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"edgegw/internal/testenv"
	"edgegw/ringstore"
	"edgegw/stats"

	"github.com/gorilla/websocket"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func newRing(t testing.TB, size int) *ringstore.Ring {
	t.Helper()
	seq, err := ringstore.OpenSequence(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return ringstore.NewRing(size, seq)
}

// appendBatch appends one poll of device: n tags t00…, values base+i.
func appendBatch(t testing.TB, r *ringstore.Ring, device string, n int, base float64) (first, last uint64) {
	t.Helper()
	batch := make([]ringstore.Sample, n)
	ts := time.Now().UnixMicro()
	for i := range batch {
		batch[i] = ringstore.Sample{Device: device, Tag: fmt.Sprintf("t%02d", i), Value: base + float64(i), TS: ts}
	}
	first, last, err := r.Append(batch)
	if err != nil {
		t.Fatal(err)
	}
	return first, last
}

// testServer runs a Server with Serve on 127.0.0.1:0 until the test ends.
type testServer struct {
	*Server
	ring   *ringstore.Ring
	base   string // http://127.0.0.1:PORT
	wsURL  string
	client *http.Client
	stop   func() // cancels Serve and waits for it (idempotent)
}

func startServer(t testing.TB, cfg Config) *testServer {
	t.Helper()
	if cfg.Listen == "" {
		cfg.Listen = "127.0.0.1:0"
	}
	ring, _ := cfg.Ring.(*ringstore.Ring)
	if cfg.Ring == nil {
		ring = newRing(t, 200)
		cfg.Ring = ring
	}
	if cfg.RateLimit == (RateLimits{}) {
		// Tests load the server from loopback far beyond the default
		// limits; the tests of the limits set theirs.
		cfg.RateLimit.ExemptLoopback = true
	}
	s := New(cfg)
	addr, err := s.Listen()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx) }()
	tr := &http.Transport{MaxIdleConnsPerHost: 2000, DisableCompression: true}
	var once sync.Once
	ts := &testServer{
		Server: s, ring: ring,
		base:   "http://" + addr.String(),
		wsURL:  "ws://" + addr.String() + "/api/ws",
		client: &http.Client{Transport: tr, Timeout: 60 * time.Second},
	}
	ts.stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("Serve: %v", err)
				}
			case <-time.After(20 * time.Second):
				t.Errorf("Serve did not return within 20s of cancel")
			}
			tr.CloseIdleConnections()
		})
	}
	t.Cleanup(ts.stop)
	return ts
}

func (ts *testServer) get(t testing.TB, path string) (int, http.Header, []byte) {
	t.Helper()
	resp, err := ts.client.Get(ts.base + path)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: read: %v", path, err)
	}
	return resp.StatusCode, resp.Header, b
}

type longReply struct {
	Seq     uint64             `json:"seq"`
	Reset   bool               `json:"reset"`
	Samples []ringstore.Sample `json:"samples"`
	Error   string             `json:"error"`
}

func (ts *testServer) longPoll(t testing.TB, last uint64) longReply {
	t.Helper()
	code, _, b := ts.get(t, "/api/longPolling?lastSequence="+strconv.FormatUint(last, 10))
	if code != http.StatusOK {
		t.Fatalf("longPolling: %d %s", code, b)
	}
	var r longReply
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatalf("longPolling: %v in %s", err, b)
	}
	return r
}

// waitFor is testenv.WaitFor: poll a condition with a deadline.
var waitFor = testenv.WaitFor

type wsFrame struct {
	Type    string             `json:"type"`
	Seq     uint64             `json:"seq"`
	Reset   bool               `json:"reset"`
	Samples []ringstore.Sample `json:"samples"`
}

func dialWS(t testing.TB, url string, h http.Header) *websocket.Conn {
	t.Helper()
	d := websocket.Dialer{HandshakeTimeout: 10 * time.Second}
	c, resp, err := d.Dial(url, h)
	if err != nil {
		code := 0
		if resp != nil {
			code = resp.StatusCode
		}
		t.Fatalf("dial %s: %v (HTTP %d)", url, err, code)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func readFrame(c *websocket.Conn, d time.Duration) (wsFrame, error) {
	var f wsFrame
	_ = c.SetReadDeadline(time.Now().Add(d))
	typ, b, err := c.ReadMessage()
	if err != nil {
		return f, err
	}
	if typ != websocket.TextMessage {
		return f, errors.New("not a text frame")
	}
	if err := json.Unmarshal(b, &f); err != nil {
		return f, fmt.Errorf("%v in %s", err, b)
	}
	return f, nil
}

func mustFrame(t testing.TB, c *websocket.Conn) wsFrame {
	t.Helper()
	f, err := readFrame(c, 10*time.Second)
	if err != nil {
		t.Fatalf("read frame: %v", err)
	}
	return f
}

// seqChecker asserts samples arrive in order with no gap and no duplicate.
type seqChecker struct {
	next uint64 // expected next seq
	n    int
}

func (c *seqChecker) add(samples []ringstore.Sample) error {
	for _, s := range samples {
		if s.Seq != c.next {
			return fmt.Errorf("got seq %d, want %d (after %d samples)", s.Seq, c.next, c.n)
		}
		c.next++
		c.n++
	}
	return nil
}

// fakeDevices is data for /api/devices, /metrics and the page.
type fakeDevices []stats.Entry

func (f fakeDevices) Devices() []stats.Entry { return f }

var _ Devices = fakeDevices(nil)

func someDevices() fakeDevices {
	now := time.Now()
	mk := func(name, transport, addr string, good bool, rtts ...time.Duration) stats.Entry {
		d := &stats.Device{}
		for _, r := range rtts {
			d.Requests.Add(1)
			d.Responses.Add(1)
			d.RTT.Observe(r)
			d.Cycle.Observe(r + 100*time.Microsecond)
		}
		d.Requests.Add(2)
		d.Timeouts.Add(2)
		d.Polls.Add(uint64(len(rtts)))
		if good {
			d.GoodPolls.Add(uint64(len(rtts)))
			d.LastGoodUS.Store(now.UnixMicro())
		}
		return stats.Entry{
			Info: stats.Info{Name: name, Transport: transport, Address: addr, Unit: 1, Interval: time.Minute,
				Tags: []stats.TagInfo{{Name: "t00", Unit: "°C"}, {Name: "t01", Unit: "%RH"}}},
			Stats: d,
		}
	}
	return fakeDevices{
		mk("logger-02", "tcp", "127.0.0.1:1502", true, 300*time.Microsecond, 800*time.Microsecond, 20*time.Millisecond),
		mk("logger-01", "udp", "127.0.0.1:1503", true, 200*time.Microsecond, 400*time.Microsecond),
		mk(`odd "name"\`+"\n", "rtu", "/dev/ttyS1", false, 5*time.Millisecond),
	}
}

// rawConn dials 127.0.0.1 with a small receive buffer (set before connect).
func rawConn(t testing.TB, addr string, rcvbuf int) net.Conn {
	t.Helper()
	d := net.Dialer{Timeout: 5 * time.Second, Control: func(_, _ string, rc syscall.RawConn) error {
		var serr error
		err := rc.Control(func(fd uintptr) {
			serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, rcvbuf)
		})
		if err != nil {
			return err
		}
		return serr
	}}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}
