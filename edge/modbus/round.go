package modbus

import (
	"errors"
	"net"
	"time"
)

var errNotThisSocket = errors.New("modbus: udp round: request without a device of this socket")

// SendRound sends every request of reqs to its r.Conn (UDPConns of this
// socket) back to back — with one sendmmsg where the kernel has it — and
// returns when every one has its reply or deadline has passed; the requests
// still unanswered then fail with ErrTimeout. Each request gets the same
// random transaction id, matching (source, id, unit, function, length) and
// counting as a UDPConn.Read* call; the reader goroutine (Run) fills a
// round's replies in place and wakes the caller once, when the last one is
// in. Requests to the same device may be in one round (each has its own
// id); a Request appears at most once. A nil entry is skipped. reqs and its
// Requests are not retained.
//
// Several goroutines may call SendRound at once, with other requests; Do
// and the Read* methods may run meanwhile.
func (s *UDPSocket) SendRound(reqs []*Request, deadline time.Time) {
	start := time.Now()
	w := s.waiter()
	s.mu.Lock()
	n := s.enqueueLocked(reqs, w)
	s.mu.Unlock()
	if n > 0 {
		s.sendRound(reqs, n)
		w.wait(time.Until(deadline))
		s.mu.Lock()
		for _, r := range reqs {
			if r != nil {
				s.expire(&r.pend)
			}
		}
		s.putWaiter(w)
		s.mu.Unlock()
	} else {
		s.mu.Lock()
		s.putWaiter(w)
		s.mu.Unlock()
	}
	waited := deadline.Sub(start)
	for _, r := range reqs {
		if r != nil && !s.failUnsent(r) {
			r.result(&r.Conn.device, waited)
		}
	}
}

// failUnsent ends r, whose wait is over, when it never was in flight (no
// device of this socket, a closed device, a request that cannot be sent)
// or its datagram could not be sent, and reports whether it did; otherwise
// r is answered or timed out and its caller takes the result. Caller does
// not hold mu (r is no longer pending).
func (s *UDPSocket) failUnsent(r *Request) bool {
	switch {
	case r.Conn == nil || r.Conn.t.s != s:
		r.Data, r.Err = nil, errNotThisSocket
	case r.pend.state == pendIdle:
		err := r.check()
		if err == nil {
			err = net.ErrClosed
		}
		r.fail(&r.Conn.device, err)
	case r.pend.state == pendExpired && r.pend.sendErr != nil:
		r.fail(&r.Conn.device, r.pend.sendErr)
		r.pend.sendErr = nil
	default:
		return false
	}
	return true
}

// waiter takes a free round waiter (or makes one). Caller does not hold mu.
func (s *UDPSocket) waiter() *udpWaiter {
	s.mu.Lock()
	defer s.mu.Unlock()
	if n := len(s.waiters); n > 0 {
		w := s.waiters[n-1]
		s.waiters = s.waiters[:n-1]
		return w
	}
	return newWaiter()
}

// putWaiter frees w, draining a signal sent after its wait gave up. Caller
// holds mu (no request of w is waiting any more).
func (s *UDPSocket) putWaiter(w *udpWaiter) {
	select {
	case <-w.ch:
	default:
	}
	w.left = 0
	s.waiters = append(s.waiters, w)
}

// sendRound sends the registered requests of reqs: one sendmmsg call (or
// a few, if the kernel takes part) when batching, else one write each. A
// request whose datagram could not be sent ends at once with the error.
func (s *UDPSocket) sendRound(reqs []*Request, n int) {
	if !s.batch.Load() {
		for _, r := range reqs {
			if r != nil && r.pend.state == pendWaiting {
				s.sendOne(r)
			}
		}
		return
	}
	s.sendMu.Lock()
	defer s.sendMu.Unlock()
	b := s.send
	b.grow(n)
	s.sendReqs = s.sendReqs[:0]
	for _, r := range reqs {
		if r == nil || r.pend.state != pendWaiting {
			continue
		}
		if d := r.pend.dest; d.saOK {
			b.set(len(s.sendReqs), r.adu[:], &d.sa, d.sa.n)
			s.sendReqs = append(s.sendReqs, r)
		} else {
			s.sendOne(r) // no sockaddr for this family: the kernel's error
		}
	}
	off, err := s.sendBatch(b, len(s.sendReqs), s.sendFailedF)
	if err == errBatchUnsupported {
		s.batch.Store(false)
		s.log.Warn("modbus: udp sendmmsg refused by the kernel; one syscall per datagram")
	}
	for _, r := range s.sendReqs[off:] { // not sent by the batch
		s.sendOne(r)
	}
	clear(s.sendReqs)
}

// sendFailed ends request i of the batch being sent: the kernel refused it.
func (s *UDPSocket) sendFailed(i int, err error) { s.endSend(s.sendReqs[i], err) }

func (s *UDPSocket) sendOne(r *Request) {
	if _, err := s.conn.WriteToUDPAddrPort(r.adu[:], r.pend.dest.addr); err != nil {
		s.endSend(r, err)
	}
}

func (s *UDPSocket) endSend(r *Request, err error) {
	s.mu.Lock()
	if r.pend.state == pendWaiting {
		s.expire(&r.pend)
		r.pend.sendErr = err
	}
	s.mu.Unlock()
}

// A Round keeps the requests of many UDP devices of one socket in flight for
// one goroutine that drives them as an event loop: Send puts a batch on the
// wire (one sendmmsg where the kernel has it), Ready is signalled when every
// request of some batch has its reply (or failed), and Done takes a request
// back once it is answered, failed or past its Deadline. The reader
// goroutine (Run) fills replies in place and wakes the Round's goroutine
// once per completed batch, never per reply. Matching, checks, counters and
// errors are those of SendRound.
//
// A Round is used by one goroutine; several Rounds and SendRound callers
// may share a socket. A Request is in at most one Round at a time and is
// not sent again before Done has returned true for it.
type Round struct {
	s  *UDPSocket
	ch chan struct{} // capacity 1: some batch completed
	ws []*udpWaiter  // one per batch; free again when its requests all ended
}

// NewRound returns a Round on s; it starts nothing.
func (s *UDPSocket) NewRound() *Round { return &Round{s: s, ch: make(chan struct{}, 1)} }

// Ready is signalled (once, capacity 1) when every request of a batch has
// ended; it may also be signalled when there is nothing left to take.
func (rd *Round) Ready() <-chan struct{} { return rd.ch }

// waiter returns a batch waiter with nothing pending. Caller holds s.mu.
func (rd *Round) waiter() *udpWaiter {
	for _, w := range rd.ws {
		if w.left == 0 {
			return w
		}
	}
	w := &udpWaiter{ch: rd.ch}
	rd.ws = append(rd.ws, w)
	return w
}

// enqueueLocked gives each request of reqs to this socket (nil entries
// skipped): a fresh transaction id, registered under waiter w, the ADU
// encoded. It returns how many are to be sent; the others (no device of
// this socket, a closed device, a request that cannot be sent, no free id)
// keep a state their caller turns into the error. Caller holds mu.
func (s *UDPSocket) enqueueLocked(reqs []*Request, w *udpWaiter) int {
	n := 0
	for _, r := range reqs {
		if r == nil {
			continue
		}
		r.pend.state = pendIdle
		r.Data, r.Err = nil, nil
		if r.Conn == nil || r.Conn.t.s != s {
			continue
		}
		t := r.Conn.t
		if t.closed || r.check() != nil {
			continue
		}
		p := t.prepare(r)
		p.w = w
		if err := s.register(p); err != nil {
			p.state, p.sendErr = pendExpired, err
			continue
		}
		r.encode(p.tid, t.pend.unit)
		n++
	}
	return n
}

// Send sends reqs as one batch, back to back, each under a fresh
// transaction id; each is answered until its Deadline. It returns how many
// went out; the others (no device of this socket, a closed device, a
// request that cannot be sent, no free id, refused by the kernel) have
// already failed: Done returns true for them at once.
func (rd *Round) Send(reqs []*Request) int {
	s := rd.s
	s.mu.Lock()
	w := rd.waiter()
	n := s.enqueueLocked(reqs, w)
	s.mu.Unlock()
	if n > 0 {
		s.sendRound(reqs, n)
	}
	return n
}

// Done reports whether r, sent with Send, has ended at now: answered,
// failed, or past its Deadline (then it fails with ErrTimeout and a reply
// that comes later counts as late). When it has, Data and Err are set as
// after SendRound and r may be sent again; otherwise r stays in flight.
func (rd *Round) Done(r *Request, now time.Time) bool {
	s := rd.s
	s.mu.Lock()
	if r.pend.state == pendWaiting {
		if now.Before(r.Deadline) {
			s.mu.Unlock()
			return false
		}
		s.expire(&r.pend)
	}
	s.mu.Unlock()
	r.Replied = time.Time{}
	if !s.failUnsent(r) {
		r.result(&r.Conn.device, r.Conn.t.timeout)
	}
	r.pend.state = pendIdle
	return true
}
