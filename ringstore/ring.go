package ringstore

import (
	"errors"
	"fmt"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"unsafe"
)

// DefaultRingSize is the ring's capacity in samples when the config names none.
const DefaultRingSize = 200

// Snapshot is the latest sample of every tag ever appended, sorted by device
// then tag, and the sequence number it is current to. Immutable once
// published: readers may keep and encode it without any lock.
type Snapshot struct {
	Seq    uint64
	Epoch  uint64 // the epoch of Seq (see Sequence)
	Latest []Sample
}

// Result is what Since returns.
type Result struct {
	// Samples newer than the caller's sequence, oldest first (appended to dst).
	Samples []Sample
	// Reset: the caller's sequence fell out of the ring, or is ahead of the
	// ring (the gateway restarted). Samples is empty; use Snapshot instead.
	Reset bool
	// Seq is the ring's last sequence number at the time of the call, and
	// Epoch its epoch.
	Seq   uint64
	Epoch uint64
	// Wait is closed by the first Append after this call. Taken under the
	// same lock as the check, so waiting on it cannot miss an append.
	Wait <-chan struct{}
}

// slot is one sample as the ring keeps it: 24 bytes on every target and no
// pointers, so the garbage collector never scans the ring (a Sample is 80
// bytes on 64-bit targets, with three pointers). What a Sample has beside
// is found elsewhere: its Seq from the slot's position (the ring's samples
// are consecutive), its Device and Tag from the tag's entry in latest (tag
// is that index, stable: latest only grows), its Epoch from epochs, and a
// string tag's Text from texts.
type slot struct {
	ts      int64
	value   float64
	tag     uint32
	bool    bool
	quality Quality
	kind    Kind
}

// SlotBytes is what one sample costs in the ring (its capacity is
// SlotBytes × Cap bytes, whatever the names' lengths).
const SlotBytes = int(unsafe.Sizeof(slot{}))

// epochFrom says that the ring's samples from seq first on were numbered in
// epoch (until the next entry's first).
type epochFrom struct{ first, epoch uint64 }

// Ring keeps the last N samples and the latest sample of every tag.
// Safe for concurrent use: Append from any number of pollers, readers anywhere.
type Ring struct {
	seq       *Sequence
	consumers []Consumer // see every appended batch (Consume): HandOff under the lock, After after it

	mu      sync.Mutex
	buf     []slot          // circular, len == capacity once full
	start   int             // index of the oldest sample when full
	last    uint64          // seq of the newest sample in buf
	epoch   uint64          // epoch of last
	epochs  []epochFrom     // the epochs of the samples in buf, oldest first (one unless the sequence changed epoch)
	texts   map[int]*string // a string tag's Text, by position in buf
	wake    chan struct{}
	handed  bool        // wake was handed out by Since: the next append closes it and makes another
	latest  []Sample    // latest sample per tag, in first-seen order
	index   map[key]int // (device, tag) -> index in latest
	snap    atomic.Pointer[Snapshot]
	dirty   atomic.Bool   // latest changed since snap was built
	appends atomic.Uint64 // batches appended
}

type key struct{ device, tag string }

// NewRing returns a ring of size samples (DefaultRingSize if size <= 0)
// taking its numbers from seq.
func NewRing(size int, seq *Sequence) *Ring {
	if size <= 0 {
		size = DefaultRingSize
	}
	r := &Ring{
		seq:   seq,
		buf:   make([]slot, 0, size),
		texts: make(map[int]*string),
		wake:  make(chan struct{}),
		index: make(map[key]int),
		last:  seq.Last(),
		epoch: seq.Epoch(),
	}
	r.snap.Store(&Snapshot{Seq: r.last, Epoch: r.epoch})
	return r
}

// A Consumer sees every batch the ring numbers, once, in sequence order.
// Both functions are optional.
//   - HandOff runs while the ring's lock is held, right after the batch is
//     numbered, so consumers see batches in sequence order; it must not
//     block nor do I/O (the durable queue's hand-off, spool.Queue.HandOff).
//   - After runs once the lock is released, in the appender's goroutine,
//     before Append returns, with the batch and its last seq (the queue's
//     disk write, spool.Queue.Persist; the history's Add): a poll goes on
//     only once its consumers have it, while other pollers and every reader
//     go on without waiting for them.
type Consumer struct {
	Name    string // for errors and the README's list: "queue", "history", …
	HandOff func(batch []Sample)
	After   func(batch []Sample, last uint64)
}

// Consume adds c to the ring's consumers, after those added before it: each
// sees every batch, in the order they were added. A second consumer of the
// same name is refused, so none can silently replace another. Add every
// consumer before the first Append (they are read without the lock).
func (r *Ring) Consume(c Consumer) error {
	if c.Name == "" {
		return errors.New("ringstore: a consumer needs a name")
	}
	for _, o := range r.consumers {
		if o.Name == c.Name {
			return fmt.Errorf("ringstore: consumer %q added twice", c.Name)
		}
	}
	r.consumers = append(r.consumers, c)
	return nil
}

// Append numbers the batch (one poll of one device), stores it, updates the
// latest values and wakes every waiter. It returns the first and last
// sequence numbers given. The batch's Seq fields are overwritten in place.
func (r *Ring) Append(batch []Sample) (first, last uint64, err error) {
	if len(batch) == 0 {
		return 0, 0, nil
	}
	first, last = r.append(batch)
	for i := range r.consumers {
		if f := r.consumers[i].After; f != nil {
			f(batch, last)
		}
	}
	return first, last, nil
}

func (r *Ring) append(batch []Sample) (first, last uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	first, epoch := r.seq.ReserveEpoch(len(batch))
	r.noteEpoch(first, first+uint64(len(batch))-1, epoch)
	j := -1
	for i := range batch {
		batch[i].Seq = first + uint64(i)
		batch[i].Epoch = epoch
		j = r.keep(&batch[i], j)
		r.push(&batch[i], j)
	}
	last = first + uint64(len(batch)) - 1
	r.last, r.epoch = last, epoch
	r.dirty.Store(true)
	r.appends.Add(1)
	for i := range r.consumers {
		if f := r.consumers[i].HandOff; f != nil {
			f(batch)
		}
	}
	if r.handed { // no one can wait on a channel never handed out: no allocation per append then
		close(r.wake)
		r.wake = make(chan struct{})
		r.handed = false
	}
	return first, last
}

// keep makes s the latest sample of its tag and returns the tag's index in
// latest (added when new). prev is the index of the batch's previous sample
// (-1 for the first): a device lists its tags in the same order every poll,
// and latest holds them in the order first seen, so the entry after prev is
// tried before the map (whose look-up hashes both names, a cache miss a
// sample on a fleet).
func (r *Ring) keep(s *Sample, prev int) int {
	if n := prev + 1; prev >= 0 && n < len(r.latest) && r.latest[n].Tag == s.Tag && r.latest[n].Device == s.Device {
		r.latest[n] = *s
		return n
	}
	k := key{s.Device, s.Tag}
	if j, ok := r.index[k]; ok {
		r.latest[j] = *s
		return j
	}
	j := len(r.latest)
	r.index[k] = j
	r.latest = append(r.latest, *s)
	return j
}

// noteEpoch records that the batch first..last is numbered in epoch, and
// forgets the epochs of samples that leave the ring with it.
func (r *Ring) noteEpoch(first, last, epoch uint64) {
	if n := len(r.epochs); n == 0 || r.epochs[n-1].epoch != epoch {
		r.epochs = append(r.epochs, epochFrom{first: first, epoch: epoch})
	}
	if len(r.epochs) == 1 {
		return
	}
	// No sample older than this one is left once the batch is in (the ring
	// holds at most cap samples ending at last).
	oldest := last - min(uint64(cap(r.buf)), last) + 1
	k := 0
	for k+1 < len(r.epochs) && r.epochs[k+1].first <= oldest {
		k++
	}
	if k > 0 {
		r.epochs = append(r.epochs[:0], r.epochs[k:]...)
	}
}

// push stores s, the latest entry j, in the next slot.
func (r *Ring) push(s *Sample, j int) {
	sl := slot{ts: s.TS, value: s.Value, tag: uint32(j), bool: s.Bool, quality: s.Quality, kind: s.Kind}
	p := len(r.buf)
	if p < cap(r.buf) {
		r.buf = append(r.buf, sl)
	} else {
		p = r.start
		if r.buf[p].kind == KindString {
			delete(r.texts, p)
		}
		r.buf[p] = sl
		r.start = (r.start + 1) % len(r.buf)
	}
	if s.Kind == KindString && s.Text != nil {
		r.texts[p] = s.Text
	}
}

// Epoch is the epoch of Seq.
func (r *Ring) Epoch() uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.epoch
}

// Seq is the last sequence number appended (or, before the first append,
// the last one handed out before this process started).
func (r *Ring) Seq() uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.last
}

// Cap is the ring's capacity in samples.
func (r *Ring) Cap() int { return cap(r.buf) }

// Appends is the number of batches appended since start.
func (r *Ring) Appends() uint64 { return r.appends.Load() }

// Since returns every sample with seq > after still in the ring, appended to
// dst, or Reset when after is older than the oldest sample kept or newer than
// the ring's last. When nothing is newer, Samples is empty and Wait is the
// channel to wait on.
func (r *Ring) Since(after uint64, dst []Sample) Result {
	return r.SinceN(after, 0, dst)
}

// SinceN is Since returning at most n samples (the oldest ones; n <= 0: all
// of them): a reader that serves a long tail in bounded chunks copies one
// chunk at a time.
func (r *Ring) SinceN(after uint64, n int, dst []Sample) Result {
	r.mu.Lock()
	defer r.mu.Unlock()
	res := Result{Samples: dst, Seq: r.last, Epoch: r.epoch, Wait: r.wake}
	r.handed = true
	if after > r.last {
		res.Reset = true
		return res
	}
	size := len(r.buf)
	if after == r.last {
		return res
	}
	oldest := r.last - uint64(size) + 1 // last+1 when empty (after a restart)
	if after+1 < oldest {
		res.Reset = true
		return res
	}
	skip := int(after + 1 - oldest) // samples at or below after
	end := size
	if n > 0 && skip+n < end {
		end = skip + n
	}
	// Each slot is expanded in place into the caller's buffer: its Seq from
	// its position, its names from latest, its epoch from epochs.
	n0 := len(res.Samples)
	res.Samples = slices.Grow(res.Samples, end-skip)[:n0+end-skip]
	out := res.Samples[n0:]
	e := 0
	p := r.start + skip
	if p >= size {
		p -= size
	}
	for i := range out {
		seq := oldest + uint64(skip+i)
		for e+1 < len(r.epochs) && r.epochs[e+1].first <= seq {
			e++
		}
		sl := &r.buf[p]
		l := &r.latest[sl.tag]
		// Field by field: a Sample literal stored through d is built aside
		// and copied, at 3 times the cost.
		d := &out[i]
		d.Seq, d.Epoch, d.TS, d.Value = seq, r.epochs[e].epoch, sl.ts, sl.value
		d.Device, d.Tag = l.Device, l.Tag
		d.Bool, d.Quality, d.Kind = sl.bool, sl.quality, sl.kind
		d.Text = nil
		if sl.kind == KindString {
			d.Text = r.texts[p]
		}
		if p++; p == size {
			p = 0
		}
	}
	return res
}

// Snapshot returns the latest value of every tag. It is rebuilt at most once
// per append, whatever the number of readers.
func (r *Ring) Snapshot() *Snapshot {
	if !r.dirty.Load() {
		return r.snap.Load()
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.dirty.Load() {
		return r.snap.Load()
	}
	latest := make([]Sample, len(r.latest))
	copy(latest, r.latest)
	sort.Slice(latest, func(i, j int) bool {
		if latest[i].Device != latest[j].Device {
			return latest[i].Device < latest[j].Device
		}
		return latest[i].Tag < latest[j].Tag
	})
	s := &Snapshot{Seq: r.last, Epoch: r.epoch, Latest: latest}
	r.snap.Store(s)
	r.dirty.Store(false)
	return s
}
