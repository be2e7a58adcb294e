package wire

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"math"
	"strings"
	"testing"
	"testing/iotest"

	"edgegw/ringstore"
)

// The frames of the package comment, as byte literals: every encoder must
// write exactly these, and every decoder must read them back.

const epochHex = "9f3c04e1a2b3c4d5"

var epoch, _ = ringstore.ParseEpoch(epochHex)

func docSamples() []ringstore.Sample {
	sn := "SN-4711"
	return []ringstore.Sample{
		{Seq: 41, Epoch: epoch, Device: "logger-01", Tag: "temperature", Value: 21.5, TS: 1764450000123456},
		{Seq: 42, Epoch: epoch, Device: "logger-01", Tag: "run", Value: 1, Bool: true, TS: 1764450000123456},
		{Seq: 44, Epoch: epoch, Device: "plc", Tag: "serial", Kind: ringstore.KindString, Text: &sn, TS: 1764450000123999},
		{Seq: 45, Epoch: epoch, Device: "plc", Tag: "flow", Quality: ringstore.Timeout, TS: 1764450000124000},
	}
}

const docArray = `[{"seq":41,"device":"logger-01","tag":"temperature","value":21.5,"quality":"good","ts":1764450000123456},` +
	`{"seq":42,"device":"logger-01","tag":"run","value":true,"quality":"good","ts":1764450000123456},` +
	`{"seq":44,"device":"plc","tag":"serial","value":"SN-4711","quality":"good","ts":1764450000123999},` +
	`{"seq":45,"device":"plc","tag":"flow","value":null,"quality":"timeout","ts":1764450000124000}]`

const docArrayMS = `[{"seq":41,"device":"logger-01","tag":"temperature","value":21.5,"quality":"good","ts":1764450000123},` +
	`{"seq":42,"device":"logger-01","tag":"run","value":true,"quality":"good","ts":1764450000123},` +
	`{"seq":44,"device":"plc","tag":"serial","value":"SN-4711","quality":"good","ts":1764450000123},` +
	`{"seq":45,"device":"plc","tag":"flow","value":null,"quality":"timeout","ts":1764450000124}]`

func TestFrameLayouts(t *testing.T) {
	s := docSamples()
	gw := []byte(`"gw-01"`)
	ans := WriteAnswer{ID: "7", OK: true, Written: 42.5, ReadBack: 42.5}
	fail := WriteAnswer{ID: "7", Error: "edge: x: out of range", Kind: "out of range"}
	for _, c := range []struct {
		name string
		got  []byte
		want string
	}{
		{"batch", AppendBatch(nil, gw, s, false, nil),
			`{"type":"batch","v":2,"gateway":"gw-01","epoch":"` + epochHex + `","first":41,"last":45,"samples":` + docArray + `}`},
		{"batch ms skip", AppendBatch(nil, gw, s, true, []Range{{11, 20}, {43, 43}}),
			`{"type":"batch","v":2,"gateway":"gw-01","epoch":"` + epochHex + `","ts_unit":"ms","first":41,"last":45,"skip":[[11,20],[43,43]],"samples":` + docArrayMS + `}`},
		{"batch loss", AppendBatchLoss(nil, gw, s, false, []Range{{11, 20}}, []Loss{{Epoch: epochHex, First: 21, Last: 40, Reason: LossCrash}, {Epoch: epochHex, First: 43, Last: 43, Reason: LossFull}}),
			`{"type":"batch","v":2,"gateway":"gw-01","epoch":"` + epochHex + `","first":41,"last":45,"skip":[[11,20]],"loss":[{"epoch":"` + epochHex + `","first":21,"last":40,"reason":"crash"},{"epoch":"` + epochHex + `","first":43,"last":43,"reason":"full"}],"samples":` + docArray + `}`},
		{"ack", AppendAck(nil, 42), `{"type":"ack","last":42}`},
		{"write", AppendWriteCommand(nil, "7", "boiler-plc", "setpoint", 42.5),
			`{"type":"write","id":"7","device":"boiler-plc","tag":"setpoint","value":42.5}`},
		{"write result", AppendWriteResult(nil, &ans), `{"type":"write_result","id":"7","ok":true,"written":42.5,"read_back":42.5}`},
		{"write failure", AppendWriteResult(nil, &fail),
			`{"type":"write_result","id":"7","ok":false,"error":"edge: x: out of range","kind":"out of range"}`},
		{"not finite", AppendWriteResult(nil, &WriteAnswer{ID: `"x"`, OK: true, Written: math.Inf(1), ReadBack: 2}),
			`{"type":"write_result","id":"\"x\"","ok":true,"written":null,"read_back":2}`},
		{"stored", AppendStored(nil, gw, epochHex, &s[0]),
			`{"gateway":"gw-01","epoch":"` + epochHex + `","seq":41,"device":"logger-01","tag":"temperature","value":21.5,"quality":"good","ts":1764450000123456}` + "\n"},
		{"stored v1", AppendStored(nil, gw, "", &s[0]),
			`{"gateway":"gw-01","seq":41,"device":"logger-01","tag":"temperature","value":21.5,"quality":"good","ts":1764450000123456}` + "\n"},
		{"per tag", AppendTagPayload(nil, &s[0], "°C", false),
			`{"value":21.5,"quality":"good","ts":1764450000123456,"seq":41,"unit":"°C"}`},
		{"per tag ms", AppendTagPayload([]byte("x"), &s[3], "", true),
			`x{"value":null,"quality":"timeout","ts":1764450000124,"seq":45}`},
		{"short", AppendShortPoll(nil, 1042, epoch, s), `{"seq":1042,"epoch":"` + epochHex + `","tags":` + docArray + `}`},
		{"long", AppendLongPoll(nil, 1042, epoch, false, s), `{"seq":1042,"epoch":"` + epochHex + `","reset":false,"samples":` + docArray + `}`},
		{"long empty", AppendLongPoll(nil, 1042, epoch, true, nil), `{"seq":1042,"epoch":"` + epochHex + `","reset":true,"samples":[]}`},
		{"ws samples", AppendWSSamples(nil, 45, s), `{"type":"samples","seq":45,"epoch":"` + epochHex + `","samples":` + docArray + `}`},
		{"ws snapshot", AppendWSSnapshot(nil, 1042, epoch, true, s),
			`{"type":"snapshot","seq":1042,"epoch":"` + epochHex + `","reset":true,"samples":` + docArray + `}`},
	} {
		if string(c.got) != c.want {
			t.Errorf("%s:\n got %s\nwant %s", c.name, c.got, c.want)
		}
		if i := strings.IndexByte(c.want, '{'); !json.Valid([]byte(c.want[i:])) {
			t.Errorf("%s: not JSON", c.name)
		}
	}
}

func TestParseBatchReadsTheLayout(t *testing.T) {
	s := docSamples()
	for _, ms := range []bool{false, true} {
		frame := AppendBatch(nil, []byte(`"gw-01"`), s, ms, []Range{{11, 20}})
		f, err := ParseBatch(frame, DefaultMaxBatch)
		if err != nil {
			t.Fatalf("ms %v: %v", ms, err)
		}
		if f.V != 2 || f.Gateway != "gw-01" || f.Epoch != epochHex || f.First != 41 || f.Last != 45 || len(f.Skip) != 1 || f.Skip[0] != (Range{11, 20}) {
			t.Fatalf("ms %v: %+v", ms, f)
		}
		for i := range s {
			want := s[i].TS
			if ms {
				want = want / 1000 * 1000 // a receiver keeps µs, cut to the ms sent
			}
			g := f.Samples[i]
			if g.Seq != s[i].Seq || g.Device != s[i].Device || g.Tag != s[i].Tag || g.TS != want || g.EffectiveQuality() != s[i].EffectiveQuality() {
				t.Errorf("ms %v: sample %d = %+v", ms, i, g)
			}
		}
	}
	loss := []Loss{{Epoch: "0000000000000007", First: 3, Last: 9, Reason: LossCrash}, {Epoch: epochHex, First: 42, Last: 42, Reason: "full"}}
	f, err := ParseBatch(AppendBatchLoss(nil, []byte(`"gw-01"`), s, false, nil, loss), DefaultMaxBatch)
	if err != nil || len(f.Loss) != 2 || f.Loss[0] != loss[0] || f.Loss[1] != loss[1] {
		t.Fatalf("loss: %+v %v", f, err)
	}
	noEpoch := `{"type":"batch","v":2,"gateway":"g","epoch":"` + epochHex + `","first":5,"last":5,"loss":[{"first":2,"last":4,"reason":"crash"}],"samples":[{"seq":5,"device":"d","tag":"t","value":1,"quality":"good","ts":1}]}`
	if f, err := ParseBatch([]byte(noEpoch), 10); err != nil || f.Loss[0].Epoch != epochHex {
		t.Fatalf("a loss without epoch is the batch's: %+v %v", f, err)
	}
	b, a, err := ParseFromGateway(AppendBatch(nil, []byte(`"g"`), s[:1], false, nil), 10)
	if err != nil || a != nil || b == nil || b.Last != 41 {
		t.Fatalf("from gateway, batch: %+v %+v %v", b, a, err)
	}
	b, a, err = ParseFromGateway([]byte(`{"type":"write_result","id":"7","ok":false,"error":"e","kind":"busy"}`), 10)
	if err != nil || b != nil || a == nil || a.ID != "7" || a.OK || a.Kind != "busy" || a.Error != "e" {
		t.Fatalf("from gateway, answer: %+v %+v %v", b, a, err)
	}
	v1 := `{"type":"batch","gateway":"g","first":1,"last":1,"samples":[{"seq":1,"device":"d","tag":"t","value":1,"quality":"good","ts":1}]}`
	if f, err := ParseBatch([]byte(v1), 10); err != nil || f.V != 0 || f.Epoch != "" {
		t.Fatalf("version 1: %+v %v", f, err)
	}
}

func TestParseBatchRefuses(t *testing.T) {
	smp := func(seq int) string {
		return `{"seq":` + string(rune('0'+seq)) + `,"device":"d","tag":"t","value":1,"quality":"good","ts":1}`
	}
	for _, c := range []struct{ frame, msg string }{
		{`{"type":"ack","last":1}`, "type"},
		{`{"type":"batch","first":1,"last":1,"samples":[` + smp(1) + `]}`, "no gateway"},
		{`{"type":"batch","gateway":"g","first":1,"last":1,"samples":[]}`, "no samples"},
		{`{"type":"batch","gateway":"g","first":1,"last":2,"samples":[` + smp(2) + `,` + smp(1) + `]}`, "do not match"},
		{`{"type":"batch","gateway":"g","first":2,"last":1,"samples":[` + smp(2) + `,` + smp(1) + `]}`, "seq 1 after 2"},
		{`{"type":"batch","v":2,"gateway":"g","first":1,"last":1,"samples":[` + smp(1) + `]}`, "without an epoch"},
		{`{"type":"batch","v":2,"gateway":"g","epoch":"xyz","first":1,"last":1,"samples":[` + smp(1) + `]}`, "epoch"},
		{`{"type":"batch","gateway":"g","first":5,"last":5,"skip":[[3,5]],"samples":[` + smp(5) + `]}`, "skip [3,5]"},
		{`{"type":"batch","gateway":"g","first":5,"last":5,"skip":[[4,3]],"samples":[` + smp(5) + `]}`, "skip [4,3]"},
		{`{"type":"batch","gateway":"g","first":5,"last":5,"loss":[{"first":3,"last":5}],"samples":[` + smp(5) + `]}`, "loss [3,5]"},
		{`{"type":"batch","gateway":"g","first":5,"last":5,"loss":[{"first":4,"last":3}],"samples":[` + smp(5) + `]}`, "loss [4,3]"},
		{`{"type":"batch","gateway":"g","first":5,"last":5,"loss":[{"epoch":"zz","first":1,"last":3}],"samples":[` + smp(5) + `]}`, "loss: "},
		{`{"type":"batch","gateway":"g","first":1,"last":1,"ts_unit":"s","samples":[` + smp(1) + `]}`, "ts_unit"},
		{`{"type":"batch","gateway":"g","first":1,"last":3,"samples":[` + smp(1) + `,` + smp(2) + `,` + smp(3) + `]}`, "3 samples (at most 2)"},
		{`{"type":"batch","gateway":"g","samples":{"seq":1}}`, "cannot unmarshal"},
		{`{"type":"batch"`, "unexpected end"},
	} {
		_, err := ParseBatch([]byte(c.frame), 2)
		var pe *ProtocolError
		if !errors.As(err, &pe) || pe.Frame != "batch" || !strings.Contains(err.Error(), c.msg) || !strings.HasPrefix(err.Error(), "wire: batch: ") {
			t.Errorf("%s: %v, want a batch error with %q", c.frame, err, c.msg)
		}
	}
}

func TestParseUplink(t *testing.T) {
	m, err := ParseUplink(AppendAck(nil, 42))
	if err != nil || m.Type != "ack" || m.Last != 42 {
		t.Fatalf("ack: %+v %v", m, err)
	}
	m, err = ParseUplink(AppendWriteCommand(nil, "7", "boiler-plc", "setpoint", 42.5))
	if err != nil || m.Type != "write" || m.Bad != "" || m.Cmd != (WriteCommand{ID: "7", Device: "boiler-plc", Tag: "setpoint", Value: 42.5}) {
		t.Fatalf("write: %+v %v", m, err)
	}
	for _, c := range []struct{ in, bad string }{
		{`{"type":"write","id":7,"device":"d","tag":"t","value":1}`, "id is not a string"},
		{`{"type":"write","id":"1","device":"d/x","tag":"t","value":1}`, `device "d/x"`},
		{`{"type":"write","id":"1","device":"d","tag":"","value":1}`, `tag ""`},
		{`{"type":"write","id":"1","device":"d","tag":"t","value":1e999}`, "out of range"},
		{`{"type":"write","id":"1","device":"d","tag":"t","value":"1"}`, "not a number"},
		{`{"type":"write","id":"1","device":"d","tag":"t"}`, "no value"},
		{`{"type":"write","id":"` + strings.Repeat("i", MaxIDLen+1) + `","device":"d","tag":"t","value":1}`, "id longer"},
	} {
		m, err := ParseUplink([]byte(c.in))
		if err != nil || !strings.Contains(m.Bad, c.bad) || len(m.Cmd.ID) > MaxIDLen {
			t.Errorf("%s: %+v %v, want bad %q", c.in, m, err, c.bad)
		}
	}
	for _, c := range []struct{ in, frame string }{
		{`{"type":"ack"}`, "ack"}, {`{"type":"hello"}`, "uplink"}, {`not json`, "uplink"},
	} {
		_, err := ParseUplink([]byte(c.in))
		var pe *ProtocolError
		if !errors.As(err, &pe) || pe.Frame != c.frame {
			t.Errorf("%s: %v, want a %s error", c.in, err, c.frame)
		}
	}
}

func TestParseValue(t *testing.T) {
	for _, c := range []struct {
		in   string
		want float64
		ok   bool
	}{
		{"1", 1, true}, {"-2.5", -2.5, true}, {"1e3", 1000, true}, {"true", 1, true}, {"false", 0, true},
		{"1e999", 0, false}, {"-1e999", 0, false}, {`"1"`, 0, false}, {"null", 0, false}, {"", 0, false}, {"[1]", 0, false}, {"{}", 0, false},
	} {
		v, err := ParseValue([]byte(c.in))
		if (err == nil) != c.ok || v != c.want {
			t.Errorf("%q: %v %v", c.in, v, err)
		}
	}
}

func TestParseMQTTWrite(t *testing.T) {
	for _, c := range []struct {
		in, id string
		v      float64
		ok     bool
	}{
		{`42.5`, "", 42.5, true}, {`true`, "", 1, true}, {`{"value":3,"id":"cmd-1"}`, "cmd-1", 3, true},
		{`{"id":"x"}`, "", 0, false}, {`"abc"`, "", 0, false}, {`{"value":1,"id":5}`, "", 0, false},
		{strings.Repeat("9", MaxMQTTWrite+1), "", 0, false}, {``, "", 0, false},
	} {
		id, v, err := ParseMQTTWrite([]byte(c.in))
		if (err == nil) != c.ok || (c.ok && (id != c.id || v != c.v)) {
			t.Errorf("%.40q: %q %v %v", c.in, id, v, err)
		}
	}
}

func TestParseWriteRequest(t *testing.T) {
	r, err := ParseWriteRequest(strings.NewReader(`{"device":"boiler-plc","tag":"setpoint","value":21.5}`))
	if err != nil || r != (WriteRequest{Device: "boiler-plc", Tag: "setpoint", Value: 21.5}) {
		t.Fatalf("%+v %v", r, err)
	}
	if r, err := ParseWriteRequest(strings.NewReader(` {"value":true,"tag":"p","device":"d"} `)); err != nil || r.Value != 1 {
		t.Fatalf("bool: %+v %v", r, err)
	}
	for _, c := range []struct{ in, msg string }{
		{`{"device":"d",`, "unexpected EOF"},
		{`{"device":"d","tag":"t","value":1,"force":true}`, "unknown field"},
		{`{"device":"d","tag":"t","value":1}{}`, "data after"},
		{`{"device":"d","tag":"t","value":1} x`, "invalid character"},
		{`{"device":"d","tag":"t","value":[[[[[1]]]]]}`, "nested deeper than 4"},
		{`{"device":"d","tag":"t","value":"1"}`, "number or true/false"},
		{`{"device":"d","tag":"t","value":1e400}`, "number or true/false"},
		{`{"device":"d","tag":"t","value":null}`, `missing "value"`},
		{`{"tag":"t","value":1}`, `missing "device"`},
		{`{"device":"d","value":1}`, `missing "tag"`},
		{`[1]`, "cannot unmarshal"},
	} {
		_, err := ParseWriteRequest(strings.NewReader(c.in))
		var pe *ProtocolError
		if !errors.As(err, &pe) || pe.Frame != "write" || !strings.Contains(pe.Msg, c.msg) {
			t.Errorf("%s: %v, want a write error with %q", c.in, err, c.msg)
		}
	}
	if _, err := ParseWriteRequest(strings.NewReader("  ")); !errors.Is(err, ErrEmptyBody) {
		t.Errorf("empty: %v", err)
	}
	// A deep body fails at its first read, before the decoder sees it.
	deep := bytes.Repeat([]byte("["), 100000)
	rd := &countingReader{r: bytes.NewReader(deep)}
	if _, err := ParseWriteRequest(rd); !errors.Is(err, errTooDeep) || rd.n > 64<<10 {
		t.Errorf("deep: %v after %d bytes", err, rd.n)
	}
	// The reader's own error comes back wrapped, for the caller to branch on.
	boom := errors.New("boom")
	if _, err := ParseWriteRequest(iotest.ErrReader(boom)); !errors.Is(err, boom) {
		t.Errorf("reader error: %v", err)
	}
	if _, err := ParseWriteRequest(io.MultiReader(strings.NewReader(`{"device":`), iotest.ErrReader(boom))); !errors.Is(err, boom) {
		t.Errorf("reader error mid-body: %v", err)
	}
}

type countingReader struct {
	r io.Reader
	n int
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += n
	return n, err
}

func TestParseResume(t *testing.T) {
	for in, want := range map[string]uint64{`{"lastSequence":0}`: 0, `{"lastSequence":18446744073709551615}`: math.MaxUint64, ` {"lastSequence":5,"x":1}`: 5} {
		if n, msg := ParseResume([]byte(in)); msg != "" || n != want {
			t.Errorf("%s: %d %q", in, n, msg)
		}
	}
	for _, in := range []string{`{"lastSequence":-1}`, `{"lastSequence":1.5}`, `{}`, `[]`, `x`, `{"lastSequence":18446744073709551616}`} {
		if n, msg := ParseResume([]byte(in)); msg == "" || n != 0 || len(msg) > 123 {
			t.Errorf("%s: %d %q, want a close reason", in, n, msg)
		}
	}
}

func TestCountElements(t *testing.T) {
	for in, want := range map[string]int{
		`[]`: 0, ` [ ] `: 0, `[1]`: 1, `[1,2]`: 2, `[{"a":[1,2,3]},{"b":","}]`: 2, `["\"],["]`: 1, `[[],[]]`: 2, `[{}]`: 1, `{}`: 0, `null`: 0,
		`["a\\",","]`: 2, `[ "x" , 1 ]`: 2,
	} {
		if got := CountElements([]byte(in)); got != want {
			t.Errorf("%s: %d, want %d", in, got, want)
		}
	}
}

// A chunked scan (a reader's reads) ends where a whole one does.
func TestScannerChunks(t *testing.T) {
	text := []byte(`[{"a":"x\"]\\"},[[1,2],{"b":[3]}],"\\\"",4]`)
	var whole Scanner
	whole.Scan(text)
	if whole.Depth != 0 || whole.Deepest != 4 || whole.Elements() != 4 {
		t.Fatalf("whole: depth %d deepest %d elements %d", whole.Depth, whole.Deepest, whole.Elements())
	}
	for cut := range text {
		var s Scanner
		s.Scan(text[:cut])
		s.Scan(text[cut:])
		if s != whole {
			t.Fatalf("cut at %d: %+v, want %+v", cut, s, whole)
		}
	}
}

func TestValidName(t *testing.T) {
	for s, ok := range map[string]bool{"logger-01": true, "a.b_c": true, "": false, "a/b": false, "é": false, "a b": false,
		strings.Repeat("x", MaxNameLen): true, strings.Repeat("x", MaxNameLen+1): false} {
		if ValidName(s) != ok {
			t.Errorf("%q: %v", s, !ok)
		}
	}
}

func TestReadReplies(t *testing.T) {
	s := docSamples()
	for _, c := range []struct {
		name           string
		body           []byte
		seq            uint64
		reset, snapTyp bool
	}{
		{"short", append(AppendShortPoll(nil, 45, epoch, s), '\n'), 45, false, false},
		{"long", append(AppendLongPoll(nil, 45, epoch, false, s), '\n'), 45, false, false},
		{"long reset", AppendLongPoll(nil, 99, epoch, true, s), 99, true, false},
		{"ws samples", AppendWSSamples(nil, 45, s), 45, false, false},
		{"ws snapshot", AppendWSSnapshot(nil, 50, epoch, false, s), 50, false, true},
		{"v1 reply", []byte(`{"seq":45,"reset":false,"samples":` + docArray + `}`), 45, false, false},
	} {
		h, rest, err := ReadHead(c.body)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if h.Seq != c.seq || h.Reset != c.reset || h.Snapshot != c.snapTyp {
			t.Errorf("%s: head %+v, want seq %d reset %v snapshot %v", c.name, h, c.seq, c.reset, c.snapTyp)
		}
		i := 0
		if err := EachSample(rest, func(seq uint64, ts int64, size int) {
			if want := len(s[i].AppendJSON(nil)); seq != s[i].Seq || ts != s[i].TS || size != want {
				t.Errorf("%s: sample %d = %d %d %d, want %d %d %d", c.name, i, seq, ts, size, s[i].Seq, s[i].TS, want)
			}
			i++
		}); err != nil || i != len(s) {
			t.Fatalf("%s: %d samples, %v", c.name, i, err)
		}
	}
	h, rest, err := ReadHead(AppendLongPoll(nil, 7, epoch, false, nil))
	if err != nil || h.Seq != 7 {
		t.Fatalf("empty: %+v %v", h, err)
	}
	if err := EachSample(rest, func(uint64, int64, int) { t.Error("sample in an empty list") }); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{`{"error":"x"}`, `{"seq":x,"samples":[]}`, `{"seq":1,"samples":[{"seq":2,"device":"d"}]}`} {
		h, rest, err := ReadHead([]byte(bad))
		if err == nil {
			err = EachSample(rest, func(uint64, int64, int) {})
		}
		if !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: parsed as %+v (%v), want ErrMalformed", bad, h, err)
		}
	}
}

func TestRangeJSON(t *testing.T) {
	b, err := json.Marshal([]Range{{1, 2}, {5, 5}})
	if err != nil || string(b) != `[[1,2],[5,5]]` {
		t.Fatalf("%s %v", b, err)
	}
	var back []Range
	if err := json.Unmarshal(b, &back); err != nil || len(back) != 2 || back[1] != (Range{5, 5}) {
		t.Fatalf("%+v %v", back, err)
	}
	if err := json.Unmarshal([]byte(`[["a",1]]`), &back); err == nil {
		t.Fatal("a string range accepted")
	}
}
