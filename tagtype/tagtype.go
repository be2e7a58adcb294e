package tagtype

import (
	"fmt"
	"math"
	"slices"
	"strings"
)

// Type is a tag's data type on the wire. The zero Type is no type.
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
	String    // Length registers of text (StringLocation says how many bytes of each)
	Int8High  // the most significant byte of one register, signed
	Int8Low   // the least significant byte of one register, signed
	Uint8High // the most significant byte of one register
	Uint8Low  // the least significant byte of one register
	Float16   // IEEE 754 binary16 (half precision) in one register
	numTypes
)

// Kind is what a type's value is.
type Kind uint8

const (
	Number  Kind = iota + 1 // a float64 after scale and offset
	Boolean                 // 0 or 1, shown as false/true
	Text                    // a string
)

func (k Kind) String() string {
	switch k {
	case Number:
		return "number"
	case Boolean:
		return "bool"
	case Text:
		return "string"
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// Sparkplug 3.0 datatypes (Sparkplug B specification 3.0.0, 6.4.16, the
// DataType enum of sparkplug_b.proto).
const (
	SparkplugInt8    uint32 = 1
	SparkplugInt16   uint32 = 2
	SparkplugInt32   uint32 = 3
	SparkplugInt64   uint32 = 4
	SparkplugUInt8   uint32 = 5
	SparkplugUInt16  uint32 = 6
	SparkplugUInt32  uint32 = 7
	SparkplugUInt64  uint32 = 8
	SparkplugFloat   uint32 = 9
	SparkplugDouble  uint32 = 10
	SparkplugBoolean uint32 = 11
	SparkplugString  uint32 = 12
)

// info is everything the gateway knows about one type.
type info struct {
	name      string
	aliases   []string
	words     int  // registers on holding/input; 0 for String (the tag's Length)
	bits      int  // width of the value: 8, 16, 32 or 64 (1 for Bool)
	signed    bool // integer types
	float     bool
	kind      Kind
	sparkplug uint32 // datatype of the unscaled value
	regs      []Register
	orders    []Order
	writable  bool
}

var words16 = []Register{Holding, Input}

var table = [numTypes]info{
	Int16:     {name: "int16", words: 1, bits: 16, signed: true, kind: Number, sparkplug: SparkplugInt16, regs: words16, orders: []Order{ABCD, BADC}, writable: true},
	Uint16:    {name: "uint16", words: 1, bits: 16, kind: Number, sparkplug: SparkplugUInt16, regs: words16, orders: []Order{ABCD, BADC}, writable: true},
	Int32:     {name: "int32", words: 2, bits: 32, signed: true, kind: Number, sparkplug: SparkplugInt32, regs: words16, orders: allOrders, writable: true},
	Uint32:    {name: "uint32", words: 2, bits: 32, kind: Number, sparkplug: SparkplugUInt32, regs: words16, orders: allOrders, writable: true},
	Float32:   {name: "float32", words: 2, bits: 32, float: true, kind: Number, sparkplug: SparkplugFloat, regs: words16, orders: allOrders, writable: true},
	Int64:     {name: "int64", words: 4, bits: 64, signed: true, kind: Number, sparkplug: SparkplugInt64, regs: words16, orders: allOrders, writable: true},
	Uint64:    {name: "uint64", words: 4, bits: 64, kind: Number, sparkplug: SparkplugUInt64, regs: words16, orders: allOrders, writable: true},
	Float64:   {name: "float64", words: 4, bits: 64, float: true, kind: Number, sparkplug: SparkplugDouble, regs: words16, orders: allOrders, writable: true},
	Bool:      {name: "bool", words: 1, bits: 1, kind: Boolean, sparkplug: SparkplugBoolean, regs: []Register{Holding, Input, Coil, Discrete}, orders: []Order{ABCD}, writable: true},
	String:    {name: "string", kind: Text, sparkplug: SparkplugString, regs: words16, orders: []Order{ABCD, BADC}},
	Int8High:  {name: "int8_high", aliases: []string{"int8h"}, words: 1, bits: 8, signed: true, kind: Number, sparkplug: SparkplugInt8, regs: words16, orders: []Order{ABCD}},
	Int8Low:   {name: "int8_low", aliases: []string{"int8l"}, words: 1, bits: 8, signed: true, kind: Number, sparkplug: SparkplugInt8, regs: words16, orders: []Order{ABCD}},
	Uint8High: {name: "uint8_high", aliases: []string{"uint8h"}, words: 1, bits: 8, kind: Number, sparkplug: SparkplugUInt8, regs: words16, orders: []Order{ABCD}},
	Uint8Low:  {name: "uint8_low", aliases: []string{"uint8l"}, words: 1, bits: 8, kind: Number, sparkplug: SparkplugUInt8, regs: words16, orders: []Order{ABCD}},
	Float16:   {name: "float16", aliases: []string{"half"}, words: 1, bits: 16, float: true, kind: Number, sparkplug: SparkplugFloat, regs: words16, orders: []Order{ABCD, BADC}, writable: true},
}

var allOrders = []Order{ABCD, CDAB, BADC, DCBA}

var byName = func() map[string]Type {
	m := map[string]Type{}
	for t := Type(1); t < numTypes; t++ {
		m[table[t].name] = t
		for _, a := range table[t].aliases {
			m[a] = t
		}
	}
	return m
}()

// Parse maps a config type name, or one of its aliases (Telegraf's
// int8h, int8l, uint8h, uint8l; half), to a Type.
func Parse(s string) (Type, error) {
	if t, ok := byName[s]; ok {
		return t, nil
	}
	return 0, fmt.Errorf("tagtype: type %q: want %s", s, strings.Join(Names(), ", "))
}

// Names lists the canonical type names in the order of the README's table.
func Names() []string {
	out := make([]string, 0, numTypes-1)
	for t := Type(1); t < numTypes; t++ {
		out = append(out, table[t].name)
	}
	return out
}

func (t Type) ok() bool { return t > 0 && t < numTypes }

func (t Type) String() string {
	if t.ok() {
		return table[t].name
	}
	return fmt.Sprintf("type(%d)", uint8(t))
}

// Words is the number of 16-bit registers a value of t occupies on a
// holding or input register: 1, 2 or 4 (1 for Bool: a bit of one
// register); 0 for String, whose tags give their own length.
func (t Type) Words() int {
	if t.ok() {
		return table[t].words
	}
	return 0
}

// Kind is what the value of t is: a number, a bool or text.
func (t Type) Kind() Kind {
	if t.ok() {
		return table[t].kind
	}
	return 0
}

// Float says whether t is a floating-point type (float16, float32, float64).
func (t Type) Float() bool { return t.ok() && table[t].float }

// Integer says whether t is an integer type (the 8- to 64-bit ones).
func (t Type) Integer() bool { return t.Kind() == Number && !t.Float() }

// Writable says whether a tag of type t may be written. The 8-bit types
// may not: writing one byte means writing the whole register, which would
// overwrite the other byte with whatever was read before. Strings may not.
func (t Type) Writable() bool { return t.ok() && table[t].writable }

// Range is the interval of raw (unscaled) values a value of t holds: the
// integer range of an integer type, ±the largest finite value of a float
// type, 0..1 for Bool, and 0, 0 for String.
func (t Type) Range() (lo, hi float64) {
	if !t.ok() {
		return 0, 0
	}
	in := table[t]
	switch {
	case t == Bool:
		return 0, 1
	case in.kind == Text:
		return 0, 0
	case t == Float16:
		return -65504, 65504
	case t == Float32:
		return -math.MaxFloat32, math.MaxFloat32
	case t == Float64:
		return -math.MaxFloat64, math.MaxFloat64
	case in.signed:
		return -math.Ldexp(1, in.bits-1), math.Ldexp(1, in.bits-1) - 1
	}
	return 0, math.Ldexp(1, in.bits) - 1
}

// Sparkplug is the Sparkplug 3.0 datatype of a tag of type t. A scaled
// value (scale != 1 or offset != 0) has decimals, so a scaled integer is
// Float when it is 16 bits wide or less, Double when wider; scaled float16
// and float32 stay Float. Bool and String are never scaled.
func (t Type) Sparkplug(scaled bool) uint32 {
	if !t.ok() {
		return 0
	}
	in := table[t]
	if scaled && in.kind == Number {
		if in.bits <= 16 || t == Float32 {
			return SparkplugFloat
		}
		return SparkplugDouble
	}
	return in.sparkplug
}

// Registers lists the register kinds a tag of type t may live in.
func (t Type) Registers() []Register {
	if t.ok() {
		return table[t].regs
	}
	return nil
}

// Allows says whether a tag of type t may live in register kind r.
func (t Type) Allows(r Register) bool { return slices.Contains(t.Registers(), r) }

// Orders lists the byte orders a tag of type t may use; the first is the
// default. A 16-bit value has no word to swap (ABCD, BADC); a byte of a
// register and a bit count from the register's value as read (ABCD).
func (t Type) Orders() []Order {
	if t.ok() {
		return table[t].orders
	}
	return nil
}

// AllowsOrder says whether a tag of type t may use byte order o.
func (t Type) AllowsOrder(o Order) bool { return slices.Contains(t.Orders(), o) }

// Span is the number of addresses a tag of type t occupies in register kind
// r: 1 on a coil or discrete input (one bit), length for a String, else
// Words. It is the one register count of the gateway: the config checks
// addresses with it and the read plan reads it.
func Span(t Type, r Register, length int) int {
	switch {
	case r.Bits():
		return 1
	case t == String:
		return length
	}
	return t.Words()
}

// Register is the Modbus data table a tag lives in.
type Register uint8

const (
	Holding  Register = iota // FC3, 16-bit read/write
	Input                    // FC4, 16-bit read-only
	Coil                     // FC1, 1-bit read/write
	Discrete                 // FC2, 1-bit read-only
)

var registerNames = [...]string{"holding", "input", "coil", "discrete"}

// ParseRegister maps a config register name to a Register.
func ParseRegister(s string) (Register, error) {
	if i := slices.Index(registerNames[:], s); i >= 0 {
		return Register(i), nil
	}
	return 0, fmt.Errorf("tagtype: register %q: want holding, input, coil or discrete", s)
}

func (r Register) String() string { return registerNames[r&3] }

// Bits says whether r is a bit table (coil, discrete input).
func (r Register) Bits() bool { return r == Coil || r == Discrete }

// Writable says whether r can be written (holding registers and coils).
func (r Register) Writable() bool { return r == Holding || r == Coil }

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

var orderNames = [...]string{"ABCD", "CDAB", "BADC", "DCBA"}

// ParseOrder maps a config order name ("" means ABCD) to an Order.
func ParseOrder(s string) (Order, error) {
	if s == "" {
		return ABCD, nil
	}
	if i := slices.Index(orderNames[:], s); i >= 0 {
		return Order(i), nil
	}
	return 0, fmt.Errorf("tagtype: order %q: want ABCD, CDAB, BADC or DCBA", s)
}

func (o Order) String() string { return orderNames[o&3] }

// Location is where the characters of a string tag sit in each register
// (Telegraf's string_register_location).
type Location uint8

const (
	Both  Location = iota // two characters a register, in the order the tag's Order says
	Lower                 // one character a register, in its least significant byte
	Upper                 // one character a register, in its most significant byte
)

var locationNames = [...]string{"both", "lower", "upper"}

// ParseLocation maps a config string_register_location ("" means both).
func ParseLocation(s string) (Location, error) {
	if s == "" {
		return Both, nil
	}
	if i := slices.Index(locationNames[:], s); i >= 0 {
		return Location(i), nil
	}
	return 0, fmt.Errorf("tagtype: string_register_location %q: want both, lower or upper", s)
}

func (l Location) String() string { return locationNames[l%3] }

// Chars is the number of characters one register holds at l.
func (l Location) Chars() int {
	if l == Both {
		return 2
	}
	return 1
}
