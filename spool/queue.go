package spool

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"syscall"
	"time"

	"edgegw/internal/backoff"
	"edgegw/ringstore"
)

// Queue defaults.
const (
	DefaultMaxBytes      = 64 << 20
	DefaultFsyncInterval = time.Second
	cacheSamples         = 8192 // written samples kept in memory for Peek (disk)
	maxRecordSamples     = 256  // samples per record
	maxDropRanges        = 1024 // DroppedRanges kept (the counter is exact regardless)
	maxSkips             = 64   // skips kept (the oldest go first; each is a restart)
)

// Fsync policies.
const (
	FsyncBatched = "batched" // a sync at most every FsyncInterval (default)
	FsyncAlways  = "always"  // a sync after every write
	FsyncNever   = "never"   // leave it to the OS
)

// Config configures Open. The zero value is a 64 MiB memory queue.
type Config struct {
	Dir           string        // "" = memory only
	MaxBytes      int64         // bound; beyond it the oldest samples are dropped and counted (64 MiB)
	Fsync         string        // FsyncBatched (default), FsyncAlways or FsyncNever
	FsyncInterval time.Duration // for FsyncBatched, and how often the ack mark is saved (1s)
	SegmentBytes  int64         // segment file size (MaxBytes/16 within [1 KiB, 8 MiB])
	Cursors       []string      // the consumers, each reading with its own Cursor; none = one unnamed cursor
	Logger        *slog.Logger
}

// SeqRange is an inclusive range of sequence numbers.
type SeqRange struct{ First, Last uint64 }

// Stats is a copy of the queue's counters.
type Stats struct {
	Samples       int64      // unacknowledged samples held
	Bytes         int64      // what MaxBytes bounds: on disk (a segment's bytes prorated to its unacknowledged samples), in memory their estimated size
	OldestTS      int64      // TS of the oldest unacknowledged sample, 0 if none
	Acked         uint64     // everything <= Acked is acknowledged (or dropped)
	Unwritten     int64      // samples handed off and not (yet) written to the store: to disk, or to memory without Dir
	Mode          string     // "disk", "memory" (no Dir), or "memory (disk: <error>)" while the disk fails
	Dropped       uint64     // samples dropped (bound exceeded, not writable at shutdown, handed off after Close); a Cursor's: those it had not acknowledged
	Corrupt       uint64     // records skipped because their checksum failed (logged with file and offset)
	DroppedRanges []SeqRange // where the drops were (first 1024 ranges)
	Lost          uint64     // samples in loss ranges (handed out, never to be sent: Dropped, and what a crash took), since Open
	LossForgotten uint64     // samples of loss ranges forgotten beyond the 4096 kept (a receiver sees them as a plain gap)
	Losses        []Loss     // the loss ranges not yet sent and acknowledged
	Recovered     int64      // bytes cut from torn or corrupt segment tails at open
	Segments      int        // segment files
}

// Queue is the durable store-and-forward queue between the ring and the
// upstream pusher: the ring hands it every batch (HandOff under the ring's
// lock, Persist after it), the pusher reads the oldest unacknowledged
// samples (Peek, PeekAfter) and removes them only on acknowledgement (Ack)
// — a transaction, as telegraf's buffer does.
//
// Ordering: samples carry the ring's global seq, so the queue is strictly
// ordered by seq. It is gap-free except where samples were dropped, and
// every drop is counted (Dropped) and located (DroppedRanges).
//
// Where samples are: HandOff puts them in the queue's memory (the hand-off
// buffer); Persist, or Run when Persist could not, writes them to the store
// — segment files in Dir (diskStore), or a slice in RAM without Dir
// (memStore) — and the last 8192 written samples stay in memory too (with
// Dir) so that a sender keeping up never reads the disk. Acknowledged (or
// dropped) samples leave the store; their segment files are deleted by Run.
//
// Bound: beyond MaxBytes of unacknowledged samples the oldest whole samples
// beyond the bound are dropped, each counted and located; dropped samples
// count as acknowledged. On disk a segment's bytes are prorated to its
// unacknowledged samples (segments are MaxBytes/16, at least 1 KiB, so a
// small bound with a healthy uplink drops nothing); in memory each sample
// counts its estimated size. The bound is checked after each write and,
// while samples are kept in memory (no Dir, or the disk failing), at each
// hand-off.
//
// Disk faults never stop the queue: when a write fails (no space left,
// read-only file system, I/O error) the queue keeps new samples in memory
// (Mode "memory (disk: <error>)", QueueHealth false), MaxBytes bounding disk
// and memory together, logs the change once and then at most once a
// minute, and Run retries the disk with jittered backoff (0.5 s to 10 s): the first
// write that succeeds takes the queue back to disk by itself. What is still
// in memory at Close is counted as dropped and logged. A read error while
// sending (EIO, EMFILE) is retried with backoff (100 ms to 30 s) and never
// deletes or skips anything; a record whose checksum fails is skipped,
// counted (Corrupt) and logged with file and offset.
//
// Crash semantics: Append (Persist) writes each batch into the page cache
// before it returns, so a SIGKILL loses nothing that was appended; a power
// loss keeps what was synced. The ack mark is saved at most every
// FsyncInterval (each flush with FsyncAlways) and at Close, so after a
// crash a few already-acknowledged samples may be sent again — receivers
// dedup by (gateway, epoch, seq) — but an unacknowledged sample is never
// skipped. Loss is never silent: the handed mark (file queue.handed, the
// highest seq handed off, written by one pwrite before each write and
// synced with the segment) is kept apart from the last durable seq, so at
// Open every seq up to it that no segment holds (a torn or corrupt tail
// cut, a record skipped, samples that were only in memory) becomes a Loss
// (LossCrash) of its epoch, logged with the samples a cut removed; drops
// at the bound and at shutdown are losses too (LossFull, LossUnwritten).
// Losses (file queue.loss) are sent with the batch that crosses them
// (Losses) until it is acknowledged. With FsyncBatched a power cut (not a
// SIGKILL: the page cache survives that) can also take the handed mark's
// last write; the samples handed out after its last sync are then taken
// for never used (a skip), which FsyncAlways excludes.
//
// When fsync happens (never without Dir):
//   - FsyncBatched: Run's goroutine syncs the active segment at most every
//     FsyncInterval when it was written to, outside the writer lock, so
//     no appender waits for it;
//   - FsyncAlways: Persist syncs after its writes, under the writer lock,
//     before it returns (the appenders waiting then share that one sync:
//     a group commit), and Run after the writes it does itself;
//   - a roll (every SegmentBytes of records, in whichever goroutine
//     writes: usually an appender's Persist, under the writer lock) syncs
//     the full segment before closing it, then the directory for the new
//     file, whatever the policy but FsyncNever;
//   - the ack mark's temporary file before its rename (not FsyncNever);
//   - the last flush (Run's when ctx ends, then Close's) syncs the active
//     segment whatever the policy, FsyncNever included.
//
// Concurrency: all methods are safe for concurrent use. HandOff, Ack, Peek's
// bookkeeping and Stats take the queue's mutex (mu) for a short, disk-free
// critical section; Persist and Run's flush take the writer lock (wmu) for
// the writes and the shared sync of FsyncAlways, and mu only around their
// bookkeeping; disk reads run under the reader lock (rmu) outside both; the
// batched fsync and the ack mark run in the flush (Run's goroutine, under
// fmu) outside both. Lock order: fmu, wmu, mu; rmu, mu; the store's own
// locks last. Call Close after Run has returned.
type Queue struct {
	cfg     Config
	log     *slog.Logger
	st      store
	durable bool // st is a diskStore
	cache   int  // written samples kept in memory for Peek: cacheSamples on disk, 0 in memory
	kick    chan struct{}

	mu          sync.Mutex
	head        uint64    // acknowledged (or dropped) by every cursor up to here: the slowest cursor's head
	curs        []*Cursor // the consumers' cursors (at least one), in Config.Cursors order
	mem         fifo      // handed off: cached written samples, then unwritten ones
	written     int       // mem's first written samples are in the store
	storeOnly   uint64    // samples with seq <= storeOnly may be in the store only
	pendBytes   int64     // estBytes of the unwritten samples (mem after written)
	writtenTo   uint64    // every handed-off sample up to here is written (or was acked)
	diskErr     error     // the write error that put the queue in memory; nil = writing
	lastErr     error     // the last write error since Open, kept after a success (WriteHealth)
	lastErrAt   time.Time
	diskSince   time.Time
	diskLog     time.Time    // last "still in memory" line
	diskGate    backoff.Gate // no write attempt before its Until while diskErr is set
	dropLog     time.Time    // last "full, dropped" line
	dropLogN    uint64       // samples dropped since
	dropped     uint64
	ranges      []SeqRange
	recovered   int64
	corrupt     uint64
	wake        chan struct{}
	closed      bool
	oldestFor   uint64 // head for which oldestTS is valid (+1; 0 = invalid)
	oldestTS    int64
	skips       []ringstore.Skip // numbers never given to a sample (restarts), oldest first
	losses      []Loss           // numbers given to samples that were lost, oldest first
	lossDirty   bool             // losses changed since saved
	lost        uint64
	lossForgot  uint64
	handed      uint64 // the highest seq handed off (or, at open, the handed mark)
	handedEpoch uint64
	runFirst    uint64 // the first seq handed off by this process

	wmu  sync.Mutex // the writer
	wbuf []ringstore.Sample

	handedSaved uint64 // the handed mark written (wmu)

	fmu          sync.Mutex // one flush at a time (Run's, Close's): its sync and ack-mark state
	lastSync     time.Time
	ackSaved     uint64
	cursSaved    []uint64 // the cursors' heads saved (named cursors only)
	lastAckWrite time.Time
	errLogged    time.Time

	rmu      sync.Mutex   // the store's reader and its retry state
	readErr  error        // the last read error, nil after a good read
	readGate backoff.Gate // no store read before its Until (after a read error)
	readLog  time.Time    // last read error logged
}

// Open opens (or creates) the queue in cfg.Dir and recovers what is on
// disk: a torn or corrupt tail is cut at the last complete record and
// logged. A directory that cannot be made or read (read-only, failing) is
// not an error: the queue starts in memory and retries the disk.
func Open(cfg Config) (*Queue, error) {
	if cfg.MaxBytes <= 0 {
		cfg.MaxBytes = DefaultMaxBytes
	}
	switch cfg.Fsync {
	case "":
		cfg.Fsync = FsyncBatched
	case FsyncBatched, FsyncAlways, FsyncNever:
	default:
		return nil, fmt.Errorf("spool: unknown fsync policy %q (batched, always, never)", cfg.Fsync)
	}
	if cfg.FsyncInterval <= 0 {
		cfg.FsyncInterval = DefaultFsyncInterval
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if err := checkCursors(cfg.Cursors); err != nil {
		return nil, err
	}
	q := &Queue{cfg: cfg, log: cfg.Logger, kick: make(chan struct{}, 1), wake: make(chan struct{}),
		diskGate: backoff.Gate{Delay: backoff.Delay{Min: 500 * time.Millisecond, Max: 10 * time.Second}},
		readGate: backoff.Gate{Delay: backoff.Delay{Min: 100 * time.Millisecond, Max: 30 * time.Second}}}
	names := cfg.Cursors
	if len(names) == 0 {
		names = []string{""}
	}
	for _, n := range names {
		q.curs = append(q.curs, &Cursor{q: q, name: n})
	}
	if cfg.Dir == "" {
		q.st = new(memStore)
		return q, nil
	}
	seg := cfg.SegmentBytes
	if seg <= 0 {
		seg = min(max(cfg.MaxBytes/16, 1<<10), 8<<20)
	}
	d, rec, err := openDisk(cfg, seg)
	q.st, q.durable, q.cache = d, true, cacheSamples
	q.head, q.ackSaved, q.skips, q.corrupt, q.recovered = rec.head, rec.head, rec.skips, rec.corrupt, rec.bytes
	q.handed, q.handedEpoch, q.handedSaved = rec.handed, rec.handedEpoch, rec.handed
	q.losses = rec.losses
	if len(cfg.Cursors) > 0 {
		// Each cursor resumes where it was saved, never below the ack mark
		// (a cursor the file does not name starts there).
		saved := readCursors(cfg.Dir, q.log)
		q.cursSaved = make([]uint64, len(q.curs))
		for i, c := range q.curs {
			c.head = max(saved[c.name], rec.head)
			q.cursSaved[i] = c.head
		}
		q.head = q.minHeadLocked()
	} else {
		q.curs[0].head = rec.head
	}
	for _, l := range rec.found {
		q.addLossLocked(l)
	}
	q.storeOnly = d.usage(q.head).last
	if err != nil {
		q.degrade(err) // a read-only or failing data_dir: the gateway runs, the queue keeps to memory
	}
	return q, nil
}

// Append is HandOff then Persist: for a caller that holds no other lock.
func (q *Queue) Append(batch []ringstore.Sample) {
	if len(batch) == 0 {
		return
	}
	q.HandOff(batch)
	q.Persist(batch[len(batch)-1].Seq)
}

// Consumer is the queue as a reader of the ring (ringstore.Ring.Consume):
// HandOff under the ring's lock, Persist after it.
func (q *Queue) Consumer(name string) ringstore.Consumer {
	return ringstore.Consumer{Name: name, HandOff: q.HandOff, After: func(_ []ringstore.Sample, last uint64) { q.Persist(last) }}
}

// HandOff takes a batch (consecutive seqs, as the ring numbers them) into
// the queue's memory, in seq order: the ring calls it under its lock
// (OnAppend). It does no I/O: readers see the batch at once; Persist writes
// it. While samples are kept in memory (no Dir, or the disk failing) the
// oldest samples beyond MaxBytes are dropped here and counted.
func (q *Queue) HandOff(batch []ringstore.Sample) {
	if len(batch) == 0 {
		return
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	n := len(batch)
	if last := batch[n-1].Seq; last > q.handed {
		q.handed, q.handedEpoch = last, batch[n-1].Epoch
	}
	if q.runFirst == 0 {
		q.runFirst = batch[0].Seq
	}
	if q.closed {
		q.addDrop(Loss{Epoch: batch[0].Epoch, First: batch[0].Seq, Last: batch[n-1].Seq, Reason: LossUnwritten}, uint64(n))
		q.log.Error("spool: samples after close dropped", "samples", n, "first", batch[0].Seq)
		return
	}
	q.mem.push(batch...)
	for i := range batch {
		q.pendBytes += estBytes(&batch[i])
	}
	if !q.durable || q.diskErr != nil {
		q.keepBoundLocked()
	}
	close(q.wake)
	q.wake = make(chan struct{})
	select {
	case q.kick <- struct{}{}:
	default:
	}
}

// Persist writes every handed-off sample up to seq last to the store (on
// disk: one write(2) per record into the page cache, so a SIGKILL a moment
// later loses nothing), and with FsyncAlways syncs it, before it returns.
// The ring calls it after releasing its lock (AfterAppend): only the
// appender waits for the disk. Concurrent appenders share the work (a
// group commit): the first to take the writer lock writes and syncs what
// all have handed off; the others find theirs done. Segment rolls (every
// MaxBytes/16) happen here too, with their fsync (see Queue). While the
// disk fails (full, read-only, I/O errors) it writes nothing (Run retries
// with backoff).
func (q *Queue) Persist(last uint64) {
	q.wmu.Lock() // lock order: wmu, then mu (as in flush)
	defer q.wmu.Unlock()
	q.mu.Lock()
	done := q.writtenTo >= last || q.head >= last
	q.mu.Unlock()
	if done {
		return
	}
	for q.writeOnce(false) {
	}
	if q.cfg.Fsync == FsyncAlways {
		if sync := q.st.syncer(); sync != nil {
			sync()
		}
	}
}

// writeOnce writes up to a few thousand handed-off samples (wmu held). It
// reports whether more are waiting. While the disk fails it tries only
// when the backoff has passed (or force, at shutdown).
func (q *Queue) writeOnce(force bool) bool {
	if q.durable {
		q.saveHanded() // first, and even while the disk refuses records (a full disk still takes it)
	}
	q.mu.Lock()
	if q.diskErr != nil && !force && q.diskGate.Wait(time.Now()) > 0 {
		q.mu.Unlock()
		return false
	}
	pending := q.mem.items()[q.written:]
	n := min(len(pending), 4*maxRecordSamples)
	q.wbuf = append(q.wbuf[:0], pending[:n]...)
	head := q.head
	more := len(pending) > n
	q.mu.Unlock()
	if n == 0 {
		return false
	}
	take := q.wbuf
	skip := searchAfter(take, head)
	done := skip // taken samples accounted for (the acked ones need no write)
	for i := skip; i < len(take); {
		j := i + 1
		for j < len(take) && j-i < maxRecordSamples && take[j].Seq == take[j-1].Seq+1 && take[j].Epoch == take[i].Epoch {
			j++
		}
		if err := q.st.write(take[i:j]); err != nil {
			q.degrade(err)
			more = false // the rest stays in memory; retried by Run after the backoff
			break
		}
		done, i = j, j
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	for i := range take[:done] {
		q.pendBytes -= estBytes(&take[i])
	}
	q.written += done
	if done > 0 {
		q.writtenTo = max(q.writtenTo, take[done-1].Seq)
	}
	if done > skip && q.diskErr != nil {
		q.log.Info("spool: writing to disk again", "dir", q.cfg.Dir, "after", errText(q.diskErr),
			"in_memory", q.mem.len()-q.written, "dropped_total", q.dropped, "since", q.diskSince.Format(time.RFC3339))
		q.diskErr = nil
		q.diskGate.OK()
	}
	for q.written > q.cache {
		q.storeOnly = max(q.storeOnly, q.mem.front().Seq)
		q.mem.pop()
		q.written--
	}
	q.keepBoundLocked()
	q.oldestFor = 0
	return more
}

// degrade records a disk failure: the queue keeps new samples in memory
// (bounded by MaxBytes) and Run retries the disk with backoff. One log line
// at the change; Run adds one a minute while it lasts. Takes mu.
func (q *Queue) degrade(err error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.diskGate.Failed(time.Now())
	if q.diskErr == nil {
		q.diskSince, q.diskLog = time.Now(), time.Now()
		q.log.Error("spool: disk write failed; keeping samples in memory (bounded by max_bytes) and retrying",
			"dir", q.cfg.Dir, "err", err, "max_bytes", q.cfg.MaxBytes)
	}
	q.diskErr = err
	q.lastErr, q.lastErrAt = err, time.Now()
}

// WriteHealth is the queue's disk writer: failing is the error of the last
// write while the disk refuses them (nil once a write succeeds), last the
// last write error since Open and at when it happened (zero: none).
func (q *Queue) WriteHealth() (at time.Time, failing, last error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.lastErrAt, q.diskErr, q.lastErr
}

// Mode is "disk", "memory" (no directory) or "memory (disk: <error>)"
// while the disk refuses writes.
func (q *Queue) Mode() string {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.modeLocked()
}

func (q *Queue) modeLocked() string {
	switch {
	case !q.durable:
		return "memory"
	case q.diskErr != nil:
		return "memory (disk: " + errText(q.diskErr) + ")"
	}
	return "disk"
}

// errText is the system's words for err ("no space left on device") when
// there are some, else err's text.
func errText(err error) string {
	var errno syscall.Errno
	if errors.As(err, &errno) {
		return errno.Error()
	}
	return err.Error()
}

// QueueHealth is false with a reason while a configured disk queue keeps to
// memory because the disk fails: the gateway is not storing durably.
func (q *Queue) QueueHealth() (ok bool, reason string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.diskErr != nil {
		return false, "not storing: queue " + q.modeLocked()
	}
	return true, ""
}

// addDrop counts a drop and records it as a loss range (mu held). A
// range may hold seqs that were never handed out (a skip): n counts the
// samples.
func (q *Queue) addDrop(l Loss, n uint64) {
	q.dropped += n
	q.dropCursorsLocked(l, n)
	q.addLossLocked(l)
	q.lost -= l.Last - l.First + 1 - n
	if k := len(q.ranges); k > 0 && q.ranges[k-1].Last+1 == l.First {
		q.ranges[k-1].Last = l.Last
		return
	}
	if len(q.ranges) < maxDropRanges {
		q.ranges = append(q.ranges, SeqRange{l.First, l.Last})
	}
}

// keepBoundLocked drops the oldest unacknowledged samples while what is
// unacknowledged (the store's usage plus the unwritten samples' estimate)
// is above MaxBytes: first the store's oldest, then the oldest unwritten
// ones (the disk fails), each counted and located. Dropped samples count
// as acknowledged.
func (q *Queue) keepBoundLocked() {
	excess := q.st.usage(q.head).bytes + q.pendBytes - q.cfg.MaxBytes
	if excess <= 0 {
		return
	}
	first := q.head + 1
	var n uint64
	drop, excess := q.st.oldest(q.head, excess)
	for _, r := range drop {
		q.addDrop(r, r.Last-r.First+1)
		n += r.Last - r.First + 1
		q.head = r.Last
	}
	q.releaseLocked()
	// Then the oldest samples held in memory (not written: the disk fails).
	for excess > 0 && q.written == 0 && q.mem.len() > 0 {
		s := q.mem.front()
		if s.Seq > q.head {
			q.addDrop(Loss{Epoch: s.Epoch, First: s.Seq, Last: s.Seq, Reason: LossFull}, 1)
			q.head = s.Seq
			n++
		}
		e := estBytes(s)
		q.pendBytes -= e
		excess -= e
		q.mem.pop()
	}
	if n == 0 {
		return
	}
	q.dropLogN += n
	if time.Since(q.dropLog) >= time.Minute { // one line a minute while full, with the count
		q.log.Warn("spool: full, dropped the oldest samples", "samples", q.dropLogN, "first", first, "last", q.head,
			"max_bytes", q.cfg.MaxBytes, "dropped_total", q.dropped)
		q.dropLog, q.dropLogN = time.Now(), 0
	}
}

// releaseLocked forgets what is at or below head: the cached written
// samples and the store's (its files go at Run's next flush).
func (q *Queue) releaseLocked() {
	for q.written > 0 && q.mem.front().Seq <= q.head {
		q.mem.pop()
		q.written--
	}
	q.st.release(q.head)
}

// Stats returns the queue's counters: Samples, Bytes, OldestTS and Acked
// above the slowest cursor (what the queue holds), Dropped every drop.
func (q *Queue) Stats() Stats { return q.stats(nil) }

// stats is Stats, as cursor c sees it (nil: the queue's).
func (q *Queue) stats(c *Cursor) Stats {
	q.mu.Lock()
	head, dropped := q.head, q.dropped
	if c != nil {
		head, dropped = c.head, c.dropped
	}
	st := Stats{Acked: head, Dropped: dropped, Corrupt: q.corrupt, Recovered: q.recovered, Lost: q.lost, LossForgotten: q.lossForgot}
	st.DroppedRanges = append([]SeqRange(nil), q.ranges...)
	st.Losses = append([]Loss(nil), q.losses...)
	u := q.st.usage(head)
	st.Samples, st.Bytes, st.Segments = u.samples, u.bytes, u.segments
	unwritten := q.mem.items()[q.written:]
	for i := range unwritten {
		if unwritten[i].Seq > head {
			st.Samples++
			st.Bytes += estBytes(&unwritten[i])
		}
	}
	st.Unwritten = int64(len(unwritten))
	st.Mode = q.modeLocked()
	ok := head == q.head && q.oldestFor == q.head+1
	st.OldestTS = q.oldestTS
	q.mu.Unlock()
	if st.Samples == 0 {
		st.OldestTS = 0
	} else if !ok {
		if s := q.peek(c, head, 1, nil); len(s) > 0 {
			st.OldestTS = s[0].TS
			q.mu.Lock()
			if q.head == head {
				q.oldestFor, q.oldestTS = head+1, st.OldestTS
			}
			q.mu.Unlock()
		}
	}
	return st
}

// Run is the writer: it moves handed-off batches Persist did not write to
// the store, syncs per policy, saves the ack mark and deletes segments
// that are acknowledged. It returns when ctx ends, after writing what was
// handed off.
func (q *Queue) Run(ctx context.Context) error {
	tick := time.NewTicker(q.cfg.FsyncInterval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			q.flush(true)
			return nil
		case <-q.kick:
		case <-tick.C:
			q.logDegraded()
		}
		q.flush(false)
	}
}

// logDegraded says, at most once a minute, that the queue still keeps to
// memory, with how much it holds there and has dropped.
func (q *Queue) logDegraded() {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.diskErr == nil || time.Since(q.diskLog) < time.Minute {
		return
	}
	q.diskLog = time.Now()
	q.log.Warn("spool: still keeping samples in memory; the disk refuses writes",
		"dir", q.cfg.Dir, "err", q.diskErr, "in_memory", q.mem.len()-q.written, "dropped_total", q.dropped,
		"since", q.diskSince.Format(time.RFC3339))
}

// flush writes anything still waiting (after a failed write), then syncs
// and saves the ack mark per policy (or unconditionally when final). The
// batched fsync and the ack mark run outside wmu, so Persist never waits
// for them; fmu keeps the sync and ack-mark state to one flush at a time.
func (q *Queue) flush(final bool) {
	q.fmu.Lock()
	defer q.fmu.Unlock()
	now := time.Now()
	q.wmu.Lock()
	for q.writeOnce(final) {
	}
	var sync func()
	switch {
	case q.cfg.Fsync == FsyncAlways:
		if s := q.st.syncer(); s != nil {
			s() // under wmu: whoever takes it next finds the writes synced (Persist)
		}
	case final || q.cfg.Fsync == FsyncBatched && now.Sub(q.lastSync) >= q.cfg.FsyncInterval:
		if sync = q.st.syncer(); sync != nil {
			q.lastSync = now
		}
	}
	q.wmu.Unlock()
	if sync != nil {
		sync()
	}
	q.mu.Lock()
	head := q.head
	q.st.release(head) // a segment rolled since the last ack
	var heads []cursorHead
	moved := false
	if q.cursSaved != nil {
		for i, c := range q.curs {
			heads = append(heads, cursorHead{c.name, c.head})
			moved = moved || c.head != q.cursSaved[i]
		}
	}
	q.mu.Unlock()
	due := final || q.cfg.Fsync == FsyncAlways || now.Sub(q.lastAckWrite) >= q.cfg.FsyncInterval
	if moved && due {
		// Before the ack mark: a cursor never lags the mark after a crash
		// (and one that does starts at the mark, which is below it anyway).
		if err := q.st.saveCursors(heads); err != nil {
			q.logErr("save cursors", err)
		} else {
			for i, h := range heads {
				q.cursSaved[i] = h.head
			}
			q.lastAckWrite = now
		}
	}
	mark := head != q.ackSaved && due
	if err := q.st.checkpoint(head, mark); err != nil {
		q.logErr("save ack mark", err)
	} else if mark {
		q.ackSaved, q.lastAckWrite = head, now
		q.pruneSkips(head)
	}
	q.pruneLosses(q.ackSaved) // saves new losses too
}

// logErr logs a failed save at most every 10 seconds (fmu held).
func (q *Queue) logErr(what string, err error) {
	if time.Since(q.errLogged) < 10*time.Second {
		return
	}
	q.errLogged = time.Now()
	q.log.Error("spool: "+what+" failed", "dir", q.cfg.Dir, "err", err)
}

// pruneSkips forgets the skips whose jump is acknowledged (the ack mark
// head is saved) and saves the rest (fmu held).
func (q *Queue) pruneSkips(head uint64) {
	q.mu.Lock()
	keep := q.skips[:0]
	for _, k := range q.skips {
		if k.Last >= head { // its jump is not acknowledged yet
			keep = append(keep, k)
		}
	}
	pruned := len(keep) < len(q.skips)
	clear(q.skips[len(keep):])
	q.skips = keep
	skips := append([]ringstore.Skip(nil), keep...)
	q.mu.Unlock()
	if pruned {
		if err := q.st.saveSkips(skips); err != nil {
			q.logErr("save restart skips", err)
		}
	}
}

// Close writes what was handed off, syncs, saves the ack mark and closes the
// files. Call it after Run has returned. Appends after Close are dropped.
func (q *Queue) Close() error {
	q.mu.Lock()
	if q.closed {
		q.mu.Unlock()
		return nil
	}
	q.mu.Unlock()
	q.flush(true)
	q.wmu.Lock()
	q.st.close()
	q.wmu.Unlock()
	q.mu.Lock()
	q.closed = true
	// What could not be written (disk full or failing) is lost with the
	// process: counted as dropped and logged, never silently.
	var lost uint64
	for _, s := range q.mem.items()[q.written:] {
		if s.Seq > q.head {
			q.addDrop(Loss{Epoch: s.Epoch, First: s.Seq, Last: s.Seq, Reason: LossUnwritten}, 1)
			lost++
		}
	}
	dropped := q.dropped
	q.mu.Unlock()
	if lost > 0 {
		q.log.Error("spool: samples not written at shutdown (disk full or failing); counted as dropped", "samples", lost, "dropped_total", dropped, "dir", q.cfg.Dir)
	}
	return nil
}

// Wait returns a channel closed by the next Append. Take it before Peek:
// an append between the two then still wakes the caller.
func (q *Queue) Wait() <-chan struct{} {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.wake
}

// Acked is the sequence number up to which the first cursor (the only
// one unless Config.Cursors names several) acknowledged or lost everything.
func (q *Queue) Acked() uint64 { return q.curs[0].Acked() }

// Ack acknowledges, for the first cursor, every sample with seq <= last
// (Cursor.Ack). The mark is saved by the writer (at once with
// FsyncAlways, else at most every FsyncInterval and at Close), so a crash
// may bring back a few acknowledged samples, never skip an
// unacknowledged one.
func (q *Queue) Ack(last uint64) { q.curs[0].Ack(last) }

// Peek returns up to n of the oldest samples the first cursor has not
// acknowledged, in order, appended to dst, without removing them.
func (q *Queue) Peek(n int, dst []ringstore.Sample) []ringstore.Sample { return q.PeekAfter(0, n, dst) }

// PeekAfter is Peek for the samples with seq > after (and > Acked): a sender
// with batches in flight reads past them. The result is always a gap-free
// continuation: a sample is never skipped unless it was dropped (and counted).
func (q *Queue) PeekAfter(after uint64, n int, dst []ringstore.Sample) []ringstore.Sample {
	return q.peek(q.curs[0], after, n, dst)
}

// peek is PeekAfter above cursor c's head (nil: above the queue's).
func (q *Queue) peek(c *Cursor, after uint64, n int, dst []ringstore.Sample) []ringstore.Sample {
	if n <= 0 {
		return dst
	}
	floor := func() uint64 { // mu held
		if c != nil {
			return max(c.head, q.head)
		}
		return q.head
	}
	start := len(dst)
	for attempt := 0; attempt < 4; attempt++ {
		q.mu.Lock()
		after = max(after, floor())
		if after >= q.storeOnly {
			dst = q.peekMem(after, n, dst)
			q.mu.Unlock()
			return dst
		}
		storeOnly := q.storeOnly
		q.mu.Unlock()

		var failed bool
		dst, failed = q.readStore(after, storeOnly, n, dst)
		got := len(dst) - start
		if failed && got == 0 {
			return dst // retried after a backoff: nothing is skipped or deleted
		}
		if got > 0 {
			last := dst[len(dst)-1].Seq
			if got < n && last >= storeOnly {
				q.mu.Lock()
				if last >= q.storeOnly {
					dst = q.peekMem(max(last, floor()), n-got, dst)
				}
				q.mu.Unlock()
			}
			return dst
		}
		// Nothing read: segments went away under us (acked or dropped) or
		// the cache moved on; look again.
	}
	return dst
}

func (q *Queue) peekMem(after uint64, n int, dst []ringstore.Sample) []ringstore.Sample {
	m := q.mem.items()
	i := searchAfter(m, after)
	return append(dst, m[i:min(len(m), i+n)]...)
}

// readStore reads from the store (rmu): after an open or read error it
// backs off (100 ms doubling to 30 s, jittered) and reports failed; the error may be
// transient (EIO, EMFILE), so nothing is deleted or skipped. Logged at the
// first error and then at most once a minute.
func (q *Queue) readStore(after, upto uint64, n int, dst []ringstore.Sample) (_ []ringstore.Sample, failed bool) {
	q.rmu.Lock()
	defer q.rmu.Unlock()
	if q.readGate.Wait(time.Now()) > 0 {
		return dst, true
	}
	dst, corrupt, err := q.st.read(after, upto, n, dst)
	if corrupt > 0 {
		q.mu.Lock()
		q.corrupt += uint64(corrupt)
		q.mu.Unlock()
	}
	if err != nil {
		wait := q.readGate.Failed(time.Now())
		if q.readErr == nil || time.Since(q.readLog) >= time.Minute {
			q.log.Error("spool: read failed; retrying (nothing deleted)", "err", err, "retry_in", wait)
			q.readLog = time.Now()
		}
		q.readErr = err
		return dst, true
	}
	if q.readErr != nil {
		q.log.Info("spool: reading the queue again", "dir", q.cfg.Dir, "after", q.readErr)
		q.readErr = nil
		q.readGate.OK()
	}
	return dst, false
}

// LastSeq is the highest sequence number the queue holds, has
// acknowledged or was handed (the handed mark: seqs handed out and lost
// in a crash included; 0 when it never held one): the Sequence starts
// above it, and a restart's skip starts above it, so a skip never covers
// a seq that was given to a sample.
func (q *Queue) LastSeq() uint64 {
	q.mu.Lock()
	defer q.mu.Unlock()
	last := max(q.head, q.st.usage(q.head).last)
	if n := q.mem.len(); n > 0 {
		last = max(last, q.mem.at(n-1).Seq)
	}
	return max(last, q.handed)
}

// Resume tells the queue where this run's numbering starts: when epoch
// continues and first is above LastSeq + 1, the numbers in between were
// reserved by the previous run and never handed out (LastSeq counts the
// handed mark: what was handed out and lost is a Loss, found at Open). That skip is
// kept (file queue.skips) until acknowledged and sent with the batch that
// crosses it (Skips), so a receiver does not report it as a gap.
func (q *Queue) Resume(epoch, first uint64, continued bool) {
	last := q.LastSeq()
	if !continued || first <= last+1 || last == 0 {
		return
	}
	q.mu.Lock()
	q.skips = append(q.skips, ringstore.Skip{Epoch: epoch, First: last + 1, Last: first - 1})
	if len(q.skips) > maxSkips {
		q.skips = q.skips[len(q.skips)-maxSkips:]
	}
	skips := append([]ringstore.Skip(nil), q.skips...)
	q.mu.Unlock()
	if err := q.st.saveSkips(skips); err != nil {
		q.log.Warn("spool: restart skip not saved (a receiver may report it as a gap after another restart)", "err", err)
	}
}

// Skips returns the skips of epoch whose end lands in (after, last]: the
// ones a batch of that epoch covering (after, last] crosses.
func (q *Queue) Skips(epoch, after, last uint64) []ringstore.Skip {
	q.mu.Lock()
	defer q.mu.Unlock()
	var out []ringstore.Skip
	for _, k := range q.skips {
		if k.Epoch == epoch && k.Last+1 > after && k.Last+1 <= last {
			out = append(out, k)
		}
	}
	return out
}
