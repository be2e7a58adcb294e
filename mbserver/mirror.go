package mbserver

import (
	"encoding/binary"
	"fmt"
	"math"
	"sync"

	"edgegw/ringstore"
)

// Mirror formats: how one tag's scaled value sits in registers.
const (
	FormatFloat32 = "float32" // 2 registers, IEEE 754, big-endian (ABCD), the scaled value
	FormatInt16   = "int16"   // 1 register, round(value × Multiplier), -32768..32767
	FormatUint16  = "uint16"  // 1 register, round(value × Multiplier), 0..65535
	FormatRaw     = "raw"     // the tag's own registers (Words of them) as Encode makes them from the value
)

// What a read of a tag without a good value gets.
const (
	OnBadException = "exception" // the whole read fails with exception 0x04
	OnBadValue     = "value"     // the tag's registers hold BadValue (int16, uint16, each raw register) or NaN (float32)
)

// Quality register values (Mirror.QualityAddress).
const (
	QualityGood     = 0
	QualityTimeout  = 1
	QualityError    = 2
	QualityStale    = 3
	QualityNone     = 4 // no sample yet
	QualityOutRange = 5 // the value does not fit the slot's format
)

// Mirror is the virtual unit that serves the latest values (FC3 and FC4
// read the same map; any other function is exception 0x01, a write too).
type Mirror struct {
	Unit  uint8
	Slots []Slot
	OnBad string // OnBadException (default) or OnBadValue
	// BadValue is what an int16 or uint16 slot holds with OnBadValue (as a
	// register: -32768 is 0x8000).
	BadValue int
	// QualityAddress >= 0: one register per slot, in Slots order, from this
	// address, holding the slot's Quality* code; these never fail. -1: none.
	QualityAddress int
}

// Slot is one tag's value at Address (Words registers).
type Slot struct {
	Address    uint16
	Device     string
	Tag        string
	Format     string  // FormatFloat32 (default), FormatInt16, FormatUint16, FormatRaw
	Multiplier float64 // int16, uint16: the register is round(value × Multiplier); 0 means 1
	// Raw (FormatRaw): RawWords registers (1..4) that Encode makes from the
	// value (the tag's type and byte order, scale and offset undone); an
	// error reads as out of range.
	RawWords int
	Encode   func(v float64) ([]byte, error)
}

// Words is the number of registers the slot takes.
func (s Slot) Words() int {
	switch s.Format {
	case FormatInt16, FormatUint16:
		return 1
	case FormatRaw:
		return s.RawWords
	}
	return 2
}

// cell is what one register address of the map holds.
type cell struct {
	slot int32 // index into slots, -1: nothing
	word int8  // word of the slot, or -1: the slot's quality register
}

type mirror struct {
	cfg   Mirror
	ring  Latest
	lo    int
	cells []cell // address lo+i

	mu    sync.Mutex
	snap  *ringstore.Snapshot
	index map[[2]string]int // device/tag -> index in snap.Latest
}

func newMirror(m Mirror, ring Latest) (*mirror, error) {
	if m.OnBad == "" {
		m.OnBad = OnBadException
	}
	if m.OnBad != OnBadException && m.OnBad != OnBadValue {
		return nil, fmt.Errorf("mbserver: mirror: on_bad %q is not %q or %q", m.OnBad, OnBadException, OnBadValue)
	}
	if len(m.Slots) == 0 {
		return nil, fmt.Errorf("mbserver: mirror: no slots")
	}
	lo, hi := 1<<16, -1
	span := func(a, n int) {
		lo, hi = min(lo, a), max(hi, a+n-1)
	}
	for i := range m.Slots {
		sl := &m.Slots[i]
		if sl.Format == "" {
			sl.Format = FormatFloat32
		}
		if sl.Multiplier == 0 {
			sl.Multiplier = 1
		}
		if sl.Format == FormatRaw && (sl.RawWords < 1 || sl.RawWords > 4 || sl.Encode == nil) {
			return nil, fmt.Errorf("mbserver: mirror: %s/%s: raw needs 1..4 words and an encoder", sl.Device, sl.Tag)
		}
		span(int(sl.Address), sl.Words())
	}
	if m.QualityAddress >= 0 {
		span(m.QualityAddress, len(m.Slots))
	}
	if hi > 0xFFFF {
		return nil, fmt.Errorf("mbserver: mirror: the map ends at %d, past 65535", hi)
	}
	mi := &mirror{cfg: m, ring: ring, lo: lo, cells: make([]cell, hi-lo+1)}
	for i := range mi.cells {
		mi.cells[i] = cell{slot: -1}
	}
	put := func(a int, c cell, what string) error {
		if o := mi.cells[a-lo]; o.slot >= 0 {
			return fmt.Errorf("mbserver: mirror: register %d: %s overlaps %s/%s", a, what, m.Slots[o.slot].Device, m.Slots[o.slot].Tag)
		}
		mi.cells[a-lo] = c
		return nil
	}
	for i, sl := range m.Slots {
		for w := 0; w < sl.Words(); w++ {
			if err := put(int(sl.Address)+w, cell{slot: int32(i), word: int8(w)}, sl.Device+"/"+sl.Tag); err != nil {
				return nil, err
			}
		}
		if m.QualityAddress >= 0 {
			if err := put(m.QualityAddress+i, cell{slot: int32(i), word: -1}, "the quality register of "+sl.Device+"/"+sl.Tag); err != nil {
				return nil, err
			}
		}
	}
	return mi, nil
}

// latest is the index of the ring's current snapshot (rebuilt when it changed).
func (m *mirror) latest() (*ringstore.Snapshot, map[[2]string]int) {
	snap := m.ring.Snapshot()
	m.mu.Lock()
	defer m.mu.Unlock()
	if snap != m.snap {
		idx := make(map[[2]string]int, len(snap.Latest))
		for i, s := range snap.Latest {
			idx[[2]string{s.Device, s.Tag}] = i
		}
		m.snap, m.index = snap, idx
	}
	return m.snap, m.index
}

// value is slot i's registers and its quality code.
func (m *mirror) value(snap *ringstore.Snapshot, idx map[[2]string]int, i int) (regs [4]uint16, q int) {
	sl := m.cfg.Slots[i]
	bad := func(code int) ([4]uint16, int) {
		switch sl.Format {
		case FormatFloat32:
			b := math.Float32bits(float32(math.NaN()))
			return [4]uint16{uint16(b >> 16), uint16(b)}, code
		case FormatRaw:
			bv := uint16(int16(m.cfg.BadValue))
			return [4]uint16{bv, bv, bv, bv}, code
		}
		return [4]uint16{uint16(int16(m.cfg.BadValue))}, code
	}
	k, ok := idx[[2]string{sl.Device, sl.Tag}]
	if !ok {
		return bad(QualityNone)
	}
	s := snap.Latest[k]
	switch s.Quality {
	case ringstore.Good:
	case ringstore.Timeout:
		return bad(QualityTimeout)
	case ringstore.Stale:
		return bad(QualityStale)
	default:
		return bad(QualityError)
	}
	switch sl.Format {
	case FormatFloat32:
		b := math.Float32bits(float32(s.Value))
		return [4]uint16{uint16(b >> 16), uint16(b)}, QualityGood
	case FormatRaw:
		b, err := sl.Encode(s.Value)
		if err != nil || len(b) != 2*sl.RawWords {
			return bad(QualityOutRange)
		}
		for w := 0; w < sl.RawWords; w++ {
			regs[w] = binary.BigEndian.Uint16(b[2*w:])
		}
		return regs, QualityGood
	case FormatInt16:
		v := math.Round(s.Value * sl.Multiplier)
		if v < math.MinInt16 || v > math.MaxInt16 {
			return bad(QualityOutRange)
		}
		return [4]uint16{uint16(int16(v))}, QualityGood
	default:
		v := math.Round(s.Value * sl.Multiplier)
		if v < 0 || v > math.MaxUint16 {
			return bad(QualityOutRange)
		}
		return [4]uint16{uint16(v)}, QualityGood
	}
}

// answer serves one read from the latest values.
//
//	FC3/FC4 request: fc, addr(2), qty(2) (1..125)   reply: fc, 2·qty, registers
//
// Addresses outside the map's first..last register are exception 0x02;
// unmapped registers inside it read 0. With OnBadException a slot in the
// range without a good value fails the read with 0x04.
func (m *mirror) answer(pdu []byte) []byte {
	fc := pdu[0]
	if fc != 3 && fc != 4 {
		return exception(fc, ExIllegalFunction)
	}
	if len(pdu) != 5 {
		return exception(fc, ExIllegalValue)
	}
	addr, qty := int(binary.BigEndian.Uint16(pdu[1:])), int(binary.BigEndian.Uint16(pdu[3:]))
	if qty < 1 || qty > 125 {
		return exception(fc, ExIllegalValue)
	}
	if addr < m.lo || addr+qty > m.lo+len(m.cells) {
		return exception(fc, ExIllegalAddress)
	}
	snap, idx := m.latest()
	out := make([]byte, 2, 2+2*qty)
	out[0], out[1] = fc, byte(2*qty)
	for a := addr; a < addr+qty; a++ {
		c := m.cells[a-m.lo]
		var v uint16
		if c.slot >= 0 {
			regs, q := m.value(snap, idx, int(c.slot))
			switch {
			case c.word < 0:
				v = uint16(q)
			case q != QualityGood && m.cfg.OnBad == OnBadException:
				return exception(fc, ExDeviceFailure)
			default:
				v = regs[c.word]
			}
		}
		out = binary.BigEndian.AppendUint16(out, v)
	}
	return out
}
