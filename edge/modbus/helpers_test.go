package modbus

import (
	"encoding/binary"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"edgegw/internal/testenv"
)

// poller is the method set the edge scheduler relies on; every per-device
// connection type must have it.
type poller interface {
	ReadCoils(addr, qty uint16) ([]byte, error)
	ReadDiscreteInputs(addr, qty uint16) ([]byte, error)
	ReadHoldingRegisters(addr, qty uint16) ([]byte, error)
	ReadInputRegisters(addr, qty uint16) ([]byte, error)
	WriteSingleCoil(addr uint16, on bool) error
	WriteSingleRegister(addr, value uint16) error
	WriteMultipleRegisters(addr uint16, values []byte) error
	Close() error
	Counters() Counters
}

var (
	_ poller = (*TCPConn)(nil)
	_ poller = (*UDPConn)(nil)
	_ poller = (*RTUConn)(nil)
)

// slave is a minimal Modbus data model for the in-test responders:
// holding register a holds hr[a]; input register a holds a^0x5A5A; coil a
// is set when a%3 == 0 unless written; discrete input a is a%2 == 1.
// Addresses >= 60000 answer exception 2, unknown functions exception 1.
type slave struct {
	mu    sync.Mutex
	hr    [1 << 16]uint16
	coils map[uint16]bool
}

func newSlave() *slave {
	s := &slave{coils: map[uint16]bool{}}
	for i := range s.hr {
		s.hr[i] = uint16(i) * 7
	}
	return s
}

func (s *slave) coil(a uint16) bool {
	if v, ok := s.coils[a]; ok {
		return v
	}
	return a%3 == 0
}

func exc(fc, code byte) []byte { return []byte{fc | 0x80, code} }

// pdu answers one request PDU.
func (s *slave) pdu(req []byte) []byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	fc := req[0]
	if len(req) < 5 {
		return exc(fc, 3)
	}
	a, q := binary.BigEndian.Uint16(req[1:]), binary.BigEndian.Uint16(req[3:])
	switch fc {
	case 1, 2, 3, 4, 16:
		if int(a)+int(q) > 60000 {
			return exc(fc, 2)
		}
	case 5, 6:
		if a >= 60000 {
			return exc(fc, 2)
		}
	}
	switch fc {
	case 1, 2:
		out := []byte{fc, byte((q + 7) / 8)}
		out = append(out, make([]byte, (q+7)/8)...)
		for i := range q {
			on := s.coil(a + i)
			if fc == 2 {
				on = (a+i)%2 == 1
			}
			if on {
				out[2+i/8] |= 1 << (i % 8)
			}
		}
		return out
	case 3, 4:
		out := []byte{fc, byte(2 * q)}
		for i := range q {
			v := s.hr[a+i]
			if fc == 4 {
				v = (a + i) ^ 0x5A5A
			}
			out = binary.BigEndian.AppendUint16(out, v)
		}
		return out
	case 5:
		s.coils[a] = q == 0xFF00
		return append([]byte(nil), req[:5]...)
	case 6:
		s.hr[a] = q
		return append([]byte(nil), req[:5]...)
	case 16:
		for i := range q {
			s.hr[a+i] = binary.BigEndian.Uint16(req[6+2*i:])
		}
		return append([]byte(nil), req[:5]...)
	}
	return exc(fc, 1)
}

// mbap wraps a reply PDU for the request ADU req (same tid and unit).
func mbap(req, pdu []byte) []byte {
	out := make([]byte, 7, 7+len(pdu))
	copy(out, req[:4])
	binary.BigEndian.PutUint16(out[4:], uint16(len(pdu)+1))
	out[6] = req[6]
	return append(out, pdu...)
}

// rtuFrame builds an RTU frame with CRC.
func rtuFrame(unit byte, pdu []byte) []byte {
	f := append([]byte{unit}, pdu...)
	c := crc16(f)
	return append(f, byte(c), byte(c>>8))
}

// readMBAP reads one MBAP frame from a stream.
func readMBAP(r io.Reader) ([]byte, error) {
	hdr := make([]byte, 7)
	if _, err := io.ReadFull(r, hdr); err != nil {
		return nil, err
	}
	n := int(binary.BigEndian.Uint16(hdr[4:]))
	if n < 1 || n > 254 {
		return nil, errors.New("bad length")
	}
	body := make([]byte, n-1)
	if _, err := io.ReadFull(r, body); err != nil {
		return nil, err
	}
	return append(hdr, body...), nil
}

// tcpServer is an in-test MBAP (or RTU-over-TCP) responder on 127.0.0.1:0.
// serve is called per connection and returns when the connection ends.
type tcpServer struct {
	t     testing.TB
	addr  string
	serve func(c net.Conn)

	mu       sync.Mutex
	ln       net.Listener
	conns    map[net.Conn]struct{}
	accepted int
	wg       sync.WaitGroup
}

func startTCPServer(t testing.TB, serve func(c net.Conn)) *tcpServer {
	t.Helper()
	s := &tcpServer{t: t, serve: serve, conns: map[net.Conn]struct{}{}}
	s.listen("127.0.0.1:0")
	s.addr = s.ln.Addr().String()
	t.Cleanup(s.stop)
	return s
}

func (s *tcpServer) listen(addr string) {
	s.t.Helper()
	var ln net.Listener
	var err error
	for range 100 { // the port may still be in use for a moment after a restart
		if ln, err = net.Listen("tcp", addr); err == nil {
			break
		}
	}
	if err != nil {
		s.t.Fatal(err)
	}
	s.mu.Lock()
	s.ln = ln
	s.mu.Unlock()
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s.mu.Lock()
			s.conns[c] = struct{}{}
			s.accepted++
			s.mu.Unlock()
			s.wg.Add(1)
			go func() {
				defer s.wg.Done()
				s.serve(c)
				c.Close()
				s.mu.Lock()
				delete(s.conns, c)
				s.mu.Unlock()
			}()
		}
	}()
}

// stop closes the listener and every connection and waits for them.
func (s *tcpServer) stop() {
	s.mu.Lock()
	if s.ln != nil {
		s.ln.Close()
		s.ln = nil
	}
	for c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	testenv.Wait(s.t, stopLimit, "the tcp server's goroutines to stop", s.wg.Wait)
}

// restart simulates a device reboot: every connection closed, then the
// same address listened on again.
func (s *tcpServer) restart() {
	s.stop()
	s.listen(s.addr)
}

func (s *tcpServer) acceptedCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.accepted
}

// serveMBAP answers every request with reply(req) (nil: no answer).
func serveMBAP(reply func(c net.Conn, req []byte) []byte) func(net.Conn) {
	return func(c net.Conn) {
		for {
			req, err := readMBAP(c)
			if err != nil {
				return
			}
			if out := reply(c, req); out != nil {
				if _, err := c.Write(out); err != nil {
					return
				}
			}
		}
	}
}

// waitFor is testenv.WaitFor: poll a condition with a deadline.
var waitFor = testenv.WaitFor

// stopLimit bounds every wait for a goroutine or process a test stops (a
// Run returning, a responder's goroutines): generous for a loaded machine
// under -race, and a failure naming what hung, not the package's timeout.
const stopLimit = time.Minute

func u16s(b []byte) []uint16 {
	out := make([]uint16, len(b)/2)
	for i := range out {
		out[i] = binary.BigEndian.Uint16(b[2*i:])
	}
	return out
}

// newTestSocket is a UDPSocket without a network socket, for the matcher.
func newTestSocket() *UDPSocket {
	return &UDPSocket{rng: rand.NewChaCha8([32]byte{1}), dests: map[netip.AddrPort]*udpDest{}, byIP: map[netip.Addr]*udpDest{}}
}
