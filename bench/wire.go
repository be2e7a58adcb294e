package bench

import (
	"bytes"
	"errors"
	"net"
	"sync/atomic"
)

// Reading the gateway's replies without a full JSON decode: every reply
// (shortPolling, longPolling, a WebSocket frame, the MQTT peer's payload)
// starts with its own "seq" before the first '[' and lists samples written
// by ringstore.Sample.AppendJSON, whose field order is fixed:
//
//	{"seq":1042,"reset":false,"samples":[{"seq":1041,"device":"d","tag":"t","value":1,"quality":"good","ts":1764450000123456},…]}
//	{"type":"samples","seq":1045,"samples":[…]}
//	{"seq":1042,"tags":[…]}
//
// eachSample finds every `{"seq":N` after the '[' and the `"ts":T` that
// follows it. Device and tag names never contain `"ts":` in the stand.

var (
	keySeq    = []byte(`"seq":`)
	keyTS     = []byte(`"ts":`)
	keyObj    = []byte(`{"seq":`)
	keyReset  = []byte(`"reset":true`)
	keySnapTy = []byte(`"type":"snapshot"`)
)

var errMalformed = errors.New("bench: malformed reply")

// head is the part of a reply before its sample list.
type head struct {
	seq      uint64
	reset    bool
	snapshot bool // a WebSocket snapshot frame
}

// parseHead reads the top-level fields and returns the rest (from '[').
func parseHead(b []byte) (head, []byte, error) {
	j := bytes.IndexByte(b, '[')
	if j < 0 {
		return head{}, nil, errMalformed
	}
	h := b[:j]
	i := bytes.Index(h, keySeq)
	if i < 0 {
		return head{}, nil, errMalformed
	}
	seq, n := parseUint(h[i+len(keySeq):])
	if n == 0 {
		return head{}, nil, errMalformed
	}
	return head{seq: seq, reset: bytes.Contains(h, keyReset), snapshot: bytes.Contains(h, keySnapTy)}, b[j:], nil
}

// eachSample calls fn for every sample in rest, in order, with the length
// of the sample's JSON object.
func eachSample(rest []byte, fn func(seq uint64, ts int64, size int)) error {
	for {
		i := bytes.Index(rest, keyObj)
		if i < 0 {
			return nil
		}
		whole := len(rest) - i
		rest = rest[i+len(keyObj):]
		seq, n := parseUint(rest)
		if n == 0 {
			return errMalformed
		}
		rest = rest[n:]
		k := bytes.Index(rest, keyTS)
		if k < 0 {
			return errMalformed
		}
		rest = rest[k+len(keyTS):]
		ts, m := parseUint(rest)
		if m == 0 {
			return errMalformed
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

// wireCounter counts what crosses the sockets of one step: bytes read and
// written by the application on each connection (HTTP headers and
// WebSocket/MQTT framing included, TCP/IP headers not), and dials.
type wireCounter struct {
	read, written, dials atomic.Uint64
}

func (w *wireCounter) wrap(c net.Conn) net.Conn {
	w.dials.Add(1)
	return &countConn{Conn: c, w: w}
}

type countConn struct {
	net.Conn
	w *wireCounter
}

func (c *countConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.w.read.Add(uint64(n))
	return n, err
}

func (c *countConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	c.w.written.Add(uint64(n))
	return n, err
}
