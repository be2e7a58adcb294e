package edge

import (
	"context"
	"sync"
	"time"
)

// RoundWindow is how close in time devices must be due to be polled by
// one wake-up: a device due within RoundWindow of a wake-up is polled then,
// that much early at most (its window, and so its deadline, does not
// move). Devices of one interval (TCP, UDP) or stagger slot (RTU) are due
// at the same instant.
const RoundWindow = 2 * time.Millisecond

// clock wakes the TCP and RTU bus goroutines of a Run with one timer:
// every bus due within RoundWindow of the timer's firing is woken by that
// one timer event, instead of each bus keeping a timer of its own.
type clock struct {
	mu    sync.Mutex
	timer *time.Timer
	armed time.Time // when the timer fires; zero: stopped
	due   map[*bus]time.Time
}

func newClock() *clock {
	c := &clock{timer: time.NewTimer(time.Hour), due: map[*bus]time.Time{}}
	c.timer.Stop()
	return c
}

// at asks for b to be woken (on b.wake) at t, replacing its earlier
// request. Safe from any goroutine.
func (c *clock) at(b *bus, t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.due[b] = t
	if c.armed.IsZero() || t.Before(c.armed) {
		c.armed = t
		c.timer.Reset(time.Until(t))
	}
}

// forget drops b's request (b's goroutine ends).
func (c *clock) forget(b *bus) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.due, b)
}

// run fires the timer until ctx is done.
func (c *clock) run(ctx context.Context) {
	defer c.timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-c.timer.C:
		}
		c.fire(time.Now())
	}
}

// fire wakes every bus due by now+RoundWindow and sets the timer for the
// next one.
func (c *clock) fire(now time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	horizon := now.Add(RoundWindow)
	var next time.Time
	for b, t := range c.due {
		if !t.After(horizon) {
			delete(c.due, b)
			select {
			case b.wake <- struct{}{}:
			default: // a wake-up is already waiting
			}
			continue
		}
		if next.IsZero() || t.Before(next) {
			next = t
		}
	}
	c.armed = next
	if !next.IsZero() {
		c.timer.Reset(time.Until(next))
	}
}
