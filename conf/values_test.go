package conf

import (
	"testing"
	"time"
)

func TestSize(t *testing.T) {
	for in, want := range map[string]int64{
		"0": 0, "1024": 1024, "64MiB": 64 << 20, "512KiB": 512 << 10, "1GB": 1e9, "1 GiB": 1 << 30,
		"3kb": 3000, "2TiB": 2 << 40, "7b": 7, " 5MB ": 5e6, "8mib": 8 << 20,
	} {
		var s Size
		if err := s.UnmarshalText([]byte(in)); err != nil || int64(s) != want {
			t.Errorf("%q: %d, %v; want %d", in, s, err, want)
		}
	}
	for _, in := range []string{"", "MiB", "1.5GiB", "-1", "10 parsecs", "9223372036854775808", "9000000TiB", "1k"} {
		var s Size
		if err := s.UnmarshalText([]byte(in)); err == nil {
			t.Errorf("%q: accepted as %d", in, s)
		}
	}
}

func TestDuration(t *testing.T) {
	var d Duration
	if err := d.UnmarshalText([]byte("1m30s")); err != nil || time.Duration(d) != 90*time.Second {
		t.Errorf("1m30s: %v %v", d, err)
	}
	if b, _ := d.MarshalText(); string(b) != "1m30s" {
		t.Errorf("marshal %s", b)
	}
	for _, in := range []string{"", "200", "1x", "s"} {
		if err := d.UnmarshalText([]byte(in)); err == nil {
			t.Errorf("%q accepted", in)
		}
	}
}

func TestEditDistance(t *testing.T) {
	for _, c := range []struct {
		a, b string
		want int
	}{{"adress", "address", 1}, {"listn", "listen", 1}, {"abc", "abc", 0}, {"kitten", "sitting", 3}, {"x", "interval", 3}} {
		if got := editDistance(c.a, c.b, 3); got != c.want {
			t.Errorf("%s/%s: %d want %d", c.a, c.b, got, c.want)
		}
	}
}
