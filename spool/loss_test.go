package spool

import (
	"bytes"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

const lossEpoch = 0x9f3c04e1a2b3c4d5

// lossDir writes 5 records of 4 samples (seqs 1..20, epoch lossEpoch) and
// closes the queue; it returns the directory, the segment and the offset
// where each record starts (plus the file size).
func lossDir(t *testing.T) (dir, seg string, starts []int) {
	t.Helper()
	dir = t.TempDir()
	q := openQ(t, Config{Dir: dir, Fsync: FsyncNever})
	for s := uint64(1); s <= 20; s += 4 {
		b := mkBatch(s, 1, 4)
		for i := range b {
			b[i].Epoch = lossEpoch
		}
		q.Append(b) // one record each
	}
	q.Close()
	seg, b := oneSegment(t, dir)
	for off := 0; off < len(b); {
		size, _, _, err := recordSpan(b[off:])
		if err != nil {
			t.Fatal(err)
		}
		starts = append(starts, off)
		off += size
	}
	if len(starts) != 5 {
		t.Fatalf("%d records, want 5", len(starts))
	}
	return dir, seg, append(starts, len(b))
}

// copyDir copies the queue's files into a fresh directory.
func copyDir(t *testing.T, from string) string {
	t.Helper()
	to := t.TempDir()
	es, err := os.ReadDir(from)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range es {
		b, err := os.ReadFile(filepath.Join(from, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(to, e.Name()), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return to
}

// checkPartition: the samples the queue holds and its loss ranges are
// exactly 1..20, each seq once, all losses of lossEpoch and reason crash,
// and Lost counts them.
func checkPartition(t *testing.T, q *Queue, what string) (held int, losses []Loss) {
	t.Helper()
	seen := map[uint64]string{}
	for _, s := range peekAll(t, q) {
		seen[s.Seq] = "held"
	}
	st := q.Stats()
	var lost uint64
	for _, l := range st.Losses {
		if l.Epoch != lossEpoch || l.Reason != LossCrash || l.First > l.Last {
			t.Fatalf("%s: loss %+v", what, l)
		}
		for s := l.First; s <= l.Last; s++ {
			if seen[s] != "" {
				t.Fatalf("%s: seq %d both %s and lost (%+v)", what, s, seen[s], st.Losses)
			}
			seen[s] = "lost"
			lost++
		}
	}
	for s := uint64(1); s <= 20; s++ {
		if seen[s] == "" {
			t.Fatalf("%s: seq %d neither held nor lost (losses %+v)", what, s, st.Losses)
		}
	}
	if len(seen) != 20 || st.Lost != lost && !strings.Contains(what, "reopened") { // Lost counts since Open
		t.Fatalf("%s: %d seqs accounted, Lost %d, ranges hold %d", what, len(seen), st.Lost, lost)
	}
	if got := q.LastSeq(); got != 20 {
		t.Fatalf("%s: LastSeq %d, want 20 (the handed mark)", what, got)
	}
	return 20 - int(lost), st.Losses
}

// A power cut tears the last record at any byte: its 4 samples are one
// loss range [17,20], the log counts samples, and the restart's skip
// starts above them.
func TestQueueTornTailEveryOffsetLossExact(t *testing.T) {
	dir, seg, starts := lossDir(t)
	last, end := starts[4], starts[5]
	for off := last; off < end; off++ {
		d := copyDir(t, dir)
		if err := os.Truncate(filepath.Join(d, filepath.Base(seg)), int64(off)); err != nil {
			t.Fatal(err)
		}
		var logs bytes.Buffer
		q := openQ(t, Config{Dir: d, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
		what := fmt.Sprintf("cut at %d (last record %d..%d)", off, last, end)
		held, losses := checkPartition(t, q, what)
		if held != 16 || !slices.Equal(losses, []Loss{{Epoch: lossEpoch, First: 17, Last: 20, Reason: LossCrash}}) {
			t.Fatalf("%s: held %d, losses %+v", what, held, losses)
		}
		if off > last && !strings.Contains(logs.String(), "cut segment tail") {
			t.Fatalf("%s: no cut logged: %s", what, logs.String())
		}
		if off > last && !strings.Contains(logs.String(), "samples=4 first=17 last=20") {
			t.Fatalf("%s: the cut is not logged in samples: %s", what, logs.String())
		}
		q.Resume(lossEpoch, 1000, true)
		if k := q.Skips(lossEpoch, 16, 1000); len(k) != 1 || k[0].First != 21 || k[0].Last != 999 {
			t.Fatalf("%s: skip %+v, want [21,999]", what, k)
		}
		if l := q.Losses(16, 1000); len(l) != 1 {
			t.Fatalf("%s: a batch from 17 does not cross the loss: %+v", what, l)
		}
		q.Close()
		// Reopened (the loss file saved at Close): the same loss, once.
		q = openQ(t, Config{Dir: d})
		if _, l := checkPartition(t, q, what+", reopened"); len(l) != 1 || l[0].First != 17 || l[0].Last != 20 {
			t.Fatalf("%s: after reopen losses %+v", what, l)
		}
		q.Close()
	}
}

// One byte of a record's length rots (any record, any length byte, a few
// patterns): whatever recovery cuts or skips is a loss range, exactly the
// seqs the queue no longer holds.
func TestQueueRottedLengthByteLossExact(t *testing.T) {
	dir, seg, starts := lossDir(t)
	for r := 0; r < 5; r++ {
		for j := 0; j < 4; j++ {
			for _, x := range []byte{0x01, 0x02, 0x10, 0x80, 0xff} {
				if j == 3 && x&0x80 != 0 {
					continue // the epoch flag: a checksum failure like any other, tested by x 0x01..0x10
				}
				d := copyDir(t, dir)
				p := filepath.Join(d, filepath.Base(seg))
				b, err := os.ReadFile(p)
				if err != nil {
					t.Fatal(err)
				}
				b[starts[r]+j] ^= x
				if err := os.WriteFile(p, b, 0o600); err != nil {
					t.Fatal(err)
				}
				q := openQ(t, Config{Dir: d})
				what := fmt.Sprintf("record %d length byte %d ^ %#x", r, j, x)
				held, losses := checkPartition(t, q, what)
				if held > 16 || len(losses) == 0 || losses[len(losses)-1].Last != 20 && r == 4 {
					t.Fatalf("%s: held %d, losses %+v", what, held, losses)
				}
				q.Close()
			}
		}
	}
}

// Drops at the bound (here at the start of an epoch, memory mode) are loss
// ranges of the dropped samples' epoch, reason "full", crossed by the next
// batch.
func TestQueueDropIsLoss(t *testing.T) {
	q := openQ(t, Config{MaxBytes: 4096})
	defer q.Close()
	for s := uint64(1); s <= 400; s += 4 {
		b := mkBatch(s, 1, 4)
		for i := range b {
			b[i].Epoch = lossEpoch
		}
		q.Append(b)
	}
	st := q.Stats()
	if st.Dropped == 0 || st.Lost != st.Dropped || len(st.Losses) != 1 {
		t.Fatalf("stats %+v", st)
	}
	l := st.Losses[0]
	if l.Epoch != lossEpoch || l.Reason != LossFull || l.First != 1 || l.Last != st.Dropped {
		t.Fatalf("loss %+v, dropped %d", l, st.Dropped)
	}
	first := peekAll(t, q)[0].Seq
	if first != l.Last+1 {
		t.Fatalf("first held %d after loss %+v", first, l)
	}
	if got := q.Losses(0, first); len(got) != 1 {
		t.Fatalf("the batch from %d does not carry the loss: %v", first, got)
	}
	if got := q.Losses(first, first+10); len(got) != 0 {
		t.Fatalf("a later batch carries it again: %v", got)
	}
}
