package modbus

import (
	"encoding/binary"
	"fmt"
	"testing"
	"time"

	"edgegw/internal/testenv"
)

// checkRead2 checks a read of 2 registers at a from a fast device
// (testenv.FastModbusUDP, FastModbusTCP): (a+1, a+2).
func checkRead2(t testing.TB, r *Request) {
	if r.Err != nil || len(r.Data) != 4 || binary.BigEndian.Uint16(r.Data) != r.Addr+1 || binary.BigEndian.Uint16(r.Data[2:]) != r.Addr+2 {
		t.Fatalf("read %d: % x %v", r.Addr, r.Data, r.Err)
	}
}

// TestZeroAllocsPerPoll: encode → send → receive → match → decode of a
// 2-register read allocates nothing in steady state, over UDP (one request,
// and a round of 8 batched), and over TCP.
func TestZeroAllocsPerPoll(t *testing.T) {
	s := startSocket(t)
	var reqs []*Request
	for i := range 8 {
		c, err := s.Device(testenv.FastModbusUDP(t, fmt.Sprintf("127.0.1.%d", i+1)), 1, time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		reqs = append(reqs, &Request{Conn: c, Func: 3, Qty: 2})
	}
	one := reqs[0]
	tc := NewTCP(TCPConfig{Address: testenv.FastModbusTCP(t), Unit: 1})
	defer tc.Close()
	tr := &Request{Func: 3, Qty: 2}
	var a uint16
	cases := []struct {
		name string
		poll func()
	}{
		{"udp Do", func() { a++; one.Addr = a; one.Conn.Do(one); checkRead2(t, one) }},
		{"udp SendRound of 8", func() {
			a++
			for _, r := range reqs {
				r.Addr = a
			}
			s.SendRound(reqs, time.Now().Add(5*time.Second))
			for _, r := range reqs {
				checkRead2(t, r)
			}
		}},
		{"tcp Do", func() { a++; tr.Addr = a; tc.Do(tr); checkRead2(t, tr) }},
	}
	for _, c := range cases {
		for range 50 { // warm up: buffers, free lists, the stream
			c.poll()
		}
		if n := testing.AllocsPerRun(500, c.poll); n != 0 {
			t.Errorf("%s: %v allocations per poll, want 0", c.name, n)
		}
	}
	// The measurement sees allocations: the goburrow path makes several.
	n := testing.AllocsPerRun(100, func() {
		if _, err := one.Conn.ReadHoldingRegisters(1, 2); err != nil {
			t.Fatal(err)
		}
	})
	t.Logf("the Read* path (goburrow's client): %v allocations per poll", n)
	if n == 0 {
		t.Error("the Read* path shows 0 allocations: the count measures nothing")
	}
}
