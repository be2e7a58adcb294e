package history

import (
	"slices"
	"unsafe"

	"edgegw/ringstore"
)

// chunk is a sealed run of raw points (see chunk.go for the layout).
type chunk struct {
	b        []byte // the encoded bytes (capacity within 1/16 of them)
	n        uint16
	boolForm bool
	dead     bool  // dropped (window or budget): the budget queue skips it
	last     int64 // the last point's time
	maxTS    int64 // the latest time in the chunk
	owner    *series
}

// chunkOverhead is what a sealed chunk costs besides its bytes: the struct,
// its pointer in the series and its entry in the budget queue.
const chunkOverhead = int64(unsafe.Sizeof(chunk{})) + 8 + int64(unsafe.Sizeof(budgetEntry{}))

func (c *chunk) size() int64 { return int64(cap(c.b)) + chunkOverhead }

// raw is one tag's recent points: sealed chunks, oldest first, and the head
// chunk being appended.
type raw struct {
	sealed      []*chunk
	head        bitw
	enc         enc
	hfirst      int64 // the head's first point's time
	hmax        int64 // the head's latest time
	n           int   // points held (sealed and head)
	maxPoints   int   // 0: no per-tag bound
	spanUS      int64
	headCap     int64 // cap(head.b) as last counted in the store's bytes
	from, first int64 // as before: complete from `from`; from == first while nothing was dropped
	started     bool
}

// budgetEntry is one sealed chunk in the order they were sealed: the RAM
// budget drops from the front (the oldest first).
type budgetEntry struct{ c *chunk }

// rawAdd appends a point to sr's raw window: drops chunks whose points are
// all older than keepFrom, seals the head when full, and keeps the store's
// byte count. Called with mu held.
func (s *Store) rawAdd(sr *series, ts int64, v float64, q ringstore.Quality, keepFrom int64) {
	r := &sr.raw
	for len(r.sealed) > 0 && r.sealed[0].maxTS < keepFrom {
		s.dropOldest(sr, false)
	}
	if r.enc.n > 0 && r.hmax < keepFrom && len(r.sealed) == 0 {
		s.dropHead(sr)
	}
	if r.enc.n > 0 && (r.enc.n >= r.chunkPoints() || len(r.head.b) >= chunkMaxBytes ||
		ts-r.hfirst >= r.spanUS || ts-r.hfirst < -r.spanUS || (r.enc.boolForm && !fitsBool(v))) {
		s.seal(sr)
	}
	if !r.started {
		r.from, r.first, r.started = ts, ts, true
	}
	if r.enc.n == 0 {
		r.enc = enc{boolForm: sr.isBool && fitsBool(v)}
		r.hfirst, r.hmax = ts, ts
	}
	r.enc.appendPoint(&r.head, ts, v, q)
	r.hmax = max(r.hmax, ts)
	r.n++
	if c := int64(cap(r.head.b)); c != r.headCap {
		s.rawBytes += c - r.headCap
		r.headCap = c
	}
	if r.maxPoints > 0 {
		for r.n > r.maxPoints && len(r.sealed) > 0 {
			s.dropOldest(sr, false)
		}
	}
	for s.rawBytes > s.cfg.MaxRAM && s.evictOne() {
	}
}

// chunkPoints is where the head is sealed: chunkMaxPoints, or a quarter of
// a per-tag bound, so that dropping a whole chunk keeps most of the bound.
func (r *raw) chunkPoints() int {
	if r.maxPoints > 0 {
		return min(chunkMaxPoints, max(1, r.maxPoints/4))
	}
	return chunkMaxPoints
}

// seal moves the head into a sealed chunk and queues it for the budget. The
// chunk takes the head's buffer when it is nearly full (else a copy of the
// exact size); the next head starts with room for a chunk like this one.
func (s *Store) seal(sr *series) {
	r := &sr.raw
	b := r.head.b
	if cap(b)-len(b) > len(b)/16 {
		b = slices.Clone(b)
		if cap(b) > len(b) {
			b = b[:len(b):len(b)]
		}
	}
	c := &chunk{b: b, n: uint16(r.enc.n), boolForm: r.enc.boolForm, last: r.enc.t, maxTS: r.hmax, owner: sr}
	r.sealed = append(r.sealed, c)
	s.budget = append(s.budget, budgetEntry{c})
	s.rawBytes += c.size() - r.headCap
	r.head.b, r.head.nbits, r.headCap = make([]byte, 0, len(b)+len(b)/32+1), 0, int64(len(b)+len(b)/32+1)
	s.rawBytes += r.headCap
	r.enc = enc{}
}

// dropOldest removes sr's oldest sealed chunk; evicted: for the budget.
func (s *Store) dropOldest(sr *series, evicted bool) {
	r := &sr.raw
	c := r.sealed[0]
	r.sealed[0] = nil
	r.sealed = r.sealed[1:]
	if len(r.sealed) == 0 {
		r.sealed = nil // let the backing array go
	}
	s.rawBytes -= c.size()
	c.dead, c.b, c.owner = true, nil, nil // the queue entry, if any, goes at the next compaction
	r.n -= int(c.n)
	r.from = c.last + 1
	if !evicted {
		s.budgetDead++
		s.compactBudget()
	} else {
		s.evicted.Add(1)
		s.evictedPoints.Add(uint64(c.n))
	}
}

// dropHead empties sr's head chunk (all its points are out of the window).
func (s *Store) dropHead(sr *series) {
	r := &sr.raw
	r.n -= r.enc.n
	r.from = r.enc.t + 1
	r.head.b, r.head.nbits = r.head.b[:0], 0
	r.enc = enc{}
}

// evictOne drops the oldest live sealed chunk of any tag for the RAM budget;
// false when none is left (the heads alone are over the budget).
func (s *Store) evictOne() bool {
	for s.bhead < len(s.budget) {
		e := s.budget[s.bhead]
		s.budget[s.bhead] = budgetEntry{}
		s.bhead++
		if e.c.dead {
			s.budgetDead--
			continue
		}
		sr := e.c.owner
		if len(sr.raw.sealed) == 0 || sr.raw.sealed[0] != e.c {
			continue // cannot happen: a tag's chunks are queued in order
		}
		s.dropOldest(sr, true)
		s.compactBudget()
		return true
	}
	s.compactBudget()
	return false
}

// compactBudget keeps the queue's length within twice its live chunks (and
// 64): the consumed front and the chunks the window dropped go.
func (s *Store) compactBudget() {
	if waste := s.bhead + s.budgetDead; waste > 64 && waste*2 > len(s.budget) {
		live := s.budget[:0]
		for _, e := range s.budget[s.bhead:] {
			if !e.c.dead {
				live = append(live, e)
			}
		}
		clear(s.budget[len(live):])
		s.budget, s.bhead, s.budgetDead = live, 0, 0
	}
}

// rawIter walks a tag's raw points oldest first, one chunk decoded at a time.
type rawIter struct {
	r   *raw
	i   int // next sealed chunk; len(sealed): the head
	d   dec
	in  bool // d is set
	end bool
	err error // a chunk that did not decode (counted by the caller)
}

func (r *raw) iter() rawIter { return rawIter{r: r} }

// skipBefore moves past whole sealed chunks whose points are all before t
// and that are followed by one not so (the scan below then starts there).
func (it *rawIter) skipBefore(t int64) {
	for it.i < len(it.r.sealed) && !it.in && it.r.sealed[it.i].maxTS < t {
		it.i++
	}
}

func (it *rawIter) next() (int64, float64, ringstore.Quality, bool) {
	for !it.end {
		if !it.in {
			switch {
			case it.i < len(it.r.sealed):
				c := it.r.sealed[it.i]
				it.d = newDec(c.b, int(c.n), c.boolForm)
			case it.i == len(it.r.sealed):
				it.d = newDec(it.r.head.b, it.r.enc.n, it.r.enc.boolForm)
			default:
				it.end = true
				return 0, 0, 0, false
			}
			it.i++
			it.in = true
		}
		ts, v, q, ok, err := it.d.next()
		if err != nil {
			it.err = err // chunks are written by enc only: a bug; the rest of the chunk is skipped
		}
		if ok {
			return ts, v, q, true
		}
		it.in = false
	}
	return 0, 0, 0, false
}
