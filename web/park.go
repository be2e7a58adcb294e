package web

import (
	"bytes"
	"errors"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// A long poll that has to wait holds no goroutine and no buffer. handleLong
// takes its connection from net/http (Hijack) and leaves it with the parker,
// one goroutine of Serve's for every waiting long poll. Once the ring has a
// sample newer than the poll's lastSequence, LongPollTimeout has passed, or
// the server shuts down, the parker writes the reply itself (the bytes
// writeJSON would: 200, application/json, no-store, Content-Length, and the
// headers the request's middleware had set, such as CORS) and gives the
// connection back to net/http through the server's listener (reentry), which
// serves its next request as on any kept-alive connection.
//
// A parked connection is not read, so the parker looks at each one once a
// parkSweep (recv with MSG_PEEK, nothing is consumed): one the client closed
// is closed and counted (LongPollsGone); one the client sent more bytes on
// (a pipelined request, a TLS close_notify) is answered at once with nothing
// new and given back, so net/http reads what came. Every waiting long poll
// keeps its MaxClients count and its client's slot until it is answered.
//
// Only HTTP/1.1 GETs without a body are parked, and only under Serve;
// anything else waits in its handler as before. Bytes of a next request that
// came with the parked one are dropped with the connection: its reply says
// Connection: close (the client sends the request again on a new one).

const (
	parkSweep        = time.Second
	parkWriteTimeout = 10 * time.Second // a reply's write that does not fit the socket at once
	reentryQueue     = 1024             // answered connections waiting for net/http's Accept
)

// parked is one waiting long poll.
type parked struct {
	conn    net.Conn
	after   uint64
	due     time.Time
	extra   []byte // header lines set before the handler ("Key: value\r\n"...)
	close   bool   // bytes of a next request came with this one: close after the reply
	release func() // the client's slot and the method's count
}

// parking is the parker's state. Handlers add to incoming; the parker alone
// owns the waiting list.
type parking struct {
	mu       sync.Mutex
	open     bool // the parker runs: handlers may park
	incoming []*parked
	kick     chan struct{} // cap 1: incoming grew
	back     *reentry
	writers  sync.WaitGroup // replies that did not fit the socket at once
	gone     atomic.Uint64  // parked polls whose client had gone (sweep, failed reply)
	buf      replyBuf       // the parker's own: written by runParker's goroutine only
}

// replyBuf is what writing a reply reuses: the reply's bytes and the Date
// line of the current second. The parker has one; a handler that answers
// its own poll at shutdown uses a fresh one, so the two never share.
type replyBuf struct {
	scratch  []byte
	dateSec  int64
	dateHead []byte
}

// park takes over a long poll that has to wait, with its client's slot and
// its mLong count. false: it cannot be parked (the handler waits as
// before); w is untouched then.
func (s *Server) park(w http.ResponseWriter, r *http.Request, after uint64) bool {
	p := &s.parking
	if r.Method != http.MethodGet || !r.ProtoAtLeast(1, 1) || r.Close || r.ContentLength != 0 || len(r.TransferEncoding) > 0 {
		return false
	}
	hj, ok := w.(http.Hijacker)
	if !ok {
		return false
	}
	p.mu.Lock()
	open := p.open
	p.mu.Unlock()
	if !open {
		return false
	}
	var extra bytes.Buffer
	if h := w.Header(); len(h) > 0 { // most often empty; Write sorts and pools even then
		_ = h.Write(&extra)
	}
	slot := s.keepSlot(r)
	release := func() { slot(); s.release(mLong) }
	conn, rw, err := hj.Hijack()
	if err != nil {
		// net/http took the connection (a read error while it checked for a
		// buffered byte); there is nothing left to answer on.
		release()
		s.parking.gone.Add(1)
		return true
	}
	pp := &parked{conn: conn, after: after, due: time.Now().Add(s.cfg.LongPollTimeout),
		extra: extra.Bytes(), close: rw.Reader.Buffered() > 0, release: release}
	p.mu.Lock()
	if !p.open { // Serve is shutting down: answer now, with what is there
		p.mu.Unlock()
		s.answerParked([]*parked{pp}, time.Now(), true, new(replyBuf))
		return true
	}
	p.incoming = append(p.incoming, pp)
	p.mu.Unlock()
	select {
	case p.kick <- struct{}{}:
	default:
	}
	return true
}

// runParker answers the parked long polls until stop is closed; then it
// answers every one with what is there (Connection: close) and returns once
// every reply is written.
func (s *Server) runParker(stop <-chan struct{}) {
	p := &s.parking
	defer p.writers.Wait()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	sweep := time.NewTicker(parkSweep)
	defer sweep.Stop()
	var waiting []*parked
	for {
		p.mu.Lock()
		waiting = append(waiting, p.incoming...)
		clear(p.incoming)
		p.incoming = p.incoming[:0]
		p.mu.Unlock()
		now := time.Now()
		var wake <-chan struct{}
		waiting, wake = s.answerParkedDue(waiting, now)
		var sweepC <-chan time.Time
		if len(waiting) > 0 {
			timer.Reset(waiting[0].due.Sub(now))
			sweepC = sweep.C
		} else {
			timer.Stop()
		}
		select {
		case <-wake:
		case <-timer.C:
		case <-p.kick:
		case <-sweepC:
			waiting = s.sweepParked(waiting, time.Now())
		case <-stop:
			p.mu.Lock()
			p.open = false
			waiting = append(waiting, p.incoming...)
			p.incoming = nil
			p.mu.Unlock()
			s.answerParked(waiting, time.Now(), true, &p.buf)
			return
		}
	}
}

// answerParkedDue answers the polls that have something newer, a reset, or
// are due, and returns the rest (in the order they came, so the first is due
// first) and a channel closed by the ring's next append.
func (s *Server) answerParkedDue(waiting []*parked, now time.Time) (rest []*parked, wake <-chan struct{}) {
	if len(waiting) == 0 {
		return waiting, nil
	}
	// The polls that wait share a few lastSequence values (most often one):
	// each is looked up and encoded once.
	type group struct {
		after uint64
		body  []byte // nil: nothing new
		empty []byte // the reply with nothing new, for those due
	}
	var groups []group
	find := func(after uint64) *group {
		for i := range groups {
			if groups[i].after == after {
				return &groups[i]
			}
		}
		g := group{after: after}
		body, w, _ := s.pollNow(after, false, func() []byte { return nil }, nil)
		if wake == nil {
			wake = w // the first look's: an append after it closes it
		}
		g.body = body
		groups = append(groups, g)
		return &groups[len(groups)-1]
	}
	rest = waiting[:0]
	var answer []*parked
	var bodies [][]byte
	for _, pp := range waiting {
		g := find(pp.after)
		switch {
		case g.body != nil:
			answer, bodies = append(answer, pp), append(bodies, g.body)
		case !now.Before(pp.due):
			if g.empty == nil {
				g.empty, _, _ = s.pollNow(pp.after, true, func() []byte { return nil }, nil)
			}
			answer, bodies = append(answer, pp), append(bodies, g.empty)
		default:
			rest = append(rest, pp)
		}
	}
	clear(waiting[len(rest):])
	for i, pp := range answer {
		s.replyParked(pp, bodies[i], false, now, &s.parking.buf)
	}
	return rest, wake
}

// answerParked answers every poll with what is there now; closing: with
// Connection: close, the connections are not given back. rb: the caller's
// (see replyParked).
func (s *Server) answerParked(polls []*parked, now time.Time, closing bool, rb *replyBuf) {
	for _, pp := range polls {
		body, _, _ := s.pollNow(pp.after, true, func() []byte { return nil }, nil)
		s.replyParked(pp, body, closing, now, rb)
	}
}

// sweepParked closes the polls whose client has gone and answers those whose
// client sent more (see the package comment above).
func (s *Server) sweepParked(waiting []*parked, now time.Time) []*parked {
	rest := waiting[:0]
	var early []*parked
	for _, pp := range waiting {
		switch peekConn(pp.conn) {
		case peekGone:
			pp.release()
			s.parking.gone.Add(1)
			_ = pp.conn.Close()
		case peekData:
			if pp.close {
				rest = append(rest, pp)
			} else {
				early = append(early, pp)
			}
		default:
			rest = append(rest, pp)
		}
	}
	clear(waiting[len(rest):])
	s.answerParked(early, now, false, &s.parking.buf)
	return rest
}

// replyParked writes a parked poll's reply and gives its connection back to
// net/http (or closes it: closing, a pipelined request, a failed write).
// The slot and the count are given back first: the client's next poll, sent
// as soon as this reply is read, finds them free. rb is the parker's buffer
// (p.buf) on its goroutine; there, what the socket does not take at once is
// written by a goroutine of its own, counted in p.writers. Any other rb is a
// handler's at shutdown: the handler writes the rest itself, as it may block.
func (s *Server) replyParked(pp *parked, body []byte, closing bool, now time.Time, rb *replyBuf) {
	p := &s.parking
	pp.release()
	closeAfter := closing || pp.close
	b := append(rb.scratch[:0], "HTTP/1.1 200 OK\r\nCache-Control: no-store\r\nContent-Type: application/json\r\n"...)
	b = append(b, rb.date(now)...)
	b = append(b, "Content-Length: "...)
	b = strconv.AppendInt(b, int64(len(body)), 10)
	b = append(b, "\r\n"...)
	b = append(b, pp.extra...)
	if closeAfter {
		b = append(b, "Connection: close\r\n"...)
	}
	b = append(b, "\r\n"...)
	b = append(b, body...)
	rb.scratch = b
	n, err := writeNow(pp.conn, b)
	if err != nil {
		p.gone.Add(1)
		_ = pp.conn.Close()
		return
	}
	if n == len(b) {
		p.done(pp.conn, closeAfter)
		return
	}
	rest := func(left []byte) {
		_ = pp.conn.SetWriteDeadline(time.Now().Add(parkWriteTimeout))
		if _, err := pp.conn.Write(left); err != nil {
			p.gone.Add(1)
			_ = pp.conn.Close()
			return
		}
		_ = pp.conn.SetWriteDeadline(time.Time{})
		p.done(pp.conn, closeAfter)
	}
	if rb != &p.buf {
		rest(b[n:])
		return
	}
	left := bytes.Clone(b[n:])
	p.writers.Add(1)
	go func() {
		defer p.writers.Done()
		rest(left)
	}()
}

func (p *parking) notKept() uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.back == nil {
		return 0
	}
	return p.back.full.Load()
}

func (p *parking) done(c net.Conn, closeAfter bool) {
	if closeAfter || !p.back.give(c) {
		_ = c.Close()
	}
}

// date is the Date header line of now, formatted once a second.
func (rb *replyBuf) date(now time.Time) []byte {
	if sec := now.Unix(); sec != rb.dateSec || rb.dateHead == nil {
		rb.dateSec = sec
		rb.dateHead = append(now.UTC().AppendFormat(append(rb.dateHead[:0], "Date: "...), http.TimeFormat), "\r\n"...)
	}
	return rb.dateHead
}

// socketOf is the socket under a parked connection (plain or TLS), for the
// writes and peeks that must not wait.
func socketOf(c net.Conn) syscall.RawConn {
	for {
		switch x := c.(type) {
		case *countedConn:
			c = x.Conn
		case interface{ NetConn() net.Conn }: // *tls.Conn
			c = x.NetConn()
		case syscall.Conn:
			rc, err := x.SyscallConn()
			if err != nil {
				return nil
			}
			return rc
		default:
			return nil
		}
	}
}

// writeNow writes what the socket takes at once of b (plain connections;
// TLS ones are left to conn.Write). A short count with a nil error: the rest
// has to wait for the client.
func writeNow(c net.Conn, b []byte) (int, error) {
	if _, plain := c.(*countedConn); !plain {
		return 0, nil
	}
	rc := socketOf(c)
	if rc == nil {
		return 0, nil
	}
	var n int
	var werr error
	err := rc.Write(func(fd uintptr) bool {
		for n < len(b) {
			m, err := syscall.Write(int(fd), b[n:])
			if err == syscall.EINTR {
				continue
			}
			if err == syscall.EAGAIN {
				break
			}
			if err != nil {
				werr = err
				break
			}
			n += m
		}
		return true // never wait here
	})
	if werr != nil {
		return n, werr
	}
	return n, err
}

type peekResult int

const (
	peekIdle peekResult = iota // nothing sent, still open
	peekData                   // the client sent bytes
	peekGone                   // closed or reset by the client
)

// peekConn looks at a parked connection without reading from it.
func peekConn(c net.Conn) peekResult {
	rc := socketOf(c)
	if rc == nil {
		return peekIdle
	}
	res := peekIdle
	var b [1]byte
	err := rc.Control(func(fd uintptr) {
		for {
			n, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
			switch {
			case err == syscall.EINTR:
				continue
			case err == syscall.EAGAIN:
			case err != nil || n == 0:
				res = peekGone
			default:
				res = peekData
			}
			return
		}
	})
	if err != nil {
		return peekGone
	}
	return res
}

// reentry is the listener Serve gives net/http: the connections it accepts,
// and the parked ones given back once answered.
type reentry struct {
	net.Listener
	acc     chan accepted
	back    chan net.Conn
	done    chan struct{}
	stopped chan struct{} // the accept loop has returned
	full    atomic.Uint64 // answered connections closed: the queue was full

	mu     sync.Mutex // closed, given, and sends on back
	closed bool
	// given: the connections given back that net/http has not read a
	// request from yet. It counts them as new, and Shutdown would wait 5 s
	// for such a one before it takes it for idle: Close closes them.
	given map[net.Conn]struct{}
}

type accepted struct {
	c   net.Conn
	err error
}

func newReentry(ln net.Listener) *reentry {
	l := &reentry{Listener: ln, acc: make(chan accepted), back: make(chan net.Conn, reentryQueue),
		done: make(chan struct{}), stopped: make(chan struct{}), given: make(map[net.Conn]struct{})}
	go l.accept()
	return l
}

func (l *reentry) accept() {
	defer close(l.stopped)
	for {
		c, err := l.Listener.Accept()
		select {
		case l.acc <- accepted{c, err}:
		case <-l.done:
			if c != nil {
				_ = c.Close()
			}
			return
		}
	}
}

func (l *reentry) Accept() (net.Conn, error) {
	select {
	case c := <-l.back:
		return c, nil
	default:
	}
	select {
	case c := <-l.back:
		return c, nil
	case a := <-l.acc:
		return a.c, a.err
	case <-l.done:
		return nil, net.ErrClosed
	}
}

// give hands an answered connection back. false: the listener is closed, or
// reentryQueue connections already wait for Accept (the caller closes c;
// its client reconnects).
func (l *reentry) give(c net.Conn) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return false
	}
	select {
	case l.back <- c:
		l.given[c] = struct{}{}
		return true
	default:
		l.full.Add(1)
		return false
	}
}

// connState is the server's ConnState hook: a connection given back leaves
// given once net/http reads from it (or closes it).
func (l *reentry) connState(c net.Conn, st http.ConnState) {
	if st != http.StateActive && st != http.StateClosed {
		return
	}
	l.mu.Lock()
	if len(l.given) > 0 {
		delete(l.given, c)
	}
	l.mu.Unlock()
}

// Close closes the listener and the connections given back that net/http
// has not read a request from.
func (l *reentry) Close() error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil
	}
	l.closed = true
	close(l.done)
	for len(l.back) > 0 {
		<-l.back // in given too
	}
	for c := range l.given {
		_ = c.Close()
	}
	clear(l.given)
	l.mu.Unlock()
	err := l.Listener.Close()
	<-l.stopped
	if errors.Is(err, net.ErrClosed) {
		return nil
	}
	return err
}
