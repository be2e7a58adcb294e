package e2e

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"edgegw/internal/testenv"
)

// hostileE2E is an upstream receiver that answers the WebSocket handshake
// and stores nothing: "never acks" reads every batch and answers none;
// "garbage" sends bytes that are no frame. It listens on addr until stop,
// which also closes its connections (as a receiver process that dies).
type hostileE2E struct {
	srv    *http.Server
	served chan struct{}
	mu     sync.Mutex
	conns  map[*websocket.Conn]bool
	wg     sync.WaitGroup
}

func startHostileE2E(t *testing.T, addr, kind string) *hostileE2E {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	h := &hostileE2E{served: make(chan struct{}), conns: map[*websocket.Conn]bool{}}
	up := websocket.Upgrader{}
	h.srv = &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := up.Upgrade(w, r, nil)
		if err != nil {
			return
		}
		h.mu.Lock()
		h.conns[c] = true
		h.wg.Add(1)
		h.mu.Unlock()
		defer h.wg.Done()
		defer c.Close()
		for {
			if kind == "garbage" {
				if err := c.WriteMessage(websocket.TextMessage, []byte("\x00{not json")); err != nil {
					return
				}
			}
			if _, _, err := c.ReadMessage(); err != nil {
				return
			}
		}
	})}
	go func() { defer close(h.served); _ = h.srv.Serve(ln) }()
	t.Cleanup(func() { h.stop(t) })
	return h
}

func (h *hostileE2E) stop(t *testing.T) {
	_ = h.srv.Close()
	testenv.Closed(t, h.served, 5*time.Second, "the hostile receiver's Serve")
	h.mu.Lock()
	for c := range h.conns {
		_ = c.Close()
	}
	h.conns = map[*websocket.Conn]bool{}
	h.mu.Unlock()
	testenv.Wait(t, 5*time.Second, "the hostile receiver's connections", h.wg.Wait)
}

// hostileConfig writes a gateway config: the rig's loggers, its receiver
// address as the uplink, mqtt ("" = no MQTT) as the fallback.
func hostileConfig(r *epochRig, mqtt, maxDown string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "[gateway]\nid = \"e2e\"\ndata_dir = %q\n", filepath.Join(r.dir, "data"))
	fmt.Fprintf(&b, "[http]\nlisten = \"127.0.0.1:0\"\nhealthz_upstream_max_down = %q\n[poll]\nudp_listen = \"127.0.0.1:0\"\n", maxDown)
	fmt.Fprintf(&b, "[upstream.websocket]\nurl = \"ws://%s/ingest\"\nbatch_wait = \"50ms\"\nfallback_after = \"3s\"\n", r.recvAddr)
	if mqtt != "" {
		fmt.Fprintf(&b, "[upstream.mqtt]\nbroker = \"tcp://%s\"\ntopic_prefix = \"edgegw/e2e\"\nmode = \"fallback\"\nper_tag_topics = false\n", mqtt)
	}
	b.WriteString("[[profile]]\nname = \"th\"\ntags = [ { name = \"temperature\", address = 0, type = \"int16\", scale = 0.1 }, { name = \"humidity\", address = 1, scale = 0.1 } ]\n")
	for i := 0; i < r.fleet.Len(); i++ {
		fmt.Fprintf(&b, "[[device]]\nname = \"logger-%02d\"\ntransport = \"udp\"\naddress = %q\nprofile = \"th\"\ninterval = \"50ms\"\ntimeout = \"40ms\"\n", i+1, r.fleet.Addr(i))
	}
	path := filepath.Join(r.dir, "edgegw.toml")
	if err := os.WriteFile(path, []byte(b.String()), 0o600); err != nil {
		r.t.Fatal(err)
	}
	return path
}

func (g *runningGW) upstream(t *testing.T) upstreamStatus {
	var s upstreamStatus
	if err := getJSON(t, g.page+"api/status", &s); err != nil {
		t.Logf("status: %v", err)
	}
	return s
}

// healthz returns /healthz's status code and reasons (0 on a transport error).
func (g *runningGW) healthz(t *testing.T) (int, []string) {
	resp, err := http.Get(g.page + "healthz")
	if err != nil {
		t.Logf("healthz: %v", err)
		return 0, nil
	}
	defer resp.Body.Close()
	var h struct{ Reasons []string }
	_ = json.NewDecoder(resp.Body).Decode(&h)
	return resp.StatusCode, h.Reasons
}

// metric reads one sample without labels from /metrics (-1 if absent).
func (g *runningGW) metric(t *testing.T, name string) float64 {
	var b strings.Builder
	if err := getText(g.page+"metrics", &b); err != nil {
		t.Logf("metrics: %v", err)
		return -1
	}
	for _, l := range strings.Split(b.String(), "\n") {
		if v, ok := strings.CutPrefix(l, name+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err == nil {
				return f
			}
		}
	}
	return -1
}

// lines counts the log lines holding every one of substrs.
func (p *logged) lines(substrs ...string) []string {
	var out []string
	for _, l := range strings.Split(p.log(), "\n") {
		ok := l != ""
		for _, s := range substrs {
			ok = ok && strings.Contains(l, s)
		}
		if ok {
			out = append(out, l)
		}
	}
	return out
}

// exactlyOnce checks that the seqs of all paths together hold 1..last, each
// once, and returns last (the highest seq delivered).
func exactlyOnce(t *testing.T, paths map[string][]uint64) uint64 {
	t.Helper()
	count := map[uint64]int{}
	var last uint64
	for _, seqs := range paths {
		for _, s := range seqs {
			count[s]++
			last = max(last, s)
		}
	}
	for s := uint64(1); s <= last; s++ {
		if count[s] != 1 {
			sizes := map[string]int{}
			for name, seqs := range paths {
				sizes[name] = len(seqs)
			}
			t.Fatalf("seq %d arrived %d times (of 1..%d; samples per path %v)", s, count[s], last, sizes)
		}
	}
	return last
}

// A receiver that accepts the handshake and then never acks, or sends
// garbage, is an uplink down: MQTT takes over after fallback_after (the
// path never says websocket), the receiver's failure is logged once, not
// per session; when a good receiver comes back at the address, WebSocket
// takes over, and every sample has arrived exactly once across the MQTT
// subscriber and the receiver, counted by seq.
func TestHostileReceiverFallbackE2E(t *testing.T) {
	for _, kind := range []string{"never acks", "garbage"} {
		t.Run(kind, func(t *testing.T) {
			mosq := testenv.StartMosquitto(t)
			r := newEpochRig(t, 4)
			viaMQTT := &seqLog{}
			subscribe(t, mosq.Addr, "edgegw/e2e/batch", viaMQTT)
			h := startHostileE2E(t, r.recvAddr, kind)
			gw := r.startGateway(hostileConfig(r, mosq.Addr, "10m"))
			start := time.Now()

			var st upstreamStatus
			waitFor(t, 60*time.Second, "mqtt carries the batches", func() bool {
				st = gw.upstream(t)
				return st.Upstream.Path == "mqtt" && st.Upstream.SentMQTT > 0
			})
			t.Logf("%s: mqtt took over within %v: sent_mqtt %d, queue %d samples", kind, time.Since(start).Round(100*time.Millisecond),
				st.Upstream.SentMQTT, st.Upstream.QueueSamples)
			n := len(viaMQTT.snapshot())
			waitFor(t, 60*time.Second, "samples over mqtt", func() bool { return len(viaMQTT.snapshot()) >= n+500 })
			failed := gw.metric(t, "edgegw_upstream_ws_sessions_failed_total")
			if failed < 1 {
				t.Errorf("ws_sessions_failed_total %v", failed)
			}
			if got := gw.lines("push: upstream path", "path=websocket"); len(got) != 0 {
				t.Fatalf("path websocket for a receiver that stores nothing:\n%s", strings.Join(got, "\n"))
			}
			hostileLines := gw.lines("push: websocket:")
			if len(hostileLines) == 0 || len(hostileLines) > 2 {
				t.Errorf("%v failed sessions in %d log lines, want 1 or 2:\n%s", failed, len(hostileLines), strings.Join(hostileLines, "\n"))
			}

			// the good receiver, at the same address
			h.stop(t)
			r.startReceiver()
			waitFor(t, 90*time.Second, "websocket takes over", func() bool { return gw.upstream(t).Upstream.Path == "websocket" })
			before := len(received(t, r.recvOut))
			waitFor(t, 30*time.Second, "samples over websocket", func() bool { return len(received(t, r.recvOut)) >= before+500 })
			code, _ := gw.healthz(t)
			gw.term(20 * time.Second)
			r.stopReceiver()
			if code != http.StatusOK {
				t.Errorf("healthz %d with websocket up", code)
			}

			var ws []uint64
			for _, l := range received(t, r.recvOut) {
				ws = append(ws, l.Seq)
			}
			mq := viaMQTT.snapshot()
			last := exactlyOnce(t, map[string][]uint64{"websocket": ws, "mqtt": mq})
			lines := gw.lines("push: ")
			if len(lines) > 12 {
				t.Errorf("%d push log lines:\n%s", len(lines), strings.Join(lines, "\n"))
			}
			t.Logf("%s: seqs 1..%d each once: %d over mqtt, %d over websocket; %d push log lines in %v:\n%s", kind, last, len(mq), len(ws),
				len(lines), time.Since(start).Round(time.Second), strings.Join(lines, "\n"))
		})
	}
}

// Without MQTT, a receiver that answers the handshake and sends garbage
// keeps the path buffering, without a flip: /healthz is 503 once
// healthz_upstream_max_down has passed and stays so while sessions keep
// failing; a good receiver at the address makes it 200 again and gets every
// sample once.
func TestHostileReceiverHealthzE2E(t *testing.T) {
	r := newEpochRig(t, 4)
	h := startHostileE2E(t, r.recvAddr, "garbage")
	started := time.Now()
	gw := r.startGateway(hostileConfig(r, "", "3s"))
	var reasons []string
	waitFor(t, 60*time.Second, "healthz 503 for the upstream", func() bool {
		code, rs := gw.healthz(t)
		reasons = rs
		return code == http.StatusServiceUnavailable
	})
	if len(reasons) != 1 || !strings.Contains(reasons[0], "upstream down") || !strings.Contains(reasons[0], "buffering") {
		t.Fatalf("reasons %q", reasons)
	}
	from := gw.metric(t, "edgegw_upstream_ws_sessions_failed_total")
	// The config has no key for push's reconnect bounds (500ms..30s, never
	// reset: no session is ever connected) nor its handshake and ack
	// timeouts (10s each): by the time of the 503 the backoff may already
	// be at its 30s cap on a loaded machine, so what the code guarantees is
	// one more failed session per cap + handshake + ack timeout (a garbage
	// session ends at its first read, at the latest at the ack timeout).
	const sessions = 3
	const perSession = 30*time.Second + 10*time.Second + 10*time.Second
	waitFor(t, sessions*perSession+30*time.Second, "3 more failed sessions, healthz 503 throughout", func() bool {
		if code, rs := gw.healthz(t); code != http.StatusServiceUnavailable && code != http.StatusTooManyRequests {
			t.Fatalf("healthz %d %q while the receiver stores nothing", code, rs)
		}
		return gw.metric(t, "edgegw_upstream_ws_sessions_failed_total") >= from+sessions
	})
	failed := gw.metric(t, "edgegw_upstream_ws_sessions_failed_total")
	if got := gw.lines("push: upstream path"); len(got) != 0 {
		t.Fatalf("path changes:\n%s", strings.Join(got, "\n"))
	}
	// One line for the reason; the throttle may add one "repeated=N" line
	// a minute while it holds (a loaded machine's backoff can take that
	// long), never a line per session.
	if got := gw.lines("push: websocket:"); len(got) < 1 || len(got) > 1+int(time.Since(started)/time.Minute) {
		t.Errorf("%v failed sessions in %d log lines over %v, want 1 and one a minute after:\n%s", failed, len(got), time.Since(started).Round(time.Second), strings.Join(got, "\n"))
	} else {
		for _, l := range got[1:] {
			if !strings.Contains(l, "repeated=") {
				t.Errorf("a second line that is not the throttle's summary: %s", l)
			}
		}
	}

	h.stop(t)
	r.startReceiver()
	waitFor(t, 90*time.Second, "websocket up, healthz 200", func() bool {
		code, _ := gw.healthz(t)
		return gw.upstream(t).Upstream.Path == "websocket" && code == http.StatusOK
	})
	_, upTo := r.waitDelivered(gw, 1, 30*time.Second)
	gw.term(20 * time.Second)
	r.stopReceiver()
	var ws []uint64
	for _, l := range received(t, r.recvOut) {
		ws = append(ws, l.Seq)
	}
	last := exactlyOnce(t, map[string][]uint64{"websocket": ws})
	if last < upTo {
		t.Fatalf("received up to %d, the gateway had %d", last, upTo)
	}
	t.Logf("%v failed sessions logged in 1 line; then seqs 1..%d each once at the receiver", failed, last)
}

// With ulimit -n 64, clients beyond the descriptors wait in the backlog:
// the gateway says so at Warn, at most once per 10 s, and counts it in
// /metrics (it logged at Debug only).
func TestAcceptErrorsLoggedE2E(t *testing.T) {
	r := newEpochRig(t, 1)
	var b strings.Builder
	fmt.Fprintf(&b, "[gateway]\nid = \"e2e\"\n[http]\nlisten = \"127.0.0.1:0\"\n[poll]\nudp_listen = \"127.0.0.1:0\"\n")
	fmt.Fprintf(&b, "[[device]]\nname = \"logger-01\"\ntransport = \"udp\"\naddress = %q\ninterval = \"100ms\"\ntimeout = \"50ms\"\ntags = [ { name = \"t\", address = 0 } ]\n", r.fleet.Addr(0))
	cfg := filepath.Join(r.dir, "edgegw.toml")
	if err := os.WriteFile(cfg, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	logPath := filepath.Join(r.dir, "run.log")
	f, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	// both limits (a soft one alone the Go runtime raises to the hard one)
	cmd := exec.Command("sh", "-c", `ulimit -n 64 && exec "$0" run -config "$1"`, bin, cfg)
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	f.Close()
	gw := &runningGW{logged: &logged{t: t, cmd: cmd, path: logPath, done: make(chan struct{})}}
	go func() { _ = cmd.Wait(); close(gw.done) }()
	t.Cleanup(gw.kill)
	line := gw.waitLog("edgegw running", 20*time.Second)
	gw.page = line[strings.Index(line, "page=")+len("page="):]
	addr := strings.TrimSuffix(strings.TrimPrefix(gw.page, "http://"), "/")

	var clients []net.Conn
	defer func() {
		for _, c := range clients {
			c.Close()
		}
	}()
	for i := 0; i < 100; i++ { // more than the descriptors: the kernel's backlog takes them
		c, err := net.DialTimeout("tcp", addr, 5*time.Second)
		if err != nil {
			break
		}
		clients = append(clients, c)
	}
	warn := gw.waitLog("web: cannot accept connections", 20*time.Second)
	if !strings.Contains(warn, "level=WARN") || !strings.Contains(warn, "too many open files") {
		t.Errorf("accept error line: %s", warn)
	}
	for _, c := range clients {
		c.Close()
	}
	clients = nil
	var n float64
	waitFor(t, 30*time.Second, "accept errors in /metrics", func() bool {
		n = gw.metric(t, "edgegw_web_accept_errors_total")
		return n > 0
	})
	lines := gw.lines("web: cannot accept connections")
	gw.term(20 * time.Second)
	if len(lines) > 3 {
		t.Errorf("%v accept errors in %d lines:\n%s", n, len(lines), strings.Join(lines, "\n"))
	}
	t.Logf("%d clients dialled under ulimit -n 64: %v accept errors, %d warn lines:\n%s", 100, n, len(lines), strings.Join(lines, "\n"))
}
