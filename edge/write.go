package edge

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"edgegw/edge/modbus"
)

// WriteRequest asks for one tag of one device to be set to Value (in the
// tag's engineering unit: scale and offset are removed before encoding; a
// bool is 0 or 1). Origin says who asked ("http 10.0.0.5", "websocket
// uplink", "mqtt"); it is logged with every write.
type WriteRequest struct {
	Device, Tag string
	Value       float64
	Origin      string
}

// WriteResult is a confirmed write: Written is the value asked for,
// ReadBack the value the one read after the write decoded (as a poll
// would). Duration is the time the bus spent on it: write (read-modify-write
// for a bit of a holding register) plus the read-back; queueing is not
// included.
type WriteResult struct {
	Device, Tag       string
	Written, ReadBack float64
	Duration          time.Duration
}

// Kinds of WriteError, so callers can map them to HTTP status codes or
// protocol answers.
const (
	WriteUnknownDevice = "unknown device" // no device of that name
	WriteUnknownTag    = "unknown tag"    // the device has no tag of that name
	WriteNotWritable   = "not writable"   // tag not marked writable, or input/discrete
	WriteOutOfRange    = "out of range"   // outside min/max, or not representable in the tag's type (1.5 into int16)
	WriteBusy          = "busy"           // the bus's write queue is full: try again later
	WriteDevice        = "device"         // the device did not accept the write or the read-back failed (timeout, exception, transport)
	WriteMismatch      = "mismatch"       // the read-back differs from what was written
	WriteStopped       = "stopped"        // the scheduler is not running
)

// WriteQueue is the number of writes that may wait for one bus; one more is
// refused as busy. Writes wait, polls never do.
const WriteQueue = 8

// WriteError is why a write was refused or failed; branch on Kind with
// errors.As. Msg names the device and tag.
type WriteError struct {
	Kind string // one of the Write* kinds
	Msg  string // human-readable, e.g. `write "boiler"/"setpoint" = 95: above max 90`
	Err  error  // the cause for WriteDevice (timeout, exception, transport); may be nil
}

func (e *WriteError) Error() string { return "edge: " + e.Msg }

// Unwrap returns the cause (modbus.ErrTimeout, *modbus.ModbusError, …).
func (e *WriteError) Unwrap() error { return e.Err }

// WriteErrorKind lets consumers that do not import edge classify the error
// through a one-method interface of their own.
func (e *WriteError) WriteErrorKind() string { return e.Kind }

// writer is the write side of a transport; every edge/modbus connection has it.
type writer interface {
	WriteSingleCoil(addr uint16, on bool) error
	WriteSingleRegister(addr, value uint16) error
	WriteMultipleRegisters(addr uint16, values []byte) error
}

var (
	_ writer = (*modbus.TCPConn)(nil)
	_ writer = (*modbus.UDPConn)(nil)
	_ writer = (*modbus.RTUConn)(nil)
)

// readWriter is a connection a write goes over: read-modify-write of a
// register bit needs the read side too.
type readWriter interface {
	Conn
	writer
}

// Job states: the bus claims a pending job before it touches the wire; a
// caller whose context ends first cancels it, so a write either happens and
// is answered or never starts.
const (
	jobPending int32 = iota
	jobClaimed
	jobCancelled
)

// writeJob is one validated write on its way to the bus goroutine.
type writeJob struct {
	req   WriteRequest
	dev   *device
	tag   int
	raw   float64 // unscaled value
	regs  []byte  // registers to write, wire order (multi-word and single-register types)
	state atomic.Int32
	done  chan writeOutcome // capacity 1: the bus never blocks on it
}

type writeOutcome struct {
	res WriteResult
	err error
}

// schedWrites is the Scheduler's write state.
type schedWrites struct {
	mu      sync.RWMutex // Write holds it shared while enqueueing; Run's end exclusively
	running bool
	byName  map[string]*device
	busOf   map[*device]*bus
}

// busWrites is one bus's write state. queue is read only by the bus
// goroutine (and by stopWrites after that goroutine exited); tcp is touched
// only by the bus goroutine.
type busWrites struct {
	queue chan *writeJob
	tcp   map[*device]*modbus.TCPConn // lazy write connections of UDP devices
}

// initWrites builds the lookup tables and queues (New, and a reload).
// Caller holds s.wr.mu for writing, or runs before Run.
func (s *Scheduler) initWrites() {
	s.wr.byName = make(map[string]*device, len(s.devices))
	s.wr.busOf = make(map[*device]*bus, len(s.devices))
	for _, d := range s.devices {
		s.wr.byName[d.cfg.Name] = d
	}
	for _, b := range s.buses {
		if b.wr.queue == nil {
			b.wr.queue = make(chan *writeJob, WriteQueue)
			b.pass.queue = make(chan *passJob, PassQueue) // passthrough.go
		}
		for _, d := range b.devices {
			s.wr.busOf[d] = b
		}
	}
}

// swapWrites is a reload's part of the write path: with writes held off,
// it answers the writes queued on buses that were stopped ("stopped": try
// again), runs swap (which installs the new device set) and rebuilds the
// tables.
func (s *Scheduler) swapWrites(oldBuses []*bus, kept map[*bus]bool, swap func()) {
	s.wr.mu.Lock()
	defer s.wr.mu.Unlock()
	for _, b := range oldBuses {
		if !kept[b] {
			drainWrites(b, "the device's bus restarted for a reload before the write was done; try again")
		}
	}
	swap()
	s.initWrites()
}

// drainWrites answers every write and pass-through request queued on b
// with "stopped" (b's goroutine has exited).
func drainWrites(b *bus, why string) {
	drainPass(b, why)
	for {
		select {
		case j := <-b.wr.queue:
			if j.state.CompareAndSwap(jobPending, jobClaimed) {
				j.done <- writeOutcome{err: j.fail(WriteStopped, why, nil)}
			}
		default:
			return
		}
	}
}

// startWrites lets writes in (Run, before the buses start).
func (s *Scheduler) startWrites() {
	s.wr.mu.Lock()
	s.wr.running = true
	s.wr.mu.Unlock()
}

// stopWrites refuses new writes and answers every queued one "stopped".
// Run calls it after every bus goroutine has exited.
func (s *Scheduler) stopWrites() {
	s.wr.mu.Lock()
	defer s.wr.mu.Unlock()
	s.wr.running = false
	s.mu.RLock()
	defer s.mu.RUnlock()
	for _, b := range s.buses {
		drainWrites(b, "the scheduler stopped before the write was done")
	}
}

func (j *writeJob) fail(kind, msg string, cause error) *WriteError {
	return writeErr(j.req, kind, msg, cause)
}

func writeErr(req WriteRequest, kind, msg string, cause error) *WriteError {
	return &WriteError{Kind: kind, Err: cause,
		Msg: fmt.Sprintf("write %q/%q = %s: %s: %s", req.Device, req.Tag, fmtValue(req.Value), kind, msg)}
}

func fmtValue(v float64) string { return strconv.FormatFloat(v, 'g', -1, 64) }

// Write sets one tag of one device and confirms it with one read-back. The
// request is checked here (device, tag, writable, min/max, type); then it is
// handed to the device's bus over a bounded queue (full: WriteBusy at once,
// never blocking a poll) and done between two polls — by the bus goroutine,
// or for a UDP device by a goroutine the UDP round starts while it leaves
// the device out of rounds — so it never races a poll on the same bus (an
// RTU line included) and never delays the polls of other UDP devices.
//
// On the wire: a coil with FC5; a register-sized type with FC6; a
// multi-register type with FC16; a bool on a bit of a holding register as
// read (FC3) - modify - write (FC6) of that register. The device itself may
// change the other bits of that register between the read and the write:
// that change is lost (Modbus has no atomic bit write on registers; FC22
// mask write is not supported by every logger). Devices polled over UDP
// write over TCP to the same host:port (a connection the bus opens on the
// first write and closes when Run ends) unless WriteTransport is "udp". The
// read-back goes over the poll transport. Every request uses the device's
// timeout; a write is not retried (it may have been done).
//
// Errors are *WriteError; with WriteMismatch the result carries both
// values. If ctx ends before the bus starts the write, it is never done and
// ctx's error is returned (wrapped); once started, Write waits for its end
// (bounded by three device timeouts). Every write is logged at Info with its
// origin and outcome. Safe for concurrent use.
func (s *Scheduler) Write(ctx context.Context, req WriteRequest) (WriteResult, error) {
	res := WriteResult{Device: req.Device, Tag: req.Tag, Written: req.Value}
	s.wr.mu.RLock() // the tables change on a reload
	j, werr := s.prepareWrite(req)
	if werr != nil {
		s.wr.mu.RUnlock()
		s.logWrite(req, res, werr)
		return res, werr
	}
	if !s.wr.running {
		s.wr.mu.RUnlock()
		werr = writeErr(req, WriteStopped, "the scheduler is not running", nil)
		s.logWrite(req, res, werr)
		return res, werr
	}
	b := s.wr.busOf[j.dev]
	select {
	case b.wr.queue <- j:
		s.wr.mu.RUnlock()
		if b.udp { // the UDP round looks at its queues when kicked
			select {
			case s.udpKick <- struct{}{}:
			default:
			}
		}
	default:
		s.wr.mu.RUnlock()
		werr = writeErr(req, WriteBusy, fmt.Sprintf("%d writes already wait for this bus; try again", WriteQueue), nil)
		s.logWrite(req, res, werr)
		return res, werr
	}
	select {
	case o := <-j.done:
		return o.res, o.err
	case <-ctx.Done():
		if j.state.CompareAndSwap(jobPending, jobCancelled) {
			err := fmt.Errorf("edge: write %q/%q not started: %w", req.Device, req.Tag, ctx.Err())
			s.logWrite(req, res, err)
			return res, err
		}
		o := <-j.done // started: bounded by the device timeouts
		return o.res, o.err
	}
}

// prepareWrite checks req against the configuration and encodes the value.
func (s *Scheduler) prepareWrite(req WriteRequest) (*writeJob, *WriteError) {
	d := s.wr.byName[req.Device]
	if d == nil {
		return nil, writeErr(req, WriteUnknownDevice, "no such device", nil)
	}
	ti := -1
	for i := range d.cfg.Tags {
		if d.cfg.Tags[i].Name == req.Tag {
			ti = i
			break
		}
	}
	if ti < 0 {
		return nil, writeErr(req, WriteUnknownTag, "the device has no such tag", nil)
	}
	t := &d.cfg.Tags[ti]
	switch {
	case !t.Writable:
		return nil, writeErr(req, WriteNotWritable, "the tag is not marked writable", nil)
	case !t.Register.Writable():
		return nil, writeErr(req, WriteNotWritable, t.Register.String()+" registers are read-only", nil)
	case !t.Type.Writable():
		return nil, writeErr(req, WriteNotWritable, "a "+t.Type.String()+" tag cannot be written", nil)
	}
	v := req.Value
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return nil, writeErr(req, WriteOutOfRange, "not a finite number", nil)
	}
	if t.Min != nil && v < *t.Min {
		return nil, writeErr(req, WriteOutOfRange, "below min "+fmtValue(*t.Min), nil)
	}
	if t.Max != nil && v > *t.Max {
		return nil, writeErr(req, WriteOutOfRange, "above max "+fmtValue(*t.Max), nil)
	}
	j := &writeJob{req: req, dev: d, tag: ti, done: make(chan writeOutcome, 1)}
	if t.Type == Bool {
		if v != 0 && v != 1 {
			return nil, writeErr(req, WriteOutOfRange, "a bool tag takes 0 or 1 (false or true)", nil)
		}
		j.raw = v
		return j, nil
	}
	if t.Register == Coil {
		return nil, writeErr(req, WriteOutOfRange, "a coil takes a bool, not "+t.Type.String(), nil)
	}
	raw, err := unscaled(t, v)
	if err != nil {
		return nil, writeErr(req, WriteOutOfRange, err.Error(), nil)
	}
	regs, err := EncodeRegisters(t.Type, t.Order, raw)
	if err != nil {
		return nil, writeErr(req, WriteOutOfRange, fmt.Sprintf("raw value %s: %v", fmtValue(raw), err), nil)
	}
	j.raw, j.regs = raw, regs
	return j, nil
}

// TagRegisters encodes v (in the tag's engineering unit) as the tag's own
// registers, wire order: scale and offset undone, then the tag's type and
// byte order, as a write would send them (a mirror serving raw registers).
// Bool, coil and string tags have no such registers.
func TagRegisters(t *Tag, v float64) ([]byte, error) {
	if t.Type == Bool || t.Register == Coil || t.Register == Discrete {
		return nil, fmt.Errorf("edge: tag %q: a %v on a %v has no registers of its own", t.Name, t.Type, t.Register)
	}
	raw, err := unscaled(t, v)
	if err != nil {
		return nil, fmt.Errorf("edge: tag %q: %w", t.Name, err)
	}
	return EncodeRegisters(t.Type, t.Order, raw)
}

// unscaled is the inverse of scaled: raw = (v-offset)/scale (a scale of 1/n
// multiplies by n). For integer types the raw value is rounded when it is
// within 1e-9 (relative, for large values) of a whole number and refused
// otherwise: 21.7 at scale 0.1 is 217, 21.75 is not an int16.
func unscaled(t *Tag, v float64) (float64, error) {
	var raw float64
	if inv := 1 / t.Scale; inv > 1 && math.Abs(inv-math.Round(inv)) < 1e-9*inv {
		raw = (v - t.Offset) * math.Round(inv)
	} else {
		raw = (v - t.Offset) / t.Scale
	}
	switch t.Type {
	case Float32:
		if math.Abs(raw) > math.MaxFloat32 {
			return 0, fmt.Errorf("raw value %s does not fit a float32", fmtValue(raw))
		}
	case Float16:
		if math.Abs(raw) > 65504 {
			return 0, fmt.Errorf("raw value %s does not fit a float16 (at most ±65504)", fmtValue(raw))
		}
	case Float64:
	default:
		r := math.Round(raw)
		if math.Abs(raw-r) > 1e-9*max(1, math.Abs(r)) {
			return 0, fmt.Errorf("raw value %s (scale %s, offset %s) is not a whole number: wrong type for %v",
				fmtValue(raw), fmtValue(t.Scale), fmtValue(t.Offset), t.Type)
		}
		raw = r
		// float64(MaxInt64) is 2^63, which EncodeRegisters would let through.
		if (t.Type == Int64 && raw >= 1<<63) || (t.Type == Uint64 && raw >= 1<<64) {
			return 0, fmt.Errorf("raw value %s does not fit %v", fmtValue(raw), t.Type)
		}
	}
	return raw, nil
}

// serveWrite does one queued write on the bus goroutine, unless its caller
// gave up first.
func (b *bus) serveWrite(j *writeJob) {
	if !j.state.CompareAndSwap(jobPending, jobClaimed) {
		return
	}
	res, err := b.doWrite(j)
	j.dev.log.Info("write", "origin", j.req.Origin, "tag", j.req.Tag, "value", j.req.Value,
		"result", writeResultText(err), "read_back", res.ReadBack, "duration", res.Duration, "err", errText(err))
	j.done <- writeOutcome{res: res, err: err}
}

// serveQueuedWrite does at most one waiting write (between two polls of a
// bus that has no idle time left).
func (b *bus) serveQueuedWrite() {
	select {
	case j := <-b.wr.queue:
		b.serveWrite(j)
	default:
	}
}

// closeWriteConns closes the TCP write connections (when the bus goroutine ends).
func (b *bus) closeWriteConns() {
	for d, c := range b.wr.tcp {
		_ = c.Close()
		delete(b.wr.tcp, d)
	}
}

// writeConn is the connection writes to d go over.
func (b *bus) writeConn(d *device) (readWriter, error) {
	if d.cfg.Transport == TransportUDP && d.cfg.WriteTransport != TransportUDP {
		c := b.wr.tcp[d]
		if c == nil {
			c = modbus.NewTCP(modbus.TCPConfig{Address: d.cfg.Address, Unit: d.cfg.Unit, Timeout: d.cfg.Timeout,
				Logger: d.log.With("for", "writes")})
			if b.wr.tcp == nil {
				b.wr.tcp = make(map[*device]*modbus.TCPConn)
			}
			b.wr.tcp[d] = c
		}
		return c, nil
	}
	if rw, ok := d.conn.(readWriter); ok {
		return rw, nil
	}
	return nil, fmt.Errorf("%s transport cannot write", d.cfg.Transport)
}

// doWrite writes, then reads the tag back once over the poll transport.
func (b *bus) doWrite(j *writeJob) (WriteResult, error) {
	d, t := j.dev, &j.dev.cfg.Tags[j.tag]
	res := WriteResult{Device: j.req.Device, Tag: j.req.Tag, Written: j.req.Value}
	start := time.Now()
	if d.conn == nil {
		return res, j.fail(WriteStopped, "the device's transport is not open", nil)
	}
	c, err := b.writeConn(d)
	if err != nil {
		return res, j.fail(WriteDevice, err.Error(), nil)
	}
	on := j.raw == 1
	switch {
	case t.Register == Coil:
		err = c.WriteSingleCoil(t.Address, on)
	case t.Type == Bool: // a bit of a holding register: read-modify-write
		var cur []byte
		if cur, err = c.ReadHoldingRegisters(t.Address, 1); err == nil {
			w := binary.BigEndian.Uint16(cur) &^ (1 << t.Bit)
			if on {
				w |= 1 << t.Bit
			}
			err = c.WriteSingleRegister(t.Address, w)
		}
	case len(j.regs) == 2:
		err = c.WriteSingleRegister(t.Address, binary.BigEndian.Uint16(j.regs))
	default:
		err = c.WriteMultipleRegisters(t.Address, j.regs)
	}
	if err != nil {
		res.Duration = time.Since(start)
		return res, j.fail(WriteDevice, err.Error(), err)
	}
	data, err := d.read(Read{Register: t.Register, Address: t.Address, Quantity: uint16(t.span())})
	if err != nil {
		res.Duration = time.Since(start)
		return res, j.fail(WriteDevice, "written, but the read-back failed: "+err.Error(), err)
	}
	var same bool
	var raw float64
	switch {
	case t.Register == Coil:
		if len(data) < 1 {
			err = fmt.Errorf("read-back of %d bytes", len(data))
			break
		}
		same = BitAt(data, 0) == on
		raw = map[bool]float64{false: 0, true: 1}[BitAt(data, 0)]
	default:
		if len(data) != 2*t.span() {
			err = fmt.Errorf("read-back of %d bytes, want %d", len(data), 2*t.span())
			break
		}
		raw, err = DecodeRegisters(t.Type, t.Order, t.Bit, data)
		if t.Type == Bool {
			same = (raw == 1) == on
		} else {
			same = bytes.Equal(data, j.regs)
		}
	}
	res.Duration = time.Since(start)
	if err != nil {
		return res, j.fail(WriteDevice, "written, but the read-back is malformed: "+err.Error(), err)
	}
	res.ReadBack = scaled(t, raw)
	if !same {
		return res, j.fail(WriteMismatch, fmt.Sprintf("wrote %s, read back %s", fmtValue(j.req.Value), fmtValue(res.ReadBack)), nil)
	}
	return res, nil
}

func writeResultText(err error) string {
	if err == nil {
		return "ok"
	}
	if we, ok := err.(*WriteError); ok {
		return we.Kind
	}
	return "cancelled"
}

func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// logWrite logs a write that never reached the bus (refused, busy, stopped, cancelled).
func (s *Scheduler) logWrite(req WriteRequest, res WriteResult, err error) {
	s.log.Info("write", "origin", req.Origin, "device", req.Device, "tag", req.Tag, "value", req.Value,
		"result", writeResultText(err), "duration", res.Duration, "err", errText(err))
}
