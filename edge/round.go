package edge

import (
	"context"
	"sync"
	"time"

	"edgegw/edge/modbus"
)

// States of a UDP bus in the round.
const (
	roundIdle    uint8 = iota
	roundPolling       // its device's poll has a request in flight
	roundAside         // a write, or the poll of a device that is down, runs on a goroutine of its own
)

// peekAfter is how long after a request the round looks at it even if the
// rest of its batch has not come back (a lost reply holds its batch until
// its deadline): a quarter of the timeout, at most 10 ms.
func peekAfter(timeout time.Duration) time.Duration { return min(timeout/4, 10*time.Millisecond) }

// udpRound polls every UDP device of a Run from one goroutine, as an event
// loop over one modbus.Round: at each wake-up it takes back the requests
// that ended (a reply, an error, a deadline), advances their polls (decode,
// retry, next read; at the end samples, statistics and the schedule, as a
// bus goroutine does), starts the polls of every device due within
// RoundWindow, and sends all the requests this produced as one batch
// (sendmmsg). It then sleeps until a batch is complete, a deadline or a
// peek time (peekAfter) passes, the next device is due, a write is queued
// or the set of devices changes. One request per device is in flight at a
// time; requests to different devices leave back to back. A poll never
// waits for another device's reply beyond its peek time.
//
// The slow and rare work — a write (a TCP dial, up to three timeouts) and
// the poll of a device whose transport is down (its open may resolve a
// name) — runs aside, on a goroutine of its own that the round owns, while
// that device takes no part in rounds.
type udpRound struct {
	rs     *runState
	sink   Sink
	kick   <-chan struct{} // a write was queued for a UDP device
	ctl    chan *roundCtl
	back   chan *bus     // an aside ended
	exited chan struct{} // closed when run returns

	buses  []*bus
	asides int
	wg     sync.WaitGroup // the asides
	rd     *modbus.Round
	fly    []flying          // polls with a request in flight
	out    []*modbus.Request // requests to send at the end of this turn
	pend   []*roundCtl       // changes waiting for their buses to be idle
	failed bool              // a request of the last batch failed at once
}

type flying struct {
	d *device
	b *bus
}

// roundCtl adds and removes buses; done is closed when removed buses have
// ended their poll in progress and are out.
type roundCtl struct {
	add    []*bus
	remove []*bus
	start  time.Time
	done   chan struct{}
}

func newUDPRound(rs *runState) *udpRound {
	return &udpRound{rs: rs, sink: rs.s.cfg.Sink, kick: rs.s.udpKick, ctl: make(chan *roundCtl),
		back: make(chan *bus), exited: make(chan struct{})}
}

// change applies c in the round's goroutine and waits for it (or for the
// round to have stopped).
func (r *udpRound) change(add, remove []*bus, start time.Time) {
	c := &roundCtl{add: add, remove: remove, start: start, done: make(chan struct{})}
	select {
	case r.ctl <- c:
	case <-r.exited:
		return
	}
	select {
	case <-c.done:
	case <-r.exited:
	}
}

// run polls until ctx is done, then lets the polls in progress end and
// waits for the asides.
func (r *udpRound) run(ctx context.Context) {
	defer close(r.exited)
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	stopping := false
	for {
		now := time.Now()
		r.collect(now)
		if !stopping {
			r.startDue(now)
		}
		r.flush()
		r.settle()
		if stopping && len(r.fly) == 0 && r.asides == 0 {
			r.wg.Wait()
			for _, b := range r.buses {
				b.closeWriteConns()
			}
			for _, c := range r.pend {
				close(c.done)
			}
			return
		}
		wait := time.Hour
		if at := r.nextWake(stopping); !at.IsZero() {
			wait = time.Until(at)
		}
		if r.failed {
			wait, r.failed = 0, false
		}
		timer.Reset(max(wait, 0))
		var ready <-chan struct{}
		if len(r.fly) > 0 {
			ready = r.rd.Ready()
		}
		done := ctx.Done()
		if stopping {
			done = nil
		}
		select {
		case <-done:
			stopping = true
		case <-timer.C:
		case <-ready:
		case <-r.kick:
			for _, b := range r.buses {
				r.writeNext(b)
			}
		case b := <-r.back:
			b.state = roundIdle
			r.asides--
			r.writeNext(b)
		case c := <-r.ctl:
			for _, b := range c.remove {
				b.leaving = true
			}
			r.pend = append(r.pend, c)
		}
	}
}

// nextWake is the earliest deadline or peek time of a request in flight
// and, unless stopping, the earliest time an idle device is due.
func (r *udpRound) nextWake(stopping bool) time.Time {
	var at time.Time
	consider := func(t time.Time) {
		if at.IsZero() || t.Before(at) {
			at = t
		}
	}
	now := time.Now()
	for _, f := range r.fly {
		consider(f.d.req.Deadline)
		if f.d.ps.peek.After(now) {
			consider(f.d.ps.peek)
		}
	}
	if !stopping {
		for _, b := range r.buses {
			if b.state == roundIdle && !b.leaving {
				consider(b.devices[0].next)
			}
		}
	}
	return at
}

// collect takes back every request that ended and advances its poll: the
// next request of the poll is queued, or the poll ends.
func (r *udpRound) collect(now time.Time) {
	if r.rd == nil {
		return
	}
	n := 0
	for _, f := range r.fly {
		d := f.d
		if !r.rd.Done(&d.req, now) {
			r.fly[n] = f
			n++
			continue
		}
		rtt := now.Sub(d.ps.sent)
		if !d.req.Replied.IsZero() {
			rtt = d.req.Replied.Sub(d.ps.sent) // the device's answer, not the round's
		}
		d.step(d.req.Data, d.req.Err, rtt)
		if !d.ps.done() {
			r.queue(d, d.req.Conn, now)
			r.fly[n] = f
			n++
			continue
		}
		answered, _ := d.finishPoll(r.sink)
		f.b.endPoll(d, answered)
		f.b.busy.Store(0)
		f.b.state = roundIdle
		r.writeNext(f.b) // a queued write goes between two polls
	}
	clear(r.fly[n:])
	r.fly = r.fly[:n]
}

// startDue begins the poll of every idle device due by now+RoundWindow.
func (r *udpRound) startDue(now time.Time) {
	horizon := now.Add(RoundWindow)
	for _, b := range r.buses {
		if b.state != roundIdle || b.leaving {
			continue
		}
		d := b.devices[0]
		if d.next.After(horizon) {
			continue
		}
		iv := d.cfg.Interval
		for !now.Before(d.next.Add(iv)) { // windows that ended meanwhile
			d.stats.Overruns.Add(1)
			d.next = d.next.Add(iv)
		}
		c, ok := d.conn.(*modbus.UDPConn)
		if !ok { // down: its open waits for its backoff, or is tried aside
			if d.conn == nil && !r.rs.openDue(d) {
				d.stats.Skipped.Add(1)
				d.next = d.next.Add(iv)
				continue
			}
			r.aside(b, func() { b.pollOne(d, r.sink) })
			continue
		}
		b.busy.Store(now.UnixNano())
		b.state = roundPolling
		d.beginPoll(d.next.Add(iv))
		r.fly = append(r.fly, flying{d: d, b: b})
		r.queue(d, c, now)
	}
}

// queue prepares the request for d's read in progress, to go out with the
// turn's batch.
func (r *udpRound) queue(d *device, c *modbus.UDPConn, now time.Time) {
	if r.rd == nil {
		r.rd = r.rs.udpSocket().NewRound()
	}
	q := d.prepare(d.ps.read())
	q.Conn, q.Deadline = c, now.Add(d.cfg.Timeout)
	d.ps.sent, d.ps.peek = now, now.Add(peekAfter(d.cfg.Timeout))
	r.out = append(r.out, q)
}

// flush sends the turn's requests as one batch.
func (r *udpRound) flush() {
	if len(r.out) == 0 {
		return
	}
	if r.rd.Send(r.out) < len(r.out) {
		r.failed = true // take them back at once
	}
	clear(r.out)
	r.out = r.out[:0]
}

// aside runs fn for b on a goroutine of the round's; b takes no part in
// rounds until it has ended.
func (r *udpRound) aside(b *bus, fn func()) {
	b.state = roundAside
	r.asides++
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		b.busy.Store(time.Now().UnixNano())
		fn()
		b.busy.Store(0)
		r.back <- b // the round receives until every aside has come back
	}()
}

// writeNext starts b's next queued write, if b is idle.
func (r *udpRound) writeNext(b *bus) {
	if b.state != roundIdle || b.leaving {
		return
	}
	select {
	case j := <-b.wr.queue:
		r.aside(b, func() { b.serveWrite(j) })
	default:
	}
}

// settle applies the changes whose removed buses are all idle, in order.
func (r *udpRound) settle() {
	for len(r.pend) > 0 {
		c := r.pend[0]
		for _, b := range c.remove {
			if b.state != roundIdle {
				return
			}
		}
		out := make(map[*bus]bool, len(c.remove))
		for _, b := range c.remove {
			out[b] = true
		}
		n := 0
		for _, b := range r.buses {
			if !out[b] {
				r.buses[n] = b
				n++
			}
		}
		clear(r.buses[n:])
		r.buses = r.buses[:n]
		for _, b := range c.remove {
			b.leaving = false
			b.closeWriteConns()
		}
		for _, b := range c.add {
			b.state = roundIdle
			for _, d := range b.devices {
				if d.next.IsZero() { // a device taken over by a reload keeps its schedule
					d.next = aligned(r.rs.epoch, c.start, d.cfg.Interval)
				}
			}
			r.buses = append(r.buses, b)
		}
		close(c.done)
		r.pend = r.pend[1:]
	}
}
