package modbus

import (
	"encoding/binary"
	"errors"
	"io"
	"net"
	"time"

	gb "github.com/goburrow/modbus"
)

// TCPPort is one Modbus TCP stream shared by several units: a Modbus
// TCP→RTU gateway (Moxa MGate, USR-TCP232 …) that serves one request at a
// time on few connections. It dials on first use and redials with the
// backoff rules of NewTCP. The port numbers requests itself (one
// transaction id sequence for all its units), so a reply is matched by
// transaction id and unit:
//   - a reply with an earlier transaction id (late, after its request gave
//     up) is skipped and counted Late; the stream stays;
//   - a reply for the right transaction but another unit is dropped and
//     counted Dropped (of the unit that asked);
//   - a timeout keeps the stream (a dead unit behind the gateway is not a
//     dead gateway) unless MaxSharedTimeouts requests in a row timed out or
//     the reply was cut inside a frame; any other error closes it.
//
// Not safe for concurrent use: one goroutine (the bus owning the endpoint)
// issues every request of every unit.
type TCPPort struct {
	addr     string
	timeout  time.Duration
	cnt      counters // Reconnects of the stream
	rd       *redialer
	tid      uint16
	timeouts int  // requests in a row that timed out
	desync   bool // a reply was cut inside a frame: the stream must go
}

// MaxSharedTimeouts is how many requests in a row may time out on a
// TCPPort before its stream is closed and redialled.
const MaxSharedTimeouts = 3

// NewTCPPort returns the shared stream to cfg.Address; cfg.Unit is unused
// (units come from Unit). It does not dial.
func NewTCPPort(cfg TCPConfig) *TCPPort {
	cfg.defaults()
	p := &TCPPort{addr: cfg.Address, timeout: cfg.Timeout}
	p.rd = &redialer{addr: cfg.Address, dialTimeout: cfg.DialTimeout, cnt: &p.cnt,
		log: cfg.Logger.With("transport", "tcp"), bo: newGate(cfg.BackoffMin, cfg.BackoffMax)}
	return p
}

// Close closes the stream; a later request dials again.
func (p *TCPPort) Close() error { return p.rd.close() }

// TCPUnitConn is one unit on a TCPPort.
type TCPUnitConn struct {
	device
	t *sharedTCPTransport
}

// Unit returns the connection to unit u over the port; timeout is its
// reply timeout (the port's Timeout if 0).
func (p *TCPPort) Unit(u uint8, timeout time.Duration) *TCPUnitConn {
	if timeout <= 0 {
		timeout = p.timeout
	}
	t := &sharedTCPTransport{port: p, timeout: timeout, cnt: &counters{}}
	pk := gb.NewTCPClientHandler("")
	pk.SlaveId = u
	pk.IdleTimeout = 0
	return &TCPUnitConn{device: newDevice(pk, mbapFraming, t, "tcp", p.addr, u, t.cnt), t: t}
}

// Counters returns this unit's counters; Reconnects are the port's.
func (c *TCPUnitConn) Counters() Counters {
	n := c.t.cnt.snapshot()
	n.Reconnects = c.t.port.cnt.reconnects.Load()
	return n
}

// Close releases nothing: the stream belongs to the port.
func (c *TCPUnitConn) Close() error { return nil }

var _ transport = (*sharedTCPTransport)(nil)

type sharedTCPTransport struct {
	port    *TCPPort
	timeout time.Duration
	cnt     *counters
}

// Send numbers req with the port's next transaction id (in place: the
// packager verifies the reply against the same slice), writes it and reads
// frames until the one answering it or the deadline. A malformed frame is
// counted as dropped here; a reply the packager refuses, there.
func (t *sharedTCPTransport) Send(req []byte) ([]byte, error) {
	resp, err := t.send(req)
	var fe *FrameError
	if errors.As(err, &fe) {
		t.cnt.dropped.Add(1)
	}
	return resp, err
}

func (t *sharedTCPTransport) send(req []byte) ([]byte, error) {
	p := t.port
	if len(req) < mbapHeader+1 {
		return nil, frameErr("request of %d bytes", len(req))
	}
	conn, err := p.rd.get()
	if err != nil {
		return nil, err
	}
	p.tid++
	if p.tid == 0 {
		p.tid = 1
	}
	binary.BigEndian.PutUint16(req, p.tid)
	if err := conn.SetDeadline(time.Now().Add(t.timeout)); err != nil {
		return nil, err
	}
	if _, err := conn.Write(req); err != nil {
		return nil, classify(err, t.timeout)
	}
	for {
		resp, err := t.readFrame(conn)
		if err != nil {
			return nil, err
		}
		tid := binary.BigEndian.Uint16(resp)
		switch {
		case tid != p.tid:
			t.cnt.late.Add(1) // the answer to a request that gave up
			continue
		case resp[6] != req[6]:
			t.cnt.dropped.Add(1)
			continue
		}
		if err := checkMBAP(req, resp); err != nil {
			return nil, err
		}
		return resp, nil
	}
}

func (t *sharedTCPTransport) succeeded() {
	t.port.timeouts = 0
	t.port.rd.succeeded()
}

// readFrame reads one MBAP frame. A timeout after part of a frame marks
// the stream out of step.
func (t *sharedTCPTransport) readFrame(conn net.Conn) ([]byte, error) {
	var hdr [mbapHeader]byte
	if n, err := io.ReadFull(conn, hdr[:]); err != nil {
		t.port.desync = t.port.desync || n > 0
		return nil, classify(err, t.timeout)
	}
	length := int(binary.BigEndian.Uint16(hdr[4:]))
	if length < 2 || length > mbapMaxLength {
		return nil, frameErr("mbap length %d not in 2..%d", length, mbapMaxLength)
	}
	resp := make([]byte, mbapHeader-1+length)
	copy(resp, hdr[:])
	if _, err := io.ReadFull(conn, resp[mbapHeader:]); err != nil {
		t.port.desync = true
		return nil, classify(err, t.timeout)
	}
	return resp, nil
}

// fail is told about every failed request (device.wrap): it decides
// whether the shared stream goes.
func (t *sharedTCPTransport) fail(err error) {
	p := t.port
	switch {
	case errors.Is(err, ErrBackoff):
		return
	case errors.Is(err, ErrTimeout) && !p.desync:
		if p.timeouts++; p.timeouts < MaxSharedTimeouts {
			return
		}
	}
	p.timeouts, p.desync = 0, false
	p.rd.failed(err)
}
