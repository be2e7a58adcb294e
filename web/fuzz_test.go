package web

import (
	"bytes"
	"math"
	"net/http"
	"net/url"
	"strconv"
	"testing"
)

// Fuzz targets: go test -fuzz FuzzX ./web (make fuzz). Each checks no
// panic, the parser's own invariants, and bounded allocation.

func FuzzLastSequence(f *testing.F) {
	for _, s := range []string{"lastSequence=0", "lastSequence=18446744073709551615", "lastSequence=18446744073709551616",
		"lastSequence=-1", "lastSequence=", "lastSequence=1&lastSequence=2", "x=1", "lastSequence=%zz", "lastSequence=+5",
		"lastSequence=0x10", "lastSequence=1e3", ";;;&&&==", "lastSequence=%00"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, query string) {
		r := &http.Request{URL: &url.URL{Path: "/api/longPolling", RawQuery: query}}
		n, msg := parseLastSequence(r)
		if msg == "" {
			v := r.URL.Query()["lastSequence"][0]
			if want, err := strconv.ParseUint(v, 10, 64); err != nil || want != n {
				t.Fatalf("%q: accepted %d", query, n)
			}
		} else if n != 0 || len(msg) > 200+2*len(query) {
			t.Fatalf("%q: %d %q", query, n, msg)
		}
		if a := testing.AllocsPerRun(1, func() { parseLastSequence(r) }); a > float64(20+len(query)) {
			t.Fatalf("%q: %v allocations", query, a)
		}
	})
}

func FuzzWSClientMessage(f *testing.F) {
	for _, s := range []string{`{"lastSequence":5}`, `{"lastSequence":-1}`, `{"lastSequence":1.5}`, `{"lastSequence":"5"}`,
		`{"lastSequence":18446744073709551616}`, `{}`, `[]`, `null`, "\x00\xff", `{"lastSequence":5,"x":[[[[[]]]]]}`,
		`{"lastSequence":1e2}`, `{"lastSequence":5}{"lastSequence":6}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) > DefaultWSReadLimit {
			return // the connection's read limit refuses it before parsing
		}
		n, msg := parseResume(data)
		if msg == "" {
			back, m2 := parseResume([]byte(`{"lastSequence":` + strconv.FormatUint(n, 10) + `}`))
			if m2 != "" || back != n {
				t.Fatalf("%q: %d does not round-trip", data, n)
			}
		} else if n != 0 {
			t.Fatalf("%q: %d with error %q", data, n, msg)
		}
		if a := testing.AllocsPerRun(1, func() { parseResume(data) }); a > float64(50+len(data)) {
			t.Fatalf("%q: %v allocations", data, a)
		}
	})
}

func FuzzWriteBody(f *testing.F) {
	for _, s := range []string{`{"device":"d","tag":"t","value":1}`, `{"device":"d","tag":"t","value":true}`,
		`{"device":"d","tag":"t","value":-1.5e3}`, `{"device":"d","tag":"t","value":"1"}`, `{"device":"d","tag":"t","value":null}`,
		`{"device":"d","tag":"t","value":1,"x":2}`, `{"device":"d","tag":"t","value":1} {}`, `[[[[[[[[`, `{"device":"\"[[[[[[","tag":"t","value":0}`,
		`{"device":"d","tag":"t","value":1e999}`, ``, `{`, `{"device":"d","tag":"t","value":[1]}`, "{\"device\":\"\\u0000\",\"tag\":\"t\",\"value\":0}"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		body := func() *bytes.Reader { return bytes.NewReader(data) }
		req, status, msg := parseWriteBody(http.MaxBytesReader(nil, readCloser{body()}, MaxWriteBody))
		switch {
		case status == 0:
			if req.Device == "" || req.Tag == "" || math.IsNaN(req.Value) || math.IsInf(req.Value, 0) || msg != "" {
				t.Fatalf("%q: accepted %+v", data, req)
			}
			if len(data) > MaxWriteBody {
				t.Fatalf("%q: accepted over the limit", data)
			}
		case status == http.StatusRequestEntityTooLarge:
			if len(data) <= MaxWriteBody {
				t.Fatalf("%q: 413 under the limit", data)
			}
		case status != http.StatusBadRequest || msg == "":
			t.Fatalf("%q: %d %q", data, status, msg)
		}
		a := testing.AllocsPerRun(1, func() {
			parseWriteBody(http.MaxBytesReader(nil, readCloser{body()}, MaxWriteBody))
		})
		if a > 200 {
			t.Fatalf("%q: %v allocations", data, a)
		}
	})
}

type readCloser struct{ *bytes.Reader }

func (readCloser) Close() error { return nil }
