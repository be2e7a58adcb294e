package e2e

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"

	"edgegw/internal/testenv"
	"edgegw/lab/sim"
	"edgegw/sparkplug"
)

// spHost is the test's Sparkplug primary host "scada" on a real
// mosquitto: it says online or offline (STATE, retained, Sparkplug 3.0
// JSON) and decodes, with package sparkplug's decoder, every DBIRTH and
// DDATA of group "plant".
type spHost struct {
	t       *testing.T
	c       mqtt.Client
	stateTS int64
	mu      sync.Mutex
	aliases map[spAlias]string // (device, alias) -> tag, from the DBIRTHs
	data    []spData           // every DDATA metric, in no particular order
}

type spAlias struct {
	dev   string
	alias uint64
}

type spData struct {
	dev string
	m   sparkplug.Metric
}

func startSpHost(t *testing.T, broker string) *spHost {
	t.Helper()
	h := &spHost{t: t, aliases: map[spAlias]string{}}
	h.c = mqtt.NewClient(mqtt.NewClientOptions().AddBroker("tcp://" + broker).SetClientID("scada").
		SetOrderMatters(false).SetAutoReconnect(false))
	if tok := h.c.Connect(); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("host connect: %v", tok.Error())
	}
	t.Cleanup(func() { h.c.Disconnect(100) })
	if tok := h.c.Subscribe("spBv1.0/plant/#", 1, h.onMessage); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("host subscribe: %v", tok.Error())
	}
	return h
}

// onMessage keeps births' aliases and data metrics (topic
// spBv1.0/plant/<type>/<node>/<device>).
func (h *spHost) onMessage(_ mqtt.Client, m mqtt.Message) {
	p := strings.Split(m.Topic(), "/")
	if len(p) != 5 || (p[2] != "DBIRTH" && p[2] != "DDATA") {
		return
	}
	pl, err := sparkplug.DecodePayload(m.Payload())
	if err != nil {
		h.t.Errorf("%s: %v", m.Topic(), err)
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, mt := range pl.Metrics {
		if p[2] == "DDATA" {
			h.data = append(h.data, spData{p[4], mt})
			continue
		}
		if mt.HasName && mt.HasAlias {
			k := spAlias{p[4], mt.Alias}
			if old, ok := h.aliases[k]; ok && old != mt.Name {
				h.t.Errorf("%s: alias %d is %q, was %q", m.Topic(), mt.Alias, mt.Name, old)
			}
			h.aliases[k] = mt.Name
		}
	}
}

// state publishes the host's STATE (retained), newer than the last.
func (h *spHost) state(online bool) {
	h.t.Helper()
	h.stateTS = max(time.Now().UnixMilli(), h.stateTS+1)
	tok := h.c.Publish("spBv1.0/STATE/scada", 1, true, fmt.Sprintf(`{"online":%t,"timestamp":%d}`, online, h.stateTS))
	if !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		h.t.Fatalf("STATE: %v", tok.Error())
	}
}

// spKey is one sample as a host sees it: device, tag, timestamp (ms).
type spKey struct {
	dev, tag string
	ms       int64
}

// spSeen is what the host got of one sample: how often, how often
// flagged is_historical, null or the value.
type spSeen struct {
	n, hist int
	null    bool
	v       float64
}

// seen resolves the data metrics by the births' aliases; unknown counts
// metrics of an alias no birth named.
func (h *spHost) seen() (out map[spKey]*spSeen, unknown int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	out = map[spKey]*spSeen{}
	for _, d := range h.data {
		tag, ok := h.aliases[spAlias{d.dev, d.m.Alias}]
		if !ok {
			unknown++
			continue
		}
		k := spKey{d.dev, tag, int64(d.m.Timestamp)}
		s := out[k]
		if s == nil {
			s = &spSeen{null: d.m.IsNull, v: spNumber(d.m.Value)}
			out[k] = s
		}
		s.n++
		if d.m.IsHistorical {
			s.hist++
		}
	}
	return out, unknown
}

// liveSince reports whether a DDATA metric not flagged historical and
// acquired at or after t has arrived.
func (h *spHost) liveSince(t time.Time) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, d := range h.data {
		if !d.m.IsHistorical && int64(d.m.Timestamp) >= t.UnixMilli() {
			return true
		}
	}
	return false
}

// spNumber is a numeric metric value as a float64.
func spNumber(v sparkplug.Value) float64 {
	switch v.Kind {
	case sparkplug.KindInt:
		return float64(int32(uint32(v.U)))
	case sparkplug.KindLong:
		return float64(v.U)
	case sparkplug.KindFloat:
		return float64(v.F32)
	case sparkplug.KindDouble:
		return v.F64
	case sparkplug.KindBool:
		if v.B {
			return 1
		}
	}
	return 0
}

// cursorsOf reads data_dir/queue/queue.cursors: cursor name -> head.
func cursorsOf(t *testing.T, data string) map[string]uint64 {
	t.Helper()
	out := map[string]uint64{}
	b, err := os.ReadFile(filepath.Join(data, "queue", "queue.cursors"))
	if err != nil {
		if !os.IsNotExist(err) {
			t.Fatal(err)
		}
		return out
	}
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		f := strings.Fields(l)
		if len(f) != 2 {
			t.Fatalf("queue.cursors line %q", l)
		}
		v, err := strconv.ParseUint(f[1], 10, 64)
		if err != nil {
			t.Fatalf("queue.cursors line %q: %v", l, err)
		}
		out[f[0]] = v
	}
	return out
}

var recvTotalsRE = regexp.MustCompile(`received \d+ batches, (\d+) new samples, (\d+) duplicates, (\d+) gaps`)

// recvTotals reads a stopped receiver's totals: new samples, duplicates, gaps.
func recvTotals(t *testing.T, p *logged) (fresh, dups, gaps uint64) {
	t.Helper()
	m := recvTotalsRE.FindStringSubmatch(p.log())
	if m == nil {
		t.Fatalf("receiver printed no totals:\n%s", p.log())
	}
	fresh, _ = strconv.ParseUint(m[1], 10, 64)
	dups, _ = strconv.ParseUint(m[2], 10, 64)
	gaps, _ = strconv.ParseUint(m[3], 10, 64)
	return fresh, dups, gaps
}

// The queue's cursors (internal/gateway names them).
const (
	cursorPush      = "push"
	cursorSparkplug = "sparkplug"
)

const sharedSpoolProfile = "[[profile]]\nname = \"th\"\ntags = [ { name = \"temperature\", address = 0, type = \"int16\", scale = 0.1 }, { name = \"counter\", address = 2, type = \"uint16\" } ]\n"

// seqSpans are inclusive seq ranges sorted by their first seq.
type seqSpans [][2]uint64

// span returns the last seq of the range holding s.
func (sp seqSpans) span(s uint64) (last uint64, ok bool) {
	for _, r := range sp {
		if r[0] <= s && s <= r[1] {
			return r[1], true
		}
	}
	return 0, false
}

// count is the number of seqs the ranges hold (overlaps counted once per range).
func (sp seqSpans) count() (n uint64) {
	for _, r := range sp {
		n += r[1] - r[0] + 1
	}
	return n
}

// killRun is one run of the gateway ended by SIGKILL.
type killRun struct {
	pushDown bool              // the receiver was down for the whole run (else the primary host was offline)
	s0, s1   uint64            // status seqs: a first sample of the run, just before the kill
	mark     uint64            // seq.hwm after the kill: the run's seqs are (previous run's mark, mark]
	heads    map[string]uint64 // queue.cursors after the kill
}

// One spool, two cursors, SIGKILLs: push (WebSocket to the reference
// receiver) and the Sparkplug node (a real mosquitto, the test as its
// primary host) read data_dir/queue with a cursor each. The gateway is
// killed several times, each time with one consumer's peer away for the
// whole run so that the two cursors are far apart at the kill: the
// receiver down (push behind), or the primary host offline (Sparkplug
// behind, storing). Then both come back and the last run delivers.
//
// At least once on both sides: every seq the gateway numbered reaches the
// receiver, or was reported lost by the gateway (only a killed run's
// tail: numbered, not yet written) or is a restart skip; duplicates are
// counted, not refused. The Sparkplug host gets every sample the receiver
// got, with its value: every sample of a run the host was offline for
// flagged is_historical; a live one may be left out only by report by
// exception (unchanged, or not good). The spool's figures add up: no drop,
// no corrupt record, both cursors past the last seq delivered at a clean
// stop, the receivers' new samples are the distinct seqs.
//
// EDGEGW_FULL=1 kills 12 times instead of 4.
func TestSharedSpoolTwoCursorsSurviveKills(t *testing.T) {
	mosq := testenv.StartMosquitto(t)
	host := startSpHost(t, mosq.Addr)
	r := newEpochRigFleet(t, sim.Config{Devices: 4, Transport: "udp", Tick: 10 * time.Millisecond})
	r.profile = sharedSpoolProfile
	data := filepath.Join(r.dir, "data")
	cfg := r.config("shared", data, fmt.Sprintf("[upstream.mqtt]\nbroker = \"tcp://%s\"\nmode = \"off\"\n"+
		"[upstream.sparkplug]\ngroup_id = \"plant\"\nprimary_host_id = \"scada\"\n", mosq.Addr))
	kills := 4
	if os.Getenv("EDGEGW_FULL") != "" {
		kills = 12
	}
	rnd := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 26))
	var recvs []*logged // every receiver run, for its log and totals
	recvUp := false
	setReceiver := func(up bool) {
		if up && !recvUp {
			r.startReceiver()
			recvs = append(recvs, r.recv)
		} else if !up && recvUp {
			r.recv.term(10 * time.Second)
		}
		recvUp = up
	}
	noDrop := func(st epochStatus) epochStatus {
		if st.Upstream.Dropped != 0 {
			t.Fatalf("the queue dropped %d samples", st.Upstream.Dropped)
		}
		return st
	}
	const lag = 150 // samples the away consumer's cursor is behind at least at the kill
	var runs []killRun
	var prev uint64 // the previous run's mark: a run's status starts there, its first sample is above
	for k := 0; k < kills; k++ {
		c := killRun{pushDown: k%2 == 0}
		setReceiver(!c.pushDown)
		host.state(c.pushDown)
		began := time.Now()
		gw := r.startGateway(cfg)
		testenv.WaitFor(t, 20*time.Second, fmt.Sprintf("run %d numbers samples", k), func() bool {
			c.s0 = noDrop(gw.status(t)).Seq
			return c.s0 > prev
		})
		if c.pushDown {
			testenv.WaitFor(t, 30*time.Second, fmt.Sprintf("run %d: %d samples queued for push, live Sparkplug data", k, lag), func() bool {
				return noDrop(gw.status(t)).Upstream.QueueSamples >= lag && host.liveSince(began)
			})
		} else {
			testenv.WaitFor(t, 30*time.Second, fmt.Sprintf("run %d: seq %d at the receiver", k, c.s0+lag), func() bool {
				lines := received(t, r.recvOut)
				return len(lines) > 0 && lines[len(lines)-1].Seq >= c.s0+lag
			})
		}
		target := gw.status(t).Seq + uint64(rnd.IntN(100)) // a random moment
		testenv.WaitFor(t, 20*time.Second, fmt.Sprintf("run %d reaches seq %d", k, target), func() bool {
			c.s1 = noDrop(gw.status(t)).Seq
			return c.s1 >= target
		})
		gw.kill()
		c.mark, c.heads = markOf(t, data), cursorsOf(t, data)
		// The away consumer acknowledged nothing of this run.
		away, behind := cursorSparkplug, cursorPush
		if c.pushDown {
			away, behind = cursorPush, cursorSparkplug
		}
		if k > 0 && c.heads[away] > runs[k-1].mark {
			t.Fatalf("run %d: cursor %s at %d, past the previous run's last seq %d while its peer was away", k, away, c.heads[away], runs[k-1].mark)
		}
		t.Logf("run %d (%s away): seqs %d..%d, killed at %d; saved cursors %s %d, %s %d", k, away, c.s0, c.mark, c.s1, away, c.heads[away], behind, c.heads[behind])
		runs = append(runs, c)
		prev = c.mark
	}

	// Both back: the last run delivers what every run left behind.
	setReceiver(true)
	host.state(true)
	gw := r.startGateway(cfg)
	var target uint64
	testenv.WaitFor(t, 20*time.Second, "the last run numbers samples", func() bool {
		target = noDrop(gw.status(t)).Seq
		return target > prev+lag
	})
	epoch := gw.status(t).Epoch
	lostSkipped := func() (lost map[uint64]bool, skipped seqSpans, reasons map[string]int) {
		lost, reasons = map[uint64]bool{}, map[string]int{}
		for _, p := range recvs {
			log := p.log()
			losses, _, rs := logRanges(t, log, lossLineRE)
			for _, l := range losses {
				for s := l[0]; s <= l[1]; s++ {
					lost[s] = true
				}
			}
			for k, n := range rs {
				reasons[k] += n
			}
			skips, _, _ := logRanges(t, log, skipLineRE)
			skipped = append(skipped, skips...)
		}
		sort.Slice(skipped, func(i, j int) bool { return skipped[i][0] < skipped[j][0] })
		return lost, slices.Compact(skipped), reasons // a skip is logged again with a batch sent again
	}
	// byseq: the receiver's lines of the epoch by seq (the first of a seq).
	byseq := func() map[uint64]recvLine {
		out := map[uint64]recvLine{}
		for _, l := range received(t, r.recvOut) {
			if _, ok := out[l.Seq]; !ok && l.Epoch == epoch {
				out[l.Seq] = l
			}
		}
		return out
	}
	var silent []uint64
	testenv.WaitFor(t, 60*time.Second, fmt.Sprintf("every seq up to %d at the receiver, reported lost or skipped", target), func() bool {
		got := byseq()
		lost, skipped, _ := lostSkipped()
		silent = silent[:0]
		for s := uint64(1); s <= target; s++ {
			if last, ok := skipped.span(s); ok {
				s = last
			} else if _, ok := got[s]; !ok && !lost[s] {
				silent = append(silent, s)
			}
		}
		return len(silent) == 0
	})
	var problems []string
	var leftOut, historical, spDups int
	defer func() {
		if len(problems) > 0 {
			t.Logf("the Sparkplug host: %d problems, the first: %s", len(problems), strings.Join(problems[:min(len(problems), 5)], "; "))
		}
	}()
	testenv.WaitFor(t, 60*time.Second, fmt.Sprintf("every sample up to seq %d at the Sparkplug host", target), func() bool {
		problems, leftOut, historical, spDups = sparkplugProblems(host, byseq(), runs, target)
		return len(problems) == 0
	})
	noDrop(gw.status(t))
	sentWS := gw.upstream(t).Upstream.SentWS
	if v := gw.metric(t, "edgegw_upstream_dropped_total"); v != 0 {
		t.Errorf("/metrics edgegw_upstream_dropped_total %v, want 0", v)
	}
	if v := gw.metric(t, "edgegw_upstream_queue_corrupt_total"); v != 0 {
		t.Errorf("/metrics edgegw_upstream_queue_corrupt_total %v, want 0", v)
	}
	gw.term(20 * time.Second)
	heads := cursorsOf(t, data)
	if heads[cursorPush] < target || heads[cursorSparkplug] < target {
		t.Errorf("cursors after the clean stop %v, want both at %d or beyond (delivered on both sides)", heads, target)
	}
	setReceiver(false)

	// What every seq became.
	got := byseq()
	lost, skipped, reasons := lostSkipped()
	for k, c := range runs {
		for s := c.s0 + 1; s <= c.s1; s++ {
			if _, ok := skipped.span(s); ok {
				t.Fatalf("run %d: seq %d was numbered (status %d..%d) and announced as a restart skip", k, s, c.s0, c.s1)
			}
		}
	}
	for s := range lost {
		if _, ok := got[s]; ok {
			t.Fatalf("seq %d both received and reported lost", s)
		}
		k := sort.Search(len(runs), func(i int) bool { return runs[i].mark >= s })
		if k == len(runs) {
			t.Fatalf("seq %d of the last run (clean) reported lost", s)
		}
		for x := s + 1; x <= runs[k].mark; x++ {
			if _, ok := got[x]; ok {
				t.Fatalf("seq %d lost before seq %d of the same run was received: a loss that is not the killed run's tail (run %d up to %d)", s, x, k, runs[k].mark)
			}
		}
	}
	for reason := range reasons {
		if reason != "crash" {
			t.Errorf("losses reported for %v, want only crash (the tail of a killed run)", reasons)
			break
		}
	}
	var fresh, dups, gaps uint64
	for _, p := range recvs {
		f, d, g := recvTotals(t, p)
		fresh, dups, gaps = fresh+f, dups+d, gaps+g
	}
	lines := received(t, r.recvOut)
	if n := len(seqsOf(t, lines, epoch)); uint64(n) != fresh || n != len(lines) {
		t.Errorf("receivers counted %d new samples, their file holds %d seqs of epoch %s in %d lines", fresh, n, epoch, len(lines))
	}
	if gaps != 0 {
		t.Errorf("receivers reported %d gaps", gaps)
	}
	if historical < lag*(kills/2) {
		t.Errorf("%d historical metrics at the host, want at least %d (%d runs with the host offline, %d samples each)", historical, lag*(kills/2), kills/2, lag)
	}
	t.Logf("%d kills; seqs 1..%d: %d received, %d lost (%v), %d skipped; receiver duplicates %d; Sparkplug: %d historical, %d duplicates, %d left out by report by exception; sent_ws of the last run %d",
		kills, target, len(got), len(lost), reasons, skipped.count(), dups, historical, spDups, leftOut, sentWS)
}

// sparkplugProblems checks what the host got against the receiver's
// samples (by seq) up to seq upTo: every sample there, null or with its
// value; those of a run the host was offline for flagged is_historical; a
// missing live one only if report by exception may leave it out (its
// value and quality those of the previous sample of its tag, or not
// good). It returns the problems, the samples left out, the historical
// metrics and the duplicates.
func sparkplugProblems(h *spHost, got map[uint64]recvLine, runs []killRun, upTo uint64) (problems []string, leftOut, historical, dups int) {
	seen, unknown := h.seen()
	if unknown > 0 {
		problems = append(problems, fmt.Sprintf("%d metrics of an alias no DBIRTH named", unknown))
	}
	seqs := make([]uint64, 0, len(got))
	for s := range got {
		if s <= upTo {
			seqs = append(seqs, s)
		}
	}
	sort.Slice(seqs, func(i, j int) bool { return seqs[i] < seqs[j] })
	prev := map[[2]string]recvLine{}
	for _, s := range seqs {
		l := got[s]
		p, had := prev[[2]string{l.Device, l.Tag}]
		prev[[2]string{l.Device, l.Tag}] = l
		k := sort.Search(len(runs), func(i int) bool { return runs[i].mark >= s })
		offline := k < len(runs) && !runs[k].pushDown
		x := seen[spKey{l.Device, l.Tag, l.TS / 1000}]
		switch {
		case x == nil && offline:
			problems = append(problems, fmt.Sprintf("seq %d (%s/%s), stored while the host was offline, never replayed", s, l.Device, l.Tag))
		case x == nil && (l.Quality != "good" || had && p.Quality == l.Quality && string(p.Value) == string(l.Value)):
			leftOut++
		case x == nil:
			problems = append(problems, fmt.Sprintf("live seq %d (%s/%s = %s) changed and never sent", s, l.Device, l.Tag, l.Value))
		case offline && x.hist == 0:
			problems = append(problems, fmt.Sprintf("seq %d (%s/%s), stored while the host was offline, not flagged is_historical", s, l.Device, l.Tag))
		case l.Quality != "good" && !x.null:
			problems = append(problems, fmt.Sprintf("seq %d (%s/%s) %s, not null at the host", s, l.Device, l.Tag, l.Quality))
		case l.Quality == "good":
			var v float64
			if err := json.Unmarshal(l.Value, &v); err != nil || x.null || float32(v) != float32(x.v) {
				problems = append(problems, fmt.Sprintf("seq %d (%s/%s): %s at the receiver, %v (null %v) at the host", s, l.Device, l.Tag, l.Value, x.v, x.null))
			}
		}
		if x != nil {
			historical += x.hist
			dups += x.n - 1
		}
	}
	return problems, leftOut, historical, dups
}
