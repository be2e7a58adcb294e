package web

import (
	"bytes"
	"math"
	"net/http"
	"net/url"
	"strconv"
	"strings"
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
		} else if n != 0 || len(msg) > 400 {
			t.Fatalf("%q: %d %q", query, n, msg)
		}
		if a := testing.AllocsPerRun(1, func() { parseLastSequence(r) }); a > float64(20+len(query)) {
			t.Fatalf("%q: %v allocations", query, a)
		}
	})
}

// FuzzWriteBody: the HTTP side of a write body (wire's FuzzWriteRequest
// fuzzes the parse): 413 exactly above MaxWriteBody, else 400 or accepted.
func FuzzWriteBody(f *testing.F) {
	f.Add([]byte(`{"device":"d","tag":"t","value":1}`))
	f.Add([]byte(`{"device":"d","tag":"t","value":"` + strings.Repeat("x", MaxWriteBody) + `"}`))
	f.Add([]byte(strings.Repeat("[", MaxWriteBody+1)))
	f.Add([]byte(` `))
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
