package edge

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"strings"
	"unicode/utf8"

	"edgegw/tagtype"
)

// The tag types, register kinds and byte orders are tagtype's (the one
// vocabulary the config, this package and sparkplug share); edge names them
// for its callers.
type (
	Type     = tagtype.Type
	Order    = tagtype.Order
	Register = tagtype.Register
	Location = tagtype.Location
)

const (
	Int16     = tagtype.Int16
	Uint16    = tagtype.Uint16
	Int32     = tagtype.Int32
	Uint32    = tagtype.Uint32
	Float32   = tagtype.Float32
	Int64     = tagtype.Int64
	Uint64    = tagtype.Uint64
	Float64   = tagtype.Float64
	Bool      = tagtype.Bool
	String    = tagtype.String // Tag.Length registers of text (DecodeString)
	Int8High  = tagtype.Int8High
	Int8Low   = tagtype.Int8Low
	Uint8High = tagtype.Uint8High
	Uint8Low  = tagtype.Uint8Low
	Float16   = tagtype.Float16

	ABCD = tagtype.ABCD
	CDAB = tagtype.CDAB
	BADC = tagtype.BADC
	DCBA = tagtype.DCBA

	Holding  = tagtype.Holding  // FC3, 16-bit read/write
	Input    = tagtype.Input    // FC4, 16-bit read-only
	Coil     = tagtype.Coil     // FC1, 1-bit read/write
	Discrete = tagtype.Discrete // FC2, 1-bit read-only

	Both  = tagtype.Both  // two characters a register
	Lower = tagtype.Lower // one character a register, in its low byte
	Upper = tagtype.Upper // one character a register, in its high byte
)

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
// The 8-bit types take the high (first on the wire) or low byte of their
// register; Float16 is an IEEE 754 half. The result is not scaled.
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
	case Int8High:
		return float64(int8(b[0])), nil
	case Int8Low:
		return float64(int8(b[1])), nil
	case Uint8High:
		return float64(b[0]), nil
	case Uint8Low:
		return float64(b[1]), nil
	case Float16:
		return halfToFloat(binary.BigEndian.Uint16(b[:])), nil
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
// reject values that are not whole or do not fit; a Float16 is rounded to
// the nearest half (ties to even) and refused beyond ±65504. The 8-bit
// types are not encoded (tagtype: not writable).
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
	case Float16:
		if err = fits(-65504, 65504); err == nil {
			binary.BigEndian.PutUint16(b[:], floatToHalf(v))
		}
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

// AppendText appends the text of a string tag's registers to dst, as
// bytes, and returns it. At loc Both each register holds two characters,
// the high byte first (ABCD) or swapped (BADC, for devices that store text
// little-endian per word); at Lower or Upper each holds one, in its low or
// high byte (order ABCD only). Trailing NULs and spaces are cut (devices
// pad fixed-length fields with either). It allocates only when dst is too
// small: a poll reuses one buffer.
func AppendText(dst []byte, o Order, loc Location, regs []byte) ([]byte, error) {
	if len(regs)%2 != 0 {
		return dst, fmt.Errorf("edge: string of %d bytes is not whole registers", len(regs))
	}
	switch {
	case loc == Both && o != ABCD && o != BADC:
		return dst, fmt.Errorf("edge: string byte order %v: want ABCD or BADC", o)
	case loc != Both && o != ABCD:
		return dst, fmt.Errorf("edge: string byte order %v with one character a register (%v): want ABCD", o, loc)
	}
	start := len(dst)
	for i := 0; i+1 < len(regs); i += 2 {
		hi, lo := regs[i], regs[i+1]
		switch {
		case loc == Lower:
			dst = append(dst, lo)
		case loc == Upper:
			dst = append(dst, hi)
		case o == BADC:
			dst = append(dst, lo, hi)
		default:
			dst = append(dst, hi, lo)
		}
	}
	n := len(dst)
	for n > start && (dst[n-1] == 0 || dst[n-1] == ' ') {
		n--
	}
	return dst[:n], nil
}

// DecodeString decodes the registers of a string tag (see AppendText).
// Bytes that are not UTF-8 become U+FFFD: the value is always valid text.
func DecodeString(o Order, loc Location, regs []byte) (string, error) {
	b, err := AppendText(nil, o, loc, regs)
	if err != nil {
		return "", err
	}
	return validText(b), nil
}

// validText is b as a string, with bytes that are not UTF-8 as U+FFFD.
func validText(b []byte) string {
	if utf8.Valid(b) {
		return string(b)
	}
	return strings.ToValidUTF8(string(b), "\uFFFD")
}

// halfToFloat is the value of the IEEE 754 binary16 h: 1 sign bit, 5
// exponent bits (bias 15), 10 fraction bits; exponent 0 is zero or
// subnormal (fraction × 2^-24), 31 is ±Inf (fraction 0) or NaN.
func halfToFloat(h uint16) float64 {
	sign := 1.0
	if h&0x8000 != 0 {
		sign = -1
	}
	exp, frac := int(h>>10)&0x1f, float64(h&0x3ff)
	switch exp {
	case 0:
		return sign * math.Ldexp(frac, -24)
	case 0x1f:
		if frac == 0 {
			return math.Inf(int(sign))
		}
		return math.NaN()
	}
	return sign * math.Ldexp(1024+frac, exp-25)
}

// floatToHalf is the binary16 nearest v (ties to even), for |v| <= 65504.
func floatToHalf(v float64) uint16 {
	var sign uint16
	if math.Signbit(v) {
		sign, v = 0x8000, -v
	}
	if v < 0x1p-14 { // subnormal: units of 2^-24 (1024 of them is the smallest normal, 0x0400)
		return sign | uint16(math.RoundToEven(v*0x1p24))
	}
	frac, exp := math.Frexp(v) // v = frac × 2^exp, frac in [0.5, 1)
	e := exp - 1
	m := math.RoundToEven((2*frac - 1) * 1024)
	if m == 1024 {
		m, e = 0, e+1
	}
	return sign | uint16(e+15)<<10 | uint16(m)
}

// ErrNotANumber is the error of a float register holding NaN or ±Inf: the
// sample gets quality error (JSON has no such number).
var ErrNotANumber = errors.New("edge: not a number")

// BitAt returns bit i of a packed coil/discrete-input reply (LSB of byte 0 first).
func BitAt(packed []byte, i int) bool {
	return packed[i/8]&(1<<(i%8)) != 0
}
