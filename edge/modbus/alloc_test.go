package modbus

import (
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"edgegw/internal/testenv"
)

// fastUDPDevice answers every read of 2 holding registers with (addr,
// addr+1), from fixed buffers: it allocates nothing per request, so the
// allocation counts below are the gateway's alone.
func fastUDPDevice(t testing.TB, ip string) string {
	t.Helper()
	conn, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.ParseIP(ip)})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		var in [512]byte
		var out [13]byte
		for {
			n, src, err := conn.ReadFromUDPAddrPort(in[:])
			if err != nil {
				return
			}
			if n < 12 {
				continue
			}
			fastReply(in[:12], out[:])
			_, _ = conn.WriteToUDPAddrPort(out[:], src)
		}
	}()
	t.Cleanup(func() { conn.Close(); testenv.Wait(t, stopLimit, "the fast udp logger to stop", wg.Wait) })
	return conn.LocalAddr().String()
}

// fastReply writes the 13-byte reply to a 12-byte read of 2 registers.
func fastReply(req, out []byte) {
	copy(out, req[:4])
	binary.BigEndian.PutUint16(out[4:], 7)
	out[6], out[7], out[8] = req[6], req[7], 4
	a := binary.BigEndian.Uint16(req[8:])
	binary.BigEndian.PutUint16(out[9:], a)
	binary.BigEndian.PutUint16(out[11:], a+1)
}

// fastTCPDevice is fastUDPDevice over one TCP connection at a time.
func fastTCPDevice(t testing.TB) string {
	t.Helper()
	srv := startTCPServer(t, func(c net.Conn) {
		var in [12]byte
		var out [13]byte
		for {
			if _, err := io.ReadFull(c, in[:]); err != nil {
				return
			}
			fastReply(in[:], out[:])
			if _, err := c.Write(out[:]); err != nil {
				return
			}
		}
	})
	return srv.addr
}

func checkRead2(t testing.TB, r *Request) {
	if r.Err != nil || len(r.Data) != 4 || binary.BigEndian.Uint16(r.Data) != r.Addr || binary.BigEndian.Uint16(r.Data[2:]) != r.Addr+1 {
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
		c, err := s.Device(fastUDPDevice(t, fmt.Sprintf("127.0.1.%d", i+1)), 1, time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		reqs = append(reqs, &Request{Conn: c, Func: 3, Qty: 2})
	}
	one := reqs[0]
	tc := NewTCP(TCPConfig{Address: fastTCPDevice(t), Unit: 1})
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
