package ringstore

import (
	"encoding/json"
	"math"
	"strconv"
	"strings"
	"testing"
)

// The value encodings as a JSON parser must read them: byte for byte.
func TestSampleJSONNumbers(t *testing.T) {
	str := func(s string) *string { return &s }
	point1, point2 := 0.1, 0.2
	const head = `{"seq":7,"device":"d","tag":"t","value":`
	cases := []struct {
		name string
		s    Sample
		want string
	}{
		{"uint32 3000000000", Sample{Value: 3000000000}, `3000000000,"quality":"good"`},
		{"uint32 123456789", Sample{Value: 123456789}, `123456789,"quality":"good"`},
		{"float32 123.456", Sample{Value: float64(float32(123.456)), Kind: KindFloat32}, `123.456,"quality":"good"`},
		{"NaN", Sample{Value: math.NaN(), Kind: KindFloat32}, `null,"quality":"error"`},
		{"+Inf", Sample{Value: math.Inf(1)}, `null,"quality":"error"`},
		{"-Inf", Sample{Value: math.Inf(-1), Kind: KindFloat32}, `null,"quality":"error"`},
		{"int64 2^53", Sample{Value: 1 << 53}, `9007199254740992,"quality":"good"`},
		{"int64 -2^53", Sample{Value: -(1 << 53)}, `-9007199254740992,"quality":"good"`},
		{"uint64 max (float64 digits)", Sample{Value: math.MaxUint64}, `18446744073709551616,"quality":"good"`},
		{"float64 shortest", Sample{Value: point1 + point2}, `0.30000000000000004,"quality":"good"`},
		{"float64 scaled", Sample{Value: 55.9}, `55.9,"quality":"good"`},
		{"float64 small", Sample{Value: 0.000001}, `0.000001,"quality":"good"`},
		{"float64 tiny gets exponent", Sample{Value: 1e-7}, `1e-7,"quality":"good"`},
		{"float64 huge gets exponent", Sample{Value: 1e21}, `1e+21,"quality":"good"`},
		{"float64 just below 1e21", Sample{Value: 1e20}, `100000000000000000000,"quality":"good"`},
		{"float32 scaled keeps float32 precision", Sample{Value: float64(float32(123.456)) * 10, Kind: KindFloat32}, `1234.56,"quality":"good"`},
		{"float32 beyond its range after scaling", Sample{Value: 1e39, Kind: KindFloat32}, `1e+39,"quality":"good"`},
		{"float32 tiny", Sample{Value: float64(float32(1e-10)), Kind: KindFloat32}, `1e-10,"quality":"good"`},
		{"negative zero", Sample{Value: math.Copysign(0, -1)}, `-0,"quality":"good"`},
		{"zero", Sample{}, `0,"quality":"good"`},
		{"bool", Sample{Value: 1, Bool: true}, `true,"quality":"good"`},
		{"timeout", Sample{Value: 3, Quality: Timeout}, `null,"quality":"timeout"`},
		{"string", Sample{Kind: KindString, Text: str("SN-\"42\"\n")}, `"SN-\"42\"\u000a","quality":"good"`},
		{"string not good", Sample{Kind: KindString, Text: str("x"), Quality: Stale}, `null,"quality":"stale"`},
		{"string NaN value ignored", Sample{Kind: KindString, Text: str("ok"), Value: math.NaN()}, `"ok","quality":"good"`},
	}
	for _, c := range cases {
		s := c.s
		s.Seq, s.Device, s.Tag, s.TS = 7, "d", "t", 1764450000123456
		got := string(s.AppendJSON(nil))
		want := head + c.want + `,"ts":1764450000123456}`
		if got != want {
			t.Errorf("%s:\n got %s\nwant %s", c.name, got, want)
		}
		if !json.Valid([]byte(got)) {
			t.Errorf("%s: invalid JSON %s", c.name, got)
		}
	}
}

// Whole values up to 2^53 read back into an int64 with encoding/json.
func TestSampleJSONIntegersParseAsInt64(t *testing.T) {
	for _, v := range []int64{0, 1, -1, 65535, -32768, 3000000000, 123456789, math.MaxUint32, math.MinInt32, 1 << 53, -(1 << 53), 1e15 + 7} {
		s := Sample{Value: float64(v)}
		var w struct{ Value int64 }
		if err := json.Unmarshal(s.AppendJSON(nil), &w); err != nil || w.Value != v {
			t.Errorf("%d: got %d, %v from %s", v, w.Value, err, s.AppendJSON(nil))
		}
	}
}

// A string sample survives UnmarshalJSON (the durable queue's codec is
// checked in spool's TestRecordKindsRoundTrip).
func TestSampleKindsRoundTrip(t *testing.T) {
	text := "Firmware 2.1 ä"
	in := Sample{Seq: 1, Device: "d", Tag: "sn", Kind: KindString, Text: &text, TS: 5}
	var back Sample
	if err := json.Unmarshal(in.AppendJSON(nil), &back); err != nil || back.Text == nil || *back.Text != text || back.Kind != KindString {
		t.Fatalf("UnmarshalJSON: %+v, %v", back, err)
	}
}

// FuzzSampleJSON: any value encodes as valid JSON that encoding/json reads
// back as the same number (float32 tags: the same float32), and whole values
// up to 2^53 (float32: 2^24) come out as the exact integer.
func FuzzSampleJSON(f *testing.F) {
	f.Add(uint64(math.Float64bits(3000000000)), false)
	f.Add(uint64(math.Float64bits(123456789)), false)
	f.Add(uint64(math.Float64bits(float64(float32(123.456)))), true)
	f.Add(uint64(math.Float64bits(math.NaN())), true)
	f.Add(uint64(math.Float64bits(math.Inf(-1))), false)
	f.Add(uint64(math.Float64bits(1e-7)), false)
	f.Add(uint64(math.Float64bits(1e300)), true)
	f.Fuzz(func(t *testing.T, bits uint64, f32 bool) {
		v := math.Float64frombits(bits)
		s := Sample{Seq: 1, Device: "d", Tag: "t", Value: v, TS: 1}
		if f32 {
			s.Kind = KindFloat32
		}
		j := s.AppendJSON(nil)
		var w struct {
			Value   *float64
			Quality string
		}
		if err := json.Unmarshal(j, &w); err != nil {
			t.Fatalf("%v: %s: %v", v, j, err)
		}
		if math.IsNaN(v) || math.IsInf(v, 0) {
			if w.Value != nil || w.Quality != "error" {
				t.Fatalf("%v: %s: want null and quality error", v, j)
			}
			return
		}
		if w.Value == nil || w.Quality != "good" {
			t.Fatalf("%v: %s", v, j)
		}
		got := *w.Value
		want := v
		if f32 && !math.IsInf(float64(float32(v)), 0) {
			want = float64(float32(v))
			if float32(got) != float32(want) {
				t.Fatalf("float32 %v: %s reads back as %v", float32(v), j, got)
			}
		} else if got != want {
			t.Fatalf("%v: %s reads back as %v", v, j, got)
		}
		exact := float64(1 << 53) // float32: shortest float32 form, whole and exact up to 2^24
		if f32 {
			exact = 1 << 24
		}
		if want == math.Trunc(want) && math.Abs(want) <= exact {
			var i struct{ Value int64 }
			if err := json.Unmarshal(j, &i); err != nil || float64(i.Value) != want {
				t.Fatalf("whole %v: %s does not read into an int64 (%v)", want, j, err)
			}
			if want != 0 && string(j) != `{"seq":1,"device":"d","tag":"t","value":`+strconv.FormatInt(int64(want), 10)+`,"quality":"good","ts":1}` {
				t.Fatalf("whole %v: %s", want, j)
			}
		}
	})
}

func TestSampleJSONMillis(t *testing.T) {
	for _, c := range []struct {
		us   int64
		want string
	}{{1764450000123456, "1764450000123"}, {999, "0"}, {-1, "-1"}, {-1000, "-1"}, {-1001, "-2"}} {
		s := Sample{Value: 1, TS: c.us}
		j := string(s.AppendJSONTS(nil, true))
		if !strings.HasSuffix(j, `"ts":`+c.want+"}") {
			t.Errorf("%d µs: %s, want ts %s", c.us, j, c.want)
		}
		if a := string(AppendJSONArrayTS(nil, []Sample{s}, true)); a != "["+j+"]" {
			t.Errorf("array %s", a)
		}
	}
}
