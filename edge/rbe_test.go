package edge

import (
	"testing"
	"time"

	"edgegw/ringstore"
)

// Report by exception, sample by sample: the last value kept is what a
// deadband measures from.
func TestKeep(t *testing.T) {
	good := func(v float64, ts int64) ringstore.Sample {
		return ringstore.Sample{Value: v, Quality: ringstore.Good, TS: ts}
	}
	bad := func(ts int64) ringstore.Sample { return ringstore.Sample{Quality: ringstore.Timeout, TS: ts} }
	abs := &Tag{Deadband: 0.5}
	pct := &Tag{DeadbandPercent: 10}
	both := &Tag{Deadband: 1, DeadbandPercent: 10}
	silent := &Tag{DeadbandPercent: 10, MaxSilence: 5 * time.Second}
	cases := []struct {
		name       string
		tag        *Tag
		last, next ringstore.Sample
		want       bool
	}{
		{"no deadband keeps all", &Tag{}, good(1, 1), good(1, 2), true},
		{"first sample", pct, ringstore.Sample{}, good(5, 1), true},
		{"absolute: less than the band", abs, good(10, 1), good(10.4, 2), false},
		{"absolute: the band itself is kept", abs, good(10, 1), good(10.5, 2), true},
		{"percent: inside", pct, good(20, 1), good(21.9, 2), false},
		{"percent: the band itself is left out", pct, good(20, 1), good(22, 2), false},
		{"percent: more than the band", pct, good(20, 1), good(22.25, 2), true},
		{"percent: downwards", pct, good(20, 1), good(17.75, 2), true},
		{"percent of a negative value: |last|", pct, good(-20, 1), good(-21.9, 2), false},
		{"percent of a negative value, beyond", pct, good(-20, 1), good(-17.5, 2), true},
		{"percent at 0: any change", pct, good(0, 1), good(0.001, 2), true},
		{"percent at 0: unchanged is left out", pct, good(0, 1), good(0, 2), false},
		{"both: must leave the absolute band too", both, good(2, 1), good(2.5, 2), false},
		{"both: must leave the percent band too", both, good(20, 1), good(21.5, 2), false},
		{"both: leaves both", both, good(20, 1), good(22.5, 2), true},
		{"bad after good", pct, good(20, 1), bad(2), true},
		{"bad after bad", pct, bad(1), bad(2), true},
		{"good after bad", pct, bad(1), good(20, 2), true},
		{"max_silence: younger", silent, good(20, 1), good(20, 5_000_000), false},
		{"max_silence: reached", silent, good(20, 1), good(20, 5_000_001), true},
	}
	for _, c := range cases {
		last, next := c.last, c.next
		if got := keep(c.tag, &last, &next); got != c.want {
			t.Errorf("%s: keep %v after %v = %v, want %v", c.name, next, last, got, c.want)
		}
	}
}
