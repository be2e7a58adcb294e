package edge

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"edgegw/edge/modbus"
)

// PassQueue is the number of pass-through requests that may wait for one
// bus; one more is refused at once as PassBusy (never blocking a poll).
const PassQueue = 16

// Kinds of PassError, so that a Modbus server can answer with the right
// exception (0x0A path unavailable, 0x0B target failed to respond, 0x06 busy).
const (
	PassUnknownDevice = "unknown device" // no device of that name
	PassNotShared     = "not shared"     // a UDP device: its requests are the UDP round's
	PassBusy          = "busy"           // PassQueue requests already wait for the bus
	PassDown          = "down"           // the device's transport is not open, or in its reconnect backoff
	PassTimeout       = "timeout"        // no reply within the device's timeout
	PassFailed        = "failed"         // the reply was malformed or the transport failed
	PassStopped       = "stopped"        // the scheduler is not running (or the bus restarted for a reload)
)

// PassRequest is one Modbus request for a device, passed through to the
// goroutine that owns the device's bus. PDU is the function code and its
// data, as a Modbus client sent it; Origin says who asked ("modbus
// 10.0.0.5:50112").
type PassRequest struct {
	Device string
	PDU    []byte
	Origin string
}

// PassResult is a request's outcome: PDU is the reply PDU (the function
// code and data, or fc|0x80 and the exception code the device, or the
// request check, answered). Waited is the time from the queue to the bus
// taking it up; Polls the number of polls the bus did meanwhile (the one in
// progress when it was queued included); Took the time on the wire.
type PassResult struct {
	PDU    []byte
	Waited time.Duration
	Polls  int
	Took   time.Duration
}

// PassError is why a pass-through request got no reply PDU.
type PassError struct {
	Kind string
	Msg  string
	Err  error // the transport's error for PassTimeout, PassFailed and PassDown; may be nil
}

func (e *PassError) Error() string { return "edge: " + e.Msg }

// Unwrap returns the cause.
func (e *PassError) Unwrap() error { return e.Err }

// PassErrorKind lets consumers that do not import edge classify the error.
func (e *PassError) PassErrorKind() string { return e.Kind }

// passJob is one pass-through request on its way to the bus goroutine.
type passJob struct {
	req    PassRequest
	dev    *device
	queued time.Time
	polls  uint64 // the bus's poll count when queued (plus one if a poll was running)
	state  atomic.Int32
	done   chan passOutcome // capacity 1
}

type passOutcome struct {
	res PassResult
	err error
}

// busPass is one bus's pass-through state: queue is read by the bus
// goroutine only; held is the request taken off the queue that did not fit
// before the next poll (the bus goroutine's); polls counts the polls the
// bus began.
type busPass struct {
	queue chan *passJob
	held  *passJob
	polls atomic.Uint64
}

// budget is the longest a pass-through request can hold the bus: the
// device's timeout and its pause.
func (j *passJob) budget() time.Duration { return j.dev.cfg.Timeout + j.dev.cfg.Pause }

func passErr(req PassRequest, kind, msg string, cause error) *PassError {
	return &PassError{Kind: kind, Err: cause, Msg: fmt.Sprintf("pass-through to %q (%s): %s: %s", req.Device, req.Origin, kind, msg)}
}

// Pass queues one request to the bus that polls req.Device and waits for
// its reply. The bus does it between two polls (bus.run): right away when
// the next poll is further away than the device's timeout (plus pause),
// else after that poll; after every poll it does up to PassAfterPoll
// requests that waited for it even when polls leave no idle time, as long
// as the next poll then starts within half its interval of its due time.
// So a request waits for at most one poll while no more than PassAfterPoll
// wait for the same bus (two masters with a request in flight each) and
// the bus keeps up with its polls, and the polls lose no window to any
// pass-through traffic as long as a poll takes less than half its interval
// (beyond what the bus can do, requests wait in the queue, and a full
// queue, PassQueue, answers PassBusy at once).
//
// Functions 1-4 (reads), 5, 6 and 16 (writes) go to the device with its
// unit id and timeout; any other function, and a request whose fields are
// out of the protocol's range, is answered here (exceptions 1 and 3)
// without touching the bus. A device's exception is a reply PDU, not an
// error. Errors are *PassError. If ctx ends before the bus takes the
// request up, it is never sent. Only TCP, RTU and RTU-over-TCP devices are
// shared. Safe for concurrent use.
func (s *Scheduler) Pass(ctx context.Context, req PassRequest) (PassResult, error) {
	if ex := checkPassPDU(req.PDU); ex != 0 {
		return PassResult{PDU: []byte{fc(req.PDU) | 0x80, ex}}, nil
	}
	s.wr.mu.RLock()
	d := s.wr.byName[req.Device]
	if d == nil {
		s.wr.mu.RUnlock()
		return PassResult{}, passErr(req, PassUnknownDevice, "no such device", nil)
	}
	b := s.wr.busOf[d]
	if b.udp {
		s.wr.mu.RUnlock()
		return PassResult{}, passErr(req, PassNotShared, "a udp device is not shared", nil)
	}
	if !s.wr.running {
		s.wr.mu.RUnlock()
		return PassResult{}, passErr(req, PassStopped, "the scheduler is not running", nil)
	}
	// busy first: a poll counts itself (polls) before it says it runs (busy).
	polling := b.busy.Load() != 0
	j := &passJob{req: req, dev: d, queued: time.Now(), polls: b.pass.polls.Load(), done: make(chan passOutcome, 1)}
	if polling {
		j.polls-- // the poll in progress counts as waited for
	}
	select {
	case b.pass.queue <- j:
		s.wr.mu.RUnlock()
	default:
		s.wr.mu.RUnlock()
		return PassResult{}, passErr(req, PassBusy, fmt.Sprintf("%d requests already wait for this bus", PassQueue), nil)
	}
	select {
	case o := <-j.done:
		return o.res, o.err
	case <-ctx.Done():
		if j.state.CompareAndSwap(jobPending, jobCancelled) {
			return PassResult{}, fmt.Errorf("edge: pass-through to %q not started: %w", req.Device, ctx.Err())
		}
		o := <-j.done // started: bounded by the device's timeout
		return o.res, o.err
	}
}

func fc(pdu []byte) byte {
	if len(pdu) == 0 {
		return 0
	}
	return pdu[0] &^ 0x80
}

// checkPassPDU returns the exception code a request gets without being
// sent (1 illegal function, 3 illegal data value), or 0.
//
//	FC1/FC2: fc, addr(2), qty(2)          qty 1..2000
//	FC3/FC4: fc, addr(2), qty(2)          qty 1..125
//	FC5    : fc, addr(2), 0x0000|0xFF00
//	FC6    : fc, addr(2), value(2)
//	FC16   : fc, addr(2), qty(2), n, n bytes   qty 1..123, n == 2*qty
func checkPassPDU(p []byte) byte {
	if len(p) == 0 {
		return 1
	}
	u16 := func(i int) int { return int(binary.BigEndian.Uint16(p[i:])) }
	switch p[0] {
	case 1, 2, 3, 4:
		lim := 2000
		if p[0] > 2 {
			lim = 125
		}
		if len(p) != 5 || u16(3) < 1 || u16(3) > lim || u16(1)+u16(3) > 65536 {
			return 3
		}
	case 5:
		if len(p) != 5 || (u16(3) != 0 && u16(3) != 0xFF00) {
			return 3
		}
	case 6:
		if len(p) != 5 {
			return 3
		}
	case 16:
		if len(p) < 6 || u16(3) < 1 || u16(3) > 123 || int(p[5]) != 2*u16(3) || len(p) != 6+int(p[5]) || u16(1)+u16(3) > 65536 {
			return 3
		}
	default:
		return 1
	}
	return 0
}

// passFits does the held (or next queued) pass-through request when it
// fits before next, the bus's next poll. It reports whether it did one.
func (b *bus) passFits(ctx context.Context, next time.Time) bool {
	if ctx.Err() != nil {
		return false
	}
	if b.pass.held == nil {
		select {
		case j := <-b.pass.queue:
			b.pass.held = j
		default:
			return false
		}
	}
	if time.Until(next) <= b.pass.held.budget() {
		return false
	}
	j := b.pass.held
	b.pass.held = nil
	b.servePass(j)
	return true
}

// passQueue is the queue to wait on while idle: none while a request is held.
func (b *bus) passQueue() chan *passJob {
	if b.pass.held != nil {
		return nil
	}
	return b.pass.queue
}

// PassAfterPoll is how many waiting pass-through requests a bus does after
// each poll even when the next poll is due (more only when they fit before
// it): two masters sharing a bus each get their request in after the poll
// they waited for.
const PassAfterPoll = 2

// serveQueuedPass does, right after a poll, up to PassAfterPoll of the
// pass-through requests that waited for it (held, or queued before the
// poll ended), even when polls leave no idle time — but only
// while the next poll, delayed by the request (its budget), still starts
// within half its interval of its due time: a flood cannot make the polls
// fall behind (a request that would is held for passFits or the next poll).
func (b *bus) serveQueuedPass() {
	pollEnd := time.Now()
	for i := 0; i < PassAfterPoll; i++ {
		j := b.pass.held
		b.pass.held = nil
		if j == nil {
			select {
			case j = <-b.pass.queue:
			default:
				return
			}
		}
		d := b.earliest()
		if j.queued.After(pollEnd) || time.Now().Add(j.budget()).After(d.next.Add(d.cfg.Interval/2)) {
			b.pass.held = j // passFits does it when it fits, or the next poll
			return
		}
		b.servePass(j)
	}
}

// earliest is the device whose poll is due first.
func (b *bus) earliest() *device {
	d := b.devices[0]
	for _, o := range b.devices[1:] {
		if o.next.Before(d.next) {
			d = o
		}
	}
	return d
}

// servePass does j on the bus goroutine, unless its caller gave up.
func (b *bus) servePass(j *passJob) {
	if !j.state.CompareAndSwap(jobPending, jobClaimed) {
		return
	}
	start := time.Now()
	res := PassResult{Waited: start.Sub(j.queued), Polls: int(b.pass.polls.Load() - j.polls)}
	pdu, err := b.doPass(j)
	res.Took = time.Since(start)
	if err != nil {
		j.done <- passOutcome{res: res, err: err}
		return
	}
	res.PDU = pdu
	j.done <- passOutcome{res: res}
}

// doPass sends j's PDU over the device's poll connection and builds the
// reply PDU (see checkPassPDU for the request layouts).
//
//	FC1-4 reply: fc, n, n bytes        FC5/FC6/FC16 reply: the request's first 5 bytes
func (b *bus) doPass(j *passJob) ([]byte, error) {
	d, p := j.dev, j.req.PDU
	if d.conn == nil {
		return nil, passErr(j.req, PassDown, "the device's transport is not open", nil)
	}
	addr, qty := binary.BigEndian.Uint16(p[1:]), binary.BigEndian.Uint16(p[3:])
	var data []byte
	var err error
	switch p[0] {
	case 1:
		data, err = d.conn.ReadCoils(addr, qty)
	case 2:
		data, err = d.conn.ReadDiscreteInputs(addr, qty)
	case 3:
		data, err = d.conn.ReadHoldingRegisters(addr, qty)
	case 4:
		data, err = d.conn.ReadInputRegisters(addr, qty)
	default:
		w, ok := d.conn.(writer)
		if !ok {
			return nil, passErr(j.req, PassFailed, d.cfg.Transport+" transport cannot write", nil)
		}
		switch p[0] {
		case 5:
			err = w.WriteSingleCoil(addr, qty == 0xFF00)
		case 6:
			err = w.WriteSingleRegister(addr, qty)
		case 16:
			err = w.WriteMultipleRegisters(addr, p[6:])
		}
		if err == nil {
			return append([]byte(nil), p[:5]...), nil
		}
	}
	if err != nil {
		if code, ok := modbus.IsException(err); ok {
			return []byte{p[0] | 0x80, code}, nil
		}
		switch {
		case errors.Is(err, modbus.ErrTimeout):
			return nil, passErr(j.req, PassTimeout, err.Error(), err)
		case errors.Is(err, modbus.ErrBackoff):
			return nil, passErr(j.req, PassDown, err.Error(), err)
		}
		var fe *modbus.FrameError
		if errors.As(err, &fe) {
			return nil, passErr(j.req, PassFailed, err.Error(), err)
		}
		return nil, passErr(j.req, PassDown, err.Error(), err)
	}
	return append([]byte{p[0], byte(len(data))}, data...), nil
}

// drainPass answers every pass-through request queued on b (or held by
// it) with "stopped"; b's goroutine has exited.
func drainPass(b *bus, why string) {
	if j := b.pass.held; j != nil {
		b.pass.held = nil
		if j.state.CompareAndSwap(jobPending, jobClaimed) {
			j.done <- passOutcome{err: passErr(j.req, PassStopped, why, nil)}
		}
	}
	for {
		select {
		case j := <-b.pass.queue:
			if j.state.CompareAndSwap(jobPending, jobClaimed) {
				j.done <- passOutcome{err: passErr(j.req, PassStopped, why, nil)}
			}
		default:
			return
		}
	}
}
