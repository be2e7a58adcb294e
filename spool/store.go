package spool

import (
	"sort"
	"sync"

	"edgegw/ringstore"
)

// store holds the samples the queue has written, in seq order, until the
// queue releases them (acknowledged or dropped at the bound): segment files
// (diskStore) or a slice (memStore). What the queue does with them — the
// hand-off, the bound and its drops, acks, falling back to memory when the
// disk fails, counting corrupt records, the group fsync — is written once,
// in Queue, over this interface.
//
// Locking: write, syncer and close are called with the queue's writer lock
// held, read with its reader lock; the others from anywhere. Each store
// guards its own state and never calls back into the queue.
type store interface {
	// write appends one record: samples of consecutive seqs and one epoch.
	// After an error nothing of the record is kept and the store takes
	// the next write as if it had not happened.
	write(rec []ringstore.Sample) error
	// syncer hands over the sync of what was written and not yet synced,
	// to run after the writer lock is released (it logs its own failure
	// and counts the writes unsynced again); nil when there is none.
	syncer() func()
	// read appends up to n samples with seq > after to dst, oldest first,
	// stopping once it has read up to seq upto (the queue's cache serves
	// beyond). It returns the corrupt records it skipped (each counted
	// once) and the error that ended the read early, if any.
	read(after, upto uint64, n int, dst []ringstore.Sample) ([]ringstore.Sample, int, error)
	// usage is what the store holds above head.
	usage(head uint64) usage
	// oldest is what the bound drops of the store to free excess bytes:
	// the oldest whole samples above head (ranges, oldest first), and
	// the excess they leave.
	oldest(head uint64, excess int64) ([]Loss, int64)
	// release forgets everything up to head (acknowledged or dropped),
	// without I/O: the files go at the next checkpoint.
	release(head uint64)
	// checkpoint removes the files of what was released and, with mark,
	// saves the ack mark head. Called by Run's goroutine (and Close).
	checkpoint(head uint64, mark bool) error
	// saveCursors replaces the named cursors' positions kept with the
	// queue (before the ack mark, at the same moments).
	saveCursors(heads []cursorHead) error
	// saveSkips replaces the restart skips kept with the queue.
	saveSkips(skips []ringstore.Skip) error
	// saveLosses replaces the loss ranges kept with the queue.
	saveLosses(losses []Loss) error
	// saveHanded records the highest seq handed to the queue (its epoch,
	// and the first seq of this run): cheap, called on every write.
	saveHanded(seq, epoch, first uint64) error
	// close closes the files; a write after it opens a new segment.
	close()
}

// usage is what a store holds above the ack mark.
type usage struct {
	samples  int64
	bytes    int64  // on disk (a segment's bytes prorated to its samples) or the memory estimate
	segments int    // segment files
	last     uint64 // the highest seq held or once written, 0 if none
}

// estBytes is the memory cost of a sample: the struct's fixed part plus its
// strings (an estimate; the strings are usually shared with the ring).
func estBytes(s *ringstore.Sample) int64 { return 64 + int64(len(s.Device)+len(s.Tag)) }

// fifo is a queue of samples in seq order, popped at the front.
type fifo struct {
	s   []ringstore.Sample // s[off:] is held
	off int
}

func (f *fifo) items() []ringstore.Sample  { return f.s[f.off:] }
func (f *fifo) len() int                   { return len(f.s) - f.off }
func (f *fifo) front() *ringstore.Sample   { return &f.s[f.off] }
func (f *fifo) push(b ...ringstore.Sample) { f.s = append(f.s, b...) }
func (f *fifo) at(i int) *ringstore.Sample { return &f.s[f.off+i] }
func (f *fifo) search(after uint64) int    { return searchAfter(f.items(), after) }

// searchAfter is the index of the first sample of s with seq > after.
func searchAfter(s []ringstore.Sample, after uint64) int {
	return sort.Search(len(s), func(i int) bool { return s[i].Seq > after })
}

func (f *fifo) pop() {
	f.s[f.off] = ringstore.Sample{}
	f.off++
	if f.off == len(f.s) {
		f.s, f.off = f.s[:0], 0
	} else if f.off > 1024 && f.off > len(f.s)/2 {
		n := copy(f.s, f.s[f.off:])
		clear(f.s[n:])
		f.s, f.off = f.s[:n], 0
	}
}

// memStore is the store of a queue without a directory: the written
// samples in RAM, MaxBytes bounding their estimated size (estBytes).
type memStore struct {
	mu    sync.Mutex
	q     fifo
	bytes int64 // estBytes of q
	top   uint64
}

var _ store = (*memStore)(nil)

func (m *memStore) write(rec []ringstore.Sample) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.q.push(rec...)
	for i := range rec {
		m.bytes += estBytes(&rec[i])
	}
	m.top = max(m.top, rec[len(rec)-1].Seq)
	return nil
}

func (m *memStore) syncer() func() { return nil }

func (m *memStore) read(after, _ uint64, n int, dst []ringstore.Sample) ([]ringstore.Sample, int, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	s := m.q.items()
	i := searchAfter(s, after)
	return append(dst, s[i:min(len(s), i+n)]...), 0, nil
}

func (m *memStore) usage(head uint64) usage {
	m.mu.Lock()
	defer m.mu.Unlock()
	u := usage{samples: int64(m.q.len()), bytes: m.bytes, last: m.top}
	for i := 0; i < m.q.len() && m.q.at(i).Seq <= head; i++ { // not released yet
		u.samples--
		u.bytes -= estBytes(m.q.at(i))
	}
	return u
}

func (m *memStore) oldest(head uint64, excess int64) ([]Loss, int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var drop []Loss
	for i := m.q.search(head); i < m.q.len() && excess > 0; i++ {
		s := m.q.at(i)
		if k := len(drop); k > 0 && drop[k-1].Last+1 == s.Seq && drop[k-1].Epoch == s.Epoch {
			drop[k-1].Last = s.Seq
		} else {
			drop = append(drop, Loss{Epoch: s.Epoch, First: s.Seq, Last: s.Seq, Reason: LossFull})
		}
		excess -= estBytes(s)
	}
	return drop, excess
}

func (m *memStore) release(head uint64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for m.q.len() > 0 && m.q.front().Seq <= head {
		m.bytes -= estBytes(m.q.front())
		m.q.pop()
	}
}

func (m *memStore) checkpoint(uint64, bool) error    { return nil }
func (m *memStore) saveSkips([]ringstore.Skip) error { return nil }
func (m *memStore) saveCursors([]cursorHead) error   { return nil }
func (m *memStore) saveLosses([]Loss) error          { return nil }
func (m *memStore) saveHanded(_, _, _ uint64) error  { return nil }
func (m *memStore) close()                           {}
