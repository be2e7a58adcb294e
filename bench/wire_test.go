package bench

import (
	"bytes"
	"encoding/xml"
	"strings"
	"testing"

	"edgegw/ringstore"
)

func testSamples() []ringstore.Sample {
	return []ringstore.Sample{
		{Seq: 41, Device: "logger-01", Tag: "temperature", Value: 21.5, TS: 1764450000123456},
		{Seq: 42, Device: `we"ird`, Tag: "on", Value: 1, Bool: true, TS: 1764450000123457},
		{Seq: 43, Device: "logger-03", Tag: "humidity", Quality: ringstore.Timeout, TS: 7},
	}
}

func TestParseReplies(t *testing.T) {
	s := testSamples()
	arr := ringstore.AppendJSONArray(nil, s)
	cases := []struct {
		name           string
		body           string
		seq            uint64
		reset, snapTyp bool
	}{
		{"short", `{"seq":43,"tags":` + string(arr) + "}\n", 43, false, false},
		{"long", `{"seq":43,"reset":false,"samples":` + string(arr) + "}\n", 43, false, false},
		{"long reset", `{"seq":99,"reset":true,"samples":` + string(arr) + "}\n", 99, true, false},
		{"ws samples", string(appendFrame(nil, 43, s)), 43, false, false},
		{"ws snapshot", `{"type":"snapshot","seq":50,"reset":false,"samples":` + string(arr) + "}", 50, false, true},
	}
	for _, c := range cases {
		h, rest, err := parseHead([]byte(c.body))
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if h.seq != c.seq || h.reset != c.reset || h.snapshot != c.snapTyp {
			t.Errorf("%s: head %+v, want seq %d reset %v snapshot %v", c.name, h, c.seq, c.reset, c.snapTyp)
		}
		var got []seqTS
		if err := eachSample(rest, func(seq uint64, ts int64, size int) { got = append(got, seqTS{seq, ts, size}) }); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if len(got) != len(s) {
			t.Fatalf("%s: %d samples, want %d", c.name, len(got), len(s))
		}
		for i := range s {
			if want := len(s[i].AppendJSON(nil)); got[i].seq != s[i].Seq || got[i].ts != s[i].TS || got[i].size != want {
				t.Errorf("%s: sample %d = %+v, want seq %d ts %d", c.name, i, got[i], s[i].Seq, s[i].TS)
			}
		}
	}
	empty := `{"seq":7,"reset":false,"samples":[]}`
	h, rest, err := parseHead([]byte(empty))
	if err != nil || h.seq != 7 {
		t.Fatalf("empty: %+v %v", h, err)
	}
	if err := eachSample(rest, func(uint64, int64, int) { t.Error("sample in an empty list") }); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{`{"error":"x"}`, `{"seq":x,"samples":[]}`, `{"seq":1,"samples":[{"seq":2,"device":"d"}]}`} {
		h, rest, err := parseHead([]byte(bad))
		if err == nil {
			err = eachSample(rest, func(uint64, int64, int) {})
		}
		if err == nil {
			t.Errorf("%s: parsed as %+v, want an error", bad, h)
		}
	}
}

func TestClientResultAccounting(t *testing.T) {
	r := newClientResult()
	r.begin(100)
	for _, s := range []uint64{101, 102, 104, 104, 103, 107} { // 103 late: a duplicate by position
		r.observe(s, 0, 100, 10, true)
	}
	r.jump(110) // reset: 108..110 missed
	r.observe(111, 5, 100, 10, false)
	r.finish(115)
	if r.received != 5 || r.dups != 2 || r.missed != 10 || r.resets != 1 {
		t.Fatalf("received %d dups %d missed %d resets %d", r.received, r.dups, r.missed, r.resets)
	}
	if r.received+r.missed != 115-100 {
		t.Fatalf("received + missed = %d, want 15", r.received+r.missed)
	}
	if r.useful != 500 {
		t.Fatalf("useful bytes %d, want 500", r.useful)
	}
	if r.lat.N != 4 {
		t.Fatalf("latencies recorded %d, want 4", r.lat.N)
	}
}

func TestSVGIsXML(t *testing.T) {
	c := &Chart{Title: "a <b> & c", XLabel: "clients", YLabel: "ms", LogX: true, Series: []Series{
		{Name: "ws", X: []float64{1, 10, 1000}, Y: []float64{1, 2, 30}},
		{Name: "long", X: []float64{1, 10}, Y: []float64{0.5, 0}},
	}}
	var b bytes.Buffer
	if err := c.WriteSVG(&b); err != nil {
		t.Fatal(err)
	}
	checkXML(t, b.String(), 2)
	var empty bytes.Buffer
	if err := (&Chart{Title: "empty"}).WriteSVG(&empty); err != nil {
		t.Fatal(err)
	}
	checkXML(t, empty.String(), 0)
}

// checkXML parses doc and counts its polylines.
func checkXML(t *testing.T, doc string, lines int) {
	t.Helper()
	d := xml.NewDecoder(strings.NewReader(doc))
	n, root := 0, ""
	for {
		tok, err := d.Token()
		if err != nil {
			if err.Error() == "EOF" {
				break
			}
			t.Fatalf("svg does not parse: %v\n%s", err, doc)
		}
		if se, ok := tok.(xml.StartElement); ok {
			if root == "" {
				root = se.Name.Local
			}
			if se.Name.Local == "polyline" {
				n++
			}
		}
	}
	if root != "svg" || n != lines {
		t.Fatalf("root %q with %d polylines, want svg with %d", root, n, lines)
	}
}
