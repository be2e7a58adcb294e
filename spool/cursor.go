package spool

import (
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"edgegw/ringstore"
)

// cursorFile keeps the named cursors' positions beside the ack mark.
const cursorFile = "queue.cursors"

// Reader is what an upstream sender reads from: a Cursor, or a Queue
// itself (its first cursor, the only one unless Config.Cursors names
// several).
type Reader interface {
	PeekAfter(after uint64, n int, dst []ringstore.Sample) []ringstore.Sample
	Ack(last uint64)
	Acked() uint64
	Wait() <-chan struct{}
	Losses(after, last uint64) []Loss
	Skips(epoch, after, last uint64) []ringstore.Skip
	Stats() Stats
}

var (
	_ Reader = (*Queue)(nil)
	_ Reader = (*Cursor)(nil)
)

// Cursor is one consumer's position in the queue: every consumer reads
// the same samples, written once, and acknowledges them on its own
// cursor. A sample leaves the queue (its segment is deleted) once every
// cursor has passed it. When the bound drops the oldest samples, every
// cursor still below them is moved past them, and what each cursor lost
// is counted in its own Stats().Dropped and sent as a Loss with its next
// batch (Losses), as for a single consumer.
//
// A named cursor's position is saved in the file queue.cursors (a
// temporary file, synced unless the policy is "never", renamed) before
// the queue's ack mark, at the same moments; a cursor starts at the ack
// mark when the file does not name it (a consumer added to the config),
// so a crash may resend a few acknowledged samples to a consumer, never
// skip one.
type Cursor struct {
	q    *Queue
	name string

	head    uint64 // q.mu: acknowledged (or dropped) up to here
	dropped uint64 // q.mu: samples dropped at the bound (or unwritten at Close) below this cursor
}

// Name is the cursor's name ("" for a queue's only, unnamed cursor).
func (c *Cursor) Name() string { return c.name }

// Cursor returns the named cursor of Config.Cursors, nil when there is
// none of that name.
func (q *Queue) Cursor(name string) *Cursor {
	for _, c := range q.curs {
		if c.name == name {
			return c
		}
	}
	return nil
}

// checkCursors refuses an empty, duplicate or blank-holding name.
func checkCursors(names []string) error {
	seen := map[string]bool{}
	for _, n := range names {
		if n == "" || strings.ContainsAny(n, " \t\r\n") {
			return fmt.Errorf("spool: cursor name %q: want a non-empty word", n)
		}
		if seen[n] {
			return fmt.Errorf("spool: cursor %q named twice", n)
		}
		seen[n] = true
	}
	return nil
}

// minHeadLocked is the slowest cursor's head (mu held).
func (q *Queue) minHeadLocked() uint64 {
	h := q.curs[0].head
	for _, c := range q.curs[1:] {
		h = min(h, c.head)
	}
	return h
}

// dropCursorsLocked moves every cursor below l.Last past the dropped
// range l (n samples in it), counting for each what it had not passed
// (mu held).
func (q *Queue) dropCursorsLocked(l Loss, n uint64) {
	for _, c := range q.curs {
		if c.head >= l.Last {
			continue
		}
		k := n
		if c.head >= l.First {
			k = min(n, l.Last-c.head)
		}
		c.dropped += k
		c.head = l.Last
	}
}

// Ack acknowledges, for this cursor, every sample with seq <= last. The
// samples leave the queue once every cursor has acknowledged them.
func (c *Cursor) Ack(last uint64) {
	q := c.q
	q.mu.Lock()
	if last <= c.head {
		q.mu.Unlock()
		return
	}
	c.head = last
	if h := q.minHeadLocked(); h > q.head {
		q.head = h
		q.releaseLocked()
	}
	q.mu.Unlock()
	select {
	case q.kick <- struct{}{}:
	default:
	}
}

// Acked is the seq up to which this cursor acknowledged (or lost to a drop) everything.
func (c *Cursor) Acked() uint64 {
	c.q.mu.Lock()
	defer c.q.mu.Unlock()
	return c.head
}

// PeekAfter returns up to n samples with seq > after and above the
// cursor, in order, appended to dst (Queue.PeekAfter for this cursor).
func (c *Cursor) PeekAfter(after uint64, n int, dst []ringstore.Sample) []ringstore.Sample {
	return c.q.peek(c, after, n, dst)
}

// Wait is Queue.Wait.
func (c *Cursor) Wait() <-chan struct{} { return c.q.Wait() }

// Losses is Queue.Losses: a batch of this cursor covering (after, last] crosses them.
func (c *Cursor) Losses(after, last uint64) []Loss { return c.q.Losses(after, last) }

// Skips is Queue.Skips.
func (c *Cursor) Skips(epoch, after, last uint64) []ringstore.Skip {
	return c.q.Skips(epoch, after, last)
}

// Stats is the queue's Stats as this cursor sees it: Samples, Bytes,
// OldestTS and Acked above its head, Dropped what it lost; the rest is
// the queue's.
func (c *Cursor) Stats() Stats { return c.q.stats(c) }

// readCursors reads the cursors file: name -> head. A bad line is logged
// and ignored (that cursor starts at the ack mark).
func readCursors(dir string, log *slog.Logger) map[string]uint64 {
	path := filepath.Join(dir, cursorFile)
	b, err := os.ReadFile(path)
	if err != nil {
		if !os.IsNotExist(err) {
			log.Warn("spool: cursors unreadable; they start at the ack mark", "file", path, "err", err)
		}
		return nil
	}
	out := map[string]uint64{}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		var v uint64
		if len(f) == 2 {
			v, err = strconv.ParseUint(f[1], 10, 64)
		}
		if len(f) != 2 || err != nil {
			log.Warn("spool: bad line in cursors ignored", "file", path, "line", line)
			continue
		}
		out[f[0]] = v
	}
	return out
}

// saveCursors replaces the cursors file ("name head" lines): a temporary
// file, synced unless the policy is "never", renamed.
func (d *diskStore) saveCursors(heads []cursorHead) error {
	var b []byte
	for _, h := range heads {
		b = append(b, h.name...)
		b = append(b, ' ')
		b = strconv.AppendUint(b, h.head, 10)
		b = append(b, '\n')
	}
	return d.replaceFile(cursorFile, b)
}

// cursorHead is a cursor's position as saved.
type cursorHead struct {
	name string
	head uint64
}
