package edge

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"edgegw/ringstore"
)

// bus is one share of the devices, polled one request at a time per
// connection: a TCP or RTU bus is one goroutine that polls its devices one
// at a time, each at its own interval, earliest due first, woken by the
// run's clock; a UDP bus (one device) is polled by the run's UDP round
// (round.go) with every other UDP device.
type bus struct {
	name    string
	devices []*device
	busy    atomic.Int64 // Unix ns when the poll in progress started, 0 when waiting
	wr      busWrites    // queued writes, done between polls (write.go)
	pass    busPass      // queued pass-through requests, done between polls (passthrough.go)
	// open retries the transport of a device that is down (Run sets it;
	// tried is false while the transport's backoff has not passed).
	open func(d *device) (tried bool, err error)

	udp  bool          // polled by the UDP round, not by a goroutine of its own
	wake chan struct{} // capacity 1: the clock says a device may be due (TCP, RTU)

	// The UDP round's state of this bus (its goroutine only).
	state   uint8 // roundIdle, roundPolling, roundAside
	leaving bool  // being removed (a reload): no new poll or write
}

// stuck reports a poll that has run longer than limit: a bus whose
// goroutine no longer comes back (a transport without a deadline).
func (b *bus) stuck(now time.Time, limit time.Duration) error {
	if t := b.busy.Load(); t != 0 && now.Sub(time.Unix(0, t)) > limit {
		return fmt.Errorf("edge: bus %s: one poll running for %v", b.name, now.Sub(time.Unix(0, t)).Round(time.Second))
	}
	return nil
}

// run polls until ctx is done (TCP and RTU buses). Timing rules (the UDP
// round keeps the same):
//   - device d's windows start at d.next (set by startBus: on the run's grid,
//     plus its offset) + k*interval; a poll may use its
//     window for retries and must end inside it to count as valid; a poll
//     may start up to RoundWindow early, with devices due just after it;
//   - a poll that ends after later windows have begun skips them: each
//     skipped window is an overrun, never a second poll (polls never stack);
//   - after DemoteAfter polls without any answer the device is demoted: it is
//     polled every 2^k intervals (k grows per dead poll, capped at
//     MaxDemotedPeriod); the windows in between are counted as skipped; the
//     first answer promotes it back.
//
// The bus has no timer of its own: it tells clk when its next device is
// due and sleeps until clk wakes it (with every other bus due then), a
// write or pass-through request is queued, or ctx ends. A pass-through
// request (passthrough.go) is done while idle only when the next poll is
// further away than the request's device timeout; otherwise it is held
// and done right after that poll.
func (b *bus) run(ctx context.Context, sink Sink, clk *clock) {
	defer b.closeWriteConns()
	defer clk.forget(b)
	for {
		d := b.earliest()
		if b.passFits(ctx, d.next) {
			continue
		}
		if time.Until(d.next) > RoundWindow {
			clk.at(b, d.next)
			select {
			case <-ctx.Done():
				return
			case <-b.wake:
			case j := <-b.wr.queue:
				b.serveWrite(j)
			case j := <-b.passQueue():
				b.pass.held = j // passFits does it if it fits before the poll
			}
			continue // early, late or stale wake-ups alike: look again
		} else if ctx.Err() != nil {
			return
		}
		b.pass.polls.Add(1)
		b.busy.Store(time.Now().UnixNano())
		b.pollOne(d, sink)
		b.busy.Store(0)
		b.serveQueuedWrite() // one waiting write even when polls leave no idle time
		b.serveQueuedPass()  // and the pass-through requests that waited for this poll
	}
}

// pollOne polls d in its current window and moves d.next on.
func (b *bus) pollOne(d *device, sink Sink) {
	if !b.beginWindow(d, time.Now(), sink) {
		return
	}
	answered, _ := d.poll(d.next.Add(d.cfg.Interval), sink)
	b.endPoll(d, answered)
}

// beginWindow counts the windows of d that ended while other devices were
// polled as overruns and opens d's transport if it is down. It returns
// false when d is not polled in this window (d.next has moved on).
func (b *bus) beginWindow(d *device, now time.Time, sink Sink) bool {
	iv := d.cfg.Interval
	// A window that has already ended while other devices of this bus were
	// polled is an overrun, not a late poll.
	for !now.Before(d.next.Add(iv)) {
		d.stats.Overruns.Add(1)
		d.next = d.next.Add(iv)
	}
	if d.conn == nil && !b.reopen(d, sink) {
		d.next = d.next.Add(iv)
		return false
	}
	return true
}

// endPoll moves d.next past the poll that just ended and demotes or
// promotes d.
func (b *bus) endPoll(d *device, answered bool) {
	iv := d.cfg.Interval
	d.next = d.next.Add(iv)
	now := time.Now()
	for !now.Before(d.next) { // the poll ran into later windows
		d.stats.Overruns.Add(1)
		d.next = d.next.Add(iv)
	}
	if answered {
		if d.stats.Demoted.Load() {
			d.stats.Demoted.Store(false)
			d.log.Info("device answers again: promoted")
		}
		d.deadPolls, d.backoff = 0, 0
		return
	}
	d.deadPolls++
	if d.deadPolls < DemoteAfter {
		return
	}
	if !d.stats.Demoted.Load() {
		d.stats.Demoted.Store(true)
		d.stats.Demotions.Add(1)
		d.log.Warn("device does not answer: demoted", "polls", d.deadPolls)
	}
	d.backoff = min(max(2*d.backoff, 2*iv), max(MaxDemotedPeriod, iv))
	for skip := d.backoff - iv; skip > 0; skip -= iv {
		d.stats.Skipped.Add(1)
		d.next = d.next.Add(iv)
	}
}

// reopen tries to open the transport of d, which is down, in its current
// window. It returns true when d can be polled now. A window in which the
// open was not due (backoff) is skipped; one in which it was tried and
// failed is a poll whose samples all have quality error.
func (b *bus) reopen(d *device, sink Sink) bool {
	var tried bool
	err := errors.New("edge: transport not open")
	if b.open != nil {
		tried, err = b.open(d)
	}
	if err == nil {
		d.stats.Down.Store(false)
		d.stats.SetReason("")
		d.log.Info("device transport open: polling")
		return true
	}
	if !tried {
		d.stats.Skipped.Add(1)
		return false
	}
	d.markDown(err)
	d.mask = d.due()
	for i := range d.quality {
		d.quality[i] = ringstore.Error
	}
	d.emit(time.Now(), sink)
	d.stats.Polls.Add(1)
	return false
}
