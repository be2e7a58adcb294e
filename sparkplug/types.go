package sparkplug

// The mapping of tag types onto Sparkplug datatypes and values, both ways.

import (
	"errors"
	"fmt"
	"math"

	"edgegw/ringstore"
	"edgegw/tagtype"
)

// Tag describes one tag for its DBIRTH metric.
type Tag struct {
	Name     string
	Type     tagtype.Type
	Scaled   bool // scale != 1 or offset != 0: the value is not the raw integer
	Unit     string
	Min, Max *float64
	Writable bool
}

// datatypeOf is the tag's Sparkplug datatype (tagtype's): a scaled
// integer becomes Float (16-bit) or Double (wider), its value has decimals.
func datatypeOf(t Tag) uint32 { return t.Type.Sparkplug(t.Scaled) }

// sampleValue is the metric value of a good sample of a tag of datatype dt:
// the text of a string tag, else the number as dt.
func sampleValue(dt uint32, x *ringstore.Sample) Value {
	if dt == TypeString {
		return Value{Kind: KindString, S: sampleText(x)}
	}
	return valueOf(dt, x.Value)
}

// sampleText is the text of a string tag's sample ("" for other tags).
func sampleText(x *ringstore.Sample) string {
	if x.Text == nil {
		return ""
	}
	return *x.Text
}

// valueOf encodes v as datatype dt.
func valueOf(dt uint32, v float64) Value {
	switch dt {
	case TypeBoolean:
		return Value{Kind: KindBool, B: v != 0}
	case TypeInt8, TypeInt16, TypeInt32:
		return Value{Kind: KindInt, U: uint64(uint32(int32(v)))}
	case TypeUInt8, TypeUInt16:
		return Value{Kind: KindInt, U: uint64(uint32(v))}
	case TypeInt64:
		return Value{Kind: KindLong, U: uint64(int64(v))}
	case TypeUInt32, TypeUInt64:
		return Value{Kind: KindLong, U: uint64(v)}
	case TypeFloat:
		return Value{Kind: KindFloat, F32: float32(v)}
	default:
		return Value{Kind: KindDouble, F64: v}
	}
}

// numberOf reads a command's value as a number for a tag of datatype dt.
func numberOf(dt uint32, v Value) (float64, error) {
	switch v.Kind {
	case KindBool:
		if v.B {
			return 1, nil
		}
		return 0, nil
	case KindInt:
		switch dt {
		case TypeInt8, TypeInt16, TypeInt32, TypeInt64:
			return float64(int32(uint32(v.U))), nil
		}
		return float64(uint32(v.U)), nil
	case KindLong:
		if dt == TypeInt64 || dt == TypeInt32 || dt == TypeInt16 || dt == TypeInt8 {
			return float64(int64(v.U)), nil
		}
		return float64(v.U), nil
	case KindFloat:
		return float64(v.F32), nil
	case KindDouble:
		return v.F64, nil
	}
	return 0, errors.New("no numeric or boolean value")
}

// commandValue checks a DCMD value for tag t (of datatype dt) and returns
// the number to write. A string tag is read-only; a value must be of the
// tag's kind (a bool or 0/1 for a bool, a number for a number); an
// unscaled value must fit the tag's type (whole, within its range: an Int16
// takes -32768..32767, a Float16 ±65504). A scaled value is checked by the
// Writer, against the raw range after scale and offset.
func commandValue(t *Tag, dt uint32, v Value) (float64, error) {
	switch {
	case t.Type.Kind() == tagtype.Text:
		return 0, fmt.Errorf("%s is a string tag: strings are read-only", t.Name)
	case !t.Writable:
		return 0, fmt.Errorf("%s is not writable", t.Name)
	case v.Kind == KindString:
		return 0, fmt.Errorf("a string value for %s, a %s tag", t.Name, t.Type)
	}
	x, err := numberOf(dt, v)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", t.Name, err)
	}
	if t.Type == tagtype.Bool {
		if x != 0 && x != 1 {
			return 0, fmt.Errorf("%s is a bool: it takes true or false (or 0, 1), not %v", t.Name, x)
		}
		return x, nil
	}
	if t.Scaled {
		return x, nil
	}
	lo, hi := t.Type.Range()
	switch {
	case math.IsNaN(x) || math.IsInf(x, 0):
		return 0, fmt.Errorf("%s: %v is not a finite number", t.Name, x)
	case t.Type.Integer() && x != math.Trunc(x):
		return 0, fmt.Errorf("%s: %v is not a whole number, and %s is a %s", t.Name, x, t.Name, t.Type)
	case x < lo || x > hi:
		return 0, fmt.Errorf("%s: %v outside %v..%v, the range of %s", t.Name, x, lo, hi, t.Type)
	}
	return x, nil
}

func qualityCode(q ringstore.Quality) int32 {
	switch q {
	case ringstore.Good:
		return QualityGood
	case ringstore.Timeout:
		return QualityCommFailure
	case ringstore.Stale:
		return QualityUncertain
	}
	return QualityBad
}

func sameValue(a, b Value) bool {
	return a.Kind == b.Kind && a.U == b.U && a.S == b.S && a.B == b.B && a.F32 == b.F32 && a.F64 == b.F64
}
