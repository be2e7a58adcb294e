package sparkplug

// The mapping of tag types onto Sparkplug datatypes and values, both ways.

import (
	"errors"

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
