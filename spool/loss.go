package spool

import (
	"encoding/binary"
	"errors"
	"hash/crc32"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
)

// Loss reasons: why seqs that were handed to samples will never be sent.
const (
	LossCrash     = "crash"     // not in the queue after a restart: a torn or corrupt tail cut, a corrupt record skipped, or held only in memory (disk failing) when the process died
	LossFull      = "full"      // dropped at the MaxBytes bound (oldest first)
	LossUnwritten = "unwritten" // not writable at shutdown (disk failing), or handed off after Close
)

// maxLosses bounds the loss ranges kept; beyond it the oldest is forgotten
// (counted in Stats.LossForgotten and logged: a receiver then reports that
// hole as a plain gap, without the reason).
const maxLosses = 4096

// Loss is a range of seqs of one epoch that were handed to samples and
// then lost (never to be sent), with the reason: what a receiver reports
// as a gap, counted, instead of a silent hole.
type Loss struct {
	Epoch       uint64
	First, Last uint64
	Reason      string
}

// Files of the loss accounting.
const (
	lossFile   = "queue.loss"   // loss ranges not yet acknowledged: "epoch first last reason" lines
	handedFile = "queue.handed" // the highest seq handed to the queue: seq, epoch (uint64 LE), CRC-32C
)

// addLossLocked records a loss (mu held), merging it into the newest range
// when it continues it with the same epoch and reason.
func (q *Queue) addLossLocked(l Loss) {
	q.lost += l.Last - l.First + 1
	q.lossDirty = true
	if k := len(q.losses); k > 0 {
		p := &q.losses[k-1]
		if p.Epoch == l.Epoch && p.Reason == l.Reason && p.Last+1 == l.First {
			p.Last = l.Last
			return
		}
	}
	q.losses = append(q.losses, l)
	if len(q.losses) > maxLosses {
		f := q.losses[0]
		q.lossForgot += f.Last - f.First + 1
		q.log.Error("spool: too many loss ranges; the oldest is forgotten (a receiver will report it as a gap without its reason)",
			"first", f.First, "last", f.Last, "reason", f.Reason)
		q.losses = q.losses[1:]
	}
}

// Losses returns the loss ranges whose end lands in [after, last): the ones
// a batch covering (after, last] crosses, of any epoch (seqs increase
// across epochs), oldest first.
func (q *Queue) Losses(after, last uint64) []Loss {
	q.mu.Lock()
	defer q.mu.Unlock()
	var out []Loss
	for _, l := range q.losses {
		if l.Last >= after && l.Last < last {
			out = append(out, l)
		}
	}
	return out
}

// pruneLosses forgets the losses a batch acknowledged has crossed (their
// end below the saved ack mark) and saves the list when it changed (fmu
// held).
func (q *Queue) pruneLosses(head uint64) {
	q.mu.Lock()
	keep := q.losses[:0]
	for _, l := range q.losses {
		if l.Last >= head {
			keep = append(keep, l)
		}
	}
	if len(keep) < len(q.losses) {
		q.lossDirty = true
	}
	clear(q.losses[len(keep):])
	q.losses = keep
	dirty := q.lossDirty
	q.lossDirty = false
	losses := append([]Loss(nil), keep...)
	q.mu.Unlock()
	if dirty {
		if err := q.st.saveLosses(losses); err != nil {
			q.logErr("save loss ranges", err)
			q.mu.Lock()
			q.lossDirty = true
			q.mu.Unlock()
		}
	}
}

// saveHandedLocked writes the highest seq handed off, when it moved, into
// the handed file (one pwrite into the page cache: a SIGKILL a moment
// later keeps it; synced with the segment). wmu held.
func (q *Queue) saveHanded() {
	q.mu.Lock()
	seq, epoch, first := q.handed, q.handedEpoch, q.runFirst
	q.mu.Unlock()
	if seq <= q.handedSaved {
		return
	}
	if err := q.st.saveHanded(seq, epoch, first); err == nil {
		q.handedSaved = seq
	}
}

func readLosses(path string, log *slog.Logger) []Loss {
	return readRangeFile(path, "loss ranges", log)
}

// saveLosses replaces the loss file (not synced: after a power cut the
// handed mark still shows the hole, see recoverLosses).
func (d *diskStore) saveLosses(losses []Loss) error {
	return saveRangeFile(filepath.Join(d.dir, lossFile), losses)
}

// saveHanded writes seq, epoch and this run's first seq at offset 0 of
// the handed file, which stays open: 28 bytes, one pwrite.
func (d *diskStore) saveHanded(seq, epoch, first uint64) error {
	d.hmu.Lock()
	defer d.hmu.Unlock()
	if d.hf == nil {
		f, err := os.OpenFile(filepath.Join(d.dir, handedFile), os.O_RDWR|os.O_CREATE, 0o640)
		if err != nil {
			return err
		}
		d.hf = f
	}
	var b [28]byte
	binary.LittleEndian.PutUint64(b[0:], seq)
	binary.LittleEndian.PutUint64(b[8:], epoch)
	binary.LittleEndian.PutUint64(b[16:], first)
	binary.LittleEndian.PutUint32(b[24:], crc32.Checksum(b[:24], castagnoli))
	if _, err := d.hf.WriteAt(b[:], 0); err != nil {
		d.logErr("save handed mark", err)
		return err
	}
	d.hdirty = true
	return nil
}

// syncHanded syncs the handed file when it was written since the last sync.
func (d *diskStore) syncHanded() {
	d.hmu.Lock()
	defer d.hmu.Unlock()
	if d.hf == nil || !d.hdirty {
		return
	}
	if err := d.hf.Sync(); err != nil {
		d.logErr("sync handed mark", err)
		return
	}
	d.hdirty = false
}

func (d *diskStore) closeHanded() {
	d.hmu.Lock()
	defer d.hmu.Unlock()
	if d.hf != nil {
		if d.hdirty && d.syncs {
			_ = d.hf.Sync()
		}
		d.hf.Close()
		d.hf, d.hdirty = nil, false
	}
}

var errHandedCorrupt = errors.New("checksum failed")

// readHanded reads the handed file: ok false when there is none (a fresh
// directory, or one written by an older version).
func readHanded(path string) (seq, epoch, first uint64, ok bool, err error) {
	f, err := os.Open(path)
	if os.IsNotExist(err) {
		return 0, 0, 0, false, nil
	}
	if err != nil {
		return 0, 0, 0, false, err
	}
	defer f.Close()
	var b [28]byte
	if _, err := io.ReadFull(f, b[:]); err != nil {
		return 0, 0, 0, false, err
	}
	if crc32.Checksum(b[:24], castagnoli) != binary.LittleEndian.Uint32(b[24:]) {
		return 0, 0, 0, false, errHandedCorrupt
	}
	return binary.LittleEndian.Uint64(b[0:]), binary.LittleEndian.Uint64(b[8:]), binary.LittleEndian.Uint64(b[16:]), true, nil
}

// cut is a segment tail cut at open, for its log line once the samples it
// held are known.
type cut struct {
	path       string
	off, bytes int64
	why        string
	after      uint64 // the last seq kept before the cut (the segment's first - 1: none)
}

// recoverLosses finds, at open, the seqs that were handed to the queue
// (up to the handed mark) and are in no segment, no restart skip and no
// loss range already: holes left by torn tails, corrupt records and
// samples that were only in memory when the process died. Each becomes a
// Loss (LossCrash) of the epoch of the record before it (the handed mark's
// epoch when none), and every cut is logged with the samples it removed.
func (d *diskStore) recoverLosses(rec *recovered, cuts []cut) {
	type span struct {
		first, last, epoch uint64
	}
	var held []span
	for _, s := range d.segs {
		for _, r := range s.runs {
			held = append(held, span(r))
		}
	}
	for _, k := range rec.skips {
		held = append(held, span{k.First, k.Last, 0})
	}
	for _, l := range rec.losses {
		held = append(held, span{l.First, l.Last, 0})
	}
	sort.Slice(held, func(i, j int) bool { return held[i].first < held[j].first })
	// Everything <= top is accounted for: the ack mark, or below the
	// oldest seq this queue can have held (the oldest segment's name, the
	// previous run's first hand-off).
	top := rec.head
	if top == 0 {
		start := rec.handedFirst
		if rec.minSeg > 0 && (start == 0 || rec.minSeg < start) {
			start = rec.minSeg
		}
		if start == 0 {
			return
		}
		top = start - 1
	}
	epoch := rec.handedEpoch
	prevEpoch := uint64(0)
	var found []Loss
	hole := func(a, b uint64) {
		e := prevEpoch
		if e == 0 {
			e = epoch
		}
		found = append(found, Loss{Epoch: e, First: a, Last: b, Reason: LossCrash})
	}
	for _, h := range held {
		if h.last <= top {
			if h.epoch != 0 {
				prevEpoch = h.epoch
			}
			continue
		}
		if h.first > top+1 {
			hole(top+1, h.first-1)
		}
		top = max(top, h.last)
		if h.epoch != 0 {
			prevEpoch = h.epoch
		}
	}
	if rec.handed > top {
		hole(top+1, rec.handed)
	}
	rec.found = found
	for _, c := range cuts {
		var n uint64
		first, last := uint64(0), uint64(0)
		for _, l := range found {
			if l.First == c.after+1 {
				n, first, last = l.Last-l.First+1, l.First, l.Last
			}
		}
		if rec.handedOK {
			d.log.Warn("spool: cut segment tail", "file", c.path, "offset", c.off, "samples", n, "first", first, "last", last,
				"bytes", c.bytes, "why", c.why)
		} else {
			d.log.Warn("spool: cut segment tail (samples unknown: no handed mark)", "file", c.path, "offset", c.off,
				"bytes", c.bytes, "why", c.why)
		}
	}
}
