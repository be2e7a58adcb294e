package edge

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"strings"
)

// Type is a tag's data type on the wire.
type Type uint8

const (
	Int16 Type = iota + 1
	Uint16
	Int32
	Uint32
	Float32
	Int64
	Uint64
	Float64
	Bool
	String // Tag.Length registers of text, two bytes each (DecodeString)
)

var typeNames = map[string]Type{
	"int16": Int16, "uint16": Uint16, "int32": Int32, "uint32": Uint32, "float32": Float32,
	"int64": Int64, "uint64": Uint64, "float64": Float64, "bool": Bool, "string": String,
}

// ParseType maps a config type name to a Type.
func ParseType(s string) (Type, error) {
	if t, ok := typeNames[s]; ok {
		return t, nil
	}
	return 0, fmt.Errorf("edge: unknown type %q", s)
}

func (t Type) String() string {
	for n, v := range typeNames {
		if v == t {
			return n
		}
	}
	return fmt.Sprintf("type(%d)", uint8(t))
}

// Words is the number of 16-bit registers a value of t occupies (1 for Bool:
// a bit of one register; 1 for String, whose tags give their own Length).
func (t Type) Words() int {
	switch t {
	case Int32, Uint32, Float32:
		return 2
	case Int64, Uint64, Float64:
		return 4
	}
	return 1
}

// Order is the byte order of a multi-register value, named after the
// position of the bytes of the big-endian value ABCD(EFGH) on the wire.
//
//	ABCD  big-endian words, big-endian bytes (the Modbus default)   A B C D
//	CDAB  word order reversed ("word swap", little-endian words)    C D A B
//	BADC  bytes swapped inside each word                             B A D C
//	DCBA  fully little-endian                                        D C B A
//
// For 64-bit values the same rule holds per word: CDAB reverses the order of
// the four words, BADC swaps the two bytes of each word.
type Order uint8

const (
	ABCD Order = iota
	CDAB
	BADC
	DCBA
)

// ParseOrder maps a config order name ("" means ABCD) to an Order.
func ParseOrder(s string) (Order, error) {
	switch s {
	case "", "ABCD":
		return ABCD, nil
	case "CDAB":
		return CDAB, nil
	case "BADC":
		return BADC, nil
	case "DCBA":
		return DCBA, nil
	}
	return 0, fmt.Errorf("edge: unknown byte order %q", s)
}

func (o Order) String() string { return [...]string{"ABCD", "CDAB", "BADC", "DCBA"}[o&3] }

// normalize copies regs (as on the wire) into dst in big-endian ABCD order.
func normalize(dst, regs []byte, o Order) {
	n := len(regs) / 2 // words
	for w := 0; w < n; w++ {
		src := w
		if o == CDAB || o == DCBA {
			src = n - 1 - w
		}
		hi, lo := regs[2*src], regs[2*src+1]
		if o == BADC || o == DCBA {
			hi, lo = lo, hi
		}
		dst[2*w], dst[2*w+1] = hi, lo
	}
}

// DecodeRegisters decodes a raw value from the registers of one tag (exactly
// 2*t.Words() bytes as on the wire). bit selects a bit (0 = least
// significant) of a single register for Bool; it is ignored otherwise.
// The result is not scaled.
func DecodeRegisters(t Type, o Order, bit int, regs []byte) (float64, error) {
	if len(regs) != 2*t.Words() {
		return 0, fmt.Errorf("edge: %v needs %d bytes, got %d", t, 2*t.Words(), len(regs))
	}
	var b [8]byte
	normalize(b[:len(regs)], regs, o)
	switch t {
	case Int16:
		return float64(int16(binary.BigEndian.Uint16(b[:]))), nil
	case Uint16:
		return float64(binary.BigEndian.Uint16(b[:])), nil
	case Int32:
		return float64(int32(binary.BigEndian.Uint32(b[:]))), nil
	case Uint32:
		return float64(binary.BigEndian.Uint32(b[:])), nil
	case Float32:
		return float64(math.Float32frombits(binary.BigEndian.Uint32(b[:]))), nil
	case Int64:
		return float64(int64(binary.BigEndian.Uint64(b[:]))), nil
	case Uint64:
		return float64(binary.BigEndian.Uint64(b[:])), nil
	case Float64:
		return math.Float64frombits(binary.BigEndian.Uint64(b[:])), nil
	case Bool:
		if bit < 0 || bit > 15 {
			return 0, fmt.Errorf("edge: bit %d outside 0..15", bit)
		}
		if binary.BigEndian.Uint16(b[:])&(1<<bit) != 0 {
			return 1, nil
		}
		return 0, nil
	}
	return 0, fmt.Errorf("edge: cannot decode %v", t)
}

// EncodeRegisters is the inverse of DecodeRegisters for writes: the raw
// (unscaled) value v as 2*t.Words() bytes in wire order. Integer types
// reject values that are not whole or do not fit.
func EncodeRegisters(t Type, o Order, v float64) ([]byte, error) {
	var b [8]byte
	switch t {
	case Int16, Uint16, Int32, Uint32, Int64, Uint64:
		if v != math.Trunc(v) || math.IsInf(v, 0) || math.IsNaN(v) {
			return nil, fmt.Errorf("edge: %v value %v is not a whole number", t, v)
		}
	}
	fits := func(lo, hi float64) error {
		if v < lo || v > hi {
			return fmt.Errorf("edge: %v value %v outside %v..%v", t, v, lo, hi)
		}
		return nil
	}
	var err error
	switch t {
	case Int16:
		if err = fits(math.MinInt16, math.MaxInt16); err == nil {
			binary.BigEndian.PutUint16(b[:], uint16(int16(v)))
		}
	case Uint16:
		if err = fits(0, math.MaxUint16); err == nil {
			binary.BigEndian.PutUint16(b[:], uint16(v))
		}
	case Int32:
		if err = fits(math.MinInt32, math.MaxInt32); err == nil {
			binary.BigEndian.PutUint32(b[:], uint32(int32(v)))
		}
	case Uint32:
		if err = fits(0, math.MaxUint32); err == nil {
			binary.BigEndian.PutUint32(b[:], uint32(v))
		}
	case Float32:
		binary.BigEndian.PutUint32(b[:], math.Float32bits(float32(v)))
	case Int64:
		if err = fits(math.MinInt64, math.MaxInt64); err == nil {
			binary.BigEndian.PutUint64(b[:], uint64(int64(v)))
		}
	case Uint64:
		if err = fits(0, math.MaxUint64); err == nil {
			binary.BigEndian.PutUint64(b[:], uint64(v))
		}
	case Float64:
		binary.BigEndian.PutUint64(b[:], math.Float64bits(v))
	default:
		err = fmt.Errorf("edge: cannot encode %v into registers", t)
	}
	if err != nil {
		return nil, err
	}
	n := 2 * t.Words()
	out := make([]byte, n)
	// normalize is its own inverse for every order.
	normalize(out, b[:n], o)
	return out, nil
}

// DecodeString decodes the registers of a string tag: two characters per
// register, the high byte first (ABCD) or swapped inside each register
// (BADC, for devices that store text little-endian per word). Trailing NULs
// and spaces are cut (devices pad fixed-length fields with either), and
// bytes that are not UTF-8 become U+FFFD: the value is always valid text.
func DecodeString(o Order, regs []byte) (string, error) {
	if len(regs)%2 != 0 {
		return "", fmt.Errorf("edge: string of %d bytes is not whole registers", len(regs))
	}
	if o != ABCD && o != BADC {
		return "", fmt.Errorf("edge: string byte order %v: want ABCD or BADC", o)
	}
	b := make([]byte, len(regs))
	normalize(b, regs, o)
	return strings.ToValidUTF8(strings.TrimRight(string(b), "\x00 "), "\uFFFD"), nil
}

// ErrNotANumber is the error of a float register holding NaN or ±Inf: the
// sample gets quality error (JSON has no such number).
var ErrNotANumber = errors.New("edge: not a number")

// BitAt returns bit i of a packed coil/discrete-input reply (LSB of byte 0 first).
func BitAt(packed []byte, i int) bool {
	return packed[i/8]&(1<<(i%8)) != 0
}
