package modbus

import (
	"encoding/binary"
	"errors"
	"log/slog"
	"time"

	gb "github.com/goburrow/modbus"
)

// TCPConfig configures one Modbus TCP device (or one RTU-over-TCP gateway).
// The zero value of every field means its default.
type TCPConfig struct {
	Address     string        // host:port
	Unit        uint8         // unit id (slave id); 0 is sent as is
	Timeout     time.Duration // one deadline for write+read of a request (1s)
	DialTimeout time.Duration // (Timeout)
	BackoffMin  time.Duration // first reconnect delay (100ms), jittered
	BackoffMax  time.Duration // reconnect delay cap (30s)
	Logger      *slog.Logger  // nil: discard
}

func (c *TCPConfig) defaults() {
	if c.Timeout <= 0 {
		c.Timeout = time.Second
	}
	if c.DialTimeout <= 0 {
		c.DialTimeout = c.Timeout
	}
	if c.BackoffMin <= 0 {
		c.BackoffMin = 100 * time.Millisecond
	}
	if c.BackoffMax <= 0 {
		c.BackoffMax = 30 * time.Second
	}
	if c.BackoffMax < c.BackoffMin {
		c.BackoffMax = c.BackoffMin
	}
	c.Logger = discard(c.Logger)
}

// TCPConn is one Modbus TCP device: goburrow's MBAP packager with our
// transporter over one net.Conn. It dials on first use, closes the stream on
// every error that is not an exception and does not redial before a jittered
// exponential backoff has passed (calls meanwhile fail at once with
// ErrBackoff). There is no idle timeout. Its methods are called from one
// goroutine.
type TCPConn struct {
	device
	t *tcpTransport
}

// NewTCP returns a connection to cfg.Address; it does not dial.
func NewTCP(cfg TCPConfig) *TCPConn {
	cfg.defaults()
	cnt := &counters{}
	t := &tcpTransport{
		timeout: cfg.Timeout, cnt: cnt,
		rd: &redialer{addr: cfg.Address, dialTimeout: cfg.DialTimeout, cnt: cnt,
			log: cfg.Logger.With("transport", "tcp", "unit", cfg.Unit),
			bo:  newGate(cfg.BackoffMin, cfg.BackoffMax)},
	}
	p := gb.NewTCPClientHandler("")
	p.SlaveId = cfg.Unit
	p.IdleTimeout = 0
	return &TCPConn{device: newDevice(p, mbapFraming, t, "tcp", cfg.Address, cfg.Unit, cnt), t: t}
}

// Close closes the stream; a later call dials again.
func (c *TCPConn) Close() error { return c.t.rd.close() }

var _ transport = (*tcpTransport)(nil)

// tcpTransport replaces goburrow's own TCP transporter because goburrow
// v0.1.0 returns on a read timeout without closing the stream: the late
// reply stays in the socket and the next request reads it as its answer.
// With a transaction id that happens to match (a device that answers with
// the wrong id, a gateway that renumbers, the ids of two requests apart by
// the counter's step) a stale value is delivered as data with no error;
// otherwise the stream stays one reply behind and every request fails.
// This one closes the stream on every error that is not an exception, so a
// late reply can never be read (TestTCPStaleReply); it reads exactly one
// frame by its MBAP length, checks the header (checkMBAP), and redials
// with backoff (redialer).
type tcpTransport struct {
	timeout time.Duration
	rd      *redialer // shared by the units of a TCPPort
	cnt     *counters // this unit's (dropped frames)
	tid     uint16    // transaction id of Do (goburrow's packager counts its own)
}

const (
	mbapHeader = 7
	// MBAP length field = unit id + PDU; a PDU is at most 253 bytes.
	mbapMaxLength = 253 + 1
)

// Send writes one MBAP request and reads exactly one reply frame:
//
//	transaction id : 2 bytes (must echo the request's)
//	protocol id    : 2 bytes (0)
//	length         : 2 bytes (unit id + PDU: 2..254)
//	unit id        : 1 byte  (must echo the request's)
//	PDU            : length-1 bytes (the packager's to check: pduPackager)
func (t *tcpTransport) Send(req []byte) ([]byte, error) {
	if _, err := t.rd.get(); err != nil {
		return nil, err
	}
	buf := make([]byte, maxADU)
	n, err := t.exchangeInto(req, buf)
	if err != nil {
		t.failed(err)
		return nil, err
	}
	return buf[:n], nil
}

func (t *tcpTransport) succeeded() { t.rd.succeeded() }

// failed closes the stream after an error of an exchange; a frame error
// counts as a dropped reply.
func (t *tcpTransport) failed(err error) {
	t.rd.failed(err)
	var fe *FrameError
	if errors.As(err, &fe) {
		t.cnt.dropped.Add(1)
	}
}

// checkMBAP checks a complete reply ADU's MBAP header against the request
// ADU's; the PDU after it is checked by the packager (pduPackager) or, on
// the allocation-free paths, by their own call of checkPDU.
func checkMBAP(req, resp []byte) error {
	if len(resp) < mbapHeader+2 {
		return frameErr("mbap frame of %d bytes", len(resp))
	}
	if tid, want := binary.BigEndian.Uint16(resp), binary.BigEndian.Uint16(req); tid != want {
		return frameErr("transaction id %d, want %d", tid, want)
	}
	if p := binary.BigEndian.Uint16(resp[2:]); p != 0 {
		return frameErr("protocol id %d", p)
	}
	if l := int(binary.BigEndian.Uint16(resp[4:])); l != len(resp)-6 {
		return frameErr("mbap length %d for %d bytes", l, len(resp)-6)
	}
	if resp[6] != req[6] {
		return frameErr("unit %d in reply, want %d", resp[6], req[6])
	}
	return nil
}

func (t *tcpTransport) fail(err error) { t.rd.failed(err) }
