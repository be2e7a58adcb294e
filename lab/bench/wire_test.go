package bench

import (
	"bytes"
	"encoding/xml"
	"strings"
	"testing"
)

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
