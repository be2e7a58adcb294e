package web

import (
	"context"
	"net/http"
	"strconv"
	"sync"
	"time"

	"edgegw/ringstore"
	"edgegw/wire"
)

// The polling endpoints' replies are wire's (AppendShortPoll,
// AppendLongPoll; layouts in package wire's comment). Besides them:
//
//	400 {"error":"query parameter lastSequence: \"x\" is not a non-negative integer"}
//	503 {"error":"too many longPolling clients"}                               with Retry-After: 1
//	429 {"error":"too many poll requests from 192.0.2.7; retry in 1s"}         with Retry-After (ratelimit.go)
//
// A client passes the returned seq as the next lastSequence. epoch names the
// numbering seq belongs to: when it changes, the gateway's numbering
// restarted; start again from lastSequence=0.

// encodedSnapshot caches the shortPolling body of one immutable Snapshot.
type encodedSnapshot struct {
	snap *ringstore.Snapshot
	body []byte
}

// Pooled buffers start small (a long poll's reply is a few samples) and
// grow on demand; one that grew past maxPooledBuf is left to the GC, so the
// pools hold what the usual replies need, not the largest one ever written.
var (
	bufPool     = sync.Pool{New: func() any { b := make([]byte, 0, 1<<10); return &b }}
	samplesPool = sync.Pool{New: func() any { s := make([]ringstore.Sample, 0, 16); return &s }}
)

const (
	maxPooledBuf     = 64 << 10
	maxPooledSamples = 1024
)

func putBody(p *[]byte) {
	if cap(*p) <= maxPooledBuf {
		bufPool.Put(p)
	}
}

func putSampleBuf(p *[]ringstore.Sample) {
	if cap(*p) <= maxPooledSamples {
		samplesPool.Put(p)
	}
}

// shortBody returns the shortPolling body for the ring's current snapshot,
// encoding it once per snapshot whatever the number of readers.
func (s *Server) shortBody() []byte {
	snap := s.cfg.Ring.Snapshot()
	if e := s.short.Load(); e != nil && e.snap == snap {
		return e.body
	}
	s.shortMu.Lock()
	defer s.shortMu.Unlock()
	if e := s.short.Load(); e != nil && e.snap == snap {
		return e.body
	}
	b := wire.AppendShortPoll(make([]byte, 0, 32+len(snap.Latest)*112), snap.Seq, snap.Epoch, snap.Latest)
	b = append(b, '\n')
	s.short.Store(&encodedSnapshot{snap: snap, body: b})
	return b
}

func (s *Server) handleShort(w http.ResponseWriter, r *http.Request) {
	if !s.acquire(w, mShort) {
		return
	}
	defer s.release(mShort)
	writeJSON(w, http.StatusOK, s.shortBody())
}

// parseLastSequence reads the lastSequence query parameter.
func parseLastSequence(r *http.Request) (uint64, string) {
	vals, ok := r.URL.Query()["lastSequence"]
	if !ok || len(vals) == 0 || vals[0] == "" {
		return 0, "missing query parameter lastSequence (the seq of the last reply, 0 at first)"
	}
	n, err := strconv.ParseUint(vals[0], 10, 64)
	if err != nil {
		return 0, "query parameter lastSequence: " + quoteInput(vals[0]) + " is not a non-negative integer"
	}
	return n, ""
}

func (s *Server) handleLong(w http.ResponseWriter, r *http.Request) {
	after, msg := parseLastSequence(r)
	if msg != "" {
		writeError(w, http.StatusBadRequest, msg)
		return
	}
	if !s.acquire(w, mLong) {
		return
	}
	parked := false
	defer func() {
		if !parked {
			s.release(mLong)
		}
	}()
	// A waiting client holds no buffer: the reply's is taken from the pool
	// once there is something to write.
	var bp *[]byte
	defer func() {
		if bp != nil {
			putBody(bp)
		}
	}()
	buf := func() []byte { bp = bufPool.Get().(*[]byte); return (*bp)[:0] }
	// A reply with the full snapshot costs what a short poll costs: a token
	// of the client's poll bucket (a 429 otherwise, nothing encoded).
	snapshotOK := func() bool { return s.admit(w, r, classPoll) }
	body, _, ok := s.pollNow(after, false, buf, snapshotOK)
	if !ok {
		return // refused the snapshot
	}
	if body == nil {
		// Nothing newer yet: the parker waits for it without this goroutine
		// (park.go), else this handler does.
		if parked = s.park(w, r, after); parked {
			return
		}
		if body, ok = s.longPollAdmit(r.Context(), after, buf, snapshotOK); !ok {
			return // the client went away
		}
	}
	*bp = body
	writeJSON(w, http.StatusOK, body)
}

// longPoll appends the reply to a long poll after sequence `after` to dst.
// It waits (one timer, one channel receive, no polling) until the ring has a
// sample newer than after, LongPollTimeout passes or the server shuts down.
// ok is false when ctx ended first (nothing to write).
func (s *Server) longPoll(ctx context.Context, after uint64, dst []byte) (_ []byte, ok bool) {
	return s.longPollAdmit(ctx, after, func() []byte { return dst }, nil)
}

// longPollAdmit is longPoll that, before answering with the snapshot (a
// reset), asks snapshotOK (nil: always); false ends it with ok false. It
// calls buf for the buffer to append the reply to only once it answers
// (nothing is held while it waits; ok false: buf was not called).
func (s *Server) longPollAdmit(ctx context.Context, after uint64, buf func() []byte, snapshotOK func() bool) (_ []byte, ok bool) {
	var (
		timeout <-chan time.Time
		final   bool // timed out or shutting down: answer with whatever is there now
	)
	for {
		body, wait, ok := s.pollNow(after, final, buf, snapshotOK)
		if body != nil || !ok {
			return body, ok
		}
		if timeout == nil {
			t := time.NewTimer(s.cfg.LongPollTimeout)
			defer t.Stop()
			timeout = t.C
		}
		select {
		case <-wait:
		case <-timeout:
			final = true
		case <-s.shutdown:
			final = true
		case <-ctx.Done():
			return nil, false
		}
	}
}

// pollNow is one look at the ring for a long poll after `after`: the reply
// (appended to buf()) when there are samples newer than after, a reset (the
// snapshot, once snapshotOK agrees; nil: always), or final; nil when there
// is nothing to answer yet. wait is closed by the ring's first append after
// the look. ok false: snapshotOK refused (body nil, buf not called).
func (s *Server) pollNow(after uint64, final bool, buf func() []byte, snapshotOK func() bool) (body []byte, wait <-chan struct{}, ok bool) {
	sp := samplesPool.Get().(*[]ringstore.Sample)
	res := s.cfg.Ring.Since(after, (*sp)[:0])
	switch {
	case res.Reset:
		putSampleBuf(sp)
		if snapshotOK != nil && !snapshotOK() {
			return nil, res.Wait, false
		}
		snap := s.cfg.Ring.Snapshot()
		return append(wire.AppendLongPoll(buf(), snap.Seq, snap.Epoch, true, snap.Latest), '\n'), res.Wait, true
	case len(res.Samples) > 0 || final:
		body = append(wire.AppendLongPoll(buf(), res.Seq, res.Epoch, false, res.Samples), '\n')
		*sp = res.Samples[:0]
		putSampleBuf(sp)
		return body, res.Wait, true
	}
	putSampleBuf(sp)
	return nil, res.Wait, true
}
