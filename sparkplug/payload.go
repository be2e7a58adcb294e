package sparkplug

import (
	"errors"
	"fmt"
	"math"

	"google.golang.org/protobuf/encoding/protowire"
)

// Sparkplug B data types (sparkplug_b.proto, DataType), the ones this
// package writes or reads.
const (
	TypeUnknown  uint32 = 0
	TypeInt8     uint32 = 1
	TypeInt16    uint32 = 2
	TypeInt32    uint32 = 3
	TypeInt64    uint32 = 4
	TypeUInt8    uint32 = 5
	TypeUInt16   uint32 = 6
	TypeUInt32   uint32 = 7
	TypeUInt64   uint32 = 8
	TypeFloat    uint32 = 9
	TypeDouble   uint32 = 10
	TypeBoolean  uint32 = 11
	TypeString   uint32 = 12
	TypeDateTime uint32 = 13
	TypeText     uint32 = 14
)

// Value kinds: the field number of the value in Metric's oneof (10..16),
// the same numbers serve PropertyValue's oneof shifted by 7 (3..8).
const (
	KindNone   = 0
	KindInt    = 10 // int_value, uint32: Int8/16/32 (two's complement, sign-extended), UInt8/16
	KindLong   = 11 // long_value, uint64: Int64 (two's complement), UInt32, UInt64, DateTime
	KindFloat  = 12 // float_value
	KindDouble = 13 // double_value
	KindBool   = 14 // boolean_value
	KindString = 15 // string_value: String, Text, UUID
	KindBytes  = 16 // bytes_value (read only; never written by the node)
)

// Value is one value of a metric or property. Only the field of Kind is
// meaningful.
type Value struct {
	Kind   int
	U      uint64 // KindInt (low 32 bits) and KindLong
	F32    float32
	F64    float64
	B      bool
	S      string
	Bytes  []byte
	IsNull bool // PropertyValue.is_null (a metric's is_null is Metric.IsNull)
}

// Property is one key and value of a PropertySet.
type Property struct {
	Key   string
	Type  uint32
	Value Value
}

// Metric is a Sparkplug B Metric: name and/or alias, timestamp (ms),
// datatype, flags, properties and value.
type Metric struct {
	Name         string
	HasName      bool
	Alias        uint64
	HasAlias     bool
	Timestamp    uint64
	HasTimestamp bool
	Datatype     uint32
	IsHistorical bool
	IsTransient  bool
	IsNull       bool
	Props        []Property // nil = no PropertySet; empty = an empty one
	Value        Value
}

// Payload is a Sparkplug B Payload. Timestamp is Unix milliseconds.
type Payload struct {
	Timestamp    uint64
	HasTimestamp bool
	Metrics      []Metric
	Seq          uint64
	HasSeq       bool
	UUID         string
	HasUUID      bool
	Body         []byte
}

// Field numbers of sparkplug_b.proto (see sparkplug_b.proto in this directory).
const (
	fPayloadTimestamp = 1
	fPayloadMetrics   = 2
	fPayloadSeq       = 3
	fPayloadUUID      = 4
	fPayloadBody      = 5

	fMetricName         = 1
	fMetricAlias        = 2
	fMetricTimestamp    = 3
	fMetricDatatype     = 4
	fMetricIsHistorical = 5
	fMetricIsTransient  = 6
	fMetricIsNull       = 7
	fMetricMetadata     = 8
	fMetricProperties   = 9

	fPropSetKeys   = 1
	fPropSetValues = 2

	fPropValueType   = 1
	fPropValueIsNull = 2
	propValueShift   = 7 // PropertyValue int_value = 3 = KindInt - 7, …, string_value = 8
)

// AppendPayload appends p's protobuf encoding to b, fields in number order.
func AppendPayload(b []byte, p *Payload) []byte {
	if p.HasTimestamp {
		b = protowire.AppendTag(b, fPayloadTimestamp, protowire.VarintType)
		b = protowire.AppendVarint(b, p.Timestamp)
	}
	var mb []byte
	for i := range p.Metrics {
		mb = appendMetric(mb[:0], &p.Metrics[i])
		b = protowire.AppendTag(b, fPayloadMetrics, protowire.BytesType)
		b = protowire.AppendBytes(b, mb)
	}
	if p.HasSeq {
		b = protowire.AppendTag(b, fPayloadSeq, protowire.VarintType)
		b = protowire.AppendVarint(b, p.Seq)
	}
	if p.HasUUID {
		b = protowire.AppendTag(b, fPayloadUUID, protowire.BytesType)
		b = protowire.AppendString(b, p.UUID)
	}
	if p.Body != nil {
		b = protowire.AppendTag(b, fPayloadBody, protowire.BytesType)
		b = protowire.AppendBytes(b, p.Body)
	}
	return b
}

func appendBool(b []byte, num protowire.Number, v bool) []byte {
	b = protowire.AppendTag(b, num, protowire.VarintType)
	return protowire.AppendVarint(b, protowire.EncodeBool(v))
}

func appendMetric(b []byte, m *Metric) []byte {
	if m.HasName {
		b = protowire.AppendTag(b, fMetricName, protowire.BytesType)
		b = protowire.AppendString(b, m.Name)
	}
	if m.HasAlias {
		b = protowire.AppendTag(b, fMetricAlias, protowire.VarintType)
		b = protowire.AppendVarint(b, m.Alias)
	}
	if m.HasTimestamp {
		b = protowire.AppendTag(b, fMetricTimestamp, protowire.VarintType)
		b = protowire.AppendVarint(b, m.Timestamp)
	}
	if m.Datatype != 0 {
		b = protowire.AppendTag(b, fMetricDatatype, protowire.VarintType)
		b = protowire.AppendVarint(b, uint64(m.Datatype))
	}
	if m.IsHistorical {
		b = appendBool(b, fMetricIsHistorical, true)
	}
	if m.IsTransient {
		b = appendBool(b, fMetricIsTransient, true)
	}
	if m.IsNull {
		b = appendBool(b, fMetricIsNull, true)
	}
	if m.Props != nil {
		b = protowire.AppendTag(b, fMetricProperties, protowire.BytesType)
		b = protowire.AppendBytes(b, appendPropertySet(nil, m.Props))
	}
	if !m.IsNull {
		b = appendValue(b, 0, &m.Value)
	}
	return b
}

func appendPropertySet(b []byte, ps []Property) []byte {
	for i := range ps {
		b = protowire.AppendTag(b, fPropSetKeys, protowire.BytesType)
		b = protowire.AppendString(b, ps[i].Key)
	}
	var vb []byte
	for i := range ps {
		p := &ps[i]
		vb = vb[:0]
		vb = protowire.AppendTag(vb, fPropValueType, protowire.VarintType)
		vb = protowire.AppendVarint(vb, uint64(p.Type))
		if p.Value.IsNull {
			vb = appendBool(vb, fPropValueIsNull, true)
		} else {
			vb = appendValue(vb, propValueShift, &p.Value)
		}
		b = protowire.AppendTag(b, fPropSetValues, protowire.BytesType)
		b = protowire.AppendBytes(b, vb)
	}
	return b
}

// appendValue writes the oneof value at field number Kind - shift.
func appendValue(b []byte, shift int, v *Value) []byte {
	num := protowire.Number(v.Kind - shift)
	switch v.Kind {
	case KindInt:
		b = protowire.AppendTag(b, num, protowire.VarintType)
		b = protowire.AppendVarint(b, uint64(uint32(v.U)))
	case KindLong:
		b = protowire.AppendTag(b, num, protowire.VarintType)
		b = protowire.AppendVarint(b, v.U)
	case KindFloat:
		b = protowire.AppendTag(b, num, protowire.Fixed32Type)
		b = protowire.AppendFixed32(b, math.Float32bits(v.F32))
	case KindDouble:
		b = protowire.AppendTag(b, num, protowire.Fixed64Type)
		b = protowire.AppendFixed64(b, math.Float64bits(v.F64))
	case KindBool:
		b = appendBool(b, num, v.B)
	case KindString:
		b = protowire.AppendTag(b, num, protowire.BytesType)
		b = protowire.AppendString(b, v.S)
	case KindBytes:
		if shift == 0 {
			b = protowire.AppendTag(b, num, protowire.BytesType)
			b = protowire.AppendBytes(b, v.Bytes)
		}
	}
	return b
}

var errTruncated = errors.New("sparkplug: payload: truncated or malformed field")

// field reads one field: number, wire type, the varint/fixed value or the
// bytes, and the rest of b.
type field struct {
	num   protowire.Number
	typ   protowire.Type
	u     uint64
	bytes []byte
}

func nextField(b []byte) (field, []byte, error) {
	var f field
	num, typ, n := protowire.ConsumeTag(b)
	if n < 0 {
		return f, nil, errTruncated
	}
	b = b[n:]
	f.num, f.typ = num, typ
	switch typ {
	case protowire.VarintType:
		f.u, n = protowire.ConsumeVarint(b)
	case protowire.Fixed32Type:
		var v uint32
		v, n = protowire.ConsumeFixed32(b)
		f.u = uint64(v)
	case protowire.Fixed64Type:
		f.u, n = protowire.ConsumeFixed64(b)
	case protowire.BytesType:
		f.bytes, n = protowire.ConsumeBytes(b)
	default:
		n = protowire.ConsumeFieldValue(num, typ, b)
	}
	if n < 0 {
		return f, nil, errTruncated
	}
	return f, b[n:], nil
}

func (f field) want(t protowire.Type, what string) error {
	if f.typ != t {
		return fmt.Errorf("sparkplug: payload: %s: wire type %d", what, f.typ)
	}
	return nil
}

// DecodePayload reads a Sparkplug B payload. Unknown fields are skipped
// (extensions, metadata, datasets and templates are not kept); a malformed
// encoding is an error.
func DecodePayload(b []byte) (Payload, error) {
	var p Payload
	for len(b) > 0 {
		f, rest, err := nextField(b)
		if err != nil {
			return p, err
		}
		b = rest
		switch f.num {
		case fPayloadTimestamp:
			if err := f.want(protowire.VarintType, "timestamp"); err != nil {
				return p, err
			}
			p.Timestamp, p.HasTimestamp = f.u, true
		case fPayloadMetrics:
			if err := f.want(protowire.BytesType, "metric"); err != nil {
				return p, err
			}
			m, err := decodeMetric(f.bytes)
			if err != nil {
				return p, fmt.Errorf("%w (metric %d)", err, len(p.Metrics))
			}
			p.Metrics = append(p.Metrics, m)
		case fPayloadSeq:
			if err := f.want(protowire.VarintType, "seq"); err != nil {
				return p, err
			}
			p.Seq, p.HasSeq = f.u, true
		case fPayloadUUID:
			if err := f.want(protowire.BytesType, "uuid"); err != nil {
				return p, err
			}
			p.UUID, p.HasUUID = string(f.bytes), true
		case fPayloadBody:
			if err := f.want(protowire.BytesType, "body"); err != nil {
				return p, err
			}
			p.Body = append([]byte{}, f.bytes...)
		}
	}
	return p, nil
}

func decodeMetric(b []byte) (Metric, error) {
	var m Metric
	for len(b) > 0 {
		f, rest, err := nextField(b)
		if err != nil {
			return m, err
		}
		b = rest
		var werr error
		switch f.num {
		case fMetricName:
			if werr = f.want(protowire.BytesType, "name"); werr == nil {
				m.Name, m.HasName = string(f.bytes), true
			}
		case fMetricAlias:
			if werr = f.want(protowire.VarintType, "alias"); werr == nil {
				m.Alias, m.HasAlias = f.u, true
			}
		case fMetricTimestamp:
			if werr = f.want(protowire.VarintType, "timestamp"); werr == nil {
				m.Timestamp, m.HasTimestamp = f.u, true
			}
		case fMetricDatatype:
			if werr = f.want(protowire.VarintType, "datatype"); werr == nil {
				m.Datatype = uint32(f.u)
			}
		case fMetricIsHistorical:
			if werr = f.want(protowire.VarintType, "is_historical"); werr == nil {
				m.IsHistorical = f.u != 0
			}
		case fMetricIsTransient:
			if werr = f.want(protowire.VarintType, "is_transient"); werr == nil {
				m.IsTransient = f.u != 0
			}
		case fMetricIsNull:
			if werr = f.want(protowire.VarintType, "is_null"); werr == nil {
				m.IsNull = f.u != 0
			}
		case fMetricProperties:
			if werr = f.want(protowire.BytesType, "properties"); werr == nil {
				m.Props, werr = decodePropertySet(f.bytes)
			}
		case KindInt, KindLong, KindFloat, KindDouble, KindBool, KindString, KindBytes:
			werr = decodeValue(f, 0, &m.Value)
		}
		if werr != nil {
			return m, werr
		}
	}
	if m.IsNull {
		m.Value = Value{}
	}
	return m, nil
}

// decodeValue reads a oneof value field into v (the last one wins, as in protobuf).
func decodeValue(f field, shift int, v *Value) error {
	kind := int(f.num) + shift
	var want protowire.Type
	switch kind {
	case KindInt, KindLong, KindBool:
		want = protowire.VarintType
	case KindFloat:
		want = protowire.Fixed32Type
	case KindDouble:
		want = protowire.Fixed64Type
	case KindString, KindBytes:
		want = protowire.BytesType
	default:
		return nil
	}
	if err := f.want(want, "value"); err != nil {
		return err
	}
	null := v.IsNull
	*v = Value{Kind: kind, IsNull: null}
	switch kind {
	case KindInt:
		v.U = uint64(uint32(f.u))
	case KindLong:
		v.U = f.u
	case KindBool:
		v.B = f.u != 0
	case KindFloat:
		v.F32 = math.Float32frombits(uint32(f.u))
	case KindDouble:
		v.F64 = math.Float64frombits(f.u)
	case KindString:
		v.S = string(f.bytes)
	case KindBytes:
		v.Bytes = append([]byte{}, f.bytes...)
	}
	return nil
}

func decodePropertySet(b []byte) ([]Property, error) {
	var keys []string
	var vals []Property
	for len(b) > 0 {
		f, rest, err := nextField(b)
		if err != nil {
			return nil, err
		}
		b = rest
		switch f.num {
		case fPropSetKeys:
			if err := f.want(protowire.BytesType, "property key"); err != nil {
				return nil, err
			}
			keys = append(keys, string(f.bytes))
		case fPropSetValues:
			if err := f.want(protowire.BytesType, "property value"); err != nil {
				return nil, err
			}
			pv, err := decodePropertyValue(f.bytes)
			if err != nil {
				return nil, err
			}
			vals = append(vals, pv)
		}
	}
	if len(keys) != len(vals) {
		return nil, fmt.Errorf("sparkplug: payload: property set with %d keys and %d values", len(keys), len(vals))
	}
	for i := range vals {
		vals[i].Key = keys[i]
	}
	if vals == nil {
		vals = []Property{}
	}
	return vals, nil
}

func decodePropertyValue(b []byte) (Property, error) {
	var p Property
	for len(b) > 0 {
		f, rest, err := nextField(b)
		if err != nil {
			return p, err
		}
		b = rest
		switch {
		case f.num == fPropValueType:
			if err := f.want(protowire.VarintType, "property type"); err != nil {
				return p, err
			}
			p.Type = uint32(f.u)
		case f.num == fPropValueIsNull:
			if err := f.want(protowire.VarintType, "property is_null"); err != nil {
				return p, err
			}
			p.Value.IsNull = f.u != 0
		case f.num >= KindInt-propValueShift && f.num <= KindString-propValueShift:
			if err := decodeValue(f, propValueShift, &p.Value); err != nil {
				return p, err
			}
		}
	}
	if p.Value.IsNull {
		p.Value = Value{IsNull: true}
	}
	return p, nil
}
