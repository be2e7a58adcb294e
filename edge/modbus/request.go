package modbus

import (
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"time"

	gb "github.com/goburrow/modbus"
)

// Request is one read (function 1–4) prepared once and reused for every
// poll: its encoded request and its reply buffer live in the Request, so a
// poll through TCPConn.Do, UDPConn.Do or UDPSocket.SendRound allocates
// nothing in steady state (errors allocate their message).
//
// Set Conn (SendRound only), Func, Addr and Qty; after the call Data holds
// the reply's data bytes (registers big-endian, bits packed LSB first,
// length checked against Qty), aliasing the Request's own buffer and valid
// until the Request is used again, and Err is nil or the same errors the
// Read* methods return (an exception: IsException; no reply: ErrTimeout).
// A Request is used by one call at a time.
type Request struct {
	Conn *UDPConn // SendRound, Round: the device asked
	Func byte     // 1 coils, 2 discrete inputs, 3 holding, 4 input registers
	Addr uint16
	Qty  uint16
	// Deadline (Round only): the reply must come before it.
	Deadline time.Time

	Data []byte
	Err  error
	// Replied (Round and SendRound): when the reply was read off the
	// socket, so a round-trip time does not include the wait for the rest
	// of the round; zero when there was no reply.
	Replied time.Time

	adu  [mbapHeader + 5]byte
	resp [maxADU]byte
	pend udpPending
}

var readOps = [5]string{"", "read coils", "read discrete", "read holding", "read input"}

// check refuses a request that cannot be sent.
func (r *Request) check() error {
	switch r.Func {
	case gb.FuncCodeReadCoils, gb.FuncCodeReadDiscreteInputs:
		return checkRange(r.Addr, r.Qty, maxReadBits)
	case gb.FuncCodeReadHoldingRegisters, gb.FuncCodeReadInputRegisters:
		return checkRange(r.Addr, r.Qty, maxReadRegisters)
	}
	return fmt.Errorf("%w: function %d is not a read (1-4)", ErrRequest, r.Func)
}

func (r *Request) op() string {
	if int(r.Func) < len(readOps) {
		return readOps[r.Func]
	}
	return fmt.Sprintf("function %d", r.Func)
}

// encode writes the MBAP request ADU into r's own buffer: the bytes
// goburrow's TCP packager would encode (TestRequestEncodeIsPackagers), by
// hand because its Encode allocates a new ADU per call and numbers
// transactions from its own counter, while TCPConn.Do, UDPConn.Do and
// SendRound allocate nothing and take the transport's id (the socket's
// pending table on UDP). The goburrow path (Read*, ident) keeps the
// packager.
func (r *Request) encode(tid uint16, unit byte) []byte {
	a := r.adu[:]
	binary.BigEndian.PutUint16(a[0:], tid)
	binary.BigEndian.PutUint16(a[2:], 0)
	binary.BigEndian.PutUint16(a[4:], 6)
	a[6], a[7] = unit, r.Func
	binary.BigEndian.PutUint16(a[8:], r.Addr)
	binary.BigEndian.PutUint16(a[10:], r.Qty)
	return a
}

// finish decodes a checked reply ADU (checkPDU passed) into Data or Err.
func (r *Request) finish(d *device, resp []byte) {
	if resp[7] == r.Func|0x80 {
		r.fail(d, &gb.ModbusError{FunctionCode: resp[7], ExceptionCode: resp[8]})
		return
	}
	r.Data, r.Err = resp[9:9+int(resp[8])], nil
}

func (r *Request) fail(d *device, err error) {
	r.Data, r.Err = nil, d.wrap(r.op(), r.Addr, r.Qty, err)
}

// Do runs r on this TCP device (r.Conn is ignored): the same stream,
// backoff and checks as the Read* methods, without allocating.
func (c *TCPConn) Do(r *Request) {
	if err := r.check(); err != nil {
		r.fail(&c.device, err)
		return
	}
	t := c.t
	if _, err := t.rd.get(); err != nil {
		r.fail(&c.device, err)
		return
	}
	t.tid++
	req := r.encode(t.tid, c.unit)
	n, err := t.exchangeInto(req, r.resp[:])
	if err == nil {
		err = checkPDU(req[mbapHeader:], r.resp[mbapHeader:n]) // what pduPackager.Verify does on the goburrow path
	}
	if err != nil {
		t.failed(err)
		r.fail(&c.device, err)
		return
	}
	t.rd.succeeded()
	r.finish(&c.device, r.resp[:n])
}

// exchangeInto writes req and reads one reply frame into buf (len maxADU),
// its MBAP header checked against req's (checkMBAP); it returns the frame's
// length. It reads what the socket has, up to maxADU bytes, so a reply that
// arrived whole (nearly all of them) costs one read; bytes after the frame
// (a duplicate, a late answer) put the stream out of step: the next
// exchange fails at once and the stream is closed (no stale frame is ever
// taken as an answer). The deadline is cleared after the reply so an idle
// stream holds no armed timer.
func (t *tcpTransport) exchangeInto(req, buf []byte) (int, error) {
	rd := t.rd
	if rd.extra > 0 {
		return 0, frameErr("%d bytes after the last reply", rd.extra)
	}
	conn := rd.conn
	if err := conn.SetDeadline(time.Now().Add(t.timeout)); err != nil {
		return 0, err
	}
	if _, err := conn.Write(req); err != nil {
		return 0, classify(err, t.timeout)
	}
	have, n := 0, mbapHeader
	for have < n {
		k, err := conn.Read(buf[have:maxADU])
		if k == 0 && err == nil {
			err = io.ErrNoProgress
		}
		if err != nil {
			if err == io.EOF && have > 0 {
				err = io.ErrUnexpectedEOF
			}
			return 0, classify(err, t.timeout)
		}
		have += k
		if n == mbapHeader && have >= mbapHeader {
			length := int(binary.BigEndian.Uint16(buf[4:]))
			if length < 2 || length > mbapMaxLength {
				return 0, frameErr("mbap length %d not in 2..%d", length, mbapMaxLength)
			}
			n = mbapHeader - 1 + length
		}
	}
	rd.extra = have - n
	if err := conn.SetDeadline(time.Time{}); err != nil {
		return 0, err
	}
	if err := checkMBAP(req, buf[:n]); err != nil {
		return 0, err
	}
	return n, nil
}

// Do runs r on this UDP device (r.Conn is ignored), waiting at most the
// device's timeout: the same matching and checks as the Read* methods,
// without allocating.
func (c *UDPConn) Do(r *Request) {
	if err := r.check(); err != nil {
		r.fail(&c.device, err)
		return
	}
	t := c.t
	s := t.s
	p := t.prepare(r)
	s.mu.Lock()
	err := net.ErrClosed
	if !t.closed {
		err = s.register(p)
	}
	s.mu.Unlock()
	if err != nil {
		p.state = pendIdle
		r.fail(&c.device, err)
		return
	}
	req := r.encode(p.tid, c.unit)
	_, werr := s.conn.WriteToUDPAddrPort(req, t.dst)
	t.await(p, werr == nil)
	if werr != nil && p.state == pendExpired {
		r.fail(&c.device, werr)
		return
	}
	r.result(&c.device, t.timeout)
}

// prepare points r's pending entry at t, its waiter and r's buffers.
func (t *udpTransport) prepare(r *Request) *udpPending {
	p := &r.pend
	p.tr, p.dest, p.unit, p.fc = t, t.dest, t.pend.unit, r.Func
	p.req, p.resp, p.w = r.adu[mbapHeader:], r.resp[:], t.w
	return p
}

// result turns r's completed pending entry into Data or Err.
func (r *Request) result(d *device, waited time.Duration) {
	r.Replied = time.Time{}
	switch p := &r.pend; p.state {
	case pendAnswered:
		r.Replied = p.at
		r.finish(d, r.resp[:p.n])
	case pendUntrusted:
		r.fail(d, errUntrusted)
	default:
		r.fail(d, timeoutAfter(waited))
	}
	r.pend.state = pendIdle
}
