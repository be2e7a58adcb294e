package modbus

import (
	"context"
	crand "crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	gb "github.com/goburrow/modbus"
)

// UDPConfig configures the one UDP socket shared by every Modbus UDP device.
type UDPConfig struct {
	Listen      string       // local address (":0"); tests use "127.0.0.1:0"
	BufferBytes int          // SO_RCVBUF and SO_SNDBUF asked for (4 MiB); the kernel may clamp
	Logger      *slog.Logger // nil: discard
	// NoBatch sends and reads one datagram per syscall even where
	// sendmmsg/recvmmsg are available (Linux on amd64, arm, arm64); the
	// results are the same. For comparison and as a way out.
	NoBatch bool
	// UnknownSource, if set, is also added to for every datagram from an
	// endpoint that is no device (a gateway-wide record the caller exports).
	UnknownSource *atomic.Uint64
}

// recentN is how many answered or expired transaction ids each destination
// remembers, to tell a late or duplicated reply from an unknown one. A
// remembered id is not handed out again while it is remembered.
const recentN = 64

// maxADU is the largest MBAP frame: 7-byte header + 253-byte PDU.
const maxADU = mbapHeader - 1 + mbapMaxLength

// UDPSocket is one UDP socket for all Modbus UDP devices. Requests of many
// UDPConns go out concurrently; Run is the one reader goroutine that matches
// replies to requests by (source address, transaction id) and checks unit,
// function code and length against the request. Late, duplicated, foreign
// and malformed datagrams are dropped and counted, never delivered.
//
// Transaction ids are drawn per request from a ChaCha8 generator seeded
// from crypto/rand: never 0, never one pending or among the last recentN of
// the destination. A datagram from a device's address that carries an id
// neither pending nor recent (what a blind forger guessing ids sends) makes
// every request then waiting on that address untrusted: its reply, when it
// comes, is dropped and counted (Untrusted) and the request fails.
type UDPSocket struct {
	conn     *net.UDPConn
	log      *slog.Logger
	rcv, snd int
	cnt      counters    // totals over all devices, plus unknown sources
	fam      int         // address family of the socket (batch sockaddrs)
	batch    atomic.Bool // sendmmsg/recvmmsg in use
	unknown  *atomic.Uint64

	mu      sync.Mutex
	rng     *rand.ChaCha8
	dests   map[netip.AddrPort]*udpDest
	byIP    map[netip.Addr]*udpDest // a destination at each address, to blame replies from a wrong port
	waiters []*udpWaiter            // free waiters of rounds

	raw         syscall.RawConn
	sendMu      sync.Mutex // owns send and sendReqs, the sendmmsg state of rounds
	send        *mmsgBatch
	sendReqs    []*Request
	sendFailedF func(int, error)
}

// udpDest is the transaction-id space of one destination address, shared by
// the units behind it, and the requests waiting on it.
type udpDest struct {
	addr   netip.AddrPort
	sa     rawSockaddr // addr for sendmmsg
	saOK   bool
	refs   int
	only   *udpTransport // the one device behind it while refs == 1
	pend   []*udpPending // in flight to this address (one per device and round)
	recent [recentN]recentTid
	ri     int
}

// stray counts a datagram from this destination that matches no request,
// on the device too when only one device is behind the address.
func (d *udpDest) stray() {
	if d.refs == 1 && d.only != nil {
		d.only.cnt.dropped.Add(1)
	}
}

// taint marks every request waiting on d as untrusted.
func (d *udpDest) taint() {
	for _, p := range d.pend {
		p.tainted = true
	}
}

func (d *udpDest) pending(tid uint16) *udpPending {
	for _, p := range d.pend {
		if p.tid == tid {
			return p
		}
	}
	return nil
}

func (d *udpDest) remove(p *udpPending) {
	for i, q := range d.pend {
		if q == p {
			last := len(d.pend) - 1
			d.pend[i] = d.pend[last]
			d.pend[last] = nil
			d.pend = d.pend[:last]
			return
		}
	}
}

type recentTid struct {
	tr       *udpTransport
	tid      uint16
	answered bool // else expired (timed out or write failed)
}

// States of a udpPending.
const (
	pendIdle      = iota
	pendWaiting   // registered on its destination
	pendAnswered  // reply copied into resp[:n]
	pendUntrusted // a matching reply came, but the request was tainted
	pendExpired   // timed out or the write failed
)

// udpPending is one request waiting for its reply. Its fields are guarded
// by the socket's mu while state is pendWaiting; the owner reads them after
// the waiter has been signalled or the request expired.
type udpPending struct {
	tr       *udpTransport
	dest     *udpDest
	tid      uint16
	unit, fc byte
	req      []byte // request PDU (function code + data), checked against the reply
	resp     []byte // the reply ADU is copied here (len maxADU)
	n        int
	at       time.Time // when the reply was read off the socket
	state    uint8
	tainted  bool
	w        *udpWaiter
	sendErr  error // the datagram could not be sent (round)
}

// udpWaiter wakes the goroutine that waits for left replies, once.
type udpWaiter struct {
	left  int           // under s.mu
	ch    chan struct{} // capacity 1; one send when left reaches 0
	timer *time.Timer
}

func newWaiter() *udpWaiter {
	w := &udpWaiter{ch: make(chan struct{}, 1), timer: time.NewTimer(time.Hour)}
	w.timer.Stop()
	return w
}

// done is called under s.mu when one of the waiter's requests completes.
func (w *udpWaiter) done() {
	if w.left--; w.left == 0 {
		select {
		case w.ch <- struct{}{}:
		default:
		}
	}
}

// wait blocks until every request of w completed or d has passed; it
// reports whether all completed in time.
func (w *udpWaiter) wait(d time.Duration) bool {
	if d <= 0 {
		return false
	}
	w.timer.Reset(d)
	select {
	case <-w.ch:
		w.timer.Stop()
		return true
	case <-w.timer.C:
		return false
	}
}

// register allocates p a fresh transaction id for its destination and puts
// it in flight. Caller holds mu.
// await waits for p's reply until t.timeout when its datagram went out
// (sent), then takes p out of the pending set and drains a wake-up sent
// after the wait gave up, so t's waiter is clean for the next request.
func (t *udpTransport) await(p *udpPending, sent bool) {
	if sent {
		t.w.wait(t.timeout)
	}
	t.s.mu.Lock()
	t.s.expire(p)
	t.s.mu.Unlock()
	select {
	case <-t.w.ch:
	default:
	}
}

func (s *UDPSocket) register(p *udpPending) error {
	d := p.dest
	for range 1024 {
		tid := uint16(s.rng.Uint64())
		if tid == 0 || d.pending(tid) != nil || d.find(tid) != nil {
			continue
		}
		p.tid, p.n, p.state, p.tainted, p.sendErr = tid, 0, pendWaiting, false, nil
		d.pend = append(d.pend, p)
		p.w.left++
		return nil
	}
	return errors.New("no free transaction id")
}

// expire ends p if it still waits (its tid is remembered as expired). Caller
// holds mu.
func (s *UDPSocket) expire(p *udpPending) {
	if p.state != pendWaiting {
		return
	}
	p.dest.remove(p)
	p.dest.remember(p.tr, p.tid, false)
	p.state = pendExpired
	p.w.done()
}

// NewUDPSocket opens the socket and sizes its buffers; it starts no
// goroutine: call Run.
func NewUDPSocket(cfg UDPConfig) (*UDPSocket, error) {
	if cfg.Listen == "" {
		cfg.Listen = ":0"
	}
	if cfg.BufferBytes <= 0 {
		cfg.BufferBytes = 4 << 20
	}
	log := discard(cfg.Logger).With("transport", "udp")
	la, err := net.ResolveUDPAddr("udp", cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("modbus: udp listen %q: %w", cfg.Listen, err)
	}
	conn, err := net.ListenUDP("udp", la)
	if err != nil {
		return nil, fmt.Errorf("modbus: udp listen %q: %w", cfg.Listen, err)
	}
	var seed [32]byte
	if _, err := crand.Read(seed[:]); err != nil {
		conn.Close()
		return nil, fmt.Errorf("modbus: udp %s: seed transaction ids: %w", conn.LocalAddr(), err)
	}
	s := &UDPSocket{conn: conn, log: log, rng: rand.NewChaCha8(seed), dests: map[netip.AddrPort]*udpDest{}, byIP: map[netip.Addr]*udpDest{}, send: newMmsgBatch()}
	s.sendFailedF = s.sendFailed
	s.unknown = cfg.UnknownSource
	if s.raw, err = conn.SyscallConn(); err != nil {
		conn.Close()
		return nil, fmt.Errorf("modbus: udp %s: %w", conn.LocalAddr(), err)
	}
	s.fam = s.socketFamily()
	s.batch.Store(batchSupported && !cfg.NoBatch && s.fam != 0)
	_ = conn.SetReadBuffer(cfg.BufferBytes)
	_ = conn.SetWriteBuffer(cfg.BufferBytes)
	s.rcv, s.snd, err = sockBuffers(conn)
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("modbus: udp %s: read buffer sizes: %w", conn.LocalAddr(), err)
	}
	lvl := slog.LevelInfo
	if s.rcv < cfg.BufferBytes {
		lvl = slog.LevelWarn // clamped by net.core.rmem_max
	}
	log.Log(context.Background(), lvl, "modbus: udp socket open", "local", conn.LocalAddr().String(),
		"asked", cfg.BufferBytes, "rcvbuf", s.rcv, "sndbuf", s.snd, "batch", s.batch.Load())
	return s, nil
}

// sockBuffers reads back SO_RCVBUF and SO_SNDBUF as granted (Linux reports
// twice the usable size asked for, capped by rmem_max/wmem_max).
func sockBuffers(c *net.UDPConn) (rcv, snd int, err error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return 0, 0, err
	}
	var serr error
	err = rc.Control(func(fd uintptr) {
		rcv, serr = syscall.GetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF)
		if serr == nil {
			snd, serr = syscall.GetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_SNDBUF)
		}
	})
	if err == nil {
		err = serr
	}
	return rcv, snd, err
}

// LocalAddr is the socket's bound address.
func (s *UDPSocket) LocalAddr() netip.AddrPort { return s.conn.LocalAddr().(*net.UDPAddr).AddrPort() }

// Buffers returns SO_RCVBUF and SO_SNDBUF as granted by the kernel.
func (s *UDPSocket) Buffers() (rcv, snd int) { return s.rcv, s.snd }

// Counters returns the totals over all devices of this socket, plus the
// datagrams from unknown sources (Dropped and UnknownSource) and for unknown
// transaction ids (Dropped), counted here only.
func (s *UDPSocket) Counters() Counters { return s.cnt.snapshot() }

// Close closes the socket; Run returns and waiting requests time out.
func (s *UDPSocket) Close() error { return s.conn.Close() }

// Run reads every datagram of the socket and hands each reply to the request
// waiting for it. It returns nil when ctx is done or the socket is closed,
// after its helper goroutine has exited.
func (s *UDPSocket) Run(ctx context.Context) error {
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		select {
		case <-ctx.Done():
			_ = s.conn.SetReadDeadline(time.Now())
		case <-stop:
		}
	}()
	defer func() { close(stop); wg.Wait() }()
	if s.batch.Load() {
		err := s.readBatches(ctx)
		if !errors.Is(err, errBatchUnsupported) {
			return err
		}
		s.batch.Store(false)
		s.log.Warn("modbus: udp batch calls refused by the kernel; one syscall per datagram", "err", err)
	}
	buf := make([]byte, 1024) // an MBAP frame is at most 260 bytes
	for {
		n, src, err := s.conn.ReadFromUDPAddrPort(buf)
		if err != nil {
			return s.readErr(ctx, err)
		}
		s.dispatch(src, buf[:n])
	}
}

// readBatchN is how many datagrams one recvmmsg may return.
const readBatchN = 64

// readBatches reads with recvmmsg and matches each batch under one lock.
func (s *UDPSocket) readBatches(ctx context.Context) error {
	b := newRecvBatch(readBatchN)
	bufs := make([][]byte, readBatchN)
	mem := make([]byte, readBatchN*1024) // an MBAP frame is at most 260 bytes
	for i := range bufs {
		bufs[i] = mem[i*1024 : (i+1)*1024 : (i+1)*1024]
	}
	for {
		n, err := s.recvBatch(b, bufs)
		if errors.Is(err, errBatchUnsupported) {
			return err
		}
		if err != nil {
			return s.readErr(ctx, err)
		}
		now := time.Now() // one clock read per batch: the replies' arrival
		s.mu.Lock()
		for i := range n {
			s.dispatchLocked(b.source(i), bufs[i][:b.length(i)], now)
		}
		s.mu.Unlock()
	}
}

func (s *UDPSocket) readErr(ctx context.Context, err error) error {
	if ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
		return nil
	}
	return fmt.Errorf("modbus: udp %s: read: %w", s.conn.LocalAddr(), err)
}

func unmap(ap netip.AddrPort) netip.AddrPort {
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
}

// dispatch matches one datagram (b is reused by the caller: copied before
// it is handed on).
func (s *UDPSocket) dispatch(src netip.AddrPort, b []byte) {
	now := time.Now()
	s.mu.Lock()
	s.dispatchLocked(src, b, now)
	s.mu.Unlock()
}

// dispatchLocked matches one datagram; caller holds mu. A reply is accepted
// only from the request's destination address and port, with its pending
// transaction id, a well-formed MBAP header, the request's unit and
// function (or its exception) and the length the request asked for
// (checkPDU); anything else is dropped and counted, and the request keeps
// waiting for its own reply. now is when b was read off the socket.
func (s *UDPSocket) dispatchLocked(src netip.AddrPort, b []byte, now time.Time) {
	src = unmap(src)
	d := s.dests[src]
	if d == nil {
		s.cnt.dropped.Add(1)
		s.cnt.unknownSource.Add(1)
		if s.unknown != nil {
			s.unknown.Add(1)
		}
		if d := s.byIP[src.Addr()]; d != nil {
			d.stray() // a known device answering from another port
		}
		return
	}
	if len(b) < 2 {
		s.cnt.dropped.Add(1)
		d.stray()
		return
	}
	tid := binary.BigEndian.Uint16(b)
	p := d.pending(tid)
	if p == nil {
		r := d.find(tid)
		switch {
		case r == nil:
			// Not an id we sent lately: a confused device, or someone
			// guessing ids with the device's address. Whatever waits on
			// this address now is not trusted.
			s.cnt.dropped.Add(1)
			d.stray()
			d.taint()
		case r.answered:
			s.cnt.duplicates.Add(1)
			r.tr.cnt.duplicates.Add(1)
		default:
			s.cnt.late.Add(1)
			r.tr.cnt.late.Add(1)
		}
		return
	}
	if len(b) < mbapHeader+2 || len(b) > maxADU ||
		binary.BigEndian.Uint16(b[2:]) != 0 || int(binary.BigEndian.Uint16(b[4:])) != len(b)-6 ||
		b[6] != p.unit || (b[7] != p.fc && b[7] != p.fc|0x80) || checkPDU(p.req, b[mbapHeader:]) != nil {
		// Malformed, another unit's or another function's reply, or
		// the wrong length: not ours; the request keeps waiting.
		s.cnt.dropped.Add(1)
		p.tr.cnt.dropped.Add(1)
		return
	}
	d.remove(p)
	d.remember(p.tr, tid, true)
	if p.tainted {
		s.cnt.dropped.Add(1)
		s.cnt.untrusted.Add(1)
		p.tr.cnt.dropped.Add(1)
		p.tr.cnt.untrusted.Add(1)
		p.state = pendUntrusted
	} else {
		p.n = copy(p.resp, b)
		p.at = now
		p.state = pendAnswered
	}
	p.w.done()
}

func (d *udpDest) find(tid uint16) *recentTid {
	for i := range d.recent {
		if r := &d.recent[i]; r.tr != nil && r.tid == tid {
			return r
		}
	}
	return nil
}

func (d *udpDest) remember(tr *udpTransport, tid uint16, answered bool) {
	d.recent[d.ri] = recentTid{tr: tr, tid: tid, answered: answered}
	d.ri = (d.ri + 1) % recentN
}

// UDPConn is one Modbus UDP device (one unit at one address) on a shared
// UDPSocket. Its methods are called from one goroutine; UDPConns of one
// socket run concurrently.
type UDPConn struct {
	device
	t *udpTransport
}

// Device returns the connection to unit at addr (host:port) over the
// socket. timeout is the reply timeout (200ms if 0).
func (s *UDPSocket) Device(addr string, unit uint8, timeout time.Duration) (*UDPConn, error) {
	if timeout <= 0 {
		timeout = 200 * time.Millisecond
	}
	ua, err := net.ResolveUDPAddr("udp", addr)
	if err != nil {
		return nil, fmt.Errorf("modbus: udp %s unit %d: %w", addr, unit, err)
	}
	dst := unmap(ua.AddrPort())
	t := &udpTransport{s: s, dst: dst, timeout: timeout, cnt: &counters{}, w: newWaiter()}
	s.mu.Lock()
	d := s.dests[dst]
	if d == nil {
		d = &udpDest{addr: dst}
		d.sa, d.saOK = sockaddr(s.fam, dst)
		s.dests[dst] = d
	}
	d.refs++
	d.only = nil
	if d.refs == 1 {
		d.only = t
	}
	if s.byIP[dst.Addr()] == nil {
		s.byIP[dst.Addr()] = d
	}
	t.dest = d
	s.mu.Unlock()
	t.pend = udpPending{tr: t, dest: d, unit: unit, resp: t.resp[:], w: t.w}
	p := gb.NewTCPClientHandler("")
	p.SlaveId = unit
	p.IdleTimeout = 0
	return &UDPConn{device: newDevice(p, mbapFraming, t, "udp", dst.String(), unit, t.cnt), t: t}, nil
}

// Close detaches the device from the socket (the socket stays open). When
// the last device of an address is closed, its replies count as unknown.
func (c *UDPConn) Close() error {
	s, t := c.t.s, c.t
	s.mu.Lock()
	defer s.mu.Unlock()
	if t.closed {
		return nil
	}
	t.closed = true
	if t.dest.refs--; t.dest.refs == 0 {
		delete(s.dests, t.dst)
		if s.byIP[t.dst.Addr()] == t.dest {
			delete(s.byIP, t.dst.Addr())
		}
	}
	return nil
}

var _ transport = (*udpTransport)(nil)

type udpTransport struct {
	s       *UDPSocket
	dst     netip.AddrPort
	dest    *udpDest
	timeout time.Duration
	cnt     *counters
	w       *udpWaiter
	pend    udpPending // the request of Send; one in flight per device
	buf     []byte
	resp    [maxADU]byte
	closed  bool // under s.mu
}

// errUntrusted fails a request whose destination sent a datagram with an
// unknown transaction id while it waited.
var errUntrusted = &FrameError{Reason: "reply not trusted: a datagram with an unknown transaction id came from the device's address while the request waited"}

// Send sends req under a fresh random transaction id unique for the
// destination, waits for the reader to match the reply, and puts the
// request's own transaction id back into the reply so goburrow's Verify
// passes.
func (t *udpTransport) Send(req []byte) ([]byte, error) {
	if len(req) < mbapHeader+1 {
		return nil, fmt.Errorf("%w: request of %d bytes", ErrRequest, len(req))
	}
	t.buf = append(t.buf[:0], req...)
	p := &t.pend
	p.req, p.unit, p.fc = t.buf[mbapHeader:], req[6], req[7]
	s := t.s
	s.mu.Lock()
	if t.closed {
		s.mu.Unlock()
		return nil, net.ErrClosed
	}
	if err := s.register(p); err != nil {
		s.mu.Unlock()
		return nil, err
	}
	s.mu.Unlock()
	binary.BigEndian.PutUint16(t.buf, p.tid)

	_, werr := s.conn.WriteToUDPAddrPort(t.buf, t.dst)
	t.await(p, werr == nil)
	switch p.state {
	case pendAnswered:
		resp := append([]byte(nil), p.resp[:p.n]...)
		copy(resp[:2], req[:2])
		return resp, nil
	case pendUntrusted:
		return nil, errUntrusted
	}
	if werr != nil {
		return nil, werr
	}
	return nil, timeoutAfter(t.timeout)
}

func (t *udpTransport) fail(error) {}

func (t *udpTransport) succeeded() {}
