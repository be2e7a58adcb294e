package ringstore

import (
	"errors"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
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

// Ring keeps the last N samples and the latest sample of every tag.
// Safe for concurrent use: Append from any number of pollers, readers anywhere.
type Ring struct {
	seq       *Sequence
	consumers []Consumer // see every appended batch (Consume): HandOff under the lock, After after it

	mu      sync.Mutex
	buf     []Sample // circular, len == capacity once full
	start   int      // index of the oldest sample when full
	last    uint64   // seq of the newest sample in buf
	epoch   uint64   // epoch of last
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
		buf:   make([]Sample, 0, size),
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
	for i := range batch {
		batch[i].Seq = first + uint64(i)
		batch[i].Epoch = epoch
		r.push(batch[i])
		k := key{batch[i].Device, batch[i].Tag}
		if j, ok := r.index[k]; ok {
			r.latest[j] = batch[i]
		} else {
			r.index[k] = len(r.latest)
			r.latest = append(r.latest, batch[i])
		}
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

func (r *Ring) push(s Sample) {
	if len(r.buf) < cap(r.buf) {
		r.buf = append(r.buf, s)
		return
	}
	r.buf[r.start] = s
	r.start = (r.start + 1) % len(r.buf)
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
	for i := skip; i < end; i++ {
		res.Samples = append(res.Samples, r.buf[(r.start+i)%size])
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
