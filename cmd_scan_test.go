package main

import (
	"fmt"
	"testing"
)

func TestParseUnits(t *testing.T) {
	for _, c := range []struct {
		in   string
		want string // "" for an error
	}{
		{"1-3", "[1 2 3]"}, {"7", "[7]"}, {"1,42,7", "[1 42 7]"}, {"1-3,2-4", "[1 2 3 4]"}, {" 5 - 6 ", ""},
		{"0-1", "[0 1]"}, {"1-248", ""}, {"3-1", ""}, {"a", ""}, {"", ""},
	} {
		got, err := parseUnits(c.in)
		switch {
		case c.want == "" && err == nil:
			t.Errorf("%q: %v, want an error", c.in, got)
		case c.want != "" && (err != nil || fmt.Sprint(got) != c.want):
			t.Errorf("%q: %v %v, want %s", c.in, got, err, c.want)
		}
	}
}
