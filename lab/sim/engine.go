package sim

import (
	"encoding/binary"
	"sync"
	"time"
)

// Spec limits (Modbus Application Protocol v1.1b3, 6.1–6.12).
const (
	maxReadBits  = 2000
	maxReadRegs  = 125
	maxWriteBits = 1968
	maxWriteRegs = 123
)

// engine is one unit's register bank and the request engine that serves it.
// Handle is a pure function of the bank, the request and the clock.
type engine struct {
	limit   int // addresses >= limit answer exception 2
	maxRead int // register reads above this answer exception 2
	clock   func() time.Time
	model   *model // nil: a plain bank

	mu       sync.Mutex
	boot     time.Time // model uptime and sequence counter count from here
	pinned   uint16    // model registers overwritten: bit i = holding i (0..6), bit 8+i = input i (0..2)
	coils    bits
	discrete bits
	holding  words
	input    words
}

func (e *engine) now() time.Time {
	if e.clock != nil {
		return e.clock()
	}
	return time.Now()
}

// exception appends the exception response to function code fc.
func exception(dst []byte, fc, code byte) []byte {
	return append(dst, fc|0x80, code)
}

// appendHandle appends the response PDU to the request PDU pdu. An empty
// request has no response (dst is returned unchanged); every other request
// gets a valid response or exception PDU.
//
// Request and response layouts (all fields big endian):
//
//	FC 1, 2, 3, 4  req: fc, addr(2), quantity(2)       resp: fc, byte count n, n bytes
//	               (bits LSB first from addr; registers 2 bytes each)
//	FC 5           req: fc, addr(2), 0xFF00 | 0x0000   resp: echo
//	FC 6           req: fc, addr(2), value(2)          resp: echo
//	FC 15, 16      req: fc, addr(2), quantity(2), n, n bytes
//	               resp: fc, addr(2), quantity(2)
//	exception      resp: fc|0x80, code
func (e *engine) appendHandle(dst, pdu []byte) []byte {
	if len(pdu) == 0 {
		return dst
	}
	fc := pdu[0]
	switch fc {
	case 1, 2, 3, 4:
		if len(pdu) != 5 {
			return exception(dst, fc, ExcIllegalValue)
		}
		addr := int(binary.BigEndian.Uint16(pdu[1:]))
		qty := int(binary.BigEndian.Uint16(pdu[3:]))
		limit := maxReadRegs
		if fc <= 2 {
			limit = maxReadBits
		}
		if qty < 1 || qty > limit {
			return exception(dst, fc, ExcIllegalValue)
		}
		if fc >= 3 && qty > e.maxRead {
			return exception(dst, fc, ExcIllegalAddress)
		}
		if addr+qty > e.limit {
			return exception(dst, fc, ExcIllegalAddress)
		}
		e.mu.Lock()
		defer e.mu.Unlock()
		if fc <= 2 {
			return e.readBits(dst, fc, uint16(addr), qty)
		}
		return e.readRegs(dst, fc, uint16(addr), qty)
	case 5, 6:
		if len(pdu) != 5 {
			return exception(dst, fc, ExcIllegalValue)
		}
		addr := binary.BigEndian.Uint16(pdu[1:])
		v := binary.BigEndian.Uint16(pdu[3:])
		if fc == 5 && v != 0xFF00 && v != 0 {
			return exception(dst, fc, ExcIllegalValue)
		}
		if int(addr) >= e.limit {
			return exception(dst, fc, ExcIllegalAddress)
		}
		e.mu.Lock()
		if fc == 5 {
			e.coils.set(addr, v == 0xFF00)
		} else {
			e.writeReg(addr, v)
		}
		e.mu.Unlock()
		return append(dst, pdu...)
	case 15, 16:
		if len(pdu) < 6 {
			return exception(dst, fc, ExcIllegalValue)
		}
		addr := int(binary.BigEndian.Uint16(pdu[1:]))
		qty := int(binary.BigEndian.Uint16(pdu[3:]))
		n := int(pdu[5])
		limit, want := maxWriteRegs, 2*qty
		if fc == 15 {
			limit, want = maxWriteBits, (qty+7)/8
		}
		if qty < 1 || qty > limit || n != want || len(pdu) != 6+n {
			return exception(dst, fc, ExcIllegalValue)
		}
		if addr+qty > e.limit {
			return exception(dst, fc, ExcIllegalAddress)
		}
		data := pdu[6:]
		e.mu.Lock()
		for i := 0; i < qty; i++ {
			a := uint16(addr + i)
			if fc == 15 {
				e.coils.set(a, data[i/8]&(1<<(i%8)) != 0)
			} else {
				e.writeReg(a, binary.BigEndian.Uint16(data[2*i:]))
			}
		}
		e.mu.Unlock()
		return append(dst, pdu[:5]...)
	}
	return exception(dst, fc, ExcIllegalFunction)
}

// readBits appends coils (fc 1) or discrete inputs (fc 2). Caller holds mu.
func (e *engine) readBits(dst []byte, fc byte, addr uint16, qty int) []byte {
	n := (qty + 7) / 8
	dst = append(dst, fc, byte(n))
	start := len(dst)
	for i := 0; i < n; i++ {
		dst = append(dst, 0)
	}
	out := dst[start:]
	for i := 0; i < qty; i++ {
		if e.bit(fc, addr+uint16(i)) {
			out[i/8] |= 1 << (i % 8)
		}
	}
	return dst
}

func (e *engine) bit(fc byte, a uint16) bool {
	if fc == 1 {
		return e.coils.get(a)
	}
	if a == 0 && e.model != nil {
		// discrete input 0: alarm active (alarm enabled and temperature high)
		return e.coils.get(0) && e.model.alarm(e.now())
	}
	return e.discrete.get(a)
}

// readRegs appends holding (fc 3) or input (fc 4) registers. Caller holds mu.
func (e *engine) readRegs(dst []byte, fc byte, addr uint16, qty int) []byte {
	dst = append(dst, fc, byte(2*qty))
	var snap [modelRegs]uint16
	haveSnap := false
	for i := 0; i < qty; i++ {
		a := addr + uint16(i)
		var v uint16
		switch {
		case fc == 3 && e.modelReg(a, 0, modelRegs):
			if !haveSnap {
				snap, haveSnap = e.model.registers(e.now(), e.boot), true
			}
			v = snap[a]
		case fc == 4 && e.modelReg(a, 8, modelInputs):
			if !haveSnap {
				snap, haveSnap = e.model.registers(e.now(), e.boot), true
			}
			v = snap[a]
		case fc == 3:
			v = e.holding.get(a)
		default:
			v = e.input.get(a)
		}
		dst = binary.BigEndian.AppendUint16(dst, v)
	}
	return dst
}

// modelReg reports whether address a of a table is computed by the model
// (and not pinned by a write).
func (e *engine) modelReg(a uint16, pinShift uint, n int) bool {
	return e.model != nil && int(a) < n && e.pinned&(1<<(pinShift+uint(a))) == 0
}

// writeReg stores a holding register; a write to a model register pins it.
// Caller holds mu.
func (e *engine) writeReg(a, v uint16) {
	if e.model != nil && int(a) < modelRegs {
		e.pinned |= 1 << a
	}
	e.holding.set(a, v)
}

// --- direct access (tests, demo, bench): no limits, no counters ---

func (e *engine) setHolding(addr uint16, v []uint16) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for i, x := range v {
		e.writeReg(addr+uint16(i), x)
	}
}

func (e *engine) setInput(addr uint16, v []uint16) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for i, x := range v {
		a := addr + uint16(i)
		if e.model != nil && int(a) < modelInputs {
			e.pinned |= 1 << (8 + a)
		}
		e.input.set(a, x)
	}
}

func (e *engine) setBits(t *bits, addr uint16, v []bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for i, x := range v {
		t.set(addr+uint16(i), x)
	}
}

// regs reads n registers of a table (fc 3 or 4) as the engine would serve them.
func (e *engine) regs(fc byte, addr uint16, n int) []uint16 {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := make([]uint16, 0, n)
	for n > 0 {
		q := min(n, maxReadRegs)
		b := e.readRegs(nil, fc, addr, q)[2:]
		for i := 0; i < q; i++ {
			out = append(out, binary.BigEndian.Uint16(b[2*i:]))
		}
		addr += uint16(q)
		n -= q
	}
	return out
}

// bitsAt reads n coils (fc 1) or discrete inputs (fc 2).
func (e *engine) bitsAt(fc byte, addr uint16, n int) []bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := make([]bool, n)
	for i := range out {
		out[i] = e.bit(fc, addr+uint16(i))
	}
	return out
}
