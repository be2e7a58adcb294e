package conf

import (
	"encoding"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// Duration is a duration as written in the file: a Go duration string such
// as "200ms" or "1m30s". A bare number is refused (the unit would be a guess).
type Duration time.Duration

var _ encoding.TextUnmarshaler = (*Duration)(nil)

// UnmarshalText parses a Go duration string.
func (d *Duration) UnmarshalText(text []byte) error {
	s := strings.TrimSpace(string(text))
	v, err := time.ParseDuration(s)
	if err != nil {
		if _, nerr := strconv.ParseFloat(s, 64); nerr == nil {
			return fmt.Errorf("bad duration %q: missing unit (write \"%sms\" or \"%ss\")", s, s, s)
		}
		return fmt.Errorf("bad duration %q (write e.g. \"200ms\", \"1s\", \"1m30s\")", s)
	}
	*d = Duration(v)
	return nil
}

// MarshalText writes the Go duration string.
func (d Duration) MarshalText() ([]byte, error) { return []byte(time.Duration(d).String()), nil }

// Size is a byte count as written in the file: an integer of bytes, or a
// number with a unit: B, KB, MB, GB, TB (powers of 1000) or KiB, MiB, GiB,
// TiB (powers of 1024); units are case-insensitive, a space before the unit
// is allowed. Negative sizes and overflow are refused.
type Size int64

var _ encoding.TextUnmarshaler = (*Size)(nil)

var sizeUnits = map[string]int64{
	"": 1, "b": 1,
	"kb": 1e3, "mb": 1e6, "gb": 1e9, "tb": 1e12,
	"kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40,
}

var errSize = errors.New(`write an integer of bytes or e.g. "512KiB", "64MiB", "1GB"`)

// UnmarshalText parses a size.
func (s *Size) UnmarshalText(text []byte) error {
	in := strings.TrimSpace(string(text))
	i := 0
	for i < len(in) && in[i] >= '0' && in[i] <= '9' {
		i++
	}
	if i == 0 {
		return fmt.Errorf("bad size %q: %w", in, errSize)
	}
	mult, ok := sizeUnits[strings.ToLower(strings.TrimSpace(in[i:]))]
	if !ok {
		return fmt.Errorf("bad size %q: unknown unit: %w", in, errSize)
	}
	n, err := strconv.ParseInt(in[:i], 10, 64)
	if err != nil || n > math.MaxInt64/mult {
		return fmt.Errorf("bad size %q: too large", in)
	}
	*s = Size(n * mult)
	return nil
}
