package history

import (
	"fmt"
	"math"
	"time"

	"edgegw/ringstore"
	"edgegw/stats"
)

// Points is one query's answer in columns (index i of each column is one
// point). Kinds:
//   - "raw": TS, Value (NaN when not good), Quality: the samples themselves;
//   - "buckets": TS (bucket start), Min, Max, Mean, Last (NaN in a gap: no
//     good poll), Good, Bad (polls); every bucket of the range is present;
//   - "health": TS, Polls (scheduled), Good (good polls), ValidRate (NaN when
//     nothing was scheduled), RTTMeanUS, RTTP99US (NaN when nothing answered).
type Points struct {
	Kind     string
	Step     time.Duration // bucket width; 0 for raw
	From, To int64         // the range asked, µs
	Bool     bool          // raw values of a bool tag (0/1)

	TS             []int64
	Value          []float64
	Quality        []ringstore.Quality
	Min, Max, Mean []float64
	Last           []float64
	Good, Bad      []uint32
	Polls          []uint32
	ValidRate      []float64
	RTTMeanUS      []float64
	RTTP99US       []float64
}

// Len is the number of points.
func (p *Points) Len() int { return len(p.TS) }

// MaxPoints is the most points one query returns.
func (s *Store) MaxPoints() int { return s.cfg.MaxPoints }

// RawWindow is how far back raw samples are kept (per tag, within MaxRAM
// for every tag together).
func (s *Store) RawWindow() time.Duration { return s.cfg.RawWindow }

// Query returns the history of one tag between from and to (Unix µs,
// inclusive). step == 0 picks for the range: the raw samples when the raw
// window holds the range in at most MaxPoints, else the finest buckets that
// give at most MaxPoints (fine buckets while RAM holds them, then coarse
// ones). A step > 0 asks for buckets of that width, rounded up to a multiple
// of the tier's step; more than MaxPoints of them is ErrTooMany.
func (s *Store) Query(device, tag string, from, to int64, step time.Duration) (*Points, error) {
	if err := s.check(from, to, step); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	sr := s.series[key{device, tag}]
	if sr == nil {
		return nil, fmt.Errorf("%w: device %q tag %q", ErrUnknown, device, tag)
	}
	if step == 0 && sr.raw.n > 0 && (from >= sr.raw.from || (sr.raw.from == sr.raw.first && to-from <= s.rawWindowUS)) {
		if p := s.rawPoints(sr, from, to); p != nil {
			return p, nil
		}
	}
	newest := max(sr.open.idx, sr.fine.head)
	plan, err := s.plan(from, to, step, newest)
	if err != nil {
		return nil, err
	}
	p := &Points{Kind: "buckets", Step: time.Duration(plan.width) * time.Microsecond, From: from, To: to}
	fine, coarse := sr.fine.reader(), sr.coarse.reader()
	for g := plan.first; g <= plan.last; g++ {
		a := newAcc()
		lo, hi := g*plan.k, g*plan.k+plan.k-1
		if plan.coarse {
			for i := max(lo, sr.coarse.oldest()); i <= min(hi, sr.coarse.head); i++ {
				if c, ok := coarse.get(i); ok {
					a.merge(c)
				}
			}
			if sr.copen.open() && sr.copen.idx >= lo && sr.copen.idx <= hi {
				a.merge(sr.copen.cell())
			}
			if sr.open.open() {
				if ci := floorDiv(sr.open.idx, s.k); ci >= lo && ci <= hi {
					a.merge(sr.open.cell())
				}
			}
		} else {
			for i := max(lo, sr.fine.oldest()); i <= min(hi, sr.fine.head); i++ {
				if c, ok := fine.get(i); ok {
					a.merge(c)
				}
			}
			if sr.open.open() && sr.open.idx >= lo && sr.open.idx <= hi {
				a.merge(sr.open.cell())
			}
		}
		p.TS = append(p.TS, g*plan.width)
		if a.good > 0 {
			p.Min, p.Max = append(p.Min, a.min), append(p.Max, a.max)
			p.Mean, p.Last = append(p.Mean, a.sum/float64(a.good)), append(p.Last, a.last)
		} else {
			nan := math.NaN()
			p.Min, p.Max, p.Mean, p.Last = append(p.Min, nan), append(p.Max, nan), append(p.Mean, nan), append(p.Last, nan)
		}
		p.Good, p.Bad = append(p.Good, sat32(a.good)), append(p.Bad, sat32(a.bad))
	}
	return p, nil
}

// Health returns one device's health buckets between from and to (no raw
// kind: the finest is one step).
func (s *Store) Health(device string, from, to int64, step time.Duration) (*Points, error) {
	if err := s.check(from, to, step); err != nil {
		return nil, err
	}
	var cur *stats.Snapshot // the device's record now: the open bucket is its change since the last tick
	if s.cfg.Devices != nil {
		for _, e := range s.cfg.Devices() {
			if e.Info.Name == device && e.Stats != nil {
				snap := e.Stats.Snapshot()
				cur = &snap
				break
			}
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	d := s.devices[device]
	if d == nil {
		return nil, fmt.Errorf("%w: device %q", ErrUnknown, device)
	}
	var open hcell
	openIdx := int64(noBucket)
	if cur != nil && d.seen && s.lastTickIdx != noBucket {
		open, openIdx = healthDelta(d.prev, *cur), s.lastTickIdx
	}
	plan, err := s.plan(from, to, step, max(d.fine.head, openIdx))
	if err != nil {
		return nil, err
	}
	p := &Points{Kind: "health", Step: time.Duration(plan.width) * time.Microsecond, From: from, To: to}
	fine, coarse := d.fine.reader(), d.coarse.reader()
	for g := plan.first; g <= plan.last; g++ {
		a := newHacc()
		lo, hi := g*plan.k, g*plan.k+plan.k-1
		t := fine
		if plan.coarse {
			t = coarse
			if d.copen.open() && d.copen.idx >= lo && d.copen.idx <= hi {
				a.merge(d.copen.cell())
			}
			if openIdx != noBucket && floorDiv(openIdx, s.k) >= lo && floorDiv(openIdx, s.k) <= hi {
				a.merge(open)
			}
		} else if openIdx != noBucket && openIdx >= lo && openIdx <= hi {
			a.merge(open)
		}
		for i := max(lo, t.t.oldest()); i <= min(hi, t.t.head); i++ {
			if c, ok := t.get(i); ok {
				a.merge(c)
			}
		}
		c := a.cell()
		p.TS = append(p.TS, g*plan.width)
		p.Polls, p.Good = append(p.Polls, c.sched), append(p.Good, c.good)
		vr, mean, p99 := math.NaN(), math.NaN(), math.NaN()
		if c.sched > 0 {
			vr = min(1, float64(c.good)/float64(c.sched))
		}
		if c.rttMeanUS > 0 {
			mean, p99 = float64(c.rttMeanUS), float64(c.rttP99US)
		}
		p.ValidRate, p.RTTMeanUS, p.RTTP99US = append(p.ValidRate, vr), append(p.RTTMeanUS, mean), append(p.RTTP99US, p99)
	}
	return p, nil
}

func (s *Store) check(from, to int64, step time.Duration) error {
	if from > to {
		return fmt.Errorf("%w: from %d > to %d", ErrRange, from, to)
	}
	if step < 0 || (step > 0 && step < s.cfg.Step) {
		return fmt.Errorf("%w: step %v < %v", ErrBadStep, step, s.cfg.Step)
	}
	return nil
}

// plan is which tier and grouping a bucket query uses.
type plan struct {
	coarse      bool
	k           int64 // tier buckets per point
	width       int64 // µs per point
	first, last int64 // point indices (start / width)
}

func (s *Store) plan(from, to int64, step time.Duration, newestFine int64) (plan, error) {
	// Fine buckets while RAM still holds fine buckets back to from.
	coarse := step >= s.cfg.CoarseStep ||
		(newestFine != noBucket && floorDiv(from, s.step) <= newestFine-int64(s.nFine))
	mk := func(coarse bool, k int64) plan {
		w := s.step
		if coarse {
			w = s.cstep
		}
		p := plan{coarse: coarse, k: k, width: w * k}
		p.first, p.last = floorDiv(from, p.width), floorDiv(to, p.width)
		return p
	}
	tierStep := s.step
	if coarse {
		tierStep = s.cstep
	}
	if step > 0 {
		us := step.Microseconds()
		p := mk(coarse, (us+tierStep-1)/tierStep)
		if n := p.last - p.first + 1; n > int64(s.cfg.MaxPoints) {
			return p, fmt.Errorf("%w: %d buckets of %v from %d to %d > %d; ask for a larger step",
				ErrTooMany, n, time.Duration(p.width)*time.Microsecond, from, to, s.cfg.MaxPoints)
		}
		return p, nil
	}
	p := mk(coarse, 1)
	for n := p.last - p.first + 1; n > int64(s.cfg.MaxPoints); n = p.last - p.first + 1 {
		k := p.k * ((n + int64(s.cfg.MaxPoints) - 1) / int64(s.cfg.MaxPoints))
		if !p.coarse && k*s.step >= s.cstep {
			p = mk(true, max(1, k*s.step/s.cstep))
			continue
		}
		p = mk(p.coarse, k)
	}
	return p, nil
}

// rawPoints returns the raw samples in [from, to], or nil when there are
// more than MaxPoints of them. It decodes one chunk at a time into the
// answer: the points from the first at or after from up to the first after
// to, in the order they came.
func (s *Store) rawPoints(sr *series, from, to int64) *Points {
	it := sr.raw.iter()
	it.skipBefore(from)
	p := &Points{Kind: "raw", From: from, To: to, Bool: sr.isBool}
	found := false
	for {
		ts, v, q, ok := it.next()
		if !ok || (found || ts >= from) && ts > to {
			break
		}
		if !found && ts < from {
			continue
		}
		found = true
		if p.Len() == s.cfg.MaxPoints {
			return nil
		}
		if q != ringstore.Good {
			v = math.NaN()
		}
		p.TS, p.Value, p.Quality = append(p.TS, ts), append(p.Value, v), append(p.Quality, q)
	}
	if it.err != nil {
		s.corrupt.Add(1)
	}
	return p
}
