package spool

import (
	"path/filepath"
	"testing"
)

// segFiles counts the segment files in dir.
func segFiles(t *testing.T, dir string) int {
	t.Helper()
	m, err := filepath.Glob(filepath.Join(dir, "*.seg"))
	if err != nil {
		t.Fatal(err)
	}
	return len(m)
}

// peekCursor reads everything above c's head.
func peekCursor(c *Cursor) []uint64 {
	var out []uint64
	after := uint64(0)
	for {
		b := c.PeekAfter(after, 333, nil)
		if len(b) == 0 {
			return out
		}
		for _, s := range b {
			out = append(out, s.Seq)
		}
		after = b[len(b)-1].Seq
	}
}

// Two cursors, one acking everything and one acking nothing: the bound
// holds over what the slow one keeps, the slow one's drops are counted,
// located (a Loss its next batch crosses) and it resumes right after
// them; the fast one loses nothing.
func TestCursorsSlowOneBoundExactCounted(t *testing.T) {
	const max = 32 << 10
	q := openQ(t, Config{Dir: t.TempDir(), MaxBytes: max, SegmentBytes: 4 << 10, Fsync: FsyncNever, Cursors: []string{"fast", "slow"}})
	stop := runQ(t, q)
	fast, slow := q.Cursor("fast"), q.Cursor("slow")
	if fast == nil || slow == nil || q.Cursor("other") != nil {
		t.Fatal("Cursor by name")
	}
	const total = 20000
	for s := uint64(1); s <= total; s += 200 {
		appendN(q, s, 200)
		waitFor(t, "write", func() bool { return q.Stats().Unwritten == 0 })
		if got := fast.PeekAfter(0, 1000, nil); len(got) != 200 || got[0].Seq != s {
			t.Fatalf("fast cursor read %d samples from %d, want 200 from %d", len(got), got[0].Seq, s)
		}
		fast.Ack(s + 199)
		if st := q.Stats(); st.Bytes > max {
			t.Fatalf("bound not kept: %d bytes > %d", st.Bytes, max)
		}
	}
	stop()
	fs, ss, qs := fast.Stats(), slow.Stats(), q.Stats()
	if fs.Dropped != 0 || fs.Samples != 0 || fs.Acked != total {
		t.Fatalf("fast cursor lost or holds samples: %+v", fs)
	}
	if ss.Dropped == 0 || ss.Samples < 1000 {
		t.Fatalf("slow cursor: nothing dropped or too much: %+v", ss)
	}
	if ss.Dropped+uint64(ss.Samples) != total {
		t.Fatalf("slow cursor: dropped %d + held %d != %d appended", ss.Dropped, ss.Samples, total)
	}
	if qs.Samples != ss.Samples || qs.Acked != ss.Acked || qs.Bytes > max {
		t.Fatalf("the queue holds what the slow cursor holds: queue %+v, slow %+v", qs, ss)
	}
	seqs := peekCursor(slow)
	if uint64(len(seqs)) != uint64(ss.Samples) || seqs[0] != ss.Acked+1 || seqs[len(seqs)-1] != total {
		t.Fatalf("slow cursor reads %d samples %d..%d, want %d from %d to %d", len(seqs), seqs[0], seqs[len(seqs)-1], ss.Samples, ss.Acked+1, total)
	}
	for i := 1; i < len(seqs); i++ {
		if seqs[i] != seqs[i-1]+1 {
			t.Fatalf("slow cursor: gap %d -> %d", seqs[i-1], seqs[i])
		}
	}
	ls := slow.Losses(slow.Acked(), total)
	if len(ls) != 1 || ls[0].First != 1 || ls[0].Last != ss.Acked || ls[0].Reason != LossFull {
		t.Fatalf("slow cursor's next batch crosses %v, want one %s loss 1..%d", ls, LossFull, ss.Acked)
	}
	if ls := fast.Losses(fast.Acked(), total+100); len(ls) != 0 {
		t.Fatalf("fast cursor's next batch crosses %v, want none", ls)
	}
	q.Close()
}

// Each named cursor resumes where it acknowledged after a restart; the
// ack mark is the slowest one's; a cursor the file does not name starts
// at the mark.
func TestCursorsRestartResumesEach(t *testing.T) {
	dir := t.TempDir()
	q := openQ(t, Config{Dir: dir, SegmentBytes: 4 << 10, Cursors: []string{"a", "b"}})
	stop := runQ(t, q)
	appendN(q, 1, 1000)
	q.Cursor("a").Ack(800)
	q.Cursor("b").Ack(300)
	stop()
	if err := q.Close(); err != nil {
		t.Fatal(err)
	}

	q = openQ(t, Config{Dir: dir, SegmentBytes: 4 << 10, Cursors: []string{"b", "a", "c"}})
	for _, w := range []struct {
		name  string
		acked uint64
	}{{"a", 800}, {"b", 300}, {"c", 300}} {
		c := q.Cursor(w.name)
		if got := c.Acked(); got != w.acked {
			t.Fatalf("cursor %s resumes at %d, want %d", w.name, got, w.acked)
		}
		seqs := peekCursor(c)
		if uint64(len(seqs)) != 1000-w.acked || seqs[0] != w.acked+1 {
			t.Fatalf("cursor %s reads %d samples from %d, want %d from %d", w.name, len(seqs), seqs[0], 1000-w.acked, w.acked+1)
		}
	}
	if st := q.Stats(); st.Acked != 300 || st.Samples != 700 {
		t.Fatalf("queue after restart: acked %d holding %d, want 300 and 700", st.Acked, st.Samples)
	}
	if st := q.Cursor("a").Stats(); st.Acked != 800 || st.Samples != 200 {
		t.Fatalf("cursor a after restart: acked %d holding %d, want 800 and 200", st.Acked, st.Samples)
	}
	q.Close()
}

// A segment stays while one cursor still needs it and is deleted once
// both have acknowledged it.
func TestCursorsBothAckedSegmentRemoved(t *testing.T) {
	dir := t.TempDir()
	q := openQ(t, Config{Dir: dir, SegmentBytes: 2 << 10, FsyncInterval: 10e6, Cursors: []string{"push", "sparkplug"}})
	runQ(t, q)
	appendN(q, 1, 2000)
	waitFor(t, "write", func() bool { return q.Stats().Unwritten == 0 })
	n := segFiles(t, dir)
	if n < 4 {
		t.Fatalf("%d segments, want several", n)
	}
	q.Cursor("push").Ack(2000)
	q.Cursor("push").Ack(2000)
	// Run's flush follows the ack's kick; the segments must still be there
	// after it: the ack mark (saved at the flush) stays 0.
	waitFor(t, "push's cursor saved", func() bool { return readCursors(dir, q.log)["push"] == 2000 })
	if got := segFiles(t, dir); got != n {
		t.Fatalf("%d segments after one cursor acked everything, want all %d", got, n)
	}
	if st := q.Stats(); st.Samples != 2000 || st.Acked != 0 {
		t.Fatalf("queue after one ack: %+v", st)
	}
	q.Cursor("sparkplug").Ack(2000)
	waitFor(t, "the acknowledged segments deleted", func() bool { return segFiles(t, dir) <= 1 })
	if st := q.Stats(); st.Samples != 0 || st.Acked != 2000 {
		t.Fatalf("queue after both acks: %+v", st)
	}
	q.Close()
}

func TestCursorsBadNames(t *testing.T) {
	for _, names := range [][]string{{""}, {"a", "a"}, {"a b"}} {
		if _, err := Open(Config{Cursors: names}); err == nil {
			t.Fatalf("cursors %q accepted", names)
		}
	}
}

// Without a directory the bound holds over the slowest cursor too: each
// cursor below the drop is moved past it and counts only what it had
// not acknowledged itself.
func TestCursorsMemoryBoundCountsPerCursor(t *testing.T) {
	q := openQ(t, Config{MaxBytes: 100 * (64 + 9 + 5), Cursors: []string{"fast", "slow"}}) // room for 100 samples
	fast, slow := q.Cursor("fast"), q.Cursor("slow")
	appendN(q, 1, 50)
	fast.Ack(50)
	slow.Ack(20)
	appendN(q, 51, 950) // the bound keeps 901..1000: drops 21..900
	fs, ss := fast.Stats(), slow.Stats()
	if fs.Dropped != 850 || fs.Samples != 100 || fs.Acked != 900 {
		t.Fatalf("fast cursor (acked 50): dropped %d holds %d acked %d, want 850 (51..900), 100, 900", fs.Dropped, fs.Samples, fs.Acked)
	}
	if ss.Dropped != 880 || ss.Samples != 100 || ss.Acked != 900 {
		t.Fatalf("slow cursor (acked 20): dropped %d holds %d acked %d, want 880 (21..900), 100, 900", ss.Dropped, ss.Samples, ss.Acked)
	}
	if qs := q.Stats(); qs.Dropped != 880 || qs.Samples != 100 || len(qs.DroppedRanges) != 1 || qs.DroppedRanges[0] != (SeqRange{21, 900}) {
		t.Fatalf("queue: dropped %d %v holds %d, want 880 (21..900) and 100", qs.Dropped, qs.DroppedRanges, qs.Samples)
	}
	if ls := fast.Losses(fast.Acked(), 1000); len(ls) != 1 || ls[0].Last != 900 {
		t.Fatalf("fast cursor's next batch crosses %v, want the loss ending at 900", ls)
	}
	if seqs := peekCursor(fast); len(seqs) != 100 || seqs[0] != 901 {
		t.Fatalf("fast cursor reads %d samples from %d, want the 100 kept from 901", len(seqs), seqs[0])
	}
}
