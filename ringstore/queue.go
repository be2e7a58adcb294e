package ringstore

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Queue defaults.
const (
	DefaultQueueMaxBytes = 64 << 20
	DefaultFsyncInterval = time.Second
	queueCacheSamples    = 8192 // written samples kept in memory for Peek
	maxRecordSamples     = 256  // samples per record
	maxDropRanges        = 1024 // DroppedRanges kept (the counter is exact regardless)
	ackFile              = "queue.ack"
	skipFile             = "queue.skips"
	maxSkips             = 64 // skips kept (the oldest go first; each is a restart)
	segSuffix            = ".seg"
)

// Fsync policies.
const (
	FsyncBatched = "batched" // a sync at most every FsyncInterval (default)
	FsyncAlways  = "always"  // a sync after every write
	FsyncNever   = "never"   // leave it to the OS
)

// QueueConfig configures OpenQueue. The zero value is a 64 MiB memory queue.
type QueueConfig struct {
	Dir           string        // "" = memory only
	MaxBytes      int64         // bound; beyond it the oldest samples are dropped and counted (64 MiB)
	Fsync         string        // FsyncBatched (default), FsyncAlways or FsyncNever
	FsyncInterval time.Duration // for FsyncBatched, and how often the ack mark is saved (1s)
	SegmentBytes  int64         // segment file size (MaxBytes/16 within [1 KiB, 8 MiB])
	Logger        *slog.Logger
}

// SeqRange is an inclusive range of sequence numbers.
type SeqRange struct{ First, Last uint64 }

// QueueStats is a copy of the queue's counters.
type QueueStats struct {
	Samples       int64      // unacknowledged samples held
	Bytes         int64      // bytes they take (disk; the head segment prorated) or their memory estimate
	OldestTS      int64      // TS of the oldest unacknowledged sample, 0 if none
	Acked         uint64     // everything <= Acked is acknowledged (or dropped)
	Unwritten     int64      // samples held in memory, not (yet) written to disk
	Mode          string     // "disk", "memory" (no Dir), or "memory (disk: <error>)" while the disk fails
	Dropped       uint64     // samples dropped (bound exceeded, hand-off full, not writable at shutdown)
	Corrupt       uint64     // records skipped because their checksum failed (logged with file and offset)
	DroppedRanges []SeqRange // where the drops were (first 1024 ranges)
	Recovered     int64      // bytes cut from torn or corrupt segment tails at open
	Segments      int        // segment files
}

// Skip is a range of sequence numbers of one epoch that were never given to
// a sample: what a restart skipped of the block the previous run had
// reserved. Receivers treat it as seen, not as a gap.
type Skip struct {
	Epoch       uint64
	First, Last uint64
}

type run struct{ first, last uint64 }

// segment is one file of records; its samples are runs of consecutive seqs.
type segment struct {
	first uint64 // from the file name
	path  string
	size  int64
	runs  []run
}

func (s *segment) last() uint64 {
	if len(s.runs) == 0 {
		return 0
	}
	return s.runs[len(s.runs)-1].last
}

func (s *segment) count() int64 { return s.countAbove(0) }

func (s *segment) countAbove(h uint64) int64 {
	var n int64
	for _, r := range s.runs {
		if r.last > h {
			f := r.first
			if f <= h {
				f = h + 1
			}
			n += int64(r.last - f + 1)
		}
	}
	return n
}

func (s *segment) add(first, last uint64) {
	if n := len(s.runs); n > 0 && s.runs[n-1].last+1 == first {
		s.runs[n-1].last = last
		return
	}
	s.runs = append(s.runs, run{first, last})
}

// Queue is the durable store-and-forward queue between the ring and the
// upstream pusher: the ring hands it every batch (HandOff under the ring's
// lock, Persist after it), the pusher
// reads the oldest unacknowledged samples (Peek, PeekAfter) and removes them
// only on acknowledgement (Ack) — a transaction, as telegraf's buffer does.
//
// Ordering: samples carry the ring's global seq, so the queue is strictly
// ordered by seq. It is gap-free except where samples were dropped, and
// every drop is counted (Dropped) and located (DroppedRanges).
//
// Disk layout (Dir set): segment files "<first seq, 20 digits>.seg" of
// records (layout in queue_codec.go: length + CRC-32C + compact samples,
// about 17-20 bytes per sample), written by Run's goroutine only; and
// "queue.ack", the decimal seq up to which everything is acknowledged,
// replaced by rename. Open scans every segment: a record whose checksum
// fails is skipped, counted in Corrupt and logged with file and offset; a
// partial last record (or a length that cannot be right) ends that segment —
// the file is cut there, logged and counted in Recovered; it is never fatal.
// A read or open error while sending (EIO, EMFILE) is retried with backoff
// and never deletes or skips anything. Segments holding only acknowledged
// (or dropped) samples are deleted, and only they. Beyond MaxBytes of
// unacknowledged samples the oldest whole samples beyond the bound are
// dropped, each counted and located (DroppedRanges); segments are
// MaxBytes/16 (at least 1 KiB), so a small bound with a healthy uplink
// drops nothing.
//
// Crash semantics: Append writes each batch into the page cache before it
// returns, so a SIGKILL loses nothing that was appended; a power loss keeps
// what was synced (Fsync policy: batched = at most FsyncInterval of samples
// at risk). The ack mark is saved
// at most every FsyncInterval (each write with FsyncAlways) and at Close, so
// after a crash a few already-acknowledged samples may be sent again —
// receivers dedup by (gateway, epoch, seq) — but an unacknowledged sample is never
// skipped.
//
// Disk faults never stop the queue: when a write fails (no space left,
// read-only file system, I/O error) the queue keeps new samples in memory
// (Mode "memory (disk: <error>)", QueueHealth false), MaxBytes bounding disk
// and memory together (the oldest samples beyond it dropped and counted),
// logs the change once and then at most once a minute, and Run retries the
// disk with backoff (0.5 s to 10 s): the first write that succeeds takes the
// queue back to disk by itself. What is still in memory at Close is
// counted as dropped and logged.
//
// Memory and latency: the ring hands batches over under its lock
// (HandOff: memory only) and writes them after releasing it (Persist: one
// write(2) per record, and with FsyncAlways one fsync shared by the
// appenders waiting then), so a slow disk delays only the poll whose
// samples are being written, never other pollers or readers. With the
// batched policy the fsync runs in Run's goroutine. The last 8192
// written samples stay in memory so that a sender keeping up never reads
// the disk. Memory-only mode (Dir "") keeps the same semantics in RAM with
// MaxBytes bounding an estimate of the samples' size.
//
// Why not github.com/tidwall/wal (telegraf's disk buffer): its indexes must
// be contiguous (Write(index) with index == last+1), but seqs jump after a
// restart and at drops; it refuses to open a log with a corrupt tail
// (ErrCorrupt) where a torn last record must be cut and logged; and
// TruncateFront rewrites the head segment, which we would call on every ack.
// A segment is a few lines of code here: append-only records, whole-file
// delete.
//
// Concurrency: all methods are safe for concurrent use. HandOff and Ack
// take the queue's mutex for a short, disk-free critical section; Persist
// takes the writer lock (wmu) for the writes (and, with FsyncAlways, the
// shared fsync) and the queue's mutex only around its bookkeeping; Peek
// reads the disk outside both; the batched fsync and the ack mark run in
// Run's goroutine outside both. Call Close after Run has returned.
type Queue struct {
	cfg     QueueConfig
	log     *slog.Logger
	segSize int64
	kick    chan struct{} // wakes the writer (cap 1)

	mu        sync.Mutex
	head      uint64     // acknowledged (or dropped) up to here
	segs      []*segment // oldest first; the last one is the active one while open
	mem       []Sample   // mem[memOff:]: cached written samples, then unwritten ones
	memOff    int
	written   int    // mem[memOff:memOff+written] is on disk (disk mode)
	diskOnly  uint64 // samples with seq <= diskOnly may be on disk only
	memBytes  int64  // memory mode: estimate of mem's size
	pendBytes int64  // disk mode: estimate of the unwritten samples' size (mem[memOff+written:])
	writtenTo uint64 // disk mode: every handed-off sample up to here is written (or was acked)
	diskErr   error  // disk mode: the write error that put the queue in memory; nil = on disk
	diskSince time.Time
	diskLog   time.Time // last "still in memory" line
	diskRetry time.Time // no write attempt before this while diskErr is set
	diskWait  time.Duration
	dropLog   time.Time // last "full, dropped" line
	dropLogN  uint64    // samples dropped since
	dropped   uint64
	ranges    []SeqRange
	recovered int64
	corrupt   uint64
	wake      chan struct{}
	closed    bool
	oldestFor uint64 // head for which oldestTS is valid (+1; 0 = invalid)
	oldestTS  int64
	skips     []Skip // numbers never given to a sample (restarts), oldest first

	wmu          sync.Mutex // the writer: active file, sync and ack-mark state
	wf           *os.File
	wseg         *segment
	wbuf         []Sample
	enc          []byte
	dirty        bool
	lastSync     time.Time
	ackSaved     uint64
	lastAckWrite time.Time
	errLogged    time.Time

	rmu       sync.Mutex // the disk reader's cursor and retry state
	rcur      cursor
	rbuf      []byte
	names     map[string]string   // interned device and tag names
	badRecs   map[cursor]struct{} // corrupt records counted (path, offset)
	readErr   error               // the last transient read error, nil after a good read
	readRetry time.Time           // no disk read before this (backoff after a read error)
	readWait  time.Duration       // current backoff
	readLog   time.Time           // last read error logged

	// open opens a segment for reading: os.Open, or a test's fault.
	open func(path string) (*os.File, error)
	// fsync syncs a segment file: (*os.File).Sync, or a test's slow disk.
	fsync func(*os.File) error
}

type cursor struct {
	path string
	off  int64
	seq  uint64 // first seq of the record at off
}

// OpenQueue opens (or creates) the queue in cfg.Dir and recovers what is on
// disk: a torn or corrupt tail is cut at the last complete record and logged.
func OpenQueue(cfg QueueConfig) (*Queue, error) {
	if cfg.MaxBytes <= 0 {
		cfg.MaxBytes = DefaultQueueMaxBytes
	}
	switch cfg.Fsync {
	case "":
		cfg.Fsync = FsyncBatched
	case FsyncBatched, FsyncAlways, FsyncNever:
	default:
		return nil, fmt.Errorf("ringstore: queue: unknown fsync policy %q (batched, always, never)", cfg.Fsync)
	}
	if cfg.FsyncInterval <= 0 {
		cfg.FsyncInterval = DefaultFsyncInterval
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	seg := cfg.SegmentBytes
	if seg <= 0 {
		seg = min(max(cfg.MaxBytes/16, 1<<10), 8<<20)
	}
	q := &Queue{cfg: cfg, log: cfg.Logger, segSize: seg, kick: make(chan struct{}, 1), wake: make(chan struct{}),
		names: make(map[string]string), badRecs: make(map[cursor]struct{}), open: os.Open, fsync: (*os.File).Sync}
	if cfg.Dir == "" {
		return q, nil
	}
	if err := os.MkdirAll(cfg.Dir, 0o750); err != nil {
		q.degrade(err) // a read-only or failing data_dir: the gateway runs, the queue keeps to memory
		return q, nil
	}
	if err := q.recover(); err != nil {
		q.degrade(err)
	}
	return q, nil
}

func (q *Queue) recover() error {
	dir := q.cfg.Dir
	b, err := os.ReadFile(filepath.Join(dir, ackFile))
	switch {
	case os.IsNotExist(err):
	case err != nil:
		return fmt.Errorf("ringstore: queue: %w", err)
	default:
		v, perr := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
		if perr != nil {
			// A torn ack mark: start from 0; acknowledged samples come
			// back (receivers dedup), nothing unacknowledged is lost.
			q.log.Warn("ringstore: queue: unreadable ack mark, resending from the oldest segment", "file", filepath.Join(dir, ackFile), "content", string(b))
		} else {
			q.head = v
		}
	}
	q.ackSaved = q.head
	q.skips = readSkips(filepath.Join(dir, skipFile), q.log)
	entries, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("ringstore: queue: %w", err)
	}
	var names []string
	for _, e := range entries {
		if strings.HasSuffix(e.Name(), segSuffix) && !e.IsDir() {
			names = append(names, e.Name())
		}
	}
	sort.Strings(names) // names are zero-padded first seqs
	for _, name := range names {
		first, perr := strconv.ParseUint(strings.TrimSuffix(name, segSuffix), 10, 64)
		path := filepath.Join(dir, name)
		if perr != nil {
			q.log.Warn("ringstore: queue: ignoring a file that is not a segment", "file", path)
			continue
		}
		s, err := q.scanSegment(path, first)
		if err != nil {
			return err
		}
		if s.count() == 0 || s.last() <= q.head {
			if err := os.Remove(path); err != nil {
				q.log.Warn("ringstore: queue: acknowledged segment not removed", "file", path, "err", err)
			}
			continue
		}
		q.segs = append(q.segs, s)
	}
	if n := len(q.segs); n > 0 {
		q.diskOnly = q.segs[n-1].last()
	}
	return nil
}

// scanSegment reads every record of a segment file. A record whose
// checksum fails (with a length that fits the file) is skipped, counted in
// Corrupt and logged with the file and offset; the records after it are
// kept. Only an incomplete record, or a length that cannot be right, ends
// the segment: the file is cut there (a torn tail; counted in Recovered).
func (q *Queue) scanSegment(path string, first uint64) (*segment, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("ringstore: queue: %w", err)
	}
	s := &segment{first: first, path: path}
	off := 0
	for off < len(b) {
		size, f, n, err := recordSpan(b[off:])
		if errors.Is(err, errChecksum) {
			l := int(binary.LittleEndian.Uint32(b[off:]) &^ lenEpoch)
			q.corrupt++
			q.badRecs[cursor{path: path, off: int64(off)}] = struct{}{}
			q.log.Error("ringstore: queue: corrupt record skipped (checksum)", "file", path, "offset", off, "bytes", recordHeader+l, "after_seq", s.last())
			off += recordHeader + l
			continue
		}
		if err == nil && len(s.runs) > 0 && f <= s.last() {
			err = fmt.Errorf("record seq %d not after %d", f, s.last())
		}
		if err != nil {
			cut := int64(len(b) - off)
			why := "torn tail (partial last record)"
			if !errors.Is(err, errShort) {
				why = "corrupt record: " + err.Error()
			}
			q.log.Warn("ringstore: queue: cut segment tail", "file", path, "offset", off, "bytes", cut, "why", why)
			if terr := os.Truncate(path, int64(off)); terr != nil {
				return nil, fmt.Errorf("ringstore: queue: cut %s at %d: %w", path, off, terr)
			}
			q.recovered += cut
			break
		}
		s.add(f, f+uint64(n)-1)
		off += size
	}
	s.size = int64(off)
	return s, nil
}

// estBytes is the memory-mode cost of a sample: the struct's fixed part plus
// its strings (an estimate; the strings are usually shared with the ring).
func estBytes(s *Sample) int64 { return 64 + int64(len(s.Device)+len(s.Tag)) }

// Append is HandOff then Persist: for a caller that holds no other lock.
func (q *Queue) Append(batch []Sample) {
	if len(batch) == 0 {
		return
	}
	q.HandOff(batch)
	q.Persist(batch[len(batch)-1].Seq)
}

// HandOff takes a batch (consecutive seqs, as the ring numbers them) into
// the queue's memory, in seq order: the ring calls it under its lock
// (OnAppend). It does no I/O: readers see the batch at once; Persist writes
// it. In memory mode (no Dir) the oldest samples beyond MaxBytes are
// dropped and counted.
func (q *Queue) HandOff(batch []Sample) {
	if len(batch) > 0 {
		q.handOff(batch)
	}
}

// Persist writes every handed-off sample up to seq last to the active
// segment (one write(2) per record into the page cache, so a SIGKILL a
// moment later loses nothing), and with FsyncAlways syncs it, before it
// returns. The ring calls it after releasing its lock (AfterAppend): only
// the appender waits for the disk. Concurrent appenders share the work (a
// group commit): the first to take the writer lock writes and syncs what
// all have handed off; the others find theirs done. Segment rolls (every
// MaxBytes/16) happen here too. While the disk fails (full, read-only, I/O
// errors) it writes nothing (Run retries with backoff, see Queue).
func (q *Queue) Persist(last uint64) {
	if q.cfg.Dir == "" {
		return
	}
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
	if q.cfg.Fsync == FsyncAlways && q.dirty && q.wf != nil {
		q.sync()
	}
}

// handOff adds the batch to the in-memory queue and wakes readers and the
// writer. It reports false when the batch was dropped (queue closed).
func (q *Queue) handOff(batch []Sample) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	n := len(batch)
	if q.closed {
		q.addDrop(batch[0].Seq, batch[n-1].Seq, uint64(n))
		q.log.Error("ringstore: queue: samples after close dropped", "samples", n, "first", batch[0].Seq)
		return false
	}
	q.mem = append(q.mem, batch...)
	if q.cfg.Dir == "" {
		for i := range batch {
			q.memBytes += estBytes(&batch[i])
		}
		for q.memBytes > q.cfg.MaxBytes && len(q.mem)-q.memOff > 0 {
			s := &q.mem[q.memOff]
			q.memBytes -= estBytes(s)
			q.addDrop(s.Seq, s.Seq, 1)
			q.head = max(q.head, s.Seq)
			q.popFront()
		}
	} else {
		for i := range batch {
			q.pendBytes += estBytes(&batch[i])
		}
		if q.diskErr != nil {
			q.keepBoundLocked()
		}
	}
	close(q.wake)
	q.wake = make(chan struct{})
	select {
	case q.kick <- struct{}{}:
	default:
	}
	return true
}

// degrade records a disk failure: the queue keeps new samples in memory
// (bounded by MaxBytes) and Run retries the disk with backoff. One log line
// at the change; Run adds one a minute while it lasts. Takes mu.
func (q *Queue) degrade(err error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.degradeLocked(err)
}

func (q *Queue) degradeLocked(err error) {
	q.diskWait = min(max(2*q.diskWait, 500*time.Millisecond), 10*time.Second)
	q.diskRetry = time.Now().Add(q.diskWait)
	if q.diskErr == nil {
		q.diskSince, q.diskLog = time.Now(), time.Now()
		q.log.Error("ringstore: queue: disk write failed; keeping samples in memory (bounded by max_bytes) and retrying",
			"dir", q.cfg.Dir, "err", err, "max_bytes", q.cfg.MaxBytes)
	}
	q.diskErr = err
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
	case q.cfg.Dir == "":
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
	if q.cfg.Dir != "" && q.diskErr != nil {
		return false, "not storing: queue " + q.modeLocked()
	}
	return true, ""
}

func (q *Queue) popFront() {
	q.mem[q.memOff] = Sample{}
	q.memOff++
	if q.memOff == len(q.mem) {
		q.mem, q.memOff = q.mem[:0], 0
	} else if q.memOff > 1024 && q.memOff > len(q.mem)/2 {
		n := copy(q.mem, q.mem[q.memOff:])
		clear(q.mem[n:])
		q.mem, q.memOff = q.mem[:n], 0
	}
}

func (q *Queue) addDrop(first, last, n uint64) {
	q.dropped += n
	if k := len(q.ranges); k > 0 && q.ranges[k-1].Last+1 == first {
		q.ranges[k-1].Last = last
		return
	}
	if len(q.ranges) < maxDropRanges {
		q.ranges = append(q.ranges, SeqRange{first, last})
	}
}

// Wait returns a channel closed by the next Append. Take it before Peek:
// an append between the two then still wakes the caller.
func (q *Queue) Wait() <-chan struct{} {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.wake
}

// Acked is the sequence number up to which everything is acknowledged or dropped.
func (q *Queue) Acked() uint64 {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.head
}

// Ack acknowledges every sample with seq <= last. The mark is saved by the
// writer (at once with FsyncAlways, else at most every FsyncInterval and at
// Close), so a crash may bring back a few acknowledged samples, never skip
// an unacknowledged one.
func (q *Queue) Ack(last uint64) {
	q.mu.Lock()
	if last <= q.head {
		q.mu.Unlock()
		return
	}
	q.head = last
	if q.cfg.Dir == "" {
		for len(q.mem)-q.memOff > 0 && q.mem[q.memOff].Seq <= last {
			q.memBytes -= estBytes(&q.mem[q.memOff])
			q.popFront()
		}
	} else {
		for q.written > 0 && q.mem[q.memOff].Seq <= last {
			q.popFront()
			q.written--
		}
	}
	q.mu.Unlock()
	select {
	case q.kick <- struct{}{}:
	default:
	}
}

// Peek returns up to max of the oldest unacknowledged samples, in order,
// appended to dst, without removing them.
func (q *Queue) Peek(max int, dst []Sample) []Sample { return q.PeekAfter(0, max, dst) }

// PeekAfter is Peek for the samples with seq > after (and > Acked): a sender
// with batches in flight reads past them. The result is always a gap-free
// continuation: a sample is never skipped unless it was dropped (and counted).
func (q *Queue) PeekAfter(after uint64, max int, dst []Sample) []Sample {
	if max <= 0 {
		return dst
	}
	start := len(dst)
	for attempt := 0; attempt < 4; attempt++ {
		q.mu.Lock()
		after = maxU(after, q.head)
		if after >= q.diskOnly || q.cfg.Dir == "" {
			dst = q.peekMem(after, max, dst)
			q.mu.Unlock()
			return dst
		}
		segs := make([]segment, 0, 4)
		for _, s := range q.segs {
			if s.last() > after {
				segs = append(segs, segment{first: s.first, path: s.path, size: s.size, runs: s.runs[len(s.runs)-1:]})
			}
		}
		diskOnly := q.diskOnly
		q.mu.Unlock()

		var failed bool
		dst, failed = q.peekDisk(segs, after, diskOnly, max, dst)
		got := len(dst) - start
		if failed && got == 0 {
			return dst // retried after a backoff: nothing is skipped or deleted
		}
		if got > 0 {
			last := dst[len(dst)-1].Seq
			if got < max && last >= diskOnly {
				q.mu.Lock()
				if last >= q.diskOnly {
					dst = q.peekMem(maxU(last, q.head), max-got, dst)
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

func maxU(a, b uint64) uint64 {
	if a > b {
		return a
	}
	return b
}

func (q *Queue) peekMem(after uint64, max int, dst []Sample) []Sample {
	m := q.mem[q.memOff:]
	i := sort.Search(len(m), func(i int) bool { return m[i].Seq > after })
	for ; i < len(m) && max > 0; i++ {
		dst = append(dst, m[i])
		max--
	}
	return dst
}

// peekDisk reads samples > after (and <= upto, beyond which memory serves)
// from the segment copies, using the cursor to avoid rescanning a segment.
// An open or read error (EIO, EMFILE, ...) ends the read with what was read
// so far (failed set) and backs off before the next disk read: the segment
// is kept, nothing is skipped. A record whose checksum fails is skipped,
// counted once in Corrupt and logged with the file and offset.
func (q *Queue) peekDisk(segs []segment, after, upto uint64, max int, dst []Sample) (_ []Sample, failed bool) {
	q.rmu.Lock()
	defer q.rmu.Unlock()
	if time.Now().Before(q.readRetry) {
		return dst, true
	}
	got := 0
	for _, s := range segs {
		if got >= max {
			break
		}
		off := int64(0)
		if q.rcur.path == s.path && q.rcur.seq <= after+1 && q.rcur.off < s.size {
			off = q.rcur.off
		}
		f, err := q.open(s.path)
		if err != nil {
			if os.IsNotExist(err) {
				continue // acked or dropped meanwhile
			}
			q.readFailed(s.path, err)
			return dst, true
		}
		for off < s.size && got < max {
			rec, err := q.readRecord(f, off, s.size)
			if errors.Is(err, errChecksum) {
				q.corruptRecord(s.path, off)
				off += int64(recordHeader + int(binary.LittleEndian.Uint32(rec)&^lenEpoch))
				continue
			}
			if err != nil {
				q.readFailed(s.path, err)
				f.Close()
				return dst, true
			}
			size, first, n, _ := recordSpan(rec)
			if first+uint64(n)-1 > after {
				before := len(dst)
				dst, err = decodeRecord(rec, after, max-got, dst, q.names)
				if err != nil { // the checksum held: a bug, not the disk
					dst = dst[:before]
					q.corruptRecord(s.path, off)
					off += int64(size)
					continue
				}
				got += len(dst) - before
				q.rcur = cursor{path: s.path, off: off, seq: first}
				if got >= max {
					break
				}
			}
			off += int64(size)
		}
		f.Close()
		if got > 0 && dst[len(dst)-1].Seq >= upto {
			break
		}
	}
	if q.readErr != nil {
		q.log.Info("ringstore: queue: reading the queue again", "dir", q.cfg.Dir, "after", q.readErr)
		q.readErr, q.readWait = nil, 0
	}
	return dst, false
}

// readRecord returns the checked record at off (valid until the next call).
// A checksum failure returns errChecksum with the record's header in the
// returned bytes (its length says where the next record starts).
func (q *Queue) readRecord(f *os.File, off, size int64) ([]byte, error) {
	if cap(q.rbuf) < recordHeader {
		q.rbuf = make([]byte, 64<<10)
	}
	h := q.rbuf[:recordHeader]
	if _, err := f.ReadAt(h, off); err != nil {
		return nil, err
	}
	l := int64(h[0]) | int64(h[1])<<8 | int64(h[2])<<16 | int64(h[3]&0x7f)<<24
	if l == 0 || l > maxRecord || off+recordHeader+l > size {
		return nil, fmt.Errorf("bad record length %d at offset %d", l, off)
	}
	need := int(recordHeader + l)
	if cap(q.rbuf) < need {
		q.rbuf = make([]byte, need)
	}
	b := q.rbuf[:need]
	if _, err := f.ReadAt(b, off); err != nil && !(errors.Is(err, io.EOF) && off+int64(need) <= size) {
		return nil, err
	}
	if _, _, _, err := recordSpan(b); err != nil {
		if errors.Is(err, errChecksum) {
			return b, errChecksum
		}
		return nil, fmt.Errorf("offset %d: %w", off, err)
	}
	return b, nil
}

// readFailed backs the reader off (100 ms doubling to 30 s) after an open
// or read error. The segment stays: the error may be transient (EIO,
// EMFILE); a segment is deleted only when acknowledged or dropped at the
// bound. Logged at the first error and then at most once a minute.
func (q *Queue) readFailed(path string, err error) {
	q.readWait = min(max(2*q.readWait, 100*time.Millisecond), 30*time.Second)
	q.readRetry = time.Now().Add(q.readWait)
	if q.readErr == nil || time.Since(q.readLog) >= time.Minute {
		q.log.Error("ringstore: queue: read failed; retrying (nothing deleted)", "file", path, "err", err, "retry_in", q.readWait)
		q.readLog = time.Now()
	}
	q.readErr = err
}

// corruptRecord counts a checksum-failed record once and logs it.
func (q *Queue) corruptRecord(path string, off int64) {
	k := cursor{path: path, off: off}
	if _, ok := q.badRecs[k]; ok {
		return
	}
	if len(q.badRecs) > 4096 {
		clear(q.badRecs)
	}
	q.badRecs[k] = struct{}{}
	q.mu.Lock()
	q.corrupt++
	q.mu.Unlock()
	q.log.Error("ringstore: queue: corrupt record skipped (checksum)", "file", path, "offset", off)
}

// keepBoundLocked drops the oldest unacknowledged samples while what is
// unacknowledged on disk (each segment's bytes prorated to its
// unacknowledged samples, as Stats.Bytes) is above MaxBytes: whole samples,
// the oldest first, no more than the excess at the segment's bytes per
// sample, each counted and located. Dropped samples count as acknowledged;
// their segment files go with the acknowledged ones.
func (q *Queue) keepBoundLocked() {
	var total int64
	for _, s := range q.segs {
		if c := s.count(); c > 0 {
			total += s.size * s.countAbove(q.head) / c
		}
	}
	excess := total + q.pendBytes - q.cfg.MaxBytes
	if excess <= 0 {
		return
	}
	var n uint64
	first := q.head + 1
	for _, s := range q.segs {
		if excess <= 0 {
			break
		}
		c := s.count()
		if c == 0 || s.countAbove(q.head) == 0 {
			continue
		}
		per := max(s.size/c, 1)
		k := uint64((excess + per - 1) / per)
		for _, r := range s.runs {
			if k == 0 {
				break
			}
			if r.last <= q.head {
				continue
			}
			f := maxU(r.first, q.head+1)
			m := min(k, r.last-f+1)
			q.addDrop(f, f+m-1, m)
			q.head = f + m - 1
			k -= m
			n += m
			excess -= int64(m) * per
		}
	}
	for q.written > 0 && q.mem[q.memOff].Seq <= q.head {
		q.popFront()
		q.written--
	}
	// Then the oldest samples held in memory (not written: the disk fails).
	for excess > 0 && q.written == 0 && len(q.mem) > q.memOff {
		s := &q.mem[q.memOff]
		if s.Seq > q.head {
			q.addDrop(s.Seq, s.Seq, 1)
			q.head = s.Seq
			n++
		}
		e := estBytes(s)
		q.pendBytes -= e
		excess -= e
		q.popFront()
	}
	if n == 0 {
		return
	}
	q.dropLogN += n
	if time.Since(q.dropLog) >= time.Minute { // one line a minute while full, with the count
		q.log.Warn("ringstore: queue: full, dropped the oldest samples", "samples", q.dropLogN, "first", first, "last", q.head,
			"max_bytes", q.cfg.MaxBytes, "dropped_total", q.dropped)
		q.dropLog, q.dropLogN = time.Now(), 0
	}
}

// Stats returns the queue's counters.
func (q *Queue) Stats() QueueStats {
	q.mu.Lock()
	st := QueueStats{Acked: q.head, Dropped: q.dropped, Corrupt: q.corrupt, Recovered: q.recovered, Segments: len(q.segs)}
	st.DroppedRanges = append([]SeqRange(nil), q.ranges...)
	unwritten := q.mem[q.memOff+q.written:]
	if q.cfg.Dir == "" {
		st.Samples = int64(len(unwritten))
		st.Bytes = q.memBytes
	} else {
		for _, s := range q.segs {
			if c := s.count(); c > 0 {
				a := s.countAbove(q.head)
				st.Samples += a
				st.Bytes += s.size * a / c
			}
		}
		for i := range unwritten {
			if unwritten[i].Seq > q.head {
				st.Samples++
				st.Bytes += 24 + int64(len(unwritten[i].Tag))
			}
		}
		st.Unwritten = int64(len(unwritten))
	}
	st.Mode = q.modeLocked()
	head, ok := q.head, q.oldestFor == q.head+1
	st.OldestTS = q.oldestTS
	q.mu.Unlock()
	if st.Samples == 0 {
		st.OldestTS = 0
	} else if !ok {
		if s := q.PeekAfter(head, 1, nil); len(s) > 0 {
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

// Run is the writer: it moves handed-off batches to disk, syncs per policy,
// saves the ack mark and deletes segments that are acknowledged. It returns
// when ctx ends, after writing what was handed off. Memory mode: it only waits.
func (q *Queue) Run(ctx context.Context) error {
	if q.cfg.Dir == "" {
		<-ctx.Done()
		return nil
	}
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
	q.log.Warn("ringstore: queue: still keeping samples in memory; the disk refuses writes",
		"dir", q.cfg.Dir, "err", q.diskErr, "in_memory", len(q.mem)-q.memOff-q.written, "dropped_total", q.dropped,
		"since", q.diskSince.Format(time.RFC3339))
}

// flush writes anything still waiting (after a failed write), then syncs
// and saves the ack mark per policy (or unconditionally when final). The
// fsync and the ack mark run outside wmu, so Append (under the ring's lock)
// never waits for a sync; only Run's goroutine (and Close, after Run) calls
// flush, so the sync and ack-mark state has one owner.
func (q *Queue) flush(final bool) {
	q.wmu.Lock()
	for q.writeOnce(final) {
	}
	if q.cfg.Fsync == FsyncAlways && q.dirty && q.wf != nil {
		q.sync() // under wmu: whoever takes it next finds the writes synced (Persist)
	}
	now := time.Now()
	var f *os.File
	if q.dirty && q.wf != nil && (final || q.cfg.Fsync == FsyncBatched && now.Sub(q.lastSync) >= q.cfg.FsyncInterval) {
		f, q.dirty, q.lastSync = q.wf, false, now
	}
	q.wmu.Unlock()
	if f != nil {
		// A roll may close f meanwhile; it syncs a dirty file before closing.
		if err := q.fsync(f); err != nil && !errors.Is(err, os.ErrClosed) {
			q.logErr("sync", err)
			q.wmu.Lock()
			q.dirty = q.dirty || q.wf == f
			q.wmu.Unlock()
		}
	}
	q.mu.Lock()
	head := q.head
	q.mu.Unlock()
	if head != q.ackSaved && (final || q.cfg.Fsync == FsyncAlways || now.Sub(q.lastAckWrite) >= q.cfg.FsyncInterval) {
		q.saveAck(head)
	}
	q.wmu.Lock()
	q.deleteAcked()
	q.wmu.Unlock()
}

// sync syncs the active file (wmu held): for FsyncAlways and before a close.
func (q *Queue) sync() {
	if err := q.fsync(q.wf); err != nil {
		q.logErr("sync", err)
		return
	}
	q.dirty = false
	q.lastSync = time.Now()
}

func (q *Queue) logErr(what string, err error) {
	if time.Since(q.errLogged) < 10*time.Second {
		return
	}
	q.errLogged = time.Now()
	q.log.Error("ringstore: queue: "+what+" failed", "dir", q.cfg.Dir, "err", err)
}

// writeOnce writes up to a few thousand handed-off samples. It reports
// whether more are waiting. While the disk fails it tries only when the
// backoff has passed (or force, at shutdown).
func (q *Queue) writeOnce(force bool) bool {
	q.mu.Lock()
	if q.diskErr != nil && !force && time.Now().Before(q.diskRetry) {
		q.mu.Unlock()
		return false
	}
	pending := q.mem[q.memOff+q.written:]
	n := min(len(pending), 4*maxRecordSamples)
	q.wbuf = append(q.wbuf[:0], pending[:n]...)
	head := q.head
	more := len(pending) > n
	q.mu.Unlock()
	if n == 0 {
		return false
	}
	take := q.wbuf
	skip := sort.Search(len(take), func(i int) bool { return take[i].Seq > head })
	done := skip // taken samples accounted for (the acked ones need no write)
	for i := skip; i < len(take); {
		j := i + 1
		for j < len(take) && j-i < maxRecordSamples && take[j].Seq == take[j-1].Seq+1 && take[j].Epoch == take[i].Epoch {
			j++
		}
		q.enc = appendRecord(q.enc[:0], take[i:j])
		if err := q.writeBytes(take[i].Seq, q.enc); err != nil {
			q.degrade(err)
			more = false // the rest stays in memory; retried by Run after the backoff
			break
		}
		q.mu.Lock()
		q.wseg.add(take[i].Seq, take[j-1].Seq)
		q.wseg.size += int64(len(q.enc))
		q.mu.Unlock()
		done, i = j, j
	}
	q.mu.Lock()
	for _, s := range take[:done] {
		q.pendBytes -= estBytes(&s)
	}
	q.written += done
	if done > 0 {
		q.writtenTo = max(q.writtenTo, take[done-1].Seq)
	}
	if done > skip && q.diskErr != nil {
		q.log.Info("ringstore: queue: writing to disk again", "dir", q.cfg.Dir, "after", errText(q.diskErr),
			"in_memory", len(q.mem)-q.memOff-q.written, "dropped_total", q.dropped, "since", q.diskSince.Format(time.RFC3339))
		q.diskErr, q.diskWait = nil, 0
	}
	for q.written > queueCacheSamples {
		q.diskOnly = maxU(q.diskOnly, q.mem[q.memOff].Seq)
		q.popFront()
		q.written--
	}
	q.keepBoundLocked()
	q.oldestFor = 0
	q.mu.Unlock()
	return more
}

// writeBytes appends b to the active segment, rolling to a new one (named
// by first) when it is full. On a failed write the file is cut back.
func (q *Queue) writeBytes(first uint64, b []byte) error {
	if q.wf == nil || q.wseg.size >= q.segSize {
		if err := q.roll(first); err != nil {
			return err
		}
	}
	if _, err := q.wf.Write(b); err != nil {
		if terr := q.wf.Truncate(q.wseg.size); terr != nil {
			q.closeActive()
		} else {
			_, _ = q.wf.Seek(q.wseg.size, io.SeekStart)
		}
		return err
	}
	q.dirty = true
	return nil
}

func (q *Queue) roll(first uint64) error {
	if q.wf != nil {
		q.closeActive()
	}
	path := filepath.Join(q.cfg.Dir, fmt.Sprintf("%020d%s", first, segSuffix))
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o640)
	if os.IsNotExist(err) {
		// The directory could not be made at open (a read-only data_dir) or
		// went away: make it now that the disk may take writes again.
		if merr := os.MkdirAll(q.cfg.Dir, 0o750); merr != nil {
			return merr
		}
		f, err = os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o640)
	}
	if err != nil {
		return err
	}
	if q.cfg.Fsync != FsyncNever {
		if err := syncDir(q.cfg.Dir); err != nil {
			q.logErr("sync dir", err)
		}
	}
	s := &segment{first: first, path: path}
	q.mu.Lock()
	q.segs = append(q.segs, s)
	q.mu.Unlock()
	q.wf, q.wseg, q.dirty = f, s, false
	return nil
}

func (q *Queue) closeActive() {
	if q.dirty && q.cfg.Fsync != FsyncNever {
		q.sync()
	}
	if err := q.wf.Close(); err != nil {
		q.logErr("close", err)
	}
	q.wf, q.wseg, q.dirty = nil, nil, false
}

// Ack mark file: the decimal seq up to which everything is acknowledged,
// written to a temporary file and renamed over the old one.
func (q *Queue) saveAck(head uint64) {
	path := filepath.Join(q.cfg.Dir, ackFile)
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o640)
	if err != nil {
		q.logErr("save ack mark", err)
		return
	}
	_, err = f.WriteString(strconv.FormatUint(head, 10) + "\n")
	if err == nil && q.cfg.Fsync != FsyncNever {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		q.logErr("save ack mark", err)
		return
	}
	q.ackSaved, q.lastAckWrite = head, time.Now()
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
	skips := append([]Skip(nil), keep...)
	q.mu.Unlock()
	if pruned {
		if err := writeSkips(filepath.Join(q.cfg.Dir, skipFile), skips); err != nil {
			q.logErr("save restart skips", err)
		}
	}
}

// deleteAcked removes the segments (not the active one) that hold nothing
// unacknowledged. Their samples' ack may not be saved yet: harmless, a
// deleted segment cannot come back.
func (q *Queue) deleteAcked() {
	q.mu.Lock()
	var gone []string
	keep := q.segs[:0]
	for _, s := range q.segs {
		if s != q.wseg && s.last() <= q.head {
			gone = append(gone, s.path)
			continue
		}
		keep = append(keep, s)
	}
	clear(q.segs[len(keep):])
	q.segs = keep
	q.mu.Unlock()
	for _, p := range gone {
		if err := os.Remove(p); err != nil && !os.IsNotExist(err) {
			q.logErr("remove segment", err)
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
	if q.cfg.Dir != "" {
		q.flush(true)
		q.wmu.Lock()
		if q.wf != nil {
			q.closeActive()
		}
		q.wmu.Unlock()
	}
	q.mu.Lock()
	q.closed = true
	// What could not be written (disk full or failing) is lost with the
	// process: counted as dropped and logged, never silently.
	var lost uint64
	if q.cfg.Dir != "" {
		for _, s := range q.mem[q.memOff+q.written:] {
			if s.Seq > q.head {
				q.addDrop(s.Seq, s.Seq, 1)
				lost++
			}
		}
	}
	dropped := q.dropped
	q.mu.Unlock()
	if lost > 0 {
		q.log.Error("ringstore: queue: samples not written at shutdown (disk full or failing); counted as dropped", "samples", lost, "dropped_total", dropped, "dir", q.cfg.Dir)
	}
	return nil
}

// LastSeq is the highest sequence number the queue holds or has
// acknowledged (0 when it never held one): the Sequence starts above it.
func (q *Queue) LastSeq() uint64 {
	q.mu.Lock()
	defer q.mu.Unlock()
	last := q.head
	if n := len(q.segs); n > 0 {
		last = max(last, q.segs[n-1].last())
	}
	if n := len(q.mem); n > q.memOff {
		last = max(last, q.mem[n-1].Seq)
	}
	return last
}

// Resume tells the queue where this run's numbering starts: when epoch
// continues and first is above the queue's last seq + 1, the numbers in
// between were reserved by the previous run and never used. That skip is
// kept (file queue.skips) until acknowledged and sent with the batch that
// crosses it (Skips), so a receiver does not report it as a gap.
func (q *Queue) Resume(epoch, first uint64, continued bool) {
	last := q.LastSeq()
	if !continued || first <= last+1 || last == 0 {
		return
	}
	q.mu.Lock()
	q.skips = append(q.skips, Skip{Epoch: epoch, First: last + 1, Last: first - 1})
	if len(q.skips) > maxSkips {
		q.skips = q.skips[len(q.skips)-maxSkips:]
	}
	skips := append([]Skip(nil), q.skips...)
	q.mu.Unlock()
	if q.cfg.Dir != "" {
		if err := writeSkips(filepath.Join(q.cfg.Dir, skipFile), skips); err != nil {
			q.log.Warn("ringstore: queue: restart skip not saved (a receiver may report it as a gap after another restart)", "err", err)
		}
	}
}

// Skips returns the skips of epoch whose end lands in (after, last]: the
// ones a batch of that epoch covering (after, last] crosses.
func (q *Queue) Skips(epoch, after, last uint64) []Skip {
	q.mu.Lock()
	defer q.mu.Unlock()
	var out []Skip
	for _, k := range q.skips {
		if k.Epoch == epoch && k.Last+1 > after && k.Last+1 <= last {
			out = append(out, k)
		}
	}
	return out
}

func readSkips(path string, log *slog.Logger) []Skip {
	b, err := os.ReadFile(path)
	if err != nil {
		if !os.IsNotExist(err) {
			log.Warn("ringstore: queue: restart skips unreadable", "file", path, "err", err)
		}
		return nil
	}
	var out []Skip
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) != 3 {
			continue
		}
		e, err1 := ParseEpoch(f[0])
		a, err2 := strconv.ParseUint(f[1], 10, 64)
		z, err3 := strconv.ParseUint(f[2], 10, 64)
		if err1 != nil || err2 != nil || err3 != nil || a > z {
			log.Warn("ringstore: queue: bad line in restart skips ignored", "file", path, "line", line)
			continue
		}
		out = append(out, Skip{Epoch: e, First: a, Last: z})
	}
	return out
}

// writeSkips replaces the skips file (one "epoch first last" line each).
func writeSkips(path string, skips []Skip) error {
	var b []byte
	for _, k := range skips {
		b = AppendEpoch(b, k.Epoch)
		b = append(b, ' ')
		b = strconv.AppendUint(b, k.First, 10)
		b = append(b, ' ')
		b = strconv.AppendUint(b, k.Last, 10)
		b = append(b, '\n')
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o640); err != nil {
		_ = os.Remove(tmp)
		return err
	}
	return os.Rename(tmp, path)
}
