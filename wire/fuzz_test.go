package wire

import (
	"bytes"
	"encoding/json"
	"errors"
	"math"
	"strconv"
	"strings"
	"testing"

	"edgegw/ringstore"
)

// Fuzzing (`go test -fuzz FuzzX ./wire/`): no input may panic, and what is
// accepted must satisfy the protocol's invariants. Sizes are bounded by the
// parsers themselves (samples counted before decoding; MQTT payloads of at
// most MaxMQTTWrite; uplink and resume messages by the WebSocket read limits).

// FuzzParseBatch: what a receiver reads from a gateway.
func FuzzParseBatch(f *testing.F) {
	s := []ringstore.Sample{{Seq: 5, Device: "logger-01", Tag: "temperature", Value: 21.5, TS: 1764450000123456},
		{Seq: 6, Device: "logger-01", Tag: "run", Value: 1, Bool: true, TS: 1764450000123456, Quality: ringstore.Timeout}}
	f.Add(AppendBatch(nil, []byte(`"gw-01"`), s, false, nil))
	f.Add(AppendBatch(nil, []byte(`"gw-01"`), s[:1], false, []Range{{1, 4}}))
	sn := "SN-4711"
	f.Add(AppendBatch(nil, []byte(`"gw-01"`), append(s, ringstore.Sample{Seq: 7, Device: "plc", Tag: "serial", Kind: ringstore.KindString, Text: &sn}), true, nil))
	f.Add([]byte(`{"type":"batch","gateway":"g","first":1,"last":1,"samples":[{"seq":1,"device":"d","tag":"t","value":null,"quality":"good","ts":0}]}`))
	f.Add([]byte(`{"type":"batch","gateway":"g","first":2,"last":1,"samples":[]}`))
	f.Add([]byte(`{"type":"batch","gateway":"g","first":1,"last":3,"samples":[null,null,null]}`))
	f.Add([]byte(`{"type":"batch","gateway":"g","first":1,"last":1,"samples":{"seq":1}}`))
	f.Add([]byte(`{"type":"batch","gateway":"g","samples":[` + strings.Repeat("1,", 200) + `1]}`))
	f.Add([]byte(`{"type":"batch","samples":"[\"],["}`))
	f.Add([]byte(`[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]`))
	f.Add([]byte(`{"type":"write_result","id":"1","ok":true}`))
	f.Add([]byte{})
	const maxBatch = 64
	f.Fuzz(func(t *testing.T, frame []byte) {
		var raw fromGateway
		if json.Unmarshal(frame, &raw) == nil && len(raw.Samples) > 0 {
			var elems []json.RawMessage
			if json.Unmarshal(raw.Samples, &elems) == nil && CountElements(raw.Samples) != len(elems) {
				t.Fatalf("CountElements(%s) = %d, want %d", raw.Samples, CountElements(raw.Samples), len(elems))
			}
		}
		b, err := ParseBatch(frame, maxBatch)
		b2, a, err2 := ParseFromGateway(frame, maxBatch)
		if err != nil {
			var pe *ProtocolError
			if !errors.As(err, &pe) {
				t.Fatalf("error %T %v, want *ProtocolError", err, err)
			}
			if a == nil && (err2 == nil || b2 != nil) {
				t.Fatalf("ParseFromGateway accepted what ParseBatch refused: %+v %v", b2, err2)
			}
			return
		}
		if err2 != nil || b2 == nil || a != nil || b2.Last != b.Last {
			t.Fatalf("ParseFromGateway: %+v %+v %v", b2, a, err2)
		}
		if len(b.Samples) == 0 || len(b.Samples) > maxBatch || b.Samples[0].Seq != b.First || b.Samples[len(b.Samples)-1].Seq != b.Last {
			t.Fatalf("accepted %+v", b)
		}
		for i := 1; i < len(b.Samples); i++ {
			if b.Samples[i].Seq <= b.Samples[i-1].Seq {
				t.Fatalf("accepted seq %d after %d", b.Samples[i].Seq, b.Samples[i-1].Seq)
			}
		}
		for _, k := range b.Skip {
			if k.First > k.Last || k.Last >= b.Last {
				t.Fatalf("accepted skip %+v below last %d", k, b.Last)
			}
		}
	})
}

// FuzzUplinkMessage: what the gateway reads from the uplink (acks and
// write commands).
func FuzzUplinkMessage(f *testing.F) {
	f.Add([]byte(`{"type":"ack","last":42}`))
	f.Add([]byte(`{"type":"ack"}`))
	f.Add(AppendWriteCommand(nil, "7", "boiler-plc", "setpoint", 42.5))
	f.Add([]byte(`{"type":"write","id":"e","device":"d","tag":"t","value":true}`))
	f.Add([]byte(`{"type":"write","id":7,"device":"d","tag":"t","value":1}`))
	f.Add([]byte(`{"type":"write","id":"x","device":"d/x","tag":"t","value":1e999}`))
	f.Add([]byte(`{"type":"write","id":"` + strings.Repeat("i", 200) + `","device":"d","tag":"t","value":-0}`))
	f.Add([]byte(`{"type":"write","device":"\u00e9","tag":"t","value":"1"}`))
	f.Add([]byte(`{"type":"hello"}`))
	f.Add([]byte(`not json`))
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := ParseUplink(data)
		if err != nil {
			if _, ok := err.(*ProtocolError); !ok {
				t.Fatalf("error %T %v, want *ProtocolError", err, err)
			}
			return
		}
		switch m.Type {
		case "ack":
		case "write":
			if len(m.Cmd.ID) > MaxIDLen {
				t.Fatalf("id of %d bytes kept", len(m.Cmd.ID))
			}
			if m.Bad == "" && (!ValidName(m.Cmd.Device) || !ValidName(m.Cmd.Tag) || math.IsInf(m.Cmd.Value, 0) || math.IsNaN(m.Cmd.Value)) {
				t.Fatalf("accepted command %+v", m.Cmd)
			}
			if m.Bad == "" { // a good command survives its own encoder
				back, err := ParseUplink(AppendWriteCommand(nil, m.Cmd.ID, m.Cmd.Device, m.Cmd.Tag, m.Cmd.Value))
				if err != nil || back.Cmd != m.Cmd || back.Bad != "" {
					t.Fatalf("command %+v came back as %+v %v", m.Cmd, back, err)
				}
			}
			// Whatever the command, its answer is valid JSON echoing the id.
			a := WriteAnswer{ID: m.Cmd.ID, Error: m.Bad, Kind: KindBadRequest}
			b := AppendWriteResult(nil, &a)
			var back WriteAnswer
			if err := json.Unmarshal(b, &back); err != nil || back.ID != m.Cmd.ID {
				t.Fatalf("answer %s: %v", b, err)
			}
		default:
			t.Fatalf("type %q accepted", m.Type)
		}
	})
}

// FuzzMQTTWritePayload: the payload of <prefix>/write/<device>/<tag>.
func FuzzMQTTWritePayload(f *testing.F) {
	for _, s := range []string{`42.5`, `-1`, `true`, `false`, `{"value":3,"id":"cmd-1"}`, `{"value":true}`, `{"id":"x"}`,
		`{"value":1,"id":5}`, `"abc"`, `1e999`, `nan`, ``, `null`, `[1]`, `{"value":{"value":1}}`, strings.Repeat("9", 1100)} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, payload []byte) {
		id, v, err := ParseMQTTWrite(payload)
		if err != nil {
			return
		}
		if len(payload) > MaxMQTTWrite || len(id) > MaxIDLen || math.IsInf(v, 0) || math.IsNaN(v) {
			t.Fatalf("accepted %q: id %q value %v", payload, id, v)
		}
		b := AppendWriteResult(nil, &WriteAnswer{ID: id, OK: true, Written: v, ReadBack: v})
		var back WriteAnswer
		if err := json.Unmarshal(b, &back); err != nil || back.ID != id || back.Written != v {
			t.Fatalf("answer %s: %v", b, err)
		}
	})
}

// FuzzWSClientMessage: what a local WebSocket client may send.
func FuzzWSClientMessage(f *testing.F) {
	for _, s := range []string{`{"lastSequence":5}`, `{"lastSequence":-1}`, `{"lastSequence":1.5}`, `{"lastSequence":"5"}`,
		`{"lastSequence":18446744073709551616}`, `{}`, `[]`, `null`, "\x00\xff", `{"lastSequence":5,"x":[[[[[]]]]]}`,
		`{"lastSequence":1e2}`, `{"lastSequence":5}{"lastSequence":6}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) > 4096 {
			return // the connection's read limit refuses it before parsing
		}
		n, msg := ParseResume(data)
		if msg == "" {
			back, m2 := ParseResume([]byte(`{"lastSequence":` + strconv.FormatUint(n, 10) + `}`))
			if m2 != "" || back != n {
				t.Fatalf("%q: %d does not round-trip", data, n)
			}
		} else if n != 0 || len(msg) > 123 {
			t.Fatalf("%q: %d with close reason %q", data, n, msg)
		}
		if a := testing.AllocsPerRun(1, func() { ParseResume(data) }); a > float64(50+len(data)) {
			t.Fatalf("%q: %v allocations", data, a)
		}
	})
}

// FuzzWriteRequest: a local write body. Accepted means every field is there
// and usable; refused means a typed error; a deep body never reaches the
// decoder.
func FuzzWriteRequest(f *testing.F) {
	for _, s := range []string{`{"device":"d","tag":"t","value":1}`, `{"device":"d","tag":"t","value":true}`,
		`{"device":"d","tag":"t","value":-1.5e3}`, `{"device":"d","tag":"t","value":"1"}`, `{"device":"d","tag":"t","value":null}`,
		`{"device":"d","tag":"t","value":1,"x":2}`, `{"device":"d","tag":"t","value":1} {}`, `[[[[[[[[`, `{"device":"\"[[[[[[","tag":"t","value":0}`,
		`{"device":"d","tag":"t","value":1e999}`, ``, `{`, `{"device":"d","tag":"t","value":[1]}`, "{\"device\":\"\\u0000\",\"tag\":\"t\",\"value\":0}"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		req, err := ParseWriteRequest(bytes.NewReader(data))
		var pe *ProtocolError
		switch {
		case err == nil:
			if req.Device == "" || req.Tag == "" || math.IsNaN(req.Value) || math.IsInf(req.Value, 0) {
				t.Fatalf("%q: accepted %+v", data, req)
			}
			var s Scanner
			if s.Scan(data); s.Deepest > MaxWriteDepth {
				t.Fatalf("%q: accepted %d deep", data, s.Deepest)
			}
		case errors.Is(err, ErrEmptyBody):
			if len(bytes.TrimSpace(data)) != 0 {
				t.Fatalf("%q: called empty", data)
			}
		case !errors.As(err, &pe) || pe.Msg == "":
			t.Fatalf("%q: %v", data, err)
		}
	})
}
