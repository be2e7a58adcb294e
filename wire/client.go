package wire

import (
	"bytes"
	"errors"
)

// Reading the gateway's replies without a full JSON decode, for clients
// that must keep up with it (the measurement stand's thousand clients):
// every local API reply and message that carries samples (shortPolling,
// longPolling, a WebSocket message) has its own "seq" before the first '[' and
// lists samples as the sample encoder writes them, field order fixed.
// EachSample finds every `{"seq":N` after the '[' and the `"ts":T` that
// follows it; it trusts that device and tag names hold no `"ts":` (they
// cannot: conf allows [A-Za-z0-9_.-]).

var (
	keySeq    = []byte(`"seq":`)
	keyTS     = []byte(`"ts":`)
	keyObj    = []byte(`{"seq":`)
	keyReset  = []byte(`"reset":true`)
	keySnapTy = []byte(`"type":"snapshot"`)
)

// ErrMalformed is a reply ReadHead or EachSample cannot read.
var ErrMalformed = errors.New("wire: malformed reply")

// Head is the part of a reply before its sample list.
type Head struct {
	Seq      uint64
	Reset    bool
	Snapshot bool // a WebSocket snapshot message
}

// ReadHead reads the top-level fields of a reply and returns the rest,
// from the sample list's '['.
func ReadHead(b []byte) (Head, []byte, error) {
	j := bytes.IndexByte(b, '[')
	if j < 0 {
		return Head{}, nil, ErrMalformed
	}
	h := b[:j]
	i := bytes.Index(h, keySeq)
	if i < 0 {
		return Head{}, nil, ErrMalformed
	}
	seq, n := parseUint(h[i+len(keySeq):])
	if n == 0 {
		return Head{}, nil, ErrMalformed
	}
	return Head{Seq: seq, Reset: bytes.Contains(h, keyReset), Snapshot: bytes.Contains(h, keySnapTy)}, b[j:], nil
}

// EachSample calls fn for every sample in rest (ReadHead's), in order, with
// its seq, its ts and the length of its JSON object.
func EachSample(rest []byte, fn func(seq uint64, ts int64, size int)) error {
	for {
		i := bytes.Index(rest, keyObj)
		if i < 0 {
			return nil
		}
		whole := len(rest) - i
		rest = rest[i+len(keyObj):]
		seq, n := parseUint(rest)
		if n == 0 {
			return ErrMalformed
		}
		rest = rest[n:]
		k := bytes.Index(rest, keyTS)
		if k < 0 {
			return ErrMalformed
		}
		rest = rest[k+len(keyTS):]
		ts, m := parseUint(rest)
		if m == 0 {
			return ErrMalformed
		}
		rest = rest[m:]
		fn(seq, int64(ts), whole-len(rest)+1) // up to and including the closing '}'
	}
}

func parseUint(b []byte) (v uint64, n int) {
	for n < len(b) && b[n] >= '0' && b[n] <= '9' {
		v = v*10 + uint64(b[n]-'0')
		n++
	}
	return v, n
}
