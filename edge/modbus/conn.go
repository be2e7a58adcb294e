package modbus

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"sync/atomic"

	gb "github.com/goburrow/modbus"
)

// Protocol limits (Modbus Application Protocol V1.1b3, 6.1–6.12).
const (
	maxReadBits      = 2000
	maxReadRegisters = 125
	maxWriteRegs     = 123
)

// Counters are cumulative per connection. Read them from any goroutine.
type Counters struct {
	// Reconnects counts successful dials after the first one (TCP, RTU over
	// TCP) and reopenings of a serial port.
	Reconnects uint64
	// Late counts replies that came after their request had given up: UDP
	// datagrams for a recently expired transaction id, RTU drains that
	// found bytes on the line before a request (one per drain), and whole
	// serial frames from another unit skipped while waiting for a reply.
	Late uint64
	// Duplicates counts second replies for a transaction id already
	// answered (UDP).
	Duplicates uint64
	// Dropped counts replies thrown away: malformed, for another unit, bad
	// CRC, wrong function or length, unknown transaction id, untrusted; on
	// the UDP socket also datagrams from an unknown source (those only in
	// UDPSocket.Counters).
	Dropped uint64
	// Untrusted counts UDP replies that matched their request but were
	// refused because a datagram with an unknown transaction id had come
	// from the device's address while the request waited (forged replies,
	// or a device that garbles ids). Also counted in Dropped.
	Untrusted uint64
	// UnknownSource counts datagrams from an address and port that is no
	// device (UDPSocket.Counters only). Also counted in Dropped.
	UnknownSource uint64
}

type counters struct {
	reconnects, late, duplicates, dropped, untrusted, unknownSource atomic.Uint64
}

func (c *counters) snapshot() Counters {
	return Counters{
		Reconnects: c.reconnects.Load(),
		Late:       c.late.Load(),
		Duplicates: c.duplicates.Load(),
		Dropped:    c.dropped.Load(),

		Untrusted:     c.untrusted.Load(),
		UnknownSource: c.unknownSource.Load(),
	}
}

// transport is what a device needs from its transporter besides Send.
type transport interface {
	gb.Transporter
	// fail is told about every error of a request that is not an exception,
	// including those found after Send returned (by the packager's Verify,
	// by the device's length checks); it must be idempotent (TCP closes the
	// stream and starts its backoff once).
	fail(err error)
	// succeeded is told about every request whose reply passed every check
	// (data or an exception): the link is good. Send never says so itself,
	// since the packager may still refuse the reply.
	succeeded()
}

// framing says where the PDU sits in an ADU: after head bytes, before tail
// (of the ADU's bytes, hex-decoded first when hex: Modbus ASCII).
type framing struct {
	head, tail int
	hex        bool
}

var (
	mbapFraming = framing{head: mbapHeader} // MBAP header, then the PDU (TCP, UDP)
	rtuFraming  = framing{head: 1, tail: 2} // unit id, the PDU, the CRC
)

var _ gb.Packager = (*pduPackager)(nil)

// pduPackager is goburrow's packager (MBAP or RTU) with the PDU checks
// goburrow lacks: Verify runs goburrow's own (transaction, protocol and
// unit ids; RTU length and unit), then checkPDU on the request and reply
// PDUs, and counts a refused reply as dropped. This keeps goburrow's
// Packager × Transporter split: a transporter moves and frames bytes (MBAP
// length and ids, RTU length, CRC and unit) and knows no function code; the
// packager knows PDUs and no socket. The allocation-free paths (TCPConn.Do,
// UDPConn.Do, UDPSocket.SendRound) encode their own ADUs and call checkPDU
// themselves, as this Verify would.
type pduPackager struct {
	gb.Packager
	framing
	cnt *counters
}

// Verify checks resp against req: goburrow's checks, then checkPDU.
func (p *pduPackager) Verify(req, resp []byte) error {
	if err := p.Packager.Verify(req, resp); err != nil {
		return err
	}
	err := p.verifyPDU(req, resp)
	if err != nil {
		p.cnt.dropped.Add(1)
	}
	return err
}

func (p *pduPackager) verifyPDU(req, resp []byte) error {
	if p.hex {
		var err error
		if req, err = decodeASCII(nil, req); err != nil {
			return err
		}
		if resp, err = decodeASCII(nil, resp); err != nil {
			return err
		}
	}
	if len(req) <= p.head+p.tail || len(resp) < p.head+p.tail {
		return frameErr("adu of %d bytes for a request of %d", len(resp), len(req))
	}
	return checkPDU(req[p.head:len(req)-p.tail], resp[p.head:len(resp)-p.tail])
}

// device wraps a goburrow client built from one packager (one unit, with
// the PDU checks of pduPackager) and our transporter, and adds the request
// checks goburrow lacks. Its methods are promoted into TCPConn, UDPConn,
// RTUConn and TCPUnitConn.
type device struct {
	client gb.Client
	pk     *pduPackager
	tr     transport
	kind   string // tcp, udp, rtu, rtu-tcp
	addr   string
	unit   uint8
	cnt    *counters
}

func newDevice(p gb.Packager, f framing, tr transport, kind, addr string, unit uint8, cnt *counters) device {
	pk := &pduPackager{Packager: p, framing: f, cnt: cnt}
	return device{client: gb.NewClient2(pk, tr), pk: pk, tr: tr, kind: kind, addr: addr, unit: unit, cnt: cnt}
}

// Counters returns the cumulative counters of this connection.
func (d *device) Counters() Counters { return d.cnt.snapshot() }

// wrap tells the transport how a failed request ended (an exception is a
// good reply; a refused request never reached it) and adds who and where:
// "modbus: tcp 127.0.1.3:502 unit 1: read holding 0+2: …".
func (d *device) wrap(op string, addr, qty uint16, err error) error {
	if _, ok := IsException(err); ok {
		d.tr.succeeded()
	} else if !errors.Is(err, ErrRequest) {
		d.tr.fail(err)
	}
	return fmt.Errorf("modbus: %s %s unit %d: %s %d+%d: %w", d.kind, d.addr, d.unit, op, addr, qty, err)
}

func checkRange(addr, qty, max uint16) error {
	if qty < 1 || qty > max {
		return fmt.Errorf("%w: quantity %d not in 1..%d", ErrRequest, qty, max)
	}
	if int(addr)+int(qty) > 0x10000 {
		return fmt.Errorf("%w: address %d + quantity %d > 65536", ErrRequest, addr, qty)
	}
	return nil
}

type readFn func(addr, qty uint16) ([]byte, error)

func (d *device) readBits(op string, fn readFn, addr, qty uint16) ([]byte, error) {
	if err := checkRange(addr, qty, maxReadBits); err != nil {
		return nil, d.wrap(op, addr, qty, err)
	}
	b, err := fn(addr, qty)
	if err == nil && len(b) != (int(qty)+7)/8 {
		err = frameErr("%d data bytes for %d bits", len(b), qty)
	}
	if err != nil {
		return nil, d.wrap(op, addr, qty, err)
	}
	d.tr.succeeded()
	return b, nil
}

func (d *device) readRegs(op string, fn readFn, addr, qty uint16) ([]byte, error) {
	if err := checkRange(addr, qty, maxReadRegisters); err != nil {
		return nil, d.wrap(op, addr, qty, err)
	}
	b, err := fn(addr, qty)
	if err == nil && len(b) != 2*int(qty) {
		err = frameErr("%d data bytes for %d registers", len(b), qty)
	}
	if err != nil {
		return nil, d.wrap(op, addr, qty, err)
	}
	d.tr.succeeded()
	return b, nil
}

// ReadCoils reads qty coils (FC1) and returns them packed, LSB first;
// len == (qty+7)/8 is checked.
func (d *device) ReadCoils(addr, qty uint16) ([]byte, error) {
	return d.readBits("read coils", d.client.ReadCoils, addr, qty)
}

// ReadDiscreteInputs reads qty discrete inputs (FC2), packed like ReadCoils.
func (d *device) ReadDiscreteInputs(addr, qty uint16) ([]byte, error) {
	return d.readBits("read discrete", d.client.ReadDiscreteInputs, addr, qty)
}

// ReadHoldingRegisters reads qty holding registers (FC3), big-endian, 2*qty
// bytes (checked).
func (d *device) ReadHoldingRegisters(addr, qty uint16) ([]byte, error) {
	return d.readRegs("read holding", d.client.ReadHoldingRegisters, addr, qty)
}

// ReadInputRegisters reads qty input registers (FC4), like ReadHoldingRegisters.
func (d *device) ReadInputRegisters(addr, qty uint16) ([]byte, error) {
	return d.readRegs("read input", d.client.ReadInputRegisters, addr, qty)
}

// WriteSingleCoil writes one coil (FC5); the echo is checked.
func (d *device) WriteSingleCoil(addr uint16, on bool) error {
	var v uint16
	if on {
		v = 0xFF00
	}
	if _, err := d.client.WriteSingleCoil(addr, v); err != nil {
		return d.wrap("write coil", addr, 1, err)
	}
	d.tr.succeeded()
	return nil
}

// WriteSingleRegister writes one holding register (FC6); the echo is checked.
func (d *device) WriteSingleRegister(addr, value uint16) error {
	if _, err := d.client.WriteSingleRegister(addr, value); err != nil {
		return d.wrap("write register", addr, 1, err)
	}
	d.tr.succeeded()
	return nil
}

// WriteMultipleRegisters writes len(values)/2 registers (FC16); values are
// big-endian register contents; the echo of address and quantity is checked.
func (d *device) WriteMultipleRegisters(addr uint16, values []byte) error {
	qty := uint16(len(values) / 2)
	if len(values)%2 != 0 || len(values) > 2*maxWriteRegs {
		return d.wrap("write registers", addr, qty, fmt.Errorf("%w: %d value bytes (even, at most %d)", ErrRequest, len(values), 2*maxWriteRegs))
	}
	if err := checkRange(addr, qty, maxWriteRegs); err != nil {
		return d.wrap("write registers", addr, qty, err)
	}
	if _, err := d.client.WriteMultipleRegisters(addr, qty, values); err != nil {
		return d.wrap("write registers", addr, qty, err)
	}
	d.tr.succeeded()
	return nil
}

// checkPDU checks a reply PDU (function code + data) against the request PDU
// so that every shape error is a typed *FrameError before goburrow looks at
// it (goburrow's own checks return untyped errors or, for a foreign function
// code, a bogus exception).
//
//	exception     : fc|0x80, exception code                     (2 bytes)
//	FC1/FC2 reply : fc, byte count n == (qty+7)/8, n bytes
//	FC3/FC4 reply : fc, byte count n == 2*qty, n bytes
//	FC5/FC6 reply : fc, echo of address and value               (5 bytes)
//	FC15/16 reply : fc, echo of address and quantity            (5 bytes)
//	FC17 reply    : fc, byte count n, n bytes
//	FC43 reply    : fc, MEI type (as asked), at least 5 more bytes
func checkPDU(req, resp []byte) error {
	if len(resp) < 2 {
		return frameErr("reply pdu of %d bytes", len(resp))
	}
	fc := req[0]
	switch resp[0] {
	case fc | 0x80:
		if len(resp) != 2 {
			return frameErr("exception reply of %d bytes", len(resp))
		}
		return nil
	case fc:
	default:
		return frameErr("function %#02x in reply to %#02x", resp[0], fc)
	}
	var qty int
	if len(req) >= 5 {
		qty = int(binary.BigEndian.Uint16(req[3:5]))
	}
	switch fc {
	case gb.FuncCodeReadCoils, gb.FuncCodeReadDiscreteInputs, gb.FuncCodeReadHoldingRegisters, gb.FuncCodeReadInputRegisters:
		want := 2 * qty
		if fc <= gb.FuncCodeReadDiscreteInputs {
			want = (qty + 7) / 8
		}
		if n := int(resp[1]); n != len(resp)-2 || n != want {
			return frameErr("byte count %d, %d data bytes, want %d for quantity %d", n, len(resp)-2, want, qty)
		}
	case FuncReportServerID:
		if n := int(resp[1]); n != len(resp)-2 {
			return frameErr("byte count %d, %d data bytes", n, len(resp)-2)
		}
	case FuncEncapsulated:
		if len(resp) < 7 || resp[1] != req[1] {
			return frameErr("encapsulated reply % x to mei type %#02x", resp[1:min(len(resp), 8)], req[1])
		}
	case gb.FuncCodeWriteSingleCoil, gb.FuncCodeWriteSingleRegister, gb.FuncCodeWriteMultipleCoils, gb.FuncCodeWriteMultipleRegisters:
		if len(resp) != 5 || len(req) < 5 || !bytes.Equal(resp[1:5], req[1:5]) {
			return frameErr("echo % x does not match request % x", resp[1:], req[1:min(len(req), 5)])
		}
	}
	return nil
}
