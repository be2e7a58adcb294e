package e2e

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"edgegw/internal/testenv"
)

var (
	lossLineRE = regexp.MustCompile(`msg="receiver: samples lost at the gateway".* first=(\d+) last=(\d+) lost=(\d+) reason=(\S+)`)
	skipLineRE = regexp.MustCompile(`msg="receiver: restart skip \(numbers never given to a sample\)".* first=(\d+) last=(\d+)`)
)

// ranges parses the receiver's log lines matching re into [first,last]
// pairs (and the reported counts, for losses).
func logRanges(t *testing.T, log string, re *regexp.Regexp) (out [][2]uint64, counted uint64, reasons map[string]int) {
	t.Helper()
	reasons = map[string]int{}
	for _, m := range re.FindAllStringSubmatch(log, -1) {
		a, _ := strconv.ParseUint(m[1], 10, 64)
		b, _ := strconv.ParseUint(m[2], 10, 64)
		out = append(out, [2]uint64{a, b})
		if len(m) > 3 {
			n, _ := strconv.ParseUint(m[3], 10, 64)
			counted += n
			reasons[m[4]]++
		}
	}
	return out, counted, reasons
}

// newestSegment is the path and first seq of the newest spool segment.
func newestSegment(t *testing.T, data string) (string, uint64) {
	t.Helper()
	m, _ := filepath.Glob(filepath.Join(data, "queue", "*.seg"))
	if len(m) == 0 {
		m, _ = filepath.Glob(filepath.Join(data, "*", "*.seg"))
	}
	if len(m) == 0 {
		m, _ = filepath.Glob(filepath.Join(data, "*.seg"))
	}
	if len(m) == 0 {
		return "", 0
	}
	sort.Strings(m)
	first, err := strconv.ParseUint(strings.TrimSuffix(filepath.Base(m[len(m)-1]), ".seg"), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return m[len(m)-1], first
}

// A power cut, 20 times: data_dir, the receiver down, SIGKILL at a random
// moment, then the newest spool segment cut at a random offset (a torn
// write). Then the receiver comes up: every seq handed out is received or
// reported lost, to the sample; no seq is both; a restart skip covers no
// seq that was handed out; and nothing lost lies outside the segments that
// were cut (what was fsynced survives).
func TestPowerLossIsReported(t *testing.T) {
	r := newEpochRig(t, 4)
	data := filepath.Join(r.dir, "data")
	cfg := r.config("powerloss", data, "[buffer]\nmax_bytes = \"256KiB\"\n")
	rnd := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 22))
	type cycle struct {
		s0, s1   uint64 // status seqs: s0 at the start (maybe the run's resume point), s1 before the kill: s0+1..s1 handed out
		segFirst uint64 // the cut segment's first seq
		cutBytes int64
	}
	var cycles []cycle
	var prev uint64
	for k := 0; k < 20; k++ {
		gw := r.startGateway(cfg)
		var c cycle
		testenv.WaitFor(t, 20*time.Second, "the run numbers samples", func() bool {
			c.s0 = gw.status(t).Seq
			return c.s0 > prev
		})
		target := c.s0 + 8 + uint64(rnd.IntN(120)) // a random moment: 8..128 samples later
		testenv.WaitFor(t, 20*time.Second, fmt.Sprintf("run %d reaches seq %d", k, target), func() bool {
			c.s1 = gw.status(t).Seq
			return c.s1 >= target
		})
		gw.kill()
		seg, first := newestSegment(t, data)
		if seg == "" {
			t.Fatalf("run %d: no segment in %s", k, data)
		}
		fi, err := os.Stat(seg)
		if err != nil {
			t.Fatal(err)
		}
		off := rnd.Int64N(fi.Size() + 1)
		if err := os.Truncate(seg, off); err != nil {
			t.Fatal(err)
		}
		c.segFirst, c.cutBytes = first, fi.Size()-off
		cycles = append(cycles, c)
		prev = c.s1
	}
	gw := r.startGateway(cfg)
	r.startReceiver()
	testenv.WaitFor(t, 40*time.Second, "the queue delivered and acked", func() bool {
		st := gw.status(t)
		return st.Seq > prev && st.Upstream.QueueSamples == 0 && len(received(t, r.recvOut)) > 0
	})
	gw.term(20 * time.Second)
	gaps, gapSamples := r.stopReceiverGaps()
	log := r.recv.log()

	lines := received(t, r.recvOut)
	got := map[uint64]bool{}
	var top uint64
	for _, l := range lines {
		if got[l.Seq] {
			t.Fatalf("seq %d received twice", l.Seq)
		}
		got[l.Seq] = true
		top = max(top, l.Seq)
	}
	losses, counted, reasons := logRanges(t, log, lossLineRE)
	skips, _, _ := logRanges(t, log, skipLineRE)
	lost := map[uint64]bool{}
	for _, l := range losses {
		for s := l[0]; s <= l[1]; s++ {
			if got[s] {
				t.Fatalf("seq %d both received and reported lost %v", s, l)
			}
			lost[s] = true
		}
	}
	if uint64(len(lost)) != counted {
		t.Fatalf("loss lines hold %d seqs, their counts say %d", len(lost), counted)
	}
	skipped := func(s uint64) bool {
		for _, k := range skips {
			if k[0] <= s && s <= k[1] {
				return true
			}
		}
		return false
	}
	for i, c := range cycles {
		for s := c.s0 + 1; s <= c.s1; s++ {
			if skipped(s) {
				t.Fatalf("run %d: seq %d was handed out (numbered %d..%d) and announced as a skip", i, s, c.s0, c.s1)
			}
		}
	}
	var silent []uint64
	for s := uint64(1); s <= top; s++ {
		if !got[s] && !lost[s] && !skipped(s) {
			silent = append(silent, s)
		}
	}
	if len(silent) > 0 {
		t.Fatalf("%d seqs neither received, reported lost nor skipped (first %d)", len(silent), silent[0])
	}
	// Nothing outside a cut segment is lost: each lost seq lies at or
	// above the segment cut after its run.
	for s := range lost {
		// The run that handed s out: the last whose first status read was
		// at or below s, or the first run (a fresh data_dir numbers from 1:
		// on a busy machine its first read may come after a few seqs).
		k := max(sort.Search(len(cycles), func(i int) bool { return cycles[i].s0 > s })-1, 0)
		if s < cycles[k].segFirst {
			t.Fatalf("seq %d lost below the segment cut after its run (%+v)", s, cycles[k])
		}
	}
	if gaps != 0 {
		t.Errorf("the receiver reported %d unexplained gaps (%d samples):\n%s", gaps, gapSamples, log)
	}
	var cut int64
	for _, c := range cycles {
		cut += c.cutBytes
	}
	t.Logf("20 SIGKILLs, %d bytes cut: %d received, %d lost = %d reported (%v), %d skips, 0 silent, top seq %d",
		cut, len(got), len(lost), counted, reasons, len(skips), top)
}
