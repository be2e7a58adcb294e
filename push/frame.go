package push

import (
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"edgegw/ringstore"
	"edgegw/spool"
)

// Batch frame, gateway to receiver (a WebSocket text message, or the
// payload of an MQTT message on <prefix>/batch), protocol version 2:
//
//	{"type":"batch","v":2,"gateway":"gw-01","epoch":"9f3c04e1a2b3c4d5","first":41,"last":42,
//	 "skip":[[11,1048616]],"samples":[
//	 {"seq":41,"device":"logger-01","tag":"temperature","value":21.5,"quality":"good","ts":1764450000123456},
//	 {"seq":42,...}]}
//
// Samples are consecutive in the queue (seq strictly increasing; a gap only
// where samples were dropped and counted) and all of one epoch (16 hex
// digits: a string, as JSON numbers lose precision above 2^53). first/last
// are the first and last sample's seq. skip (only when there is one) lists
// ranges [a,b] of the epoch that were never given to a sample (what a
// restart skipped of the previous run's reserved block): a receiver counts
// them as seen, not as a gap. Version 1 frames (no v, no epoch, no skip)
// are read as epoch "".
func appendBatch(b, gateway []byte, samples []ringstore.Sample, skips ...ringstore.Skip) []byte {
	return appendBatchTS(b, gateway, samples, false, skips...)
}

// appendBatchTS is appendBatch with ts in Unix milliseconds when ms is set
// (ts_unit = "ms"); the frame then says so after the epoch:
// {"type":"batch","v":2,"gateway":"gw-01","epoch":"…","ts_unit":"ms","first":…}.
func appendBatchTS(b, gateway []byte, samples []ringstore.Sample, ms bool, skips ...ringstore.Skip) []byte {
	b = append(b, `{"type":"batch","v":2,"gateway":`...)
	b = append(b, gateway...)
	b = append(b, `,"epoch":"`...)
	b = ringstore.AppendEpoch(b, samples[0].Epoch)
	b = append(b, '"')
	if ms {
		b = append(b, `,"ts_unit":"ms"`...)
	}
	b = append(b, `,"first":`...)
	b = strconv.AppendUint(b, samples[0].Seq, 10)
	b = append(b, `,"last":`...)
	b = strconv.AppendUint(b, samples[len(samples)-1].Seq, 10)
	if len(skips) > 0 {
		b = append(b, `,"skip":[`...)
		for i, k := range skips {
			if i > 0 {
				b = append(b, ',')
			}
			b = append(b, '[')
			b = strconv.AppendUint(b, k.First, 10)
			b = append(b, ',')
			b = strconv.AppendUint(b, k.Last, 10)
			b = append(b, ']')
		}
		b = append(b, ']')
	}
	b = append(b, `,"samples":`...)
	b = ringstore.AppendJSONArrayTS(b, samples, ms)
	return append(b, '}')
}

// Ack frame, receiver to gateway: everything up to last is stored.
//
//	{"type":"ack","last":42}
func appendAck(b []byte, last uint64) []byte {
	b = append(b, `{"type":"ack","last":`...)
	b = strconv.AppendUint(b, last, 10)
	return append(b, '}')
}

// ProtocolError is a frame that does not follow the protocol.
type ProtocolError struct {
	Frame string // "batch" or "ack"
	Msg   string
}

func (e *ProtocolError) Error() string { return "push: protocol: " + e.Frame + ": " + e.Msg }

type batchFrame struct {
	Type    string             `json:"type"`
	V       int                `json:"v"`
	Gateway string             `json:"gateway"`
	Epoch   string             `json:"epoch"`
	First   uint64             `json:"first"`
	Last    uint64             `json:"last"`
	Skip    [][2]uint64        `json:"skip"`
	Samples []ringstore.Sample `json:"samples"`
}

// maxSkips bounds the skip ranges of one frame.
const maxSkips = 64

// DefaultMaxBatch is the number of samples a receiver accepts in one batch
// unless configured otherwise (a gateway sends at most WS.BatchMax, 500).
const DefaultMaxBatch = 10000

func parseBatch(data []byte) (*batchFrame, error) { return parseBatchMax(data, DefaultMaxBatch) }

// parseBatchMax parses a batch frame of at most max samples. The samples
// are counted before they are decoded, so a frame of a million tiny
// elements costs a scan, not a million samples.
func parseBatchMax(data []byte, max int) (*batchFrame, error) {
	var raw inFrame
	if err := json.Unmarshal(data, &raw); err != nil {
		return nil, &ProtocolError{"batch", err.Error()}
	}
	return raw.batch(max)
}

// inFrame is any frame a receiver reads from a gateway: a batch (samples
// left raw until counted) or the answer to a write command.
type inFrame struct {
	Type    string          `json:"type"`
	V       int             `json:"v"`
	Gateway string          `json:"gateway"`
	Epoch   string          `json:"epoch"`
	First   uint64          `json:"first"`
	Last    uint64          `json:"last"`
	Skip    [][2]uint64     `json:"skip"`
	Samples json.RawMessage `json:"samples"`
	TSUnit  string          `json:"ts_unit"` // "ms": ts in milliseconds (ts_unit = "ms"); else µs
	WriteAnswer
}

// batch checks and decodes a batch of at most max samples.
func (raw *inFrame) batch(max int) (*batchFrame, error) {
	f := batchFrame{Type: raw.Type, V: raw.V, Gateway: raw.Gateway, Epoch: raw.Epoch, First: raw.First, Last: raw.Last, Skip: raw.Skip}
	if f.Type != "batch" {
		return nil, &ProtocolError{"batch", fmt.Sprintf("type %.40q", f.Type)}
	}
	if n := countElements(raw.Samples); n > max {
		return nil, &ProtocolError{"batch", fmt.Sprintf("%d samples (at most %d)", n, max)}
	}
	if len(raw.Samples) > 0 {
		if err := json.Unmarshal(raw.Samples, &f.Samples); err != nil {
			return nil, &ProtocolError{"batch", err.Error()}
		}
	}
	switch raw.TSUnit {
	case "", "us":
	case "ms":
		for i := range f.Samples { // a receiver keeps microseconds whatever the gateway sends
			f.Samples[i].TS *= 1000
		}
	default:
		return nil, &ProtocolError{"batch", fmt.Sprintf("ts_unit %.10q", raw.TSUnit)}
	}
	if err := f.check(); err != nil {
		return nil, err
	}
	return &f, nil
}

// countElements counts the top-level elements of a valid JSON array (0
// for anything else): commas at depth 1, outside strings, plus one.
func countElements(data []byte) int {
	n, depth, inStr, esc, seen := 0, 0, false, false, false
	for _, c := range data {
		if inStr {
			switch {
			case esc:
				esc = false
			case c == '\\':
				esc = true
			case c == '"':
				inStr = false
			}
			continue
		}
		switch c {
		case ' ', '\t', '\n', '\r':
			continue
		case '"':
			inStr = true
		case '[', '{':
			depth++
			if depth == 1 {
				continue
			}
		case ']', '}':
			depth--
			continue
		case ',':
			if depth == 1 {
				n++
			}
			continue
		}
		if depth >= 1 {
			seen = true
		}
	}
	if !seen {
		return 0
	}
	return n + 1
}

func (f *batchFrame) check() error {
	switch {
	case f.Type != "batch":
		return &ProtocolError{"batch", fmt.Sprintf("type %q", f.Type)}
	case f.Gateway == "":
		return &ProtocolError{"batch", "no gateway"}
	case len(f.Samples) == 0:
		return &ProtocolError{"batch", "no samples"}
	case f.Samples[0].Seq != f.First || f.Samples[len(f.Samples)-1].Seq != f.Last:
		return &ProtocolError{"batch", fmt.Sprintf("first/last %d/%d do not match the samples", f.First, f.Last)}
	case f.V >= 2 && f.Epoch == "":
		return &ProtocolError{"batch", "version 2 without an epoch"}
	case len(f.Skip) > maxSkips:
		return &ProtocolError{"batch", fmt.Sprintf("%d skip ranges (at most %d)", len(f.Skip), maxSkips)}
	}
	if f.Epoch != "" {
		if _, err := ringstore.ParseEpoch(f.Epoch); err != nil {
			return &ProtocolError{"batch", err.Error()}
		}
	}
	for _, k := range f.Skip {
		if k[0] > k[1] || k[1] >= f.Last {
			return &ProtocolError{"batch", fmt.Sprintf("skip [%d,%d] is not a range below last %d", k[0], k[1], f.Last)}
		}
	}
	for i := 1; i < len(f.Samples); i++ {
		if f.Samples[i].Seq <= f.Samples[i-1].Seq {
			return &ProtocolError{"batch", fmt.Sprintf("seq %d after %d", f.Samples[i].Seq, f.Samples[i-1].Seq)}
		}
	}
	return nil
}

func parseAck(data []byte) (uint64, error) {
	var f struct {
		Type string  `json:"type"`
		Last *uint64 `json:"last"`
	}
	if err := json.Unmarshal(data, &f); err != nil {
		return 0, &ProtocolError{"ack", err.Error()}
	}
	if f.Type != "ack" || f.Last == nil {
		return 0, &ProtocolError{"ack", fmt.Sprintf("type %q, last %v", f.Type, f.Last)}
	}
	return *f.Last, nil
}

// batcher cuts the samples after a path's cursor into batches: a full
// batch (BatchMax) goes at once; a partial one lingers until its first
// look is BatchWait old, so a live stream is sent in few frames. Both
// senders (WebSocket and MQTT) use one; it belongs to its sender goroutine.
type batcher struct {
	max   int
	wait  time.Duration
	until time.Time // linger deadline of the partial batch; zero when none
	buf   []ringstore.Sample
	skips []ringstore.Skip // the restart skips the batch from next crosses
}

// next returns the batch to send now after the cursor, or nil (nothing
// waiting, or a partial batch still lingering: see linger). A batch never
// mixes epochs: it ends before the first sample of another epoch, and is
// then due at once. skips is set to the restart skips it crosses.
func (b *batcher) next(q *spool.Queue, after uint64, now time.Time) []ringstore.Sample {
	b.buf = q.PeekAfter(after, b.max, b.buf[:0])
	b.skips = b.skips[:0]
	if len(b.buf) == 0 {
		return nil
	}
	full := len(b.buf) >= b.max
	for i := 1; i < len(b.buf); i++ {
		if b.buf[i].Epoch != b.buf[0].Epoch {
			b.buf, full = b.buf[:i], true
			break
		}
	}
	if b.until.IsZero() && !full {
		b.until = now.Add(b.wait)
	}
	if !full && now.Before(b.until) {
		return nil
	}
	b.until = time.Time{}
	b.skips = append(b.skips, q.Skips(b.buf[0].Epoch, after, b.buf[len(b.buf)-1].Seq)...)
	return b.buf
}

// linger is how long the partial batch still waits (0 when it is due), or
// -1 when none waits.
func (b *batcher) linger() time.Duration {
	if b.until.IsZero() {
		return -1
	}
	return max(0, time.Until(b.until))
}
