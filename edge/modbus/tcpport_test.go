package modbus

import (
	"encoding/binary"
	"errors"
	"io"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"edgegw/internal/testenv"
)

var _ poller = (*TCPUnitConn)(nil)

// A shared stream drops a reply from the wrong unit (counted) and skips a
// late reply to an earlier request (counted), on the one connection: the
// next request of either unit gets its own answer.
func TestTCPPortWrongUnitAndLateReply(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var accepted atomic.Int32
	done := make(chan struct{})
	go func() {
		defer close(done)
		c, err := l.Accept()
		if err != nil {
			return
		}
		accepted.Add(1)
		defer c.Close()
		reply := func(req []byte, unit byte, tid uint16) {
			r := []byte{0, 0, 0, 0, 0, 5, unit, 3, 2, 0, req[6]}
			binary.BigEndian.PutUint16(r, tid)
			_, _ = c.Write(r)
		}
		var prev uint16
		for n := 0; ; n++ {
			req := make([]byte, 12)
			if _, err := io.ReadFull(c, req); err != nil {
				return
			}
			tid := binary.BigEndian.Uint16(req)
			switch n {
			case 0: // the wrong unit answers; the right one never does
				reply(req, req[6]+1, tid)
			case 1: // first the late answer to request 0, then this one's
				reply(req, req[6], prev)
				reply(req, req[6], tid)
			default:
				reply(req, req[6], tid)
			}
			prev = tid
		}
	}()
	defer func() { l.Close(); testenv.Closed(t, done, stopLimit, "the pipelined device to stop") }()

	p := NewTCPPort(TCPConfig{Address: l.Addr().String(), Timeout: 200 * time.Millisecond})
	defer p.Close()
	u1, u2 := p.Unit(1, 0), p.Unit(2, 0)
	if _, err := u1.ReadHoldingRegisters(0, 1); !errors.Is(err, ErrTimeout) {
		t.Fatalf("wrong unit's reply: err %v, want a timeout", err)
	}
	if c := u1.Counters(); c.Dropped != 1 {
		t.Errorf("unit 1 counters %+v, want 1 dropped", c)
	}
	b, err := u2.ReadHoldingRegisters(0, 1)
	if err != nil || b[1] != 2 {
		t.Fatalf("unit 2 after a late reply: %v %v", b, err)
	}
	if c := u2.Counters(); c.Late != 1 || c.Dropped != 0 {
		t.Errorf("unit 2 counters %+v, want 1 late", c)
	}
	if b, err := u1.ReadHoldingRegisters(0, 1); err != nil || b[1] != 1 {
		t.Fatalf("unit 1 again: %v %v", b, err)
	}
	if n := accepted.Load(); n != 1 {
		t.Errorf("%d connections, want 1", n)
	}
}
