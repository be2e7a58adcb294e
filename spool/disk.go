package spool

import (
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
	"sync/atomic"
	"time"

	"edgegw/ringstore"
)

// Files in the queue's directory.
const (
	ackFile   = "queue.ack"
	skipFile  = "queue.skips"
	segSuffix = ".seg"
)

type run struct{ first, last, epoch uint64 }

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

func (s *segment) add(first, last, epoch uint64) {
	if n := len(s.runs); n > 0 && s.runs[n-1].last+1 == first && s.runs[n-1].epoch == epoch {
		s.runs[n-1].last = last
		return
	}
	s.runs = append(s.runs, run{first, last, epoch})
}

type cursor struct {
	path string
	off  int64
	seq  uint64 // first seq of the record at off
}

// diskStore keeps the written samples in segment files
// "<first seq, 20 digits>.seg" of records (layout in record.go), the ack
// mark in "queue.ack" and the restart skips in "queue.skips" (both
// replaced by rename). Only the active segment is ever written, only at
// its end; a segment file is deleted whole once released.
type diskStore struct {
	dir     string
	log     *slog.Logger
	segSize int64
	syncs   bool // the fsync policy is not "never": a roll syncs, the ack mark is synced

	mu     sync.Mutex // the index
	segs   []*segment // oldest first; active is the last one while open
	active *segment   // being written: never released
	gone   []string   // released segment files, removed at the next checkpoint

	fmu      sync.Mutex // the active file
	wf       *os.File
	enc      []byte
	dirty    bool     // written since the last sync
	inflight *os.File // handed over by syncer and not synced yet: a roll syncs it before closing

	// The reader's state: read runs under the queue's reader lock.
	rcur    cursor
	rbuf    []byte
	names   map[string]string   // interned device and tag names
	badRecs map[cursor]struct{} // corrupt records counted (path, offset)

	errLogged atomic.Int64 // unix ns of the last throttled error line

	hmu    sync.Mutex // the handed file
	hf     *os.File
	hdirty bool

	// open opens a segment for reading: os.Open, or a test's fault.
	open func(path string) (*os.File, error)
	// fsync syncs a segment file: (*os.File).Sync, or a test's slow disk.
	fsync func(*os.File) error
}

var _ store = (*diskStore)(nil)

// recovered is what openDisk found in the directory.
type recovered struct {
	head    uint64           // the ack mark
	skips   []ringstore.Skip // restart skips not yet acknowledged
	losses  []Loss           // loss ranges not yet acknowledged (file queue.loss)
	found   []Loss           // new losses: handed-out seqs held nowhere (recoverLosses)
	corrupt uint64           // records skipped because their checksum failed
	bytes   int64            // cut from torn or corrupt segment tails

	handed, handedEpoch, handedFirst uint64 // the handed mark: highest seq handed off, its epoch, the run's first
	handedOK                         bool   // the handed file was read
	minSeg                           uint64 // the lowest segment name (first seq), 0 if none
}

// openDisk opens (or creates) the directory and scans it: every segment,
// the ack mark and the skips. It returns a usable store even with an error
// (a read-only or failing directory): writes then fail until the disk
// takes them again, and the store makes the directory then.
func openDisk(cfg Config, segSize int64) (*diskStore, recovered, error) {
	d := &diskStore{dir: cfg.Dir, log: cfg.Logger, segSize: segSize, syncs: cfg.Fsync != FsyncNever,
		names: make(map[string]string), badRecs: make(map[cursor]struct{}), open: os.Open, fsync: (*os.File).Sync}
	var rec recovered
	if err := os.MkdirAll(cfg.Dir, 0o750); err != nil {
		return d, rec, err
	}
	err := d.recover(&rec)
	return d, rec, err
}

func (d *diskStore) recover(rec *recovered) error {
	b, err := os.ReadFile(filepath.Join(d.dir, ackFile))
	switch {
	case os.IsNotExist(err):
	case err != nil:
		return fmt.Errorf("spool: %w", err)
	default:
		v, perr := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
		if perr != nil {
			// A torn ack mark: start from 0; acknowledged samples come
			// back (receivers dedup), nothing unacknowledged is lost.
			d.log.Warn("spool: unreadable ack mark, resending from the oldest segment", "file", filepath.Join(d.dir, ackFile), "content", string(b))
		} else {
			rec.head = v
		}
	}
	rec.skips = readSkips(filepath.Join(d.dir, skipFile), d.log)
	rec.losses = readLosses(filepath.Join(d.dir, lossFile), d.log)
	var herr error
	rec.handed, rec.handedEpoch, rec.handedFirst, rec.handedOK, herr = readHanded(filepath.Join(d.dir, handedFile))
	if herr != nil {
		d.log.Error("spool: handed mark unreadable; samples lost in the crash before this start cannot be counted",
			"file", filepath.Join(d.dir, handedFile), "err", herr)
	}
	var cuts []cut
	entries, err := os.ReadDir(d.dir)
	if err != nil {
		return fmt.Errorf("spool: %w", err)
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
		path := filepath.Join(d.dir, name)
		if perr != nil {
			d.log.Warn("spool: ignoring a file that is not a segment", "file", path)
			continue
		}
		if rec.minSeg == 0 || first < rec.minSeg {
			rec.minSeg = first
		}
		s, err := d.scanSegment(path, first, rec, &cuts)
		if err != nil {
			return err
		}
		if s.count() == 0 || s.last() <= rec.head {
			if err := os.Remove(path); err != nil {
				d.log.Warn("spool: acknowledged segment not removed", "file", path, "err", err)
			}
			continue
		}
		d.segs = append(d.segs, s)
	}
	d.recoverLosses(rec, cuts)
	return nil
}

// scanSegment reads every record of a segment file. A record whose
// checksum fails (with a length that fits the file) is skipped, counted in
// Corrupt and logged with the file and offset; the records after it are
// kept. Only an incomplete record, or a length that cannot be right, ends
// the segment: the file is cut there (a torn tail; counted in Recovered).
func (d *diskStore) scanSegment(path string, first uint64, rec *recovered, cuts *[]cut) (*segment, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("spool: %w", err)
	}
	s := &segment{first: first, path: path}
	off := 0
	for off < len(b) {
		size, f, n, err := recordSpan(b[off:])
		if errors.Is(err, errChecksum) {
			l := int(binary.LittleEndian.Uint32(b[off:]) &^ lenEpoch)
			rec.corrupt++
			d.badRecs[cursor{path: path, off: int64(off)}] = struct{}{}
			d.log.Error("spool: corrupt record skipped (checksum); its samples are counted lost", "file", path, "offset", off, "bytes", recordHeader+l, "after_seq", s.last())
			off += recordHeader + l
			continue
		}
		if err == nil && len(s.runs) > 0 && f <= s.last() {
			err = fmt.Errorf("record seq %d not after %d", f, s.last())
		}
		if err != nil {
			why := "torn tail (partial last record)"
			if !errors.Is(err, errShort) {
				why = "corrupt record: " + err.Error()
			}
			c := cut{path: path, off: int64(off), bytes: int64(len(b) - off), why: why, after: s.last()}
			if c.after == 0 {
				c.after = first - 1
			}
			*cuts = append(*cuts, c)
			if terr := os.Truncate(path, int64(off)); terr != nil {
				return nil, fmt.Errorf("spool: cut %s at %d: %w", path, off, terr)
			}
			rec.bytes += c.bytes
			break
		}
		s.add(f, f+uint64(n)-1, recordEpoch(b[off:]))
		off += size
	}
	s.size = int64(off)
	return s, nil
}

func (d *diskStore) logErr(what string, err error) {
	now := time.Now().UnixNano()
	if last := d.errLogged.Load(); now-last < int64(10*time.Second) || !d.errLogged.CompareAndSwap(last, now) {
		return
	}
	d.log.Error("spool: "+what+" failed", "dir", d.dir, "err", err)
}

// write appends the record to the active segment, rolling to a new one
// (named by its first seq) when it is full: one write(2) into the page
// cache. On a failed write the file is cut back.
func (d *diskStore) write(rec []ringstore.Sample) error {
	d.fmu.Lock()
	defer d.fmu.Unlock()
	d.enc = appendRecord(d.enc[:0], rec)
	if d.wf == nil || d.active.size >= d.segSize {
		if err := d.roll(rec[0].Seq); err != nil {
			return err
		}
	}
	if _, err := d.wf.Write(d.enc); err != nil {
		if terr := d.wf.Truncate(d.active.size); terr != nil {
			d.closeActive()
		} else {
			_, _ = d.wf.Seek(d.active.size, io.SeekStart)
		}
		return err
	}
	d.dirty = true
	d.mu.Lock()
	d.active.add(rec[0].Seq, rec[len(rec)-1].Seq, rec[0].Epoch)
	d.active.size += int64(len(d.enc))
	d.mu.Unlock()
	return nil
}

// roll closes the active segment (syncing it first unless the policy is
// "never") and creates the next one, then syncs the directory so that the
// new file's entry survives a power loss (again unless "never"). fmu held.
func (d *diskStore) roll(first uint64) error {
	if d.wf != nil {
		d.closeActive()
	}
	path := filepath.Join(d.dir, fmt.Sprintf("%020d%s", first, segSuffix))
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o640)
	if os.IsNotExist(err) {
		// The directory could not be made at open (a read-only data_dir) or
		// went away: make it now that the disk may take writes again.
		if merr := os.MkdirAll(d.dir, 0o750); merr != nil {
			return merr
		}
		f, err = os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o640)
	}
	if err != nil {
		return err
	}
	if d.syncs {
		if err := syncDir(d.dir); err != nil {
			d.logErr("sync dir", err)
		}
	}
	s := &segment{first: first, path: path}
	d.mu.Lock()
	d.segs = append(d.segs, s)
	d.active = s
	d.mu.Unlock()
	d.wf, d.dirty = f, false
	return nil
}

// closeActive syncs the active file when it holds unsynced writes (unless
// the policy is "never") and closes it. fmu held.
func (d *diskStore) closeActive() {
	if (d.dirty || d.inflight == d.wf) && d.syncs {
		d.syncNow()
	}
	if err := d.wf.Close(); err != nil {
		d.logErr("close", err)
	}
	d.mu.Lock()
	d.active = nil
	d.mu.Unlock()
	d.wf, d.dirty, d.inflight = nil, false, nil
}

func (d *diskStore) syncNow() {
	if err := d.fsync(d.wf); err != nil {
		d.logErr("sync", err)
		return
	}
	d.dirty = false
}

func (d *diskStore) syncer() func() {
	d.fmu.Lock()
	defer d.fmu.Unlock()
	if !d.dirty || d.wf == nil {
		return nil
	}
	f := d.wf
	d.dirty, d.inflight = false, f
	return func() {
		d.syncHanded() // the handed mark first: on disk it is never below a synced sample
		err := d.fsync(f)
		d.fmu.Lock()
		defer d.fmu.Unlock()
		if d.inflight == f {
			d.inflight = nil
		}
		// os.ErrClosed: a roll closed f meanwhile, after syncing it.
		if err != nil && !errors.Is(err, os.ErrClosed) {
			d.logErr("sync", err)
			d.dirty = d.dirty || d.wf == f
		}
	}
}

func (d *diskStore) close() {
	d.fmu.Lock()
	defer d.fmu.Unlock()
	if d.wf != nil {
		d.closeActive()
	}
	d.closeHanded()
}

// read reads the segments holding samples > after, using the cursor to
// avoid rescanning a segment. An open or read error (EIO, EMFILE, ...)
// ends the read with what was read so far; the segment is kept, nothing
// is skipped. A record whose checksum fails is skipped, counted once and
// logged with the file and offset.
func (d *diskStore) read(after, upto uint64, n int, dst []ringstore.Sample) ([]ringstore.Sample, int, error) {
	d.mu.Lock()
	segs := make([]segment, 0, 4)
	for _, s := range d.segs {
		if s.last() > after {
			segs = append(segs, segment{path: s.path, size: s.size, runs: s.runs[len(s.runs)-1:]})
		}
	}
	d.mu.Unlock()
	got, corrupt := 0, 0
	for _, s := range segs {
		if got >= n {
			break
		}
		off := int64(0)
		if d.rcur.path == s.path && d.rcur.seq <= after+1 && d.rcur.off < s.size {
			off = d.rcur.off
		}
		f, err := d.open(s.path)
		if err != nil {
			if os.IsNotExist(err) {
				continue // acked or dropped meanwhile
			}
			return dst, corrupt, err
		}
		for off < s.size && got < n {
			rec, err := d.readRecord(f, off, s.size)
			if errors.Is(err, errChecksum) {
				corrupt += d.corruptRecord(s.path, off)
				off += int64(recordHeader + int(binary.LittleEndian.Uint32(rec)&^lenEpoch))
				continue
			}
			if err != nil {
				f.Close()
				return dst, corrupt, fmt.Errorf("%s: %w", s.path, err)
			}
			size, first, k, _ := recordSpan(rec)
			if first+uint64(k)-1 > after {
				before := len(dst)
				dst, err = decodeRecord(rec, after, n-got, dst, d.names)
				if err != nil { // the checksum held: a bug, not the disk
					dst = dst[:before]
					corrupt += d.corruptRecord(s.path, off)
					off += int64(size)
					continue
				}
				got += len(dst) - before
				d.rcur = cursor{path: s.path, off: off, seq: first}
				if got >= n {
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
	return dst, corrupt, nil
}

// readRecord returns the checked record at off (valid until the next call).
// A checksum failure returns errChecksum with the record's header in the
// returned bytes (its length says where the next record starts).
func (d *diskStore) readRecord(f *os.File, off, size int64) ([]byte, error) {
	if cap(d.rbuf) < recordHeader {
		d.rbuf = make([]byte, 64<<10)
	}
	h := d.rbuf[:recordHeader]
	if _, err := f.ReadAt(h, off); err != nil {
		return nil, err
	}
	l := int64(h[0]) | int64(h[1])<<8 | int64(h[2])<<16 | int64(h[3]&0x7f)<<24
	if l == 0 || l > maxRecord || off+recordHeader+l > size {
		return nil, fmt.Errorf("bad record length %d at offset %d", l, off)
	}
	need := int(recordHeader + l)
	if cap(d.rbuf) < need {
		d.rbuf = make([]byte, need)
	}
	b := d.rbuf[:need]
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

// corruptRecord logs a checksum-failed record and returns 1 the first time
// it is seen, 0 after.
func (d *diskStore) corruptRecord(path string, off int64) int {
	k := cursor{path: path, off: off}
	if _, ok := d.badRecs[k]; ok {
		return 0
	}
	if len(d.badRecs) > 4096 {
		clear(d.badRecs)
	}
	d.badRecs[k] = struct{}{}
	d.log.Error("spool: corrupt record skipped (checksum)", "file", path, "offset", off)
	return 1
}

func (d *diskStore) usage(head uint64) usage {
	d.mu.Lock()
	defer d.mu.Unlock()
	u := usage{segments: len(d.segs)}
	for _, s := range d.segs {
		if c := s.count(); c > 0 {
			a := s.countAbove(head)
			u.samples += a
			u.bytes += s.size * a / c
		}
	}
	if n := len(d.segs); n > 0 {
		u.last = d.segs[n-1].last()
	}
	return u
}

// oldest drops whole samples, the oldest first, no more than the excess at
// each segment's bytes per sample.
func (d *diskStore) oldest(head uint64, excess int64) ([]Loss, int64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	var drop []Loss
	for _, s := range d.segs {
		if excess <= 0 {
			break
		}
		c := s.count()
		if c == 0 || s.countAbove(head) == 0 {
			continue
		}
		per := max(s.size/c, 1)
		k := uint64((excess + per - 1) / per)
		for _, r := range s.runs {
			if k == 0 {
				break
			}
			if r.last <= head {
				continue
			}
			f := max(r.first, head+1)
			m := min(k, r.last-f+1)
			drop = append(drop, Loss{Epoch: r.epoch, First: f, Last: f + m - 1, Reason: LossFull})
			head = f + m - 1
			k -= m
			excess -= int64(m) * per
		}
	}
	return drop, excess
}

// release takes the segments (not the active one) that hold nothing above
// head out of the index; their files go at the next checkpoint. Their
// samples' ack may not be saved yet: harmless, a deleted segment cannot
// come back.
func (d *diskStore) release(head uint64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	keep := d.segs[:0]
	for _, s := range d.segs {
		if s != d.active && s.last() <= head {
			d.gone = append(d.gone, s.path)
			continue
		}
		keep = append(keep, s)
	}
	clear(d.segs[len(keep):])
	d.segs = keep
}

func (d *diskStore) checkpoint(head uint64, mark bool) error {
	var err error
	if mark {
		err = d.saveAck(head)
	}
	d.mu.Lock()
	gone := d.gone
	d.gone = nil
	d.mu.Unlock()
	for _, p := range gone {
		if rerr := os.Remove(p); rerr != nil && !os.IsNotExist(rerr) {
			d.logErr("remove segment", rerr)
		}
	}
	return err
}

// saveAck writes the ack mark file: the decimal seq up to which everything
// is acknowledged (replaceFile).
func (d *diskStore) saveAck(head uint64) error {
	return d.replaceFile(ackFile, []byte(strconv.FormatUint(head, 10)+"\n"))
}

// replaceFile writes name in the directory through a temporary file
// (synced unless the policy is "never") renamed over the old one.
func (d *diskStore) replaceFile(name string, b []byte) error {
	path := filepath.Join(d.dir, name)
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o640)
	if err != nil {
		return err
	}
	_, err = f.Write(b)
	if err == nil && d.syncs {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	return err
}

func readSkips(path string, log *slog.Logger) []ringstore.Skip {
	var out []ringstore.Skip
	for _, l := range readRangeFile(path, "restart skips", log) {
		out = append(out, ringstore.Skip{Epoch: l.Epoch, First: l.First, Last: l.Last})
	}
	return out
}

// saveSkips replaces the skips file (one "epoch first last" line each;
// not synced: a lost skip only makes a receiver report a gap).
func (d *diskStore) saveSkips(skips []ringstore.Skip) error {
	r := make([]Loss, len(skips))
	for i, k := range skips {
		r[i] = Loss{Epoch: k.Epoch, First: k.First, Last: k.Last}
	}
	return saveRangeFile(filepath.Join(d.dir, skipFile), r)
}

// readRangeFile reads a file of "epoch first last [reason]" lines (the
// skips, the losses); a bad line is logged and ignored.
func readRangeFile(path, what string, log *slog.Logger) []Loss {
	b, err := os.ReadFile(path)
	if err != nil {
		if !os.IsNotExist(err) {
			log.Warn("spool: "+what+" unreadable", "file", path, "err", err)
		}
		return nil
	}
	var out []Loss
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) != 3 && len(f) != 4 {
			continue
		}
		e, err1 := ringstore.ParseEpoch(f[0])
		a, err2 := strconv.ParseUint(f[1], 10, 64)
		z, err3 := strconv.ParseUint(f[2], 10, 64)
		if err1 != nil || err2 != nil || err3 != nil || a > z {
			log.Warn("spool: bad line in "+what+" ignored", "file", path, "line", line)
			continue
		}
		l := Loss{Epoch: e, First: a, Last: z}
		if len(f) == 4 {
			l.Reason = f[3]
		}
		out = append(out, l)
	}
	return out
}

// saveRangeFile replaces a file of "epoch first last [reason]" lines:
// temporary file, rename, not synced.
func saveRangeFile(path string, r []Loss) error {
	var b []byte
	for _, l := range r {
		b = ringstore.AppendEpoch(b, l.Epoch)
		b = append(b, ' ')
		b = strconv.AppendUint(b, l.First, 10)
		b = append(b, ' ')
		b = strconv.AppendUint(b, l.Last, 10)
		if l.Reason != "" {
			b = append(b, ' ')
			b = append(b, l.Reason...)
		}
		b = append(b, '\n')
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o640); err != nil {
		_ = os.Remove(tmp)
		return err
	}
	return os.Rename(tmp, path)
}

// syncDir syncs a directory: its entries (a new segment) survive a power loss.
func syncDir(dir string) error {
	f, err := os.Open(dir)
	if err == nil {
		err = f.Sync()
		f.Close()
	}
	return err
}
