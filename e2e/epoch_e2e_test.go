package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"edgegw/internal/testenv"
	"edgegw/lab/sim"
)

// logged is an edgegw process whose output goes to a file the test reads
// whole (every line, also after the process exited).
type logged struct {
	t    *testing.T
	cmd  *exec.Cmd
	path string
	done chan struct{}
}

var logSeq struct {
	sync.Mutex
	n int
}

func startLogged(t *testing.T, dir string, args ...string) *logged {
	t.Helper()
	logSeq.Lock()
	logSeq.n++
	path := filepath.Join(dir, fmt.Sprintf("%s-%d.log", args[0], logSeq.n))
	logSeq.Unlock()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	f.Close()
	p := &logged{t: t, cmd: cmd, path: path, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(p.done) }()
	t.Cleanup(p.kill)
	return p
}

func (p *logged) log() string {
	b, _ := os.ReadFile(p.path)
	return string(b)
}

// waitLog returns the first line holding substr, waiting at most limit.
func (p *logged) waitLog(substr string, limit time.Duration) string {
	p.t.Helper()
	var line string
	testenv.WaitFor(p.t, limit, fmt.Sprintf("%q in %s", substr, p.path), func() bool {
		for _, l := range strings.Split(p.log(), "\n") {
			if strings.Contains(l, substr) {
				line = l
				return true
			}
		}
		select {
		case <-p.done:
			p.t.Fatalf("%v exited before printing %q:\n%s", p.cmd.Args, substr, p.log())
		default:
		}
		return false
	})
	return line
}

func (p *logged) kill() {
	select {
	case <-p.done:
	default:
		_ = p.cmd.Process.Kill()
		testenv.Closed(p.t, p.done, 20*time.Second, fmt.Sprintf("%s to exit after SIGKILL", p.cmd.Args))
	}
}

// term stops the process with SIGTERM and waits for its exit.
func (p *logged) term(limit time.Duration) {
	p.t.Helper()
	_ = p.cmd.Process.Signal(os.Interrupt)
	select {
	case <-p.done:
		if c := p.cmd.ProcessState.ExitCode(); c != 0 {
			p.t.Errorf("%v exited %d:\n%s", p.cmd.Args, c, p.log())
		}
	case <-time.After(limit):
		p.t.Fatalf("%v did not stop within %v", p.cmd.Args, limit)
	}
}

// recvLine is one line of `edgegw receive` output.
type recvLine struct {
	Epoch   string          `json:"epoch"`
	Seq     uint64          `json:"seq"`
	Device  string          `json:"device"`
	Tag     string          `json:"tag"`
	Value   json.RawMessage `json:"value"` // null when quality is not good
	Quality string          `json:"quality"`
	TS      int64           `json:"ts"` // Unix µs
}

// received reads the receiver's output: the lines, in order. The receiver
// writes a batch's lines with one write(2), which a reader may see half
// done (the file grows a page at a time): the text after the last newline
// is a write in progress, not a line. A line torn for good is followed by
// the next write's lines, so it still fails here.
func received(t *testing.T, path string) []recvLine {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	b = b[:bytes.LastIndexByte(b, '\n')+1]
	var out []recvLine
	for _, l := range strings.Split(string(b), "\n") {
		if l == "" {
			continue
		}
		var r recvLine
		if err := json.Unmarshal([]byte(l), &r); err != nil {
			t.Fatalf("receiver line %q: %v", l, err)
		}
		out = append(out, r)
	}
	return out
}

// TestReceivedSkipsAWriteInProgress: a reader that meets a batch half
// written (seen in make test-loaded: TestSharedSpoolTwoCursorsSurviveKills
// failed on "unexpected end of JSON input") reads the complete lines only.
func TestReceivedSkipsAWriteInProgress(t *testing.T) {
	path := filepath.Join(t.TempDir(), "out.jsonl")
	full := `{"epoch":"e","seq":1,"device":"d","tag":"t","value":1,"quality":"good","ts":1}` + "\n"
	if err := os.WriteFile(path, []byte(full+full[:30]), 0o600); err != nil {
		t.Fatal(err)
	}
	if lines := received(t, path); len(lines) != 1 || lines[0].Seq != 1 {
		t.Fatalf("got %+v", lines)
	}
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if lines := received(t, path); len(lines) != 0 {
		t.Fatalf("empty file: %+v", lines)
	}
}

// seqsOf returns the seqs received for epoch, sorted, and fails on a
// duplicate line.
func seqsOf(t *testing.T, lines []recvLine, epoch string) []uint64 {
	t.Helper()
	seen := map[uint64]bool{}
	var out []uint64
	for _, l := range lines {
		if l.Epoch != epoch {
			continue
		}
		if seen[l.Seq] {
			t.Fatalf("epoch %s seq %d written twice by the receiver", epoch, l.Seq)
		}
		seen[l.Seq] = true
		out = append(out, l.Seq)
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}

// hasAll reports whether seqs (sorted) holds every number from first to last.
func hasAll(seqs []uint64, first, last uint64) bool {
	if last < first {
		return false
	}
	i := sort.Search(len(seqs), func(i int) bool { return seqs[i] >= first })
	return i < len(seqs) && seqs[i] == first && i+int(last-first) < len(seqs) && seqs[i+int(last-first)] == last
}

type epochStatus struct {
	Seq      uint64 `json:"seq"`
	Epoch    string `json:"epoch"`
	Upstream struct {
		Path         string `json:"path"`
		QueueSamples int64  `json:"queue_samples"`
		Dropped      uint64 `json:"dropped"`
	} `json:"upstream"`
}

// epochRig is a small fleet, a gateway config and the reference receiver.
type epochRig struct {
	t        *testing.T
	dir      string
	fleet    *sim.Fleet
	recvAddr string
	recvOut  string
	recv     *logged
	profile  string // the [[profile]] "th" of config ("" = temperature and humidity)
}

func newEpochRig(t *testing.T, devices int) *epochRig {
	return newEpochRigFleet(t, sim.Config{Devices: devices, Transport: "udp"})
}

// newEpochRigFleet is newEpochRig with the simulated loggers of fc (UDP).
func newEpochRigFleet(t *testing.T, fc sim.Config) *epochRig {
	r := &epochRig{t: t, dir: t.TempDir(), fleet: runFleet(t, fc)}
	r.recvAddr = fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	r.recvOut = filepath.Join(r.dir, "received.jsonl")
	return r
}

func (r *epochRig) startReceiver() {
	r.recv = startLogged(r.t, r.dir, "receive", "-listen", r.recvAddr, "-out", r.recvOut)
	r.recv.waitLog("receiving on", 10*time.Second)
}

// config writes a gateway config with dataDir ("" = memory only) and extra
// TOML, and returns its path.
func (r *epochRig) config(name, dataDir, extra string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "[gateway]\nid = \"e2e\"\n")
	if dataDir != "" {
		fmt.Fprintf(&b, "data_dir = %q\n", dataDir)
	}
	fmt.Fprintf(&b, "[http]\nlisten = \"127.0.0.1:0\"\n[poll]\nudp_listen = \"127.0.0.1:0\"\n")
	fmt.Fprintf(&b, "[upstream.websocket]\nurl = \"ws://%s/ingest\"\nbatch_wait = \"50ms\"\n", r.recvAddr)
	b.WriteString(extra)
	if r.profile != "" {
		b.WriteString(r.profile)
	} else {
		b.WriteString("[[profile]]\nname = \"th\"\ntags = [ { name = \"temperature\", address = 0, type = \"int16\", scale = 0.1 }, { name = \"humidity\", address = 1, scale = 0.1 } ]\n")
	}
	for i := 0; i < r.fleet.Len(); i++ {
		fmt.Fprintf(&b, "[[device]]\nname = \"logger-%02d\"\ntransport = \"udp\"\naddress = %q\nprofile = \"th\"\ninterval = \"50ms\"\ntimeout = \"40ms\"\n", i+1, r.fleet.Addr(i))
	}
	path := filepath.Join(r.dir, name+".toml")
	if err := os.WriteFile(path, []byte(b.String()), 0o600); err != nil {
		r.t.Fatal(err)
	}
	return path
}

type runningGW struct {
	*logged
	page string
}

func (r *epochRig) startGateway(cfg string) *runningGW {
	p := startLogged(r.t, r.dir, "run", "-config", cfg)
	line := p.waitLog("edgegw running", 20*time.Second)
	return &runningGW{p, line[strings.Index(line, "page=")+len("page="):]}
}

func (g *runningGW) status(t *testing.T) epochStatus {
	var s epochStatus
	if err := getJSON(t, g.page+"api/status", &s); err != nil {
		t.Logf("status: %v", err)
	}
	return s
}

// waitDelivered waits until the receiver holds every seq of the gateway's
// current epoch from first up to what the gateway had numbered when the
// wait began, and returns that seq.
func (r *epochRig) waitDelivered(g *runningGW, first uint64, limit time.Duration) (string, uint64) {
	r.t.Helper()
	var st epochStatus
	testenv.WaitFor(r.t, limit, fmt.Sprintf("the gateway numbers seq %d", first), func() bool {
		st = g.status(r.t)
		return st.Seq >= first
	})
	testenv.WaitFor(r.t, limit, fmt.Sprintf("epoch %s seqs %d..%d at the receiver", st.Epoch, first, st.Seq), func() bool {
		return hasAll(seqsOf(r.t, received(r.t, r.recvOut), st.Epoch), first, st.Seq)
	})
	return st.Epoch, st.Seq
}

var gapsRE = regexp.MustCompile(`(\d+) gaps \((\d+) samples\)`)

// lossRE reads the receiver's totals of loss ranges: seqs the gateway
// reported lost (dropped at its bound, a crash's tail), apart from gaps.
var lossRE = regexp.MustCompile(`(\d+) losses \((\d+) samples lost at the gateway\)`)

// receiverLost is the number of samples the stopped receiver counted as
// reported lost by the gateway.
func (r *epochRig) receiverLost() uint64 {
	r.t.Helper()
	m := lossRE.FindStringSubmatch(r.recv.log())
	if m == nil {
		r.t.Fatalf("receiver printed no loss totals:\n%s", r.recv.log())
	}
	n, _ := strconv.ParseUint(m[2], 10, 64)
	return n
}

// stopReceiverGaps stops the receiver with SIGTERM and returns the gaps it
// reported and the samples they hold.
func (r *epochRig) stopReceiverGaps() (gaps, samples uint64) {
	r.t.Helper()
	r.recv.term(10 * time.Second)
	m := gapsRE.FindStringSubmatch(r.recv.log())
	if m == nil {
		r.t.Fatalf("receiver printed no totals:\n%s", r.recv.log())
	}
	gaps, _ = strconv.ParseUint(m[1], 10, 64)
	samples, _ = strconv.ParseUint(m[2], 10, 64)
	return gaps, samples
}

// stopReceiver stops the receiver and fails the test if it reported a gap.
func (r *epochRig) stopReceiver() {
	r.t.Helper()
	if gaps, _ := r.stopReceiverGaps(); gaps != 0 || strings.Contains(r.recv.log(), "gap in sequence") {
		r.t.Errorf("receiver reported gaps:\n%s", r.recv.log())
	}
}

// A wiped data_dir (as every reboot of an OpenWrt box whose /var is RAM),
// and a switch from memory-only to a fresh data_dir: the second run's
// numbering starts again, under a new epoch, and the real receiver writes
// every one of its samples, logs the new epoch and reports no gap.
func TestEpochWipedDataDir(t *testing.T) {
	r := newEpochRig(t, 4)
	r.startReceiver()
	data := filepath.Join(r.dir, "data")
	cfg := r.config("disk", data, "")

	gw := r.startGateway(cfg)
	testenv.WaitFor(t, 30*time.Second, "run 1 numbers 480 samples", func() bool { return gw.status(t).Seq >= 480 })
	e1, s1 := r.waitDelivered(gw, 1, 30*time.Second)
	gw.term(20 * time.Second)
	if err := os.RemoveAll(data); err != nil {
		t.Fatal(err)
	}
	gw = r.startGateway(cfg)
	testenv.WaitFor(t, 30*time.Second, "run 2 numbers 480 samples", func() bool { return gw.status(t).Seq >= 480 })
	e2, s2 := r.waitDelivered(gw, 1, 30*time.Second)
	if e2 == e1 {
		t.Fatalf("wiped data_dir kept epoch %s", e1)
	}
	r.recv.waitLog("new_epoch="+e2, 10*time.Second)
	if !strings.Contains(r.recv.log(), "old_epoch="+e1) {
		t.Errorf("receiver did not log the old epoch %s:\n%s", e1, r.recv.log())
	}
	if !strings.Contains(gw.log(), "new epoch") {
		t.Errorf("gateway did not log its new epoch:\n%s", gw.log())
	}
	gw.term(20 * time.Second)

	// Memory-only, then a fresh data_dir: numbers from the clock, then from 1.
	gw = r.startGateway(r.config("mem", "", ""))
	e3 := gw.status(t).Epoch
	testenv.WaitFor(t, 30*time.Second, "memory-only run delivers", func() bool { return len(seqsOf(t, received(t, r.recvOut), e3)) >= 200 })
	gw.term(20 * time.Second)
	gw = r.startGateway(r.config("fresh", filepath.Join(r.dir, "fresh"), ""))
	testenv.WaitFor(t, 30*time.Second, "fresh run numbers 480 samples", func() bool { return gw.status(t).Seq >= 480 })
	e4, s4 := r.waitDelivered(gw, 1, 30*time.Second)
	if e4 == e3 || e4 == e2 {
		t.Fatalf("fresh data_dir epoch %s (memory-only run %s)", e4, e3)
	}
	r.recv.waitLog("new_epoch="+e4, 10*time.Second)
	gw.term(20 * time.Second)
	r.stopReceiver()
	t.Logf("run 1: epoch %s 1..%d; wiped: epoch %s 1..%d; memory-only %s; fresh: epoch %s 1..%d", e1, s1, e2, s2, e3, e4, s4)
}

// markOf reads the high-water mark (first line of seq.hwm).
func markOf(t *testing.T, dataDir string) uint64 {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dataDir, "seq.hwm"))
	if err != nil {
		t.Fatal(err)
	}
	m, err := strconv.ParseUint(strings.SplitN(string(b), "\n", 2)[0], 10, 64)
	if err != nil {
		t.Fatalf("seq.hwm %q: %v", b, err)
	}
	return m
}

// A clean restart, then a SIGKILL in the middle of an outage: one epoch,
// the receiver reports no gap (the restarts' skips are announced), and its
// seqs are consecutive except exactly at the two restarts, where the new
// run starts right above the mark the previous run had reserved.
func TestEpochRestartsAreNotGaps(t *testing.T) {
	r := newEpochRig(t, 4)
	r.startReceiver()
	data := filepath.Join(r.dir, "data")
	cfg := r.config("disk", data, "")
	gw := r.startGateway(cfg)
	epoch, _ := r.waitDelivered(gw, 1, 30*time.Second)

	// clean restart
	mark1 := markOf(t, data)
	gw.term(20 * time.Second)
	gw = r.startGateway(cfg)
	if st := gw.status(t); st.Epoch != epoch {
		t.Fatalf("clean restart: epoch %s, was %s", st.Epoch, epoch)
	}
	r.waitDelivered(gw, mark1+1, 30*time.Second)

	// outage, SIGKILL, restart, receiver back
	r.stopReceiver()
	testenv.WaitFor(t, 30*time.Second, "queue grows during the outage", func() bool { return gw.status(t).Upstream.QueueSamples >= 300 })
	mark2 := markOf(t, data)
	gw.kill()
	gw = r.startGateway(cfg)
	testenv.WaitFor(t, 30*time.Second, "restart numbers above the mark", func() bool { return gw.status(t).Seq > mark2+100 })
	r.startReceiver()
	_, last := r.waitDelivered(gw, mark2+1, 60*time.Second)
	gw.term(20 * time.Second)
	r.stopReceiver()

	seqs := seqsOf(t, received(t, r.recvOut), epoch)
	jumps := 0
	for i := 1; i < len(seqs); i++ {
		if seqs[i] == seqs[i-1]+1 {
			continue
		}
		if (seqs[i] == mark1+1 && seqs[i-1] <= mark1) || (seqs[i] == mark2+1 && seqs[i-1] <= mark2) {
			jumps++
			continue
		}
		t.Fatalf("missing: %d then %d (marks %d, %d)", seqs[i-1], seqs[i], mark1, mark2)
	}
	if seqs[0] != 1 || jumps != 2 || seqs[len(seqs)-1] < last {
		t.Fatalf("seqs %d..%d, %d jumps (want from 1, 2 jumps, up to %d)", seqs[0], seqs[len(seqs)-1], jumps, last)
	}
	if other := len(received(t, r.recvOut)) - len(seqs); other != 0 {
		t.Fatalf("%d lines of another epoch", other)
	}
	t.Logf("%d samples in epoch %s, restarts at marks %d and %d, 0 gaps", len(seqs), epoch, mark1, mark2)
}

// The receiver stopped and started again twice mid-stream: its state file
// carries the dedup across, so no line is written twice and none is missing.
func TestEpochReceiverRestartNoDuplicates(t *testing.T) {
	r := newEpochRig(t, 4)
	r.startReceiver()
	gw := r.startGateway(r.config("disk", filepath.Join(r.dir, "data"), ""))
	epoch, _ := r.waitDelivered(gw, 1, 30*time.Second)
	for i := 0; i < 2; i++ {
		r.stopReceiver()
		n := gw.status(t).Seq
		testenv.WaitFor(t, 30*time.Second, "gateway goes on while the receiver is away", func() bool { return gw.status(t).Seq > n+100 })
		r.startReceiver()
		r.recv.waitLog("dedup state loaded", 30*time.Second)
		r.waitDelivered(gw, 1, 30*time.Second)
	}
	_, last := r.waitDelivered(gw, 1, 30*time.Second)
	gw.term(20 * time.Second)
	r.stopReceiver()
	seqs := seqsOf(t, received(t, r.recvOut), epoch) // fails on a duplicate line
	if !hasAll(seqs, 1, last) {
		t.Fatalf("missing seqs in 1..%d (%d received)", last, len(seqs))
	}
	t.Logf("%d samples, no duplicate, none missing up to %d", len(seqs), last)
}
