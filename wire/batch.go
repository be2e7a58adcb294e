package wire

import (
	"encoding/json"
	"fmt"
	"strconv"

	"edgegw/ringstore"
)

// GatewayHeader carries the gateway id on the WebSocket handshake, so that
// a receiver knows who is connected before the first batch (for writes).
const GatewayHeader = "Edgegw-Gateway"

// DefaultMaxBatch is the number of samples a receiver accepts in one batch
// unless configured otherwise (a gateway sends at most 500 by default).
const DefaultMaxBatch = 10000

// MaxSkips bounds the skip ranges of one batch.
const MaxSkips = 64

// MaxLoss bounds the loss ranges of one batch.
const MaxLoss = 64

// Loss reasons a gateway sends (a receiver shows any other as it comes).
const (
	LossCrash     = "crash"     // gone after a restart: a torn or corrupt tail cut, or held only in memory when the gateway died
	LossFull      = "full"      // dropped at the gateway's queue bound (buffer.max_bytes), the oldest first
	LossUnwritten = "unwritten" // not writable at the gateway's shutdown (disk failing)
)

// Loss is a range of seqs that were given to samples the gateway lost:
// First..Last of Epoch (16 hex digits), with the reason. In JSON
// {"epoch":"…","first":a,"last":b,"reason":"…"}.
type Loss struct {
	Epoch  string `json:"epoch"`
	First  uint64 `json:"first"`
	Last   uint64 `json:"last"`
	Reason string `json:"reason"`
}

// ProtocolError is a frame that does not follow the protocol. Frame names
// it: "batch", "ack", "uplink" (anything a gateway reads from its uplink),
// "write" (a write body of the local API).
type ProtocolError struct {
	Frame string
	Msg   string
}

func (e *ProtocolError) Error() string { return "wire: " + e.Frame + ": " + e.Msg }

func protoErr(frame, format string, a ...any) *ProtocolError {
	return &ProtocolError{Frame: frame, Msg: fmt.Sprintf(format, a...)}
}

// Range is the seqs First..Last, both included; in JSON [first,last].
type Range struct{ First, Last uint64 }

// MarshalJSON writes [first,last].
func (r Range) MarshalJSON() ([]byte, error) { return r.append(nil), nil }

func (r Range) append(b []byte) []byte {
	b = append(b, '[')
	b = strconv.AppendUint(b, r.First, 10)
	b = append(b, ',')
	b = strconv.AppendUint(b, r.Last, 10)
	return append(b, ']')
}

// UnmarshalJSON reads [first,last].
func (r *Range) UnmarshalJSON(b []byte) error {
	var a [2]uint64
	if err := json.Unmarshal(b, &a); err != nil {
		return err
	}
	r.First, r.Last = a[0], a[1]
	return nil
}

// AppendBatch appends a batch frame (layout in the package comment) of
// samples, which are consecutive in the gateway's queue, strictly
// increasing and of one epoch. gateway is the gateway id already as a JSON
// string; ms writes every ts in Unix milliseconds (and "ts_unit":"ms");
// skips are the ranges of the epoch the batch crosses that were never given
// to a sample.
func AppendBatch(b, gateway []byte, samples []ringstore.Sample, ms bool, skips []Range) []byte {
	return AppendBatchLoss(b, gateway, samples, ms, skips, nil)
}

// AppendBatchLoss is AppendBatch with the loss ranges the batch crosses:
// seqs given to samples the gateway lost (at most MaxLoss; Reason without
// characters JSON escapes).
func AppendBatchLoss(b, gateway []byte, samples []ringstore.Sample, ms bool, skips []Range, loss []Loss) []byte {
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
			b = k.append(b)
		}
		b = append(b, ']')
	}
	if len(loss) > 0 {
		b = append(b, `,"loss":[`...)
		for i, l := range loss {
			if i > 0 {
				b = append(b, ',')
			}
			b = append(b, `{"epoch":"`...)
			b = append(b, l.Epoch...)
			b = append(b, `","first":`...)
			b = strconv.AppendUint(b, l.First, 10)
			b = append(b, `,"last":`...)
			b = strconv.AppendUint(b, l.Last, 10)
			b = append(b, `,"reason":"`...)
			b = append(b, l.Reason...)
			b = append(b, `"}`...)
		}
		b = append(b, ']')
	}
	b = append(b, `,"samples":`...)
	b = ringstore.AppendJSONArrayTS(b, samples, ms)
	return append(b, '}')
}

// AppendAck appends the ack frame: everything up to last is stored.
func AppendAck(b []byte, last uint64) []byte {
	b = append(b, `{"type":"ack","last":`...)
	b = strconv.AppendUint(b, last, 10)
	return append(b, '}')
}

// Batch is a batch frame as a receiver reads it, checked: Samples are
// strictly increasing from First to Last, ts in microseconds whatever the
// frame's ts_unit. A version 1 frame has V 0 and Epoch "".
type Batch struct {
	V       int
	Gateway string
	Epoch   string
	First   uint64
	Last    uint64
	Skip    []Range
	Loss    []Loss // seqs of samples the gateway lost; Epoch "" = the batch's
	Samples []ringstore.Sample
}

// fromGateway is any frame a receiver reads from a gateway: a batch (its
// samples left raw until counted) or the answer to a write command.
type fromGateway struct {
	Type    string          `json:"type"`
	V       int             `json:"v"`
	Gateway string          `json:"gateway"`
	Epoch   string          `json:"epoch"`
	First   uint64          `json:"first"`
	Last    uint64          `json:"last"`
	Skip    []Range         `json:"skip"`
	Loss    []Loss          `json:"loss"`
	Samples json.RawMessage `json:"samples"`
	TSUnit  string          `json:"ts_unit"` // "ms": ts in milliseconds; else µs
	WriteAnswer
}

// ParseBatch reads a batch frame of at most maxSamples samples. The samples
// are counted before they are decoded, so a frame of a million tiny
// elements costs a scan, not a million samples. Every error is a
// *ProtocolError.
func ParseBatch(data []byte, maxSamples int) (*Batch, error) {
	var raw fromGateway
	if err := json.Unmarshal(data, &raw); err != nil {
		return nil, &ProtocolError{Frame: "batch", Msg: err.Error()}
	}
	return raw.batch(maxSamples)
}

// ParseFromGateway reads a frame a receiver gets on a gateway's WebSocket:
// a batch (of at most maxSamples samples) or the answer to a write
// command. Exactly one of batch and answer is set when err is nil; every
// error is a *ProtocolError.
func ParseFromGateway(data []byte, maxSamples int) (batch *Batch, answer *WriteAnswer, err error) {
	var raw fromGateway
	if err := json.Unmarshal(data, &raw); err != nil {
		return nil, nil, &ProtocolError{Frame: "batch", Msg: err.Error()}
	}
	if raw.Type == "write_result" {
		return nil, &raw.WriteAnswer, nil
	}
	batch, err = raw.batch(maxSamples)
	return batch, nil, err
}

// batch checks and decodes a batch of at most max samples.
func (raw *fromGateway) batch(max int) (*Batch, error) {
	if raw.Type != "batch" {
		return nil, protoErr("batch", "type %.40q", raw.Type)
	}
	if n := CountElements(raw.Samples); n > max {
		return nil, protoErr("batch", "%d samples (at most %d)", n, max)
	}
	f := Batch{V: raw.V, Gateway: raw.Gateway, Epoch: raw.Epoch, First: raw.First, Last: raw.Last, Skip: raw.Skip, Loss: raw.Loss}
	if len(raw.Samples) > 0 {
		if err := json.Unmarshal(raw.Samples, &f.Samples); err != nil {
			return nil, &ProtocolError{Frame: "batch", Msg: err.Error()}
		}
	}
	switch raw.TSUnit {
	case "", "us":
	case "ms":
		for i := range f.Samples { // a receiver keeps microseconds whatever the gateway sends
			f.Samples[i].TS *= 1000
		}
	default:
		return nil, protoErr("batch", "ts_unit %.10q", raw.TSUnit)
	}
	if err := f.check(); err != nil {
		return nil, err
	}
	return &f, nil
}

func (f *Batch) check() error {
	switch {
	case f.Gateway == "":
		return protoErr("batch", "no gateway")
	case len(f.Samples) == 0:
		return protoErr("batch", "no samples")
	case f.Samples[0].Seq != f.First || f.Samples[len(f.Samples)-1].Seq != f.Last:
		return protoErr("batch", "first/last %d/%d do not match the samples", f.First, f.Last)
	case f.V >= 2 && f.Epoch == "":
		return protoErr("batch", "version 2 without an epoch")
	case len(f.Skip) > MaxSkips:
		return protoErr("batch", "%d skip ranges (at most %d)", len(f.Skip), MaxSkips)
	case len(f.Loss) > MaxLoss:
		return protoErr("batch", "%d loss ranges (at most %d)", len(f.Loss), MaxLoss)
	}
	if f.Epoch != "" {
		if _, err := ringstore.ParseEpoch(f.Epoch); err != nil {
			return &ProtocolError{Frame: "batch", Msg: err.Error()}
		}
	}
	for _, k := range f.Skip {
		if k.First > k.Last || k.Last >= f.Last {
			return protoErr("batch", "skip [%d,%d] is not a range below last %d", k.First, k.Last, f.Last)
		}
	}
	for i := range f.Loss {
		l := &f.Loss[i]
		if l.First > l.Last || l.Last >= f.Last {
			return protoErr("batch", "loss [%d,%d] is not a range below last %d", l.First, l.Last, f.Last)
		}
		if l.Epoch == "" {
			l.Epoch = f.Epoch
		} else if _, err := ringstore.ParseEpoch(l.Epoch); err != nil {
			return &ProtocolError{Frame: "batch", Msg: "loss: " + err.Error()}
		}
		if len(l.Reason) > 64 {
			return protoErr("batch", "loss reason of %d bytes (at most 64)", len(l.Reason))
		}
	}
	for i := 1; i < len(f.Samples); i++ {
		if f.Samples[i].Seq <= f.Samples[i-1].Seq {
			return protoErr("batch", "seq %d after %d", f.Samples[i].Seq, f.Samples[i-1].Seq)
		}
	}
	return nil
}

// AppendStored appends the line the reference receiver writes for a new
// sample: the sample's object with the gateway (already a JSON string) and,
// when not "", the epoch in front, and a newline:
//
//	{"gateway":"gw-01","epoch":"9f3c04e1a2b3c4d5","seq":42,"device":"logger-01",…,"ts":1764450000123456}
func AppendStored(b, gateway []byte, epoch string, s *ringstore.Sample) []byte {
	b = append(b, `{"gateway":`...)
	b = append(b, gateway...)
	if epoch != "" {
		b = append(b, `,"epoch":"`...)
		b = append(b, epoch...)
		b = append(b, '"')
	}
	b = append(b, ',')
	j := len(b)
	b = s.AppendJSON(b)
	b = append(b[:j], b[j+1:]...) // drop the sample's own '{'
	return append(b, '\n')
}
