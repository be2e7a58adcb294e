package ringstore

import (
	"encoding/json"
	"fmt"
	"math"
	"strconv"
)

// Quality says whether a sample carries a value read from the device.
type Quality uint8

const (
	Good    Quality = iota // the device answered and the value decoded
	Timeout                // no answer within the device's timeout (retries included)
	Error                  // an exception, a malformed reply or a transport error
	Stale                  // no longer polled: a reload removed the tag or its device (written once, by main)
)

var qualityNames = [...]string{Good: "good", Timeout: "timeout", Error: "error", Stale: "stale"}

func (q Quality) String() string {
	if int(q) < len(qualityNames) {
		return qualityNames[q]
	}
	return "quality(" + strconv.Itoa(int(q)) + ")"
}

// ParseQuality is the inverse of Quality.String.
func ParseQuality(s string) (Quality, error) {
	for i, n := range qualityNames {
		if n == s {
			return Quality(i), nil
		}
	}
	return 0, fmt.Errorf("ringstore: unknown quality %q", s)
}

// Sample is one value of one tag from one poll. One poll of one device yields
// one sample per tag; they share TS and get consecutive Seq numbers.
//
// JSON (Sample.AppendJSON, the only encoder; field order fixed):
//
//	{"seq":42,"device":"logger-01","tag":"temperature","value":21.5,"quality":"good","ts":1764450000123456}
//
// ts is Unix microseconds. value is a number, true/false for bool tags, a
// string for string tags, or null when quality is not good. Numbers are
// written as a JSON parser expects them (see appendNumber): whole values as
// integers without exponent (exact up to 2^53), float32 tags in their
// shortest float32 form (123.456, not 123.45600128173828), others in the
// shortest float64 form, without exponent for 1e-6 <= |v| < 1e21. A NaN or
// infinite value is never written: AppendJSON gives quality "error" and null.
type Sample struct {
	Seq     uint64  // global, strictly increasing, never reused within its epoch
	Epoch   uint64  // the Sequence epoch that numbered it (set with Seq; not in AppendJSON)
	Device  string  // device name from the config
	Tag     string  // tag name, unique within the device
	Value   float64 // scaled value; 0/1 for bool tags
	Bool    bool    // the tag is a bool: Value is 0 or 1 and encodes as false/true
	Quality Quality // Good unless the poll failed
	Kind    Kind    // how Value is written: float64 (zero value), float32, or the Text of a string tag
	TS      int64   // acquisition time, Unix microseconds
	// Text is the value of a string tag (Kind == KindString), nil otherwise.
	// A pointer, not a string: 8 bytes instead of 16 in a ring of thousands
	// (it sits with Bool, Quality and Kind's padding otherwise unused); the
	// device keeps handing out the same pointer while the text is unchanged.
	Text *string
}

// Kind says how a sample's value is written. It costs nothing: it sits in
// the padding after Bool and Quality.
type Kind uint8

const (
	KindFloat64 Kind = iota // Value, shortest float64 form (integer tags land here: whole values print as integers)
	KindFloat32             // Value came from a float32 register: shortest float32 form
	KindString              // *Text is the value
)

// NotANumber is the reason logged and reported when a float register holds
// NaN or ±Inf: such a sample is written with quality "error" and value null.
const NotANumber = "not a number"

// EffectiveQuality is the quality AppendJSON writes: Error for a good
// numeric sample whose value is NaN or infinite (JSON has no such number).
func (s *Sample) EffectiveQuality() Quality {
	if s.Quality == Good && s.Kind != KindString && !s.Bool && (math.IsNaN(s.Value) || math.IsInf(s.Value, 0)) {
		return Error
	}
	return s.Quality
}

// AppendJSON appends the sample's JSON object to b. It allocates nothing
// beyond growing b and is the encoder every consumer uses (web, push).
func (s *Sample) AppendJSON(b []byte) []byte { return s.AppendJSONTS(b, false) }

// AppendJSONTS is AppendJSON with ts in Unix milliseconds when ms is set
// (upstream ts_unit = "ms", for consumers such as Node-RED that expect
// JavaScript time): the microseconds are cut, not rounded.
func (s *Sample) AppendJSONTS(b []byte, ms bool) []byte {
	b = append(b, `{"seq":`...)
	b = strconv.AppendUint(b, s.Seq, 10)
	b = append(b, `,"device":`...)
	b = appendString(b, s.Device)
	b = append(b, `,"tag":`...)
	b = appendString(b, s.Tag)
	b = append(b, `,"value":`...)
	q := s.EffectiveQuality()
	switch {
	case q != Good:
		b = append(b, "null"...)
	case s.Bool:
		b = strconv.AppendBool(b, s.Value != 0)
	case s.Kind == KindString:
		if s.Text == nil {
			b = append(b, `""`...)
		} else {
			b = appendString(b, *s.Text)
		}
	default:
		b = appendNumber(b, s.Value, s.Kind == KindFloat32)
	}
	b = append(b, `,"quality":"`...)
	b = append(b, q.String()...)
	b = append(b, `","ts":`...)
	ts := s.TS
	if ms {
		ts = ts / 1000
		if s.TS < 0 && s.TS%1000 != 0 {
			ts-- // floor: a time before 1970 stays before its millisecond
		}
	}
	b = strconv.AppendInt(b, ts, 10)
	return append(b, '}')
}

// appendNumber writes a finite v the way JSON parsers expect numbers:
//
//   - whole values below 1e21 as plain integers (3000000000, 123456789) that
//     a parser reads into an int64; every integer up to 2^53 is exact, and
//     64-bit integers beyond it carry the float64's exact digits (README:
//     they lose precision, never gain invented ones);
//   - otherwise the shortest decimal that reads back as the same float64
//     (f32: the same float32, so a float32 register holding 123.456 is
//     123.456), without exponent for 1e-6 <= |v| < 1e21 and with one outside
//     that range (1e-7, 1e+21), as encoding/json and JavaScript write them.
func appendNumber(b []byte, v float64, f32 bool) []byte {
	bits := 64
	if f32 && !math.IsInf(float64(float32(v)), 0) { // a scale can push it beyond float32's range
		bits = 32
		v = float64(float32(v)) // a scaled float32 keeps float32 precision
	}
	a := math.Abs(v)
	switch {
	case a != 0 && (a < 1e-6 || a >= 1e21):
		n := len(b)
		b = strconv.AppendFloat(b, v, 'e', -1, bits)
		// 1e-07 → 1e-7, as encoding/json writes it
		if m := len(b); m-n >= 4 && b[m-4] == 'e' && b[m-3] == '-' && b[m-2] == '0' {
			b[m-2] = b[m-1]
			b = b[:m-1]
		}
		return b
	case bits == 64 && v == math.Trunc(v):
		return strconv.AppendFloat(b, v, 'f', 0, 64)
	}
	return strconv.AppendFloat(b, v, 'f', -1, bits)
}

// MarshalJSON makes Sample usable with encoding/json (tests, tools).
func (s Sample) MarshalJSON() ([]byte, error) { return s.AppendJSON(nil), nil }

// AppendJSONArray appends [s0,s1,...] to b.
func AppendJSONArray(b []byte, samples []Sample) []byte { return AppendJSONArrayTS(b, samples, false) }

// AppendJSONArrayTS is AppendJSONArray with ts in milliseconds when ms is set.
func AppendJSONArrayTS(b []byte, samples []Sample, ms bool) []byte {
	b = append(b, '[')
	for i := range samples {
		if i > 0 {
			b = append(b, ',')
		}
		b = samples[i].AppendJSONTS(b, ms)
	}
	return append(b, ']')
}

const hexDigits = "0123456789abcdef"

// appendString appends s as a JSON string. Device and tag names are validated
// by conf, but escape anyway: the encoder must never emit invalid JSON.
func appendString(b []byte, s string) []byte {
	b = append(b, '"')
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '"' || c == '\\':
			b = append(b, '\\', c)
		case c < 0x20:
			b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
		default:
			b = append(b, c)
		}
	}
	return append(b, '"')
}

// UnmarshalJSON reads what AppendJSON writes (receivers, tests, bench clients).
func (s *Sample) UnmarshalJSON(data []byte) error {
	var w struct {
		Seq     uint64          `json:"seq"`
		Device  string          `json:"device"`
		Tag     string          `json:"tag"`
		Value   json.RawMessage `json:"value"`
		Quality string          `json:"quality"`
		TS      int64           `json:"ts"`
	}
	if err := json.Unmarshal(data, &w); err != nil {
		return fmt.Errorf("ringstore: sample: %w", err)
	}
	q, err := ParseQuality(w.Quality)
	if err != nil {
		return err
	}
	*s = Sample{Seq: w.Seq, Device: w.Device, Tag: w.Tag, Quality: q, TS: w.TS}
	switch v := string(w.Value); {
	case v == "" || v == "null":
	case v == "true" || v == "false":
		s.Bool = true
		if v == "true" {
			s.Value = 1
		}
	case v[0] == '"':
		var t string
		if err := json.Unmarshal(w.Value, &t); err != nil {
			return fmt.Errorf("ringstore: sample %d: value: %w", w.Seq, err)
		}
		s.Kind, s.Text = KindString, &t
	default:
		f, err := strconv.ParseFloat(v, 64)
		if err != nil {
			return fmt.Errorf("ringstore: sample %d: value %s is not a number, bool or string", w.Seq, v)
		}
		s.Value = f
	}
	return nil
}
