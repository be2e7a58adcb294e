package conf

import (
	"errors"
	"io"
	"strings"
	"testing"
)

// FuzzParse: Parse never panics, returns a config xor Errors, every problem
// has a message and a line inside the file, the TOML parser agrees with the
// reference (toml_test.go), and its line index holds the reference's keys.
//
// Run with a short minimize time: go test -fuzz FuzzParse -fuzzminimizetime 2s
// (the default 60 s spent minimizing each new input from the 12 KB example
// looks like a stall on a small machine).
func FuzzParse(f *testing.F) {
	f.Add(readFile(f, examplePath))
	for _, tc := range errorCases {
		f.Add(tc.text)
	}
	f.Add(devTags)
	f.Add("[[modbus_server]]\nlisten = \":502\"\nunits = { 5 = \"plc\" }\nendpoints = [\"10.0.0.5\"]\n[modbus_server.mirror]\nunit = 9\nquality_address = 50\n" +
		"map = [ { device = \"l*\", format = \"int16\" }, { device = \"plc\", tag = \"b\", format = \"raw\", address = 20 } ]\n" + mbDevs)
	f.Add("a = [\n {x=1,\n y=2},\n]\n[[b]]\n[b.c]\n\"q\\\"k\" = '''x'''\n")
	f.Fuzz(func(t *testing.T, text string) {
		cfg, err := Parse("f.toml", []byte(text))
		if (cfg == nil) == (err == nil) {
			t.Fatalf("cfg %v, err %v", cfg != nil, err)
		}
		nlines := strings.Count(text, "\n") + 1
		if err != nil {
			var es Errors
			if !errors.As(err, &es) || len(es) == 0 {
				t.Fatalf("error %T %v", err, err)
			}
			for _, e := range es {
				if e.Msg == "" || e.Line < 0 || e.Line > nlines || e.File != "f.toml" {
					t.Fatalf("bad problem %+v", *e)
				}
			}
		} else {
			cfg.WriteTable(io.Discard)
		}
		checkLinesAgree(t, text)
		checkAgrees(t, text)
	})
}

func BenchmarkParseExample(b *testing.B) {
	data := []byte(readFile(b, examplePath))
	b.ReportAllocs()
	b.SetBytes(int64(len(data)))
	for b.Loop() {
		if _, err := Parse("bench.toml", data); err != nil {
			b.Fatal(err)
		}
	}
}
