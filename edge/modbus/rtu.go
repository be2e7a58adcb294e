package modbus

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"reflect"
	"sync"
	"syscall"
	"time"

	gb "github.com/goburrow/modbus"
	"github.com/goburrow/serial"

	"edgegw/internal/backoff"
)

// RS485Config is goburrow/serial's RS-485 ioctl setting; off unless Enabled
// (the ioctl fails on a pty).
type RS485Config = serial.RS485Config

// SerialConfig configures one serial line (one RS-485 bus). The zero value
// of every field means its default.
type SerialConfig struct {
	Path     string        // /dev/ttyS1
	Baud     int           // 9600
	DataBits int           // 8
	Parity   string        // "N" (default), "E" or "O"; goburrow/serial would take "" as EVEN
	StopBits int           // 1
	RS485    RS485Config   // off unless RS485.Enabled
	Timeout  time.Duration // default reply timeout of a unit (1s)
	Logger   *slog.Logger  // nil: discard
}

// maxSelectFD is FD_SETSIZE: goburrow/serial waits with select(2), which
// cannot watch a descriptor at or above it (reads then return nothing).
const maxSelectFD = 1024

// RTU timing and size limits (Modbus over Serial Line V1.02, 2.5.1.1).
const (
	rtuMaxFrame  = 256
	minQuietTime = 20 * time.Millisecond
)

// t35 is the inter-frame silence: 3.5 characters of 11 bits, fixed at
// 1.75 ms above 19200 baud.
func t35(baud int) time.Duration {
	if baud > 19200 {
		return 1750 * time.Microsecond
	}
	return time.Duration(38_500_000_000 / int64(baud))
}

// RTUPort is one serial bus: a serial line (OpenRTU, OpenASCII) or a TCP
// stream to a serial gateway (NewRTUOverTCP, NewASCIIOverTCP), with RTU
// framing (binary, CRC, replies framed by length) or ASCII framing (':',
// hex, LRC, CRLF: ascii.go). It takes its lock around each request, drains
// stale input before writing, keeps the t3.5 silence between frames and a
// quiet time after an error. Timeouts, counters and errors are the same
// for both framings.
type RTUPort struct {
	kind, addr string
	ascii      bool // ASCII framing instead of RTU
	line       rtuLine
	tick       time.Duration // drain read window (t3.5 on serial)
	quiet      time.Duration // silence after an error
	timeout    time.Duration
	log        *slog.Logger
	cnt        counters // Reconnects of the line

	mu      sync.Mutex
	lastErr time.Time
	last    *rtuTransport // unit of the previous request, blamed for drained bytes
	buf     [asciiMaxFrame]byte
	junk    [rtuMaxFrame]byte
}

// OpenRTU opens the serial line now (open ports early: see maxSelectFD).
func OpenRTU(cfg SerialConfig) (*RTUPort, error) { return openSerialBus(cfg, false) }

// OpenASCII opens the serial line now, for Modbus ASCII framing.
func OpenASCII(cfg SerialConfig) (*RTUPort, error) { return openSerialBus(cfg, true) }

func openSerialBus(cfg SerialConfig, ascii bool) (*RTUPort, error) {
	kind := "rtu"
	if ascii {
		kind = "ascii"
	}
	if cfg.Baud <= 0 {
		cfg.Baud = 9600
	}
	if cfg.DataBits <= 0 {
		cfg.DataBits = 8
	}
	if cfg.StopBits <= 0 {
		cfg.StopBits = 1
	}
	switch cfg.Parity {
	case "", "N", "n", "none":
		cfg.Parity = "N"
	case "E", "e", "even":
		cfg.Parity = "E"
	case "O", "o", "odd":
		cfg.Parity = "O"
	default:
		return nil, fmt.Errorf("modbus: %s %s: parity %q not N, E or O", kind, cfg.Path, cfg.Parity)
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = time.Second
	}
	tick := max(t35(cfg.Baud), time.Millisecond)
	p := &RTUPort{
		kind: kind, addr: cfg.Path, ascii: ascii, tick: tick, quiet: max(t35(cfg.Baud), minQuietTime),
		timeout: cfg.Timeout, log: discard(cfg.Logger).With("transport", kind, "path", cfg.Path),
	}
	sl := &serialLine{cfg: serial.Config{
		Address: cfg.Path, BaudRate: cfg.Baud, DataBits: cfg.DataBits, StopBits: cfg.StopBits,
		Parity: cfg.Parity, Timeout: tick, RS485: cfg.RS485,
	}, cnt: &p.cnt, log: p.log, bo: newGate(100*time.Millisecond, 30*time.Second)}
	if err := sl.open(); err != nil {
		return nil, fmt.Errorf("modbus: %s %s: %w", kind, cfg.Path, err)
	}
	p.line = sl
	return p, nil
}

// NewRTUOverTCP returns an RTU bus carried over a TCP stream (a serial
// gateway in transparent mode): RTU framing and CRC, the TCP reconnect
// rules of NewTCP. cfg.Unit is unused: units come from Unit. It does not
// dial.
func NewRTUOverTCP(cfg TCPConfig) *RTUPort { return newStreamBus(cfg, false) }

// NewASCIIOverTCP is NewRTUOverTCP with Modbus ASCII framing.
func NewASCIIOverTCP(cfg TCPConfig) *RTUPort { return newStreamBus(cfg, true) }

func newStreamBus(cfg TCPConfig, ascii bool) *RTUPort {
	cfg.defaults()
	kind := "rtu-tcp"
	if ascii {
		kind = "ascii-tcp"
	}
	p := &RTUPort{
		kind: kind, addr: cfg.Address, ascii: ascii, tick: 50 * time.Microsecond, quiet: 0,
		timeout: cfg.Timeout, log: cfg.Logger.With("transport", kind),
	}
	p.line = &tcpLine{rd: redialer{addr: cfg.Address, dialTimeout: cfg.DialTimeout, cnt: &p.cnt, log: p.log,
		bo: newGate(cfg.BackoffMin, cfg.BackoffMax)}}
	return p
}

// Close closes the line; requests after Close fail.
func (p *RTUPort) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.line.close()
}

// RTUConn is one unit on an RTUPort. Its methods are called from one
// goroutine (the bus's poller); the port serialises units anyway.
type RTUConn struct {
	device
	t *rtuTransport
}

// Unit returns the connection to unit u on the bus; timeout is its reply
// timeout (the port's Timeout if 0).
func (p *RTUPort) Unit(u uint8, timeout time.Duration) *RTUConn {
	if timeout <= 0 {
		timeout = p.timeout
	}
	t := &rtuTransport{port: p, timeout: timeout, cnt: &counters{}}
	if p.ascii {
		pk := gb.NewASCIIClientHandler("")
		pk.SlaveId = u
		return &RTUConn{device: newDevice(pk, asciiFraming, t, p.kind, p.addr, u, t.cnt), t: t}
	}
	pk := gb.NewRTUClientHandler("")
	pk.SlaveId = u
	return &RTUConn{device: newDevice(pk, rtuFraming, t, p.kind, p.addr, u, t.cnt), t: t}
}

// Counters returns this unit's counters; Reconnects are the port's.
func (c *RTUConn) Counters() Counters {
	n := c.t.cnt.snapshot()
	n.Reconnects = c.t.port.cnt.reconnects.Load()
	return n
}

// Close releases nothing: the line belongs to the port.
func (c *RTUConn) Close() error { return nil }

var _ transport = (*rtuTransport)(nil)

type rtuTransport struct {
	port    *RTUPort
	timeout time.Duration
	cnt     *counters
}

// Send does one request/reply on the bus under the port's lock.
func (t *rtuTransport) Send(req []byte) ([]byte, error) {
	p := t.port
	p.mu.Lock()
	defer p.mu.Unlock()
	resp, err := p.exchange(t, req)
	p.last = t
	if err != nil {
		p.lastErr = time.Now()
		p.line.failed(err)
		var fe *FrameError
		if errors.As(err, &fe) {
			t.cnt.dropped.Add(1)
		}
		return nil, err
	}
	return resp, nil
}

func (t *rtuTransport) succeeded() {
	p := t.port
	p.mu.Lock()
	defer p.mu.Unlock()
	p.line.succeeded()
}

func (t *rtuTransport) fail(err error) {
	p := t.port
	p.mu.Lock()
	defer p.mu.Unlock()
	p.lastErr = time.Now()
	p.line.failed(err)
}

func (p *RTUPort) exchange(t *rtuTransport, req []byte) ([]byte, error) {
	if err := p.line.ensure(); err != nil {
		return nil, err
	}
	if !p.lastErr.IsZero() {
		if w := p.quiet - time.Since(p.lastErr); w > 0 {
			time.Sleep(w) // the bus's quiet time after an error, not a synchronisation
		}
	}
	if err := p.drain(t); err != nil {
		return nil, err
	}
	deadline := time.Now().Add(t.timeout)
	if err := p.line.write(req, deadline); err != nil {
		return nil, classify(err, t.timeout)
	}
	var skipped *FrameError
	for {
		var frame []byte
		var err error
		if p.ascii {
			frame, err = readASCIIFrame(p.line.read, deadline, t.timeout, p.buf[:])
			if err == nil {
				err = checkASCII(req, frame)
			}
		} else {
			frame, err = readRTUFrame(p.line.read, deadline, t.timeout, p.buf[:rtuMaxFrame])
			if err == nil {
				err = checkSerialReply(req, frame)
			}
		}
		var fe *FrameError
		if errors.As(err, &fe) && fe.late() && time.Now().Before(deadline) {
			// A whole frame from another unit, or from ours for another
			// function: the late reply to an earlier request (one master
			// on the line), come after the drain. Counted Late like a
			// drained one; ours may follow.
			p.blameLate(t)
			p.log.Debug("modbus: late reply to another request skipped", "reason", fe.Reason)
			skipped = fe
			continue
		}
		if err != nil && skipped != nil && !errors.As(err, &fe) {
			// no reply of ours: say what came instead (a device that
			// answers as another unit shows here, not as a bare timeout)
			return nil, fmt.Errorf("%w (skipped as late: %s)", err, skipped.Reason)
		}
		if err != nil {
			return nil, err
		}
		return append([]byte(nil), frame...), nil
	}
}

// blameLate counts a late reply on the unit asked last (t when none was).
func (p *RTUPort) blameLate(t *rtuTransport) {
	blame := p.last
	if blame == nil {
		blame = t
	}
	blame.cnt.late.Add(1)
}

// drain reads until the line has been silent for one tick (t3.5 on a serial
// line: that is also the inter-frame gap before our write). Whatever it
// finds is a late reply or noise, counted Late once on the unit asked last.
func (p *RTUPort) drain(t *rtuTransport) error {
	total := 0
	limit := time.Now().Add(max(t.timeout, 100*time.Millisecond))
	for {
		n, err := p.line.read(p.junk[:], time.Now().Add(p.tick))
		if err != nil {
			return err
		}
		if n == 0 {
			break
		}
		total += n
		if time.Now().After(limit) {
			return fmt.Errorf("line not quiet: %d bytes in %v", total, max(t.timeout, 100*time.Millisecond))
		}
	}
	if total > 0 {
		p.blameLate(t)
		p.log.Debug("modbus: drained stale input", "bytes", total)
	}
	return nil
}

// readFunc reads into b, waiting at most until deadline (a serial line may
// overrun it by one tick); it returns 0, nil when nothing came.
type readFunc func(b []byte, deadline time.Time) (int, error)

// readRTUFrame reads one RTU reply, framed by length, into buf (at least
// rtuMaxFrame bytes) and checks its CRC:
//
//	unit     : 1 byte
//	function : 1 byte; with 0x80 set an exception: code (1 byte), CRC → 5 bytes
//	FC1–FC4  : byte count n (1 byte), n bytes, CRC                    → 5+n bytes
//	FC5/6/15/16 : address (2), value or quantity (2), CRC             → 8 bytes
//	FC17     : byte count n (1 byte), n bytes, CRC                    → 5+n bytes
//	FC43/14  : MEI type, read code, conformity, more follows, next object,
//	           number of objects k (6 bytes), k × (id, length l, l bytes), CRC
//	CRC      : 2 bytes, low byte first
func readRTUFrame(read readFunc, deadline time.Time, timeout time.Duration, buf []byte) ([]byte, error) {
	got := 0
	fill := func(need int) error {
		for got < need {
			n, err := read(buf[got:need], deadline)
			got += n
			if err != nil {
				return classify(err, timeout)
			}
			if n == 0 && !time.Now().Before(deadline) {
				if got > 0 {
					return fmt.Errorf("%w (%d of %d bytes)", timeoutAfter(timeout), got, need)
				}
				return timeoutAfter(timeout)
			}
		}
		return nil
	}
	if err := fill(2); err != nil {
		return nil, err
	}
	var need int
	switch fc := buf[1]; {
	case fc&0x80 != 0:
		need = 5
	case fc >= gb.FuncCodeReadCoils && fc <= gb.FuncCodeReadInputRegisters, fc == FuncReportServerID:
		if err := fill(3); err != nil {
			return nil, err
		}
		need = 5 + int(buf[2])
		if need > rtuMaxFrame {
			return nil, frameErr("byte count %d too large", buf[2])
		}
	case fc == gb.FuncCodeWriteSingleCoil, fc == gb.FuncCodeWriteSingleRegister,
		fc == gb.FuncCodeWriteMultipleCoils, fc == gb.FuncCodeWriteMultipleRegisters:
		need = 8
	case fc == FuncEncapsulated:
		pos := 8 // unit, function, MEI type … number of objects
		if err := fill(pos); err != nil {
			return nil, err
		}
		if buf[2] != MEIDeviceID {
			return nil, frameErr("mei type %#02x in reply, want %#02x", buf[2], MEIDeviceID)
		}
		for k := int(buf[7]); k > 0; k-- {
			if pos+2 > rtuMaxFrame-2 {
				return nil, frameErr("device identification objects longer than a frame")
			}
			if err := fill(pos + 2); err != nil {
				return nil, err
			}
			pos += 2 + int(buf[pos+1])
		}
		need = pos + 2
		if need > rtuMaxFrame {
			return nil, frameErr("device identification objects longer than a frame")
		}
	default:
		return nil, frameErr("unknown function %#02x in reply", fc)
	}
	if err := fill(need); err != nil {
		return nil, err
	}
	f := buf[:need]
	if got, want := uint16(f[need-2])|uint16(f[need-1])<<8, crc16(f[:need-2]); got != want {
		return nil, frameErr("crc %#04x, want %#04x", got, want)
	}
	return f, nil
}

// checkSerialReply: a whole, checked reply (unit, function, ...: an RTU
// frame past its CRC, an ASCII frame decoded) against its request. One from
// another unit, or for another function (an exception keeps the function,
// high bit set), answers another request: a late reply. The rest of the
// PDU is the packager's to check (pduPackager).
func checkSerialReply(req, resp []byte) error {
	if len(req) < 2 || len(resp) < 2 {
		return frameErr("frame of %d bytes", len(resp))
	}
	if resp[0] != req[0] {
		return &FrameError{Reason: fmt.Sprintf("reply from unit %d, want %d", resp[0], req[0]), OtherUnit: true}
	}
	if resp[1]&0x7F != req[1] {
		return &FrameError{Reason: fmt.Sprintf("reply with function %#02x, want %#02x", resp[1]&0x7F, req[1]), OtherFunction: true}
	}
	return nil
}

// rtuLine is the byte stream under an RTUPort.
type rtuLine interface {
	ensure() error // (re)open if closed, respecting the backoff
	read(b []byte, deadline time.Time) (int, error)
	write(b []byte, deadline time.Time) error
	failed(err error) // a request failed: drop the line if the error calls for it
	succeeded()
	close() error
}

var (
	_ rtuLine = (*serialLine)(nil)
	_ rtuLine = (*tcpLine)(nil)
)

// serialLine is a serial port through goburrow/serial, whose Read waits with
// select(2) for at most cfg.Timeout (one tick).
type serialLine struct {
	cfg    serial.Config
	cnt    *counters
	log    *slog.Logger
	bo     backoff.Gate
	cause  error // the failure that started the backoff (BackoffError.Cause)
	port   serial.Port
	opened bool
	closed bool
}

func (l *serialLine) open() error {
	p, err := serial.Open(&l.cfg)
	if err != nil {
		return err
	}
	if fd := portFD(p); fd >= maxSelectFD {
		p.Close()
		return fmt.Errorf("file descriptor %d >= %d: goburrow/serial uses select(2) and cannot read it; open serial ports before sockets", fd, maxSelectFD)
	}
	if l.opened {
		l.cnt.reconnects.Add(1)
	}
	l.opened, l.port = true, p
	return nil
}

// portFD reads goburrow/serial's unexported descriptor (-1 if unknown).
func portFD(p serial.Port) int {
	v := reflect.ValueOf(p)
	if v.Kind() != reflect.Pointer || v.Elem().Kind() != reflect.Struct {
		return -1
	}
	f := v.Elem().FieldByName("fd")
	if !f.IsValid() || !f.CanInt() {
		return -1
	}
	return int(f.Int())
}

func (l *serialLine) ensure() error {
	if l.port != nil {
		return nil
	}
	if l.closed {
		return net.ErrClosed
	}
	if w := l.bo.Wait(time.Now()); w > 0 {
		return &BackoffError{Cause: l.cause, Wait: w}
	}
	if err := l.open(); err != nil {
		l.bo.Failed(time.Now())
		l.cause = err
		return err
	}
	return nil
}

func (l *serialLine) read(b []byte, _ time.Time) (int, error) {
	if l.port == nil {
		return 0, net.ErrClosed
	}
	n, err := l.port.Read(b)
	if err == serial.ErrTimeout || errors.Is(err, syscall.EAGAIN) || errors.Is(err, syscall.EINTR) {
		return max(n, 0), nil
	}
	return max(n, 0), err
}

func (l *serialLine) write(b []byte, deadline time.Time) error {
	if l.port == nil {
		return net.ErrClosed
	}
	for len(b) > 0 {
		n, err := l.port.Write(b)
		if n > 0 {
			b = b[n:]
		}
		switch {
		case err == nil:
		case errors.Is(err, syscall.EAGAIN) || errors.Is(err, syscall.EINTR):
			if !time.Now().Before(deadline) {
				return os.ErrDeadlineExceeded
			}
			time.Sleep(l.cfg.Timeout) // output queue full: let it drain one tick
		default:
			return err
		}
	}
	return nil
}

// failed closes the port on transport errors (EIO after a USB adapter went
// away, …); timeouts, frame errors and exceptions keep it open.
func (l *serialLine) failed(err error) {
	var fe *FrameError
	if _, ok := IsException(err); ok || errors.Is(err, ErrTimeout) || errors.As(err, &fe) ||
		errors.Is(err, ErrBackoff) || errors.Is(err, ErrRequest) || l.port == nil {
		return
	}
	l.log.Warn("modbus: serial line error, reopening", "err", err)
	_ = l.port.Close()
	l.port = nil
	l.bo.Failed(time.Now())
	l.cause = err
}

func (l *serialLine) succeeded() { l.bo.OK() }

func (l *serialLine) close() error {
	l.closed = true
	if l.port == nil {
		return nil
	}
	err := l.port.Close()
	l.port = nil
	return err
}

// tcpLine is a TCP stream to a serial gateway, with the TCP reconnect rules.
type tcpLine struct{ rd redialer }

func (l *tcpLine) ensure() error { _, err := l.rd.get(); return err }

func (l *tcpLine) read(b []byte, deadline time.Time) (int, error) {
	if l.rd.conn == nil {
		return 0, net.ErrClosed
	}
	if err := l.rd.conn.SetReadDeadline(deadline); err != nil {
		return 0, err
	}
	n, err := l.rd.conn.Read(b)
	var ne net.Error
	if err != nil && errors.As(err, &ne) && ne.Timeout() {
		return n, nil
	}
	return n, err
}

func (l *tcpLine) write(b []byte, deadline time.Time) error {
	if l.rd.conn == nil {
		return net.ErrClosed
	}
	if err := l.rd.conn.SetWriteDeadline(deadline); err != nil {
		return err
	}
	_, err := l.rd.conn.Write(b)
	return err
}

func (l *tcpLine) failed(err error) {
	if _, ok := IsException(err); ok || errors.Is(err, ErrRequest) {
		return
	}
	l.rd.failed(err)
}
func (l *tcpLine) succeeded()   { l.rd.succeeded() }
func (l *tcpLine) close() error { return l.rd.close() }
