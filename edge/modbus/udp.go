package modbus

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"syscall"
	"time"

	gb "github.com/goburrow/modbus"
)

// UDPConfig configures the one UDP socket shared by every Modbus UDP device.
type UDPConfig struct {
	Listen      string       // local address (":0"); tests use "127.0.0.1:0"
	BufferBytes int          // SO_RCVBUF and SO_SNDBUF asked for (4 MiB); the kernel may clamp
	Logger      *slog.Logger // nil: discard
}

// recentN is how many answered or expired transaction ids each destination
// remembers, to tell a late or duplicated reply from an unknown one. A
// remembered id is not handed out again while it is remembered.
const recentN = 64

// UDPSocket is one UDP socket for all Modbus UDP devices. Requests of many
// UDPConns go out concurrently; Run is the one reader goroutine that matches
// replies to requests by (source address, transaction id) and checks unit
// and function code. Late, duplicated, foreign and malformed datagrams are
// dropped and counted, never delivered.
type UDPSocket struct {
	conn     *net.UDPConn
	log      *slog.Logger
	rcv, snd int
	cnt      counters // totals over all devices, plus unknown sources

	mu      sync.Mutex
	dests   map[netip.AddrPort]*udpDest
	byIP    map[netip.Addr]*udpDest // a destination at each address, to blame replies from a wrong port
	pending map[pendKey]*udpPending
}

type pendKey struct {
	src netip.AddrPort
	tid uint16
}

// udpDest is the transaction-id space of one destination address, shared by
// the units behind it.
type udpDest struct {
	refs   int
	only   *udpTransport // the one device behind it while refs == 1
	next   uint16
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

type recentTid struct {
	tr       *udpTransport
	tid      uint16
	answered bool // else expired (timed out or write failed)
}

type udpPending struct {
	tr       *udpTransport
	unit, fc byte
	ch       chan []byte // capacity 1; exactly one send per pending entry
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
	s := &UDPSocket{conn: conn, log: log, dests: map[netip.AddrPort]*udpDest{}, byIP: map[netip.Addr]*udpDest{}, pending: map[pendKey]*udpPending{}}
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
		"asked", cfg.BufferBytes, "rcvbuf", s.rcv, "sndbuf", s.snd)
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
// datagrams from unknown sources and for unknown transaction ids (counted
// Dropped here only).
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
	buf := make([]byte, 1024) // an MBAP frame is at most 260 bytes
	for {
		n, src, err := s.conn.ReadFromUDPAddrPort(buf)
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return nil
			}
			return fmt.Errorf("modbus: udp %s: read: %w", s.conn.LocalAddr(), err)
		}
		s.dispatch(src, buf[:n])
	}
}

func unmap(ap netip.AddrPort) netip.AddrPort {
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
}

// dispatch matches one datagram (b is reused by the caller: copied before it
// is handed on).
func (s *UDPSocket) dispatch(src netip.AddrPort, b []byte) {
	src = unmap(src)
	s.mu.Lock()
	defer s.mu.Unlock()
	d := s.dests[src]
	if d == nil {
		s.cnt.dropped.Add(1)
		if d := s.byIP[src.Addr()]; d != nil {
			d.stray() // a known device answering from another port
		}
		return
	}
	if len(b) < mbapHeader+2 || len(b) > mbapHeader-1+mbapMaxLength ||
		binary.BigEndian.Uint16(b[2:]) != 0 || int(binary.BigEndian.Uint16(b[4:])) != len(b)-6 {
		s.cnt.dropped.Add(1)
		if len(b) >= 2 {
			if p := s.pending[pendKey{src, binary.BigEndian.Uint16(b)}]; p != nil {
				p.tr.cnt.dropped.Add(1)
			}
		}
		return
	}
	tid := binary.BigEndian.Uint16(b)
	key := pendKey{src, tid}
	p := s.pending[key]
	if p == nil {
		r := d.find(tid)
		switch {
		case r == nil:
			s.cnt.dropped.Add(1)
			d.stray()
		case r.answered:
			s.cnt.duplicates.Add(1)
			r.tr.cnt.duplicates.Add(1)
		default:
			s.cnt.late.Add(1)
			r.tr.cnt.late.Add(1)
		}
		return
	}
	if b[6] != p.unit || (b[7] != p.fc && b[7] != p.fc|0x80) {
		// Another unit's or another function's reply: not ours; the
		// request keeps waiting for its own.
		s.cnt.dropped.Add(1)
		p.tr.cnt.dropped.Add(1)
		return
	}
	delete(s.pending, key)
	d.remember(p.tr, tid, true)
	p.ch <- append([]byte(nil), b...)
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

// alloc returns the next transaction id for dst that is neither pending nor
// remembered, wrapping past 65535 to 1 (0 is never used). Caller holds mu.
func (s *UDPSocket) alloc(dst netip.AddrPort, d *udpDest) (uint16, bool) {
	for range 0xFFFF {
		d.next++
		if d.next == 0 {
			d.next = 1
		}
		if _, busy := s.pending[pendKey{dst, d.next}]; busy || d.find(d.next) != nil {
			continue
		}
		return d.next, true
	}
	return 0, false
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
	t := &udpTransport{s: s, dst: dst, timeout: timeout, cnt: &counters{}, timer: time.NewTimer(time.Hour)}
	t.timer.Stop()
	t.pend = udpPending{tr: t, unit: unit, ch: make(chan []byte, 1)}
	s.mu.Lock()
	d := s.dests[dst]
	if d == nil {
		d = &udpDest{}
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
	p := gb.NewTCPClientHandler("")
	p.SlaveId = unit
	p.IdleTimeout = 0
	return &UDPConn{device: newDevice(p, t, "udp", dst.String(), unit, t.cnt), t: t}, nil
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
	timer   *time.Timer
	pend    udpPending // one request in flight per device
	buf     []byte
	closed  bool // under s.mu
}

// Send sends req under a fresh transaction id unique for the destination,
// waits for the reader to hand over the matching reply, and puts the
// request's own transaction id back into the reply so goburrow's Verify
// passes.
func (t *udpTransport) Send(req []byte) ([]byte, error) {
	if len(req) < mbapHeader+1 {
		return nil, fmt.Errorf("%w: request of %d bytes", ErrRequest, len(req))
	}
	s := t.s
	s.mu.Lock()
	if t.closed {
		s.mu.Unlock()
		return nil, net.ErrClosed
	}
	tid, ok := s.alloc(t.dst, t.dest)
	if !ok {
		s.mu.Unlock()
		return nil, errors.New("no free transaction id")
	}
	t.pend.unit, t.pend.fc = req[6], req[7]
	key := pendKey{t.dst, tid}
	s.pending[key] = &t.pend
	s.mu.Unlock()

	t.buf = append(t.buf[:0], req...)
	binary.BigEndian.PutUint16(t.buf, tid)
	resp, err := t.exchange(key)
	if err != nil {
		return nil, err
	}
	copy(resp[:2], req[:2])
	if err := checkPDU(req[mbapHeader:], resp[mbapHeader:]); err != nil {
		t.cnt.dropped.Add(1)
		s.cnt.dropped.Add(1)
		return nil, err
	}
	return resp, nil
}

func (t *udpTransport) exchange(key pendKey) ([]byte, error) {
	if _, err := t.s.conn.WriteToUDPAddrPort(t.buf, t.dst); err != nil {
		if resp := t.abandon(key); resp != nil {
			return resp, nil
		}
		return nil, err
	}
	t.timer.Reset(t.timeout)
	select {
	case resp := <-t.pend.ch:
		t.timer.Stop()
		return resp, nil
	case <-t.timer.C:
		if resp := t.abandon(key); resp != nil {
			return resp, nil
		}
		return nil, timeoutAfter(t.timeout)
	}
}

// abandon removes the pending entry and remembers its tid as expired; if the
// reader matched it first, the reply is already in the channel: take it.
func (t *udpTransport) abandon(key pendKey) []byte {
	t.s.mu.Lock()
	if t.s.pending[key] == &t.pend {
		delete(t.s.pending, key)
		t.dest.remember(t, key.tid, false)
		t.s.mu.Unlock()
		return nil
	}
	t.s.mu.Unlock()
	return <-t.pend.ch
}

func (t *udpTransport) fail(error) {}
