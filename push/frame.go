package push

import (
	"sort"
	"time"

	"edgegw/ringstore"
	"edgegw/spool"
	"edgegw/wire"
)

// Batch frames (wire.AppendBatch) carry the samples after a path's cursor.

// skipRanges turns the queue's restart skips into the frame's skip ranges
// (nil when none, the usual case: no allocation).
func skipRanges(ks []ringstore.Skip) []wire.Range {
	if len(ks) == 0 {
		return nil
	}
	r := make([]wire.Range, len(ks))
	for i, k := range ks {
		r[i] = wire.Range{First: k.First, Last: k.Last}
	}
	return r
}

// batcher cuts the samples after a path's cursor into batches: a full
// batch (BatchMax) goes at once; a partial one lingers until its first
// look is BatchWait old, so a live stream is sent in few frames. Both
// senders (WebSocket and MQTT) use one; it belongs to its sender goroutine.
type batcher struct {
	max   int
	wait  time.Duration
	until time.Time // linger deadline of the partial batch; zero when none
	buf   []ringstore.Sample
	skips []ringstore.Skip // the restart skips the batch from next crosses
	loss  []wire.Loss      // the loss ranges it crosses (nil when none)
}

// next returns the batch to send now after the cursor, or nil (nothing
// waiting, or a partial batch still lingering: see linger). A batch never
// mixes epochs: it ends before the first sample of another epoch, and is
// then due at once. skips is set to the restart skips it crosses.
func (b *batcher) next(q spool.Reader, after uint64, now time.Time) []ringstore.Sample {
	b.buf = q.PeekAfter(after, b.max, b.buf[:0])
	b.skips = b.skips[:0]
	b.loss = b.loss[:0]
	if len(b.buf) == 0 {
		return nil
	}
	full := len(b.buf) >= b.max
	for i := 1; i < len(b.buf); i++ {
		if b.buf[i].Epoch != b.buf[0].Epoch {
			b.buf, full = b.buf[:i], true
			break
		}
	}
	if b.until.IsZero() && !full {
		b.until = now.Add(b.wait)
	}
	if !full && now.Before(b.until) {
		return nil
	}
	b.until = time.Time{}
	ls := q.Losses(after, b.buf[len(b.buf)-1].Seq)
	if len(ls) > wire.MaxLoss { // end the batch after the last loss it can carry
		i := searchAfter(b.buf, ls[wire.MaxLoss-1].Last)
		b.buf, ls = b.buf[:i+1], ls[:wire.MaxLoss]
	}
	for _, l := range ls {
		if l.Last < b.buf[len(b.buf)-1].Seq {
			b.loss = append(b.loss, wire.Loss{Epoch: ringstore.FormatEpoch(l.Epoch), First: l.First, Last: l.Last, Reason: l.Reason})
		}
	}
	b.skips = append(b.skips, q.Skips(b.buf[0].Epoch, after, b.buf[len(b.buf)-1].Seq)...)
	return b.buf
}

// searchAfter is the index of the first sample with seq > after (len(s)
// when none; callers pass a seq below the last one).
func searchAfter(s []ringstore.Sample, after uint64) int {
	return sort.Search(len(s), func(i int) bool { return s[i].Seq > after })
}

// linger is how long the partial batch still waits (0 when it is due), or
// -1 when none waits.
func (b *batcher) linger() time.Duration {
	if b.until.IsZero() {
		return -1
	}
	return max(0, time.Until(b.until))
}
