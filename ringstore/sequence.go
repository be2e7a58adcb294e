package ringstore

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"
)

// SeqBlock is how many sequence numbers one write of the high-water mark
// reserves. A restart skips what was reserved and not used (at most this
// many); the skip is announced upstream (a Skip, kept by the durable queue:
// spool.Queue.Resume), so it is not a gap.
const SeqBlock = 1 << 20

// Skip is a range of sequence numbers of one epoch that were never given to
// a sample: what a restart skipped of the block the previous run had
// reserved. Receivers treat it as seen, not as a gap.
type Skip struct {
	Epoch       uint64
	First, Last uint64
}

const hwmFile = "seq.hwm"

// Sequence hands out the global sequence numbers, each under an epoch: a
// random 64-bit id that names one unbroken numbering. Within an epoch a
// number is never handed out twice, across restarts and SIGKILL included;
// (epoch, seq) identifies a sample for ever.
//
// With a directory it keeps the high-water mark file "seq.hwm" there: the
// mark (decimal) on the first line and the epoch (16 hex digits) on the
// second, written to a temporary file, synced and renamed, then the
// directory synced. Every number handed out under the epoch on disk is at
// most the mark on disk. The next mark (SeqBlock ahead) is written by Run
// when half the block is used, off the poll path; a failing write costs
// nothing until the block is truly used up.
//
// A new epoch is created whenever the sequence cannot be proven to continue:
// no mark (fresh or wiped directory), an unreadable or corrupt mark, a mark
// file without an epoch (written by an older version), memory-only mode, the
// queue holding numbers above the mark, the first mark of this run not
// written (disk full, read-only, failing), or a block used up while the disk
// refuses the next mark. Numbers stay strictly increasing in the process
// across such a change (a new epoch continues from the last number), so the
// queue stays ordered by seq; only the epoch says that the numbering broke.
// A new epoch kept only in memory is written to the directory by Run as soon
// as the disk accepts it again.
//
// Without a directory (memory-only mode) it starts at the current Unix time
// in microseconds, under a new epoch at every start.
//
// Concurrency: all methods are safe for concurrent use; Reserve never does
// I/O while Run is running (before Run, a used-up block is written inline).
type Sequence struct {
	dir  string
	log  *slog.Logger
	kick chan struct{} // wakes Run (cap 1)

	mu      sync.Mutex
	epoch   uint64
	last    uint64 // last number handed out
	first   uint64 // first number this process hands out
	mark    uint64 // ceiling of the current epoch; last <= mark
	durable bool   // mark and epoch are on disk
	writing bool   // Run owns a mark write (or a retry) in flight
	running bool   // Run is running: Reserve never writes
	why     string // why the current epoch was created ("" = continued)

	openEpoch uint64 // the epoch after open
	continued bool   // openEpoch continues the epoch on disk
	diskErr   error  // the last failed mark write, nil once one succeeds
	lastErr   error  // the last failed mark write since open, kept after a success (WriteHealth)
	lastErrAt time.Time
}

// SequenceConfig configures OpenSequenceConfig.
type SequenceConfig struct {
	Dir string // "" = memory only
	// Floor is a number already used by a sample still held elsewhere (the
	// queue's highest seq): the sequence starts above it, under a new epoch
	// when the mark is below it.
	Floor  uint64
	Logger *slog.Logger
}

// OpenSequence loads (or creates) the high-water mark in dir; dir "" means
// memory only. It never fails because of the disk (see Sequence): an
// unreadable directory gives a new epoch numbered in memory.
func OpenSequence(dir string) (*Sequence, error) { return OpenSequenceConfig(SequenceConfig{Dir: dir}) }

// OpenSequenceConfig is OpenSequence with a floor and a logger.
func OpenSequenceConfig(cfg SequenceConfig) (*Sequence, error) {
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Sequence{dir: cfg.Dir, log: log, kick: make(chan struct{}, 1)}
	if cfg.Dir == "" {
		s.last = max(uint64(time.Now().UnixMicro()), cfg.Floor)
		s.newEpochLocked("memory-only mode")
		s.mark = ^uint64(0)
		s.first = s.last + 1
		s.openEpoch = s.epoch
		return s, nil
	}
	path := filepath.Join(cfg.Dir, hwmFile)
	mark, epoch, err := readMark(path)
	if os.IsNotExist(err) {
		_ = os.MkdirAll(cfg.Dir, 0o750) // a failure shows at the mark's write below
	}
	switch {
	case os.IsNotExist(err):
		s.last = cfg.Floor
		s.newEpochLocked("no high-water mark (fresh or wiped data_dir)")
	case err != nil:
		s.last = cfg.Floor
		s.newEpochLocked(err.Error())
	case epoch == 0:
		s.last = max(mark, cfg.Floor)
		s.newEpochLocked("high-water mark without an epoch (written by an older version)")
	case cfg.Floor > mark:
		s.last = cfg.Floor
		s.newEpochLocked(fmt.Sprintf("the queue holds seq %d above the high-water mark %d", cfg.Floor, mark))
	default:
		s.epoch, s.last = epoch, mark
	}
	s.first = s.last + 1
	target := s.last + SeqBlock
	if err := writeMark(cfg.Dir, target, s.epoch); err != nil {
		s.diskErr = err
		s.lastErr, s.lastErrAt = err, time.Now()
		if s.why == "" {
			// The mark is not moved, so numbers above it must not be
			// handed out under this epoch: a restart would reuse them.
			s.newEpochLocked("disk: " + err.Error())
		}
		s.mark = ^uint64(0)
		log.Warn("ringstore: sequence: high-water mark not written; numbering in memory until the disk accepts it", "file", path, "err", err)
	} else {
		s.mark, s.durable = target, true
	}
	s.openEpoch, s.continued = s.epoch, s.why == ""
	return s, nil
}

// readMark reads the mark file: mark, and epoch (0 when the file has none).
func readMark(path string) (mark, epoch uint64, err error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, 0, err
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	mark, err = strconv.ParseUint(strings.TrimSpace(lines[0]), 10, 64)
	if err != nil || len(lines) > 2 {
		return 0, 0, fmt.Errorf("corrupt high-water mark %q in %s", b, path)
	}
	if len(lines) == 2 {
		epoch, err = strconv.ParseUint(strings.TrimSpace(lines[1]), 16, 64)
		if err != nil || epoch == 0 {
			return 0, 0, fmt.Errorf("corrupt epoch %q in %s", b, path)
		}
	}
	return mark, epoch, nil
}

// newEpochLocked switches to a fresh random epoch (never 0), logging why.
func (s *Sequence) newEpochLocked(why string) {
	old := s.epoch
	var b [8]byte
	for s.epoch == old || s.epoch == 0 {
		_, _ = rand.Read(b[:])
		s.epoch = binary.LittleEndian.Uint64(b[:])
	}
	s.why = why
	if old != 0 {
		s.log.Info("ringstore: sequence: new epoch", "old_epoch", FormatEpoch(old), "new_epoch", FormatEpoch(s.epoch), "continues_at", s.last+1, "why", why)
	} else {
		s.log.Info("ringstore: sequence: new epoch", "new_epoch", FormatEpoch(s.epoch), "starts_at", s.last+1, "why", why)
	}
}

// FormatEpoch is the epoch as it appears on the wire: 16 lower-case hex digits.
func FormatEpoch(e uint64) string {
	var b [16]byte
	return string(AppendEpoch(b[:0], e))
}

// AppendEpoch appends FormatEpoch(e) to b.
func AppendEpoch(b []byte, e uint64) []byte {
	for i := 60; i >= 0; i -= 4 {
		b = append(b, hexDigits[(e>>uint(i))&0xf])
	}
	return b
}

// ParseEpoch reads FormatEpoch's output.
func ParseEpoch(s string) (uint64, error) {
	if len(s) != 16 {
		return 0, fmt.Errorf("ringstore: epoch %q: want 16 hex digits", s)
	}
	e, err := strconv.ParseUint(s, 16, 64)
	if err != nil {
		return 0, fmt.Errorf("ringstore: epoch %q: want 16 hex digits", s)
	}
	return e, nil
}

// Last is the last number handed out (before the first, the number this
// process starts above).
func (s *Sequence) Last() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.last
}

// Epoch is the current epoch.
func (s *Sequence) Epoch() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.epoch
}

// First is the first number this process hands out (its resume point), the
// epoch it was opened with, and whether that epoch continues the one on disk
// (false: a new epoch starts here).
func (s *Sequence) First() (epoch, first uint64, continued bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.openEpoch, s.first, s.continued
}

// Durable reports whether the current epoch's mark is on disk, and the last
// mark write error otherwise.
func (s *Sequence) Durable() (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.durable || s.dir == "", s.diskErr
}

// WriteHealth is the mark's writer: failing is the error of the last mark
// write while it fails (nil once one succeeds), last the last mark write
// error since open and at when it happened (zero: none).
func (s *Sequence) WriteHealth() (at time.Time, failing, last error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lastErrAt, s.diskErr, s.lastErr
}

// Reserve hands out n consecutive numbers and returns the first. It never
// fails; the error is kept for callers of the older signature.
func (s *Sequence) Reserve(n int) (uint64, error) {
	first, _ := s.ReserveEpoch(n)
	return first, nil
}

// ReserveEpoch hands out n consecutive numbers and returns the first and
// their epoch. With Run running it never does I/O: it asks Run for the next
// mark when half the block is used and, when the block is used up before
// the mark is written, goes on under a new epoch kept in memory.
func (s *Sequence) ReserveEpoch(n int) (first, epoch uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.last+uint64(n) > s.mark {
		s.exhaustedLocked(n)
	} else if s.durable && s.running && !s.writing && s.mark-s.last-uint64(n) < SeqBlock/2 {
		s.writing = true
		select {
		case s.kick <- struct{}{}:
		default:
		}
	}
	first = s.last + 1
	s.last += uint64(n)
	return first, s.epoch
}

// exhaustedLocked handles a used-up block: a synchronous write when Run is
// not running, else (or when that write fails) a new epoch in memory.
func (s *Sequence) exhaustedLocked(n int) {
	if !s.running && s.durable {
		target := s.last + uint64(n) + SeqBlock
		err := writeMark(s.dir, target, s.epoch)
		if err == nil {
			s.mark = target
			return
		}
		s.diskErr = err
		s.lastErr, s.lastErrAt = err, time.Now()
	}
	reason := "sequence block used up and the next high-water mark is not written"
	if s.diskErr != nil {
		reason += ": " + s.diskErr.Error()
	}
	s.newEpochLocked(reason)
	s.mark, s.durable = ^uint64(0), false
	s.writing = false
	select {
	case s.kick <- struct{}{}: // Run persists the new epoch when it can
	default:
	}
}

// Run writes the marks Reserve asks for, and persists an epoch kept in
// memory (disk full, read-only, failing) once the disk accepts it again,
// retrying every few seconds. It returns when ctx ends. Memory-only: it
// only waits.
func (s *Sequence) Run(ctx context.Context) error {
	s.mu.Lock()
	s.running = true
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		s.running = false
		s.writing = false
		s.mu.Unlock()
	}()
	if s.dir == "" {
		<-ctx.Done()
		return nil
	}
	retry := time.NewTimer(time.Hour)
	retry.Stop()
	defer retry.Stop()
	backoff := time.Second
	s.mu.Lock()
	if !s.durable { // the first mark was not written at open
		s.writing = true
		retry.Reset(backoff)
	}
	s.mu.Unlock()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-s.kick:
		case <-retry.C:
		}
		s.mu.Lock()
		need := s.writing || !s.durable
		epoch, target := s.epoch, s.last+SeqBlock
		s.mu.Unlock()
		if !need {
			continue
		}
		err := writeMark(s.dir, target, epoch)
		s.mu.Lock()
		if err != nil {
			// Keep writing set: the retry is ours, Reserve does not ask
			// again. A block used up meanwhile goes to a new epoch.
			if s.diskErr == nil {
				s.log.Warn("ringstore: sequence: high-water mark not written; retrying", "dir", s.dir, "err", err)
			}
			s.diskErr = err
			s.lastErr, s.lastErrAt = err, time.Now()
			retry.Reset(backoff)
			backoff = min(2*backoff, 30*time.Second)
			s.mu.Unlock()
			continue
		}
		backoff = time.Second
		if s.epoch == epoch && s.last <= target {
			if !s.durable {
				s.log.Info("ringstore: sequence: epoch written to disk again", "epoch", FormatEpoch(epoch), "mark", target)
			}
			s.mark, s.durable, s.diskErr = target, true, nil
		}
		s.writing = false
		s.mu.Unlock()
	}
}

// writeMark replaces the mark file with mark and epoch, durably.
func writeMark(dir string, mark, epoch uint64) error {
	path := filepath.Join(dir, hwmFile)
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o640)
	if err != nil {
		return fmt.Errorf("ringstore: sequence: %w", err)
	}
	b := strconv.AppendUint(nil, mark, 10)
	b = append(b, '\n')
	b = AppendEpoch(b, epoch)
	b = append(b, '\n')
	_, err = f.Write(b)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err == nil {
		err = syncDir(dir)
	}
	if err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("ringstore: sequence: write high-water mark: %w", err)
	}
	return nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
