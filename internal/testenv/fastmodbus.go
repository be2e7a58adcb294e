package testenv

import (
	"encoding/binary"
	"io"
	"net"
	"sync"
	"testing"
	"time"
)

// The fast Modbus devices answer every read of 2 registers at address a
// (a 12-byte MBAP request, function 3 or 4) with the values (a+1, a+2),
// from fixed buffers: they allocate nothing per request, so a test's
// allocation counts are the gateway's alone. They serve until the test
// ends, which closes them and waits (at most fastStopLimit) for their
// goroutines.

// fastStopLimit bounds the wait for a fast device's goroutines at cleanup.
const fastStopLimit = time.Minute

// fastReply writes the 13-byte reply to a 12-byte MBAP read of 2
// registers at a: the request's transaction, protocol, unit and function,
// length 7, byte count 4, then a+1 and a+2.
func fastReply(req, out []byte) {
	copy(out, req[:4])
	binary.BigEndian.PutUint16(out[4:], 7)
	out[6], out[7], out[8] = req[6], req[7], 4
	a := binary.BigEndian.Uint16(req[8:])
	binary.BigEndian.PutUint16(out[9:], a+1)
	binary.BigEndian.PutUint16(out[11:], a+2)
}

// FastModbusUDP is a fast Modbus UDP device on ip (any 127.0.0.0/8
// address: a device of its own for each address), port chosen by the
// kernel; it returns its address. A datagram of another length than 12
// bytes is not answered.
func FastModbusUDP(t testing.TB, ip string) string {
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
			if n == 12 {
				fastReply(in[:12], out[:])
				_, _ = conn.WriteToUDPAddrPort(out[:], src)
			}
		}
	}()
	t.Cleanup(func() { conn.Close(); Wait(t, fastStopLimit, "the fast udp device to stop", wg.Wait) })
	return conn.LocalAddr().String()
}

// FastModbusTCP is FastModbusUDP over TCP on 127.0.0.1, one connection at
// a time (the next is accepted when the last one closes).
func FastModbusTCP(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conn net.Conn // the one being served, closed at cleanup
	closed := false   // set at cleanup: a connection accepted after is closed at once
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conn = c
			if closed {
				c.Close()
			}
			mu.Unlock()
			var in [12]byte
			var out [13]byte
			for {
				if _, err := io.ReadFull(c, in[:]); err != nil {
					break
				}
				fastReply(in[:], out[:])
				if _, err := c.Write(out[:]); err != nil {
					break
				}
			}
			c.Close()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		closed = true
		if conn != nil {
			conn.Close()
		}
		mu.Unlock()
		Wait(t, fastStopLimit, "the fast tcp device to stop", wg.Wait)
	})
	return ln.Addr().String()
}
