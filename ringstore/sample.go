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
	Stale                  // the device is demoted; the value is the last good one's age
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
// value is a number, true/false for bool tags, or null when quality is not good.
type Sample struct {
	Seq     uint64  // global, strictly increasing, never reused within its epoch
	Epoch   uint64  // the Sequence epoch that numbered it (set with Seq; not in AppendJSON)
	Device  string  // device name from the config
	Tag     string  // tag name, unique within the device
	Value   float64 // scaled value; 0/1 for bool tags
	Bool    bool    // the tag is a bool: Value is 0 or 1 and encodes as false/true
	Quality Quality // Good unless the poll failed
	TS      int64   // acquisition time, Unix microseconds
}

// AppendJSON appends the sample's JSON object to b. It allocates nothing
// beyond growing b and is the encoder every consumer uses (web, push).
func (s *Sample) AppendJSON(b []byte) []byte {
	b = append(b, `{"seq":`...)
	b = strconv.AppendUint(b, s.Seq, 10)
	b = append(b, `,"device":`...)
	b = appendString(b, s.Device)
	b = append(b, `,"tag":`...)
	b = appendString(b, s.Tag)
	b = append(b, `,"value":`...)
	switch {
	case s.Quality != Good || math.IsNaN(s.Value) || math.IsInf(s.Value, 0):
		b = append(b, "null"...)
	case s.Bool:
		b = strconv.AppendBool(b, s.Value != 0)
	default:
		b = strconv.AppendFloat(b, s.Value, 'g', -1, 64)
	}
	b = append(b, `,"quality":"`...)
	b = append(b, s.Quality.String()...)
	b = append(b, `","ts":`...)
	b = strconv.AppendInt(b, s.TS, 10)
	return append(b, '}')
}

// MarshalJSON makes Sample usable with encoding/json (tests, tools).
func (s Sample) MarshalJSON() ([]byte, error) { return s.AppendJSON(nil), nil }

// AppendJSONArray appends [s0,s1,...] to b.
func AppendJSONArray(b []byte, samples []Sample) []byte {
	b = append(b, '[')
	for i := range samples {
		if i > 0 {
			b = append(b, ',')
		}
		b = samples[i].AppendJSON(b)
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
	switch v := string(w.Value); v {
	case "", "null":
	case "true", "false":
		s.Bool = true
		if v == "true" {
			s.Value = 1
		}
	default:
		f, err := strconv.ParseFloat(v, 64)
		if err != nil {
			return fmt.Errorf("ringstore: sample %d: value %s is not a number or bool", w.Seq, v)
		}
		s.Value = f
	}
	return nil
}
