package edge

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"edgegw/ringstore"
)

// bus is one goroutine's share of the devices: it polls them one at a time,
// each at its own interval, earliest due first.
type bus struct {
	name    string
	devices []*device
	busy    atomic.Int64 // Unix ns when the poll in progress started, 0 when waiting
	wr      busWrites    // queued writes, done between polls (write.go)
	// open retries the transport of a device that is down (Run sets it;
	// tried is false while the transport's backoff has not passed).
	open func(d *device) (tried bool, err error)
}

// stuck reports a poll that has run longer than limit: a bus whose
// goroutine no longer comes back (a transport without a deadline).
func (b *bus) stuck(now time.Time, limit time.Duration) error {
	if t := b.busy.Load(); t != 0 && now.Sub(time.Unix(0, t)) > limit {
		return fmt.Errorf("edge: bus %s: one poll running for %v", b.name, now.Sub(time.Unix(0, t)).Round(time.Second))
	}
	return nil
}

// run polls until ctx is done. Timing rules:
//   - device d's windows start at start+offset+k*interval; a poll may use its
//     window for retries and must end inside it to count as valid;
//   - a poll that ends after later windows have begun skips them: each
//     skipped window is an overrun, never a second poll (polls never stack);
//   - after DemoteAfter polls without any answer the device is demoted: it is
//     polled every 2^k intervals (k grows per dead poll, capped at
//     MaxDemotedPeriod); the windows in between are counted as skipped; the
//     first answer promotes it back.
func (b *bus) run(ctx context.Context, start time.Time, sink Sink) {
	for _, d := range b.devices {
		if d.next.IsZero() { // a device taken over by a reload keeps its schedule
			d.next = start.Add(d.offset)
		}
	}
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	defer b.closeWriteConns()
	for {
		d := b.devices[0]
		for _, o := range b.devices[1:] {
			if o.next.Before(d.next) {
				d = o
			}
		}
		if wait := time.Until(d.next); wait > 0 {
			timer.Reset(wait)
			select {
			case <-ctx.Done():
				return
			case <-timer.C:
			case j := <-b.wr.queue:
				timer.Stop()
				b.serveWrite(j)
				continue
			}
		} else if ctx.Err() != nil {
			return
		}
		b.busy.Store(time.Now().UnixNano())
		b.pollOne(d, sink)
		b.busy.Store(0)
		b.serveQueuedWrite() // one waiting write even when polls leave no idle time
	}
}

// pollOne polls d in its current window and moves d.next on.
func (b *bus) pollOne(d *device, sink Sink) {
	iv := d.cfg.Interval
	// A window that has already ended while other devices of this bus were
	// polled is an overrun, not a late poll.
	now := time.Now()
	for !now.Before(d.next.Add(iv)) {
		d.stats.Overruns.Add(1)
		d.next = d.next.Add(iv)
	}
	if d.conn == nil && !b.reopen(d, sink) {
		d.next = d.next.Add(iv)
		return
	}
	answered, _ := d.poll(d.next.Add(iv), sink)
	d.next = d.next.Add(iv)
	now = time.Now()
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
	for i := range d.quality {
		d.quality[i] = ringstore.Error
	}
	d.emit(time.Now(), sink)
	d.stats.Polls.Add(1)
	return false
}
