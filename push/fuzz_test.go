package push

import (
	"encoding/json"
	"math"
	"strings"
	"testing"

	"edgegw/ringstore"
)

// Fuzzing (`go test -fuzz FuzzX ./push/`): no input may panic, and what is
// accepted must satisfy the protocol's invariants. Sizes are bounded by the
// parsers themselves (MaxBatch counted before decoding; MQTT payloads of at
// most 1 KiB; uplink messages by the WebSocket read limit).

// FuzzReceiverIngest: the receiver's batch parser and dedup.
func FuzzReceiverIngest(f *testing.F) {
	s := []ringstore.Sample{{Seq: 5, Device: "logger-01", Tag: "temperature", Value: 21.5, TS: 1764450000123456},
		{Seq: 6, Device: "logger-01", Tag: "run", Value: 1, Bool: true, TS: 1764450000123456, Quality: ringstore.Timeout}}
	f.Add(appendBatch(nil, []byte(`"gw-01"`), s))
	f.Add(appendBatch(nil, []byte(`"gw-01"`), s[:1]))
	sn := "SN-4711"
	f.Add(appendBatchTS(nil, []byte(`"gw-01"`), append(s, ringstore.Sample{Seq: 7, Device: "plc", Tag: "serial", Kind: ringstore.KindString, Text: &sn}), true))
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
		var out syncBuffer
		r := NewReceiver(ReceiverConfig{Out: &out, MaxBatch: maxBatch, MaxPending: 16})
		last, err := r.Ingest(frame)
		var raw inFrame
		if json.Unmarshal(frame, &raw) == nil && len(raw.Samples) > 0 {
			var elems []json.RawMessage
			if json.Unmarshal(raw.Samples, &elems) == nil && countElements(raw.Samples) != len(elems) {
				t.Fatalf("countElements(%s) = %d, want %d", raw.Samples, countElements(raw.Samples), len(elems))
			}
		}
		if err != nil {
			if _, ok := err.(*ProtocolError); !ok {
				t.Fatalf("error %T %v, want *ProtocolError", err, err)
			}
			if st := r.Stats(); st.BadFrames != 1 || st.Samples != 0 {
				t.Fatalf("refused frame, stats %+v", st)
			}
			return
		}
		f, _ := parseBatch(frame)
		if f == nil || len(f.Samples) == 0 || len(f.Samples) > maxBatch || last != f.Last || f.Samples[len(f.Samples)-1].Seq != last {
			t.Fatalf("accepted frame: last %d, parsed %+v", last, f)
		}
		// Every sample of an accepted batch is new once (seqs strictly increase),
		// and a second ingest of the same frame writes nothing.
		st := r.Stats()
		if st.Samples != uint64(len(f.Samples)) || st.Duplicates != 0 {
			t.Fatalf("stats %+v for %d samples", st, len(f.Samples))
		}
		if _, err := r.Ingest(frame); err != nil {
			t.Fatal(err)
		}
		if st := r.Stats(); st.Samples != uint64(len(f.Samples)) || st.Duplicates != uint64(len(f.Samples)) {
			t.Fatalf("second ingest: stats %+v", st)
		}
	})
}

// FuzzUplinkMessage: what the gateway reads from the uplink (acks and
// write commands).
func FuzzUplinkMessage(f *testing.F) {
	f.Add([]byte(`{"type":"ack","last":42}`))
	f.Add([]byte(`{"type":"ack"}`))
	f.Add(appendWriteCommand(nil, "7", "boiler-plc", "setpoint", 42.5))
	f.Add([]byte(`{"type":"write","id":"e","device":"d","tag":"t","value":true}`))
	f.Add([]byte(`{"type":"write","id":7,"device":"d","tag":"t","value":1}`))
	f.Add([]byte(`{"type":"write","id":"x","device":"d/x","tag":"t","value":1e999}`))
	f.Add([]byte(`{"type":"write","id":"` + strings.Repeat("i", 200) + `","device":"d","tag":"t","value":-0}`))
	f.Add([]byte(`{"type":"write","device":"\u00e9","tag":"t","value":"1"}`))
	f.Add([]byte(`{"type":"hello"}`))
	f.Add([]byte(`not json`))
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := parseUplink(data)
		if err != nil {
			if _, ok := err.(*ProtocolError); !ok {
				t.Fatalf("error %T %v, want *ProtocolError", err, err)
			}
			return
		}
		switch m.typ {
		case "ack":
		case "write":
			if len(m.cmd.ID) > maxIDLen {
				t.Fatalf("id of %d bytes kept", len(m.cmd.ID))
			}
			if m.bad == "" && (!validName(m.cmd.Device) || !validName(m.cmd.Tag) || math.IsInf(m.cmd.Value, 0) || math.IsNaN(m.cmd.Value)) {
				t.Fatalf("accepted command %+v", m.cmd)
			}
			// Whatever the command, its answer is valid JSON echoing the id.
			a := WriteAnswer{ID: m.cmd.ID, Error: m.bad, Kind: KindBadRequest}
			b := appendWriteResult(nil, &a)
			var back WriteAnswer
			if err := json.Unmarshal(b, &back); err != nil || back.ID != m.cmd.ID {
				t.Fatalf("answer %s: %v", b, err)
			}
		default:
			t.Fatalf("type %q accepted", m.typ)
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
		id, v, err := parseMQTTWrite(payload)
		if err != nil {
			return
		}
		if len(payload) > maxWritePayload || len(id) > maxIDLen || math.IsInf(v, 0) || math.IsNaN(v) {
			t.Fatalf("accepted %q: id %q value %v", payload, id, v)
		}
		b := appendWriteResult(nil, &WriteAnswer{ID: id, OK: true, Written: v, ReadBack: v})
		var back WriteAnswer
		if err := json.Unmarshal(b, &back); err != nil || back.ID != id || back.Written != v {
			t.Fatalf("answer %s: %v", b, err)
		}
	})
}
