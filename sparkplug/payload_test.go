package sparkplug

import (
	"bytes"
	"math"
	"reflect"
	"strings"
	"testing"

	"edgegw/ringstore"
	"edgegw/tagtype"
)

func samplePayload() Payload {
	return Payload{
		Timestamp: 1764450000123, HasTimestamp: true, Seq: 255, HasSeq: true,
		Metrics: []Metric{
			{Name: "bdSeq", HasName: true, Datatype: TypeInt64, Value: Value{Kind: KindLong, U: 7}},
			{Name: "temperature", HasName: true, Alias: 16, HasAlias: true, Timestamp: 1764450000100, HasTimestamp: true,
				Datatype: TypeFloat, Value: Value{Kind: KindFloat, F32: 21.5},
				Props: []Property{
					{Key: "engUnit", Type: TypeString, Value: Value{Kind: KindString, S: "°C"}},
					{Key: "engLow", Type: TypeDouble, Value: Value{Kind: KindDouble, F64: -40}},
					{Key: "Quality", Type: TypeInt32, Value: Value{Kind: KindInt, U: 192}},
					{Key: "gone", Type: TypeString, Value: Value{IsNull: true}},
				}},
			{Alias: 17, HasAlias: true, Timestamp: 1, HasTimestamp: true, IsHistorical: true, IsNull: true},
			{Alias: 18, HasAlias: true, Value: Value{Kind: KindInt, U: uint64(uint32(0xfffffff6))}}, // Int16 -10
			{Alias: 19, HasAlias: true, Value: Value{Kind: KindBool, B: true}, IsTransient: true},
			{Alias: 20, HasAlias: true, Value: Value{Kind: KindDouble, F64: math.Pi}},
		},
	}
}

func TestPayloadRoundTrip(t *testing.T) {
	p := samplePayload()
	b := AppendPayload(nil, &p)
	got, err := DecodePayload(b)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, p) {
		t.Fatalf("round trip:\n got %+v\nwant %+v", got, p)
	}
	// Known bytes: the start of the encoding, field by field.
	want := []byte{0x08} // field 1 varint: timestamp
	if !bytes.HasPrefix(b, want) {
		t.Fatalf("first byte %#x", b[0])
	}
	if _, err := DecodePayload(b[:len(b)-1]); err == nil {
		t.Fatal("a truncated payload decoded")
	}
}

func TestValueMapping(t *testing.T) {
	for _, c := range []struct {
		tag  Tag
		dt   uint32
		v    float64
		want Value
	}{
		{Tag{Type: tagtype.Int16}, TypeInt16, -10, Value{Kind: KindInt, U: 0xfffffff6}},
		{Tag{Type: tagtype.Uint16}, TypeUInt16, 65535, Value{Kind: KindInt, U: 65535}},
		{Tag{Type: tagtype.Int32}, TypeInt32, -1, Value{Kind: KindInt, U: 0xffffffff}},
		{Tag{Type: tagtype.Uint32}, TypeUInt32, 4000000000, Value{Kind: KindLong, U: 4000000000}},
		{Tag{Type: tagtype.Int64}, TypeInt64, -2, Value{Kind: KindLong, U: math.MaxUint64 - 1}},
		{Tag{Type: tagtype.Uint64}, TypeUInt64, 1 << 40, Value{Kind: KindLong, U: 1 << 40}},
		{Tag{Type: tagtype.Float32}, TypeFloat, 1.5, Value{Kind: KindFloat, F32: 1.5}},
		{Tag{Type: tagtype.Float64}, TypeDouble, 1.25, Value{Kind: KindDouble, F64: 1.25}},
		{Tag{Type: tagtype.Bool}, TypeBoolean, 1, Value{Kind: KindBool, B: true}},
		{Tag{Type: tagtype.Int16, Scaled: true}, TypeFloat, 21.5, Value{Kind: KindFloat, F32: 21.5}},
		{Tag{Type: tagtype.Uint32, Scaled: true}, TypeDouble, 0.1, Value{Kind: KindDouble, F64: 0.1}},
		{Tag{Type: tagtype.Int8High}, TypeInt8, -128, Value{Kind: KindInt, U: 0xffffff80}},
		{Tag{Type: tagtype.Int8Low}, TypeInt8, 127, Value{Kind: KindInt, U: 127}},
		{Tag{Type: tagtype.Uint8High}, TypeUInt8, 255, Value{Kind: KindInt, U: 255}},
		{Tag{Type: tagtype.Uint8Low, Scaled: true}, TypeFloat, 25.5, Value{Kind: KindFloat, F32: 25.5}},
		{Tag{Type: tagtype.Float16}, TypeFloat, -0.5, Value{Kind: KindFloat, F32: -0.5}},
		{Tag{Type: tagtype.Int64, Scaled: true}, TypeDouble, -0.25, Value{Kind: KindDouble, F64: -0.25}},
	} {
		dt := datatypeOf(c.tag)
		if dt != c.dt {
			t.Errorf("%+v: datatype %d, want %d", c.tag, dt, c.dt)
			continue
		}
		v := valueOf(dt, c.v)
		if !reflect.DeepEqual(v, c.want) {
			t.Errorf("%+v: value %+v, want %+v", c.tag, v, c.want)
		}
		back, err := numberOf(dt, v)
		if err != nil || back != c.v {
			t.Errorf("%+v: back %v %v, want %v", c.tag, back, err, c.v)
		}
	}
}

func TestParseState(t *testing.T) {
	for in, want := range map[string][3]any{
		`{"online":true,"timestamp":1700000000000}`: {true, uint64(1700000000000), true},
		`{"online":false,"timestamp":5}`:            {false, uint64(5), true},
		`ONLINE`:                                    {true, uint64(0), true},
		`OFFLINE`:                                   {false, uint64(0), true},
		`{"timestamp":5}`:                           {false, uint64(0), false},
		`garbage`:                                   {false, uint64(0), false},
	} {
		on, ts, ok := parseState([]byte(in))
		if on != want[0] || ts != want[1] || ok != want[2] {
			t.Errorf("%s: %v %v %v, want %v", in, on, ts, ok, want)
		}
	}
}

// FuzzPayload plays the encoder and the decoder against each other: what
// decodes re-encodes to bytes that decode to the same payload and encode
// to the same bytes again (the encoding is canonical); nothing panics.
func FuzzPayload(f *testing.F) {
	p := samplePayload()
	f.Add(AppendPayload(nil, &p))
	f.Add([]byte{})
	f.Add([]byte{0x12, 0x02, 0x50, 0x01})
	f.Add([]byte{0x12, 0x04, 0x4a, 0x02, 0x12, 0x00})
	f.Fuzz(func(t *testing.T, b []byte) {
		p1, err := DecodePayload(b)
		if err != nil {
			return
		}
		e1 := AppendPayload(nil, &p1)
		p2, err := DecodePayload(e1)
		if err != nil {
			t.Fatalf("re-encoding does not decode: %v\n% x", err, e1)
		}
		e2 := AppendPayload(nil, &p2)
		if !bytes.Equal(e1, e2) {
			t.Fatalf("not canonical:\n% x\n% x", e1, e2)
		}
		if len(p1.Metrics) != len(p2.Metrics) {
			t.Fatalf("metrics %d then %d", len(p1.Metrics), len(p2.Metrics))
		}
	})
}

// BenchmarkDDATA encodes the DDATA of one poll of a two-tag logger.
func BenchmarkDDATA(b *testing.B) {
	p := Payload{Timestamp: 1764450000123, HasTimestamp: true, Seq: 42, HasSeq: true, Metrics: []Metric{
		{Alias: 16, HasAlias: true, Timestamp: 1764450000100, HasTimestamp: true, Value: Value{Kind: KindFloat, F32: 21.5}},
		{Alias: 17, HasAlias: true, Timestamp: 1764450000100, HasTimestamp: true, Value: Value{Kind: KindFloat, F32: 45.2}},
	}}
	b.ReportAllocs()
	var buf []byte
	for b.Loop() {
		buf = AppendPayload(buf[:0], &p)
	}
	b.SetBytes(int64(len(buf)))
}

// BenchmarkDecodeDCMD decodes a one-metric command.
func BenchmarkDecodeDCMD(b *testing.B) {
	p := Payload{Timestamp: 1764450000123, HasTimestamp: true, Metrics: []Metric{
		{Name: "setpoint", HasName: true, Datatype: TypeInt16, Value: Value{Kind: KindInt, U: 55}}}}
	enc := AppendPayload(nil, &p)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := DecodePayload(enc); err != nil {
			b.Fatal(err)
		}
	}
}

// The datatype numbers tagtype hands out are this codec's.
func TestDatatypesAreTagtypes(t *testing.T) {
	for _, c := range [][2]uint32{
		{tagtype.SparkplugInt8, TypeInt8}, {tagtype.SparkplugInt16, TypeInt16}, {tagtype.SparkplugInt32, TypeInt32},
		{tagtype.SparkplugInt64, TypeInt64}, {tagtype.SparkplugUInt8, TypeUInt8}, {tagtype.SparkplugUInt16, TypeUInt16},
		{tagtype.SparkplugUInt32, TypeUInt32}, {tagtype.SparkplugUInt64, TypeUInt64}, {tagtype.SparkplugFloat, TypeFloat},
		{tagtype.SparkplugDouble, TypeDouble}, {tagtype.SparkplugBoolean, TypeBoolean}, {tagtype.SparkplugString, TypeString},
	} {
		if c[0] != c[1] {
			t.Errorf("tagtype says %d, the codec %d", c[0], c[1])
		}
	}
}

// A string tag's sample is a String metric with its text.
func TestStringSampleValue(t *testing.T) {
	text := "SN-4711"
	if dt := datatypeOf(Tag{Type: tagtype.String}); dt != TypeString {
		t.Fatalf("string datatype %d", dt)
	}
	if v := sampleValue(TypeString, &ringstore.Sample{Kind: ringstore.KindString, Text: &text}); !reflect.DeepEqual(v, Value{Kind: KindString, S: text}) {
		t.Errorf("string sample: %+v", v)
	}
	if v := sampleValue(TypeInt16, &ringstore.Sample{Value: -3}); !reflect.DeepEqual(v, Value{Kind: KindInt, U: 0xfffffffd}) {
		t.Errorf("int16 sample: %+v", v)
	}
}

// DCMD values: each writable type takes what fits it and refuses the rest
// with a reason.
func TestCommandValue(t *testing.T) {
	w := func(typ tagtype.Type) Tag { return Tag{Name: "x", Type: typ, Writable: true} }
	for _, c := range []struct {
		tag    Tag
		v      Value
		want   float64
		refuse string
	}{
		{w(tagtype.Bool), Value{Kind: KindBool, B: true}, 1, ""},
		{w(tagtype.Bool), Value{Kind: KindInt, U: 0}, 0, ""},
		{w(tagtype.Bool), Value{Kind: KindInt, U: 2}, 0, "takes true or false"},
		{w(tagtype.Int16), Value{Kind: KindInt, U: 0xfffffff9}, -7, ""},
		{w(tagtype.Int16), Value{Kind: KindInt, U: 40000}, 0, "outside -32768..32767"},
		{w(tagtype.Uint16), Value{Kind: KindInt, U: 0xffffffff}, 0, "outside 0..65535"},
		{w(tagtype.Int32), Value{Kind: KindLong, U: 1 << 31}, 0, "outside"},
		{w(tagtype.Uint32), Value{Kind: KindLong, U: 1<<32 - 1}, 1<<32 - 1, ""},
		{w(tagtype.Int64), Value{Kind: KindLong, U: math.MaxUint64}, -1, ""},
		{w(tagtype.Uint64), Value{Kind: KindLong, U: 1 << 40}, 1 << 40, ""},
		{w(tagtype.Int16), Value{Kind: KindDouble, F64: 1.5}, 0, "not a whole number"},
		{w(tagtype.Float32), Value{Kind: KindFloat, F32: 2.5}, 2.5, ""},
		{w(tagtype.Float16), Value{Kind: KindDouble, F64: 70000}, 0, "outside -65504..65504"},
		{w(tagtype.Float64), Value{Kind: KindDouble, F64: math.NaN()}, 0, "not a finite number"},
		{Tag{Name: "x", Type: tagtype.Int16, Writable: true, Scaled: true}, Value{Kind: KindFloat, F32: 21.5}, 21.5, ""},
		{w(tagtype.Int16), Value{Kind: KindString, S: "7"}, 0, "a string value for x, a int16 tag"},
		{w(tagtype.String), Value{Kind: KindString, S: "hi"}, 0, "strings are read-only"},
		{Tag{Name: "x", Type: tagtype.Int16}, Value{Kind: KindInt, U: 1}, 0, "not writable"},
	} {
		got, err := commandValue(&c.tag, datatypeOf(c.tag), c.v)
		switch {
		case c.refuse == "" && (err != nil || got != c.want):
			t.Errorf("%v %+v: %v, %v; want %v", c.tag.Type, c.v, got, err, c.want)
		case c.refuse != "" && (err == nil || !strings.Contains(err.Error(), c.refuse)):
			t.Errorf("%v %+v: %v, %v; want a refusal with %q", c.tag.Type, c.v, got, err, c.refuse)
		}
	}
}
