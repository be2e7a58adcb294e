package mbserver

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"sort"
	"strconv"
	"sync"
	"time"

	"edgegw/internal/backoff"
	"edgegw/ringstore"
	"edgegw/stats"
)

// Passer does one pass-through request on the bus that polls device and
// returns the reply PDU (which may be an exception from the device), the
// time it waited for the bus and the polls it waited for. Its errors may
// have a PassErrorKind() string method (edge.PassError): "busy" is answered
// with exception 0x06, "timeout" and "failed" with 0x0B, anything else with
// 0x0A.
type Passer interface {
	Pass(ctx context.Context, device string, pdu []byte, origin string) (reply []byte, waited time.Duration, polls int, err error)
}

// Latest is the ring's latest value of every tag (*ringstore.Ring).
type Latest interface {
	Snapshot() *ringstore.Snapshot
}

var _ Latest = (*ringstore.Ring)(nil)

// Modbus exception codes this server answers with.
const (
	ExIllegalFunction = 0x01 // unknown function, or a write while writes are off
	ExIllegalAddress  = 0x02 // mirror: outside the map
	ExIllegalValue    = 0x03 // a request field out of range
	ExDeviceFailure   = 0x04 // mirror: a tag in the range has no good value
	ExBusy            = 0x06 // the client's in-flight bound or the bus's queue is full: try again
	ExPathUnavailable = 0x0A // no such unit, the device is down or the gateway stops
	ExTargetFailed    = 0x0B // the device did not answer in its timeout (or garbled the reply)
)

// Defaults for the zero values of Config.
const (
	DefaultMaxConns    = 16
	DefaultMaxInFlight = 4
	DefaultIdleTimeout = 60 * time.Second
	maxADU             = 260
	mbapHeader         = 7
)

// Config is one server; its zero value (with Listen, Ring and Passer) means defaults.
type Config struct {
	Listen          string         // "host:port"; ":0" picks a port
	AllowedNetworks []netip.Prefix // clients outside are closed at accept (counted); empty = every client
	MaxConns        int            // open connections (16); one more is closed at accept and counted
	// MaxInFlight bounds the pass-through requests of one client address
	// (all its connections) at once (4); one more is answered 0x06 and counted.
	MaxInFlight int
	IdleTimeout time.Duration    // a connection without a request for this long is closed (60s)
	Writes      bool             // pass-through writes (FC5, FC6, FC16) reach devices; else exception 0x01
	Units       map[uint8]string // TCP unit id -> device name (its bus and its own unit id)
	Mirror      *Mirror          // nil: no mirror unit

	Passer Passer              // required when Units is not empty
	Ring   Latest              // required with a Mirror
	Stats  *stats.ModbusServer // nil: kept privately
	Logger *slog.Logger
}

// Server is one Modbus TCP server.
type Server struct {
	cfg    Config
	log    *slog.Logger
	st     *stats.ModbusServer
	mirror *mirror
	ln     net.Listener
	warn   backoff.Log // refusals, at most one line a second per kind

	mu       sync.Mutex
	inFlight map[netip.Addr]int
	conns    map[net.Conn]bool
}

// New checks cfg and fills defaults. It opens nothing and starts no goroutine.
func New(cfg Config) (*Server, error) {
	if cfg.MaxConns <= 0 {
		cfg.MaxConns = DefaultMaxConns
	}
	if cfg.MaxInFlight <= 0 {
		cfg.MaxInFlight = DefaultMaxInFlight
	}
	if cfg.IdleTimeout <= 0 {
		cfg.IdleTimeout = DefaultIdleTimeout
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Stats == nil {
		cfg.Stats = new(stats.ModbusServer)
	}
	if cfg.Stats.Listen == "" {
		cfg.Stats.Listen = cfg.Listen
	}
	if len(cfg.Units) > 0 && cfg.Passer == nil {
		return nil, errors.New("mbserver: units are mapped but no Passer is given")
	}
	s := &Server{cfg: cfg, log: cfg.Logger, st: cfg.Stats, inFlight: map[netip.Addr]int{}, conns: map[net.Conn]bool{},
		warn: backoff.Log{Every: time.Second, Level: slog.LevelWarn}}
	if m := cfg.Mirror; m != nil {
		if cfg.Ring == nil {
			return nil, errors.New("mbserver: a mirror needs the ring")
		}
		if _, ok := cfg.Units[m.Unit]; ok {
			return nil, fmt.Errorf("mbserver: unit %d is both the mirror and a pass-through unit", m.Unit)
		}
		var err error
		if s.mirror, err = newMirror(*m, cfg.Ring); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// Listen binds the listener and returns its address (also the Stats'
// Listen from then on: call it before Stats are read elsewhere).
func (s *Server) Listen() (net.Addr, error) {
	ln, err := net.Listen("tcp", s.cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("mbserver: %w", err)
	}
	s.ln = ln
	s.st.Listen = ln.Addr().String()
	return ln.Addr(), nil
}

// Stats is the server's counter record.
func (s *Server) Stats() *stats.ModbusServer { return s.st }

// Serve accepts clients until ctx is done (Listen first, or Serve listens),
// then closes every connection and returns after all goroutines exited.
func (s *Server) Serve(ctx context.Context) error {
	if s.ln == nil {
		if _, err := s.Listen(); err != nil {
			return err
		}
	}
	ln := s.ln
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // the closer: ends Accept and every connection's read
		defer wg.Done()
		<-ctx.Done()
		_ = ln.Close()
		s.mu.Lock()
		for c := range s.conns {
			_ = c.Close()
		}
		s.mu.Unlock()
	}()
	for {
		c, aerr := ln.Accept()
		if aerr != nil {
			if ctx.Err() != nil || errors.Is(aerr, net.ErrClosed) {
				break
			}
			// Out of descriptors or the like: the connection waits in
			// the backlog; try again shortly, never stop serving.
			s.st.AcceptErrors.Add(1)
			s.warn.Log(s.log, "accept", "accept failed", "err", aerr)
			select {
			case <-ctx.Done():
			case <-time.After(50 * time.Millisecond):
			}
			continue
		}
		if !s.admit(ctx, c) {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.serveConn(ctx, c)
		}()
	}
	cancel()
	wg.Wait()
	return nil
}

// admit registers c, or closes it (counted) when its client is not allowed
// or MaxConns are open.
func (s *Server) admit(ctx context.Context, c net.Conn) bool {
	ap, _ := netip.ParseAddrPort(c.RemoteAddr().String())
	addr := ap.Addr().Unmap()
	why := ""
	if !s.allowed(addr) {
		why = "not in allowed_networks"
	}
	s.mu.Lock()
	if why == "" && len(s.conns) >= s.cfg.MaxConns {
		why = "max_connections (" + strconv.Itoa(s.cfg.MaxConns) + ") open"
	}
	if why == "" && ctx.Err() == nil {
		s.conns[c] = true
		s.mu.Unlock()
		s.st.Accepted.Add(1)
		s.st.Connections.Add(1)
		return true
	}
	s.mu.Unlock()
	_ = c.Close()
	s.st.ConnsRefused.Add(1)
	s.warn.Log(s.log, "conn "+why, "connection refused", "client", c.RemoteAddr().String(), "why", why)
	return false
}

func (s *Server) allowed(a netip.Addr) bool {
	if len(s.cfg.AllowedNetworks) == 0 {
		return true
	}
	for _, p := range s.cfg.AllowedNetworks {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// serveConn reads one request, answers it, and reads the next, until the
// client goes, sends a malformed frame, is idle for IdleTimeout, or ctx ends.
//
//	MBAP request/reply: tid(2) protocol(2)=0 length(2)=1+len(pdu) unit(1) pdu
func (s *Server) serveConn(ctx context.Context, c net.Conn) {
	defer func() {
		s.mu.Lock()
		delete(s.conns, c)
		s.mu.Unlock()
		_ = c.Close()
		s.st.Connections.Add(-1)
	}()
	origin := "modbus " + c.RemoteAddr().String()
	ap, _ := netip.ParseAddrPort(c.RemoteAddr().String())
	client := ap.Addr().Unmap()
	var hdr [mbapHeader]byte
	buf := make([]byte, maxADU)
	for ctx.Err() == nil {
		_ = c.SetReadDeadline(time.Now().Add(s.cfg.IdleTimeout))
		if _, err := io.ReadFull(c, hdr[:]); err != nil {
			return
		}
		n := int(binary.BigEndian.Uint16(hdr[4:]))
		if binary.BigEndian.Uint16(hdr[2:]) != 0 || n < 2 || n > maxADU-6 {
			s.warn.Log(s.log, "bad frame", "malformed MBAP header: connection closed", "client", origin)
			return
		}
		pdu := buf[:n-1]
		if _, err := io.ReadFull(c, pdu); err != nil {
			return
		}
		reply := s.handle(ctx, client, origin, hdr[6], pdu)
		if reply == nil { // the gateway stops
			return
		}
		out := make([]byte, mbapHeader, mbapHeader+len(reply))
		copy(out, hdr[:])
		binary.BigEndian.PutUint16(out[4:], uint16(1+len(reply)))
		out = append(out, reply...)
		_ = c.SetWriteDeadline(time.Now().Add(10 * time.Second))
		if _, err := c.Write(out); err != nil {
			return
		}
	}
}

func exception(fc, code byte) []byte { return []byte{fc | 0x80, code} }

// handle answers one request PDU for unit; nil means close the connection.
func (s *Server) handle(ctx context.Context, client netip.Addr, origin string, unit byte, pdu []byte) []byte {
	s.st.Requests.Add(1)
	reply := s.answer(ctx, client, origin, unit, pdu)
	if len(reply) == 2 && reply[0]&0x80 != 0 && int(reply[1]) < len(s.st.Exceptions) {
		s.st.Exceptions[reply[1]].Add(1)
	}
	return reply
}

func isWrite(fc byte) bool { return fc == 5 || fc == 6 || fc == 15 || fc == 16 }

func (s *Server) answer(ctx context.Context, client netip.Addr, origin string, unit byte, pdu []byte) []byte {
	fc := pdu[0]
	if s.mirror != nil && unit == s.mirror.cfg.Unit {
		s.st.MirrorRequests.Add(1)
		if isWrite(fc) {
			s.st.WritesRefused.Add(1)
			return exception(fc, ExIllegalFunction)
		}
		return s.mirror.answer(pdu)
	}
	dev, ok := s.cfg.Units[unit]
	if !ok {
		return exception(fc, ExPathUnavailable)
	}
	if isWrite(fc) && !s.cfg.Writes {
		s.st.WritesRefused.Add(1)
		s.warn.Log(s.log, "write refused", "pass-through write refused: writes are off", "client", origin, "unit", unit, "device", dev, "function", fc)
		return exception(fc, ExIllegalFunction)
	}
	if !s.acquire(client) {
		s.st.Busy.Add(1)
		s.warn.Log(s.log, "busy client", "pass-through refused: the client has its requests in flight", "client", origin, "max_in_flight", s.cfg.MaxInFlight)
		return exception(fc, ExBusy)
	}
	defer s.release(client)
	s.st.PassRequests.Add(1)
	reply, waited, polls, err := s.cfg.Passer.Pass(ctx, dev, append([]byte(nil), pdu...), origin)
	if err == nil || waited > 0 {
		s.st.Wait.Observe(waited)
		s.st.WaitPolls[min(max(polls, 0), len(s.st.WaitPolls)-1)].Add(1)
	}
	if isWrite(fc) {
		s.st.Writes.Add(1)
		s.log.Info("pass-through write", "client", origin, "unit", unit, "device", dev, "function", fc,
			"address", addrOf(pdu), "result", resultText(reply, err), "err", errText(err))
	}
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		var k interface{ PassErrorKind() string }
		kind := ""
		if errors.As(err, &k) {
			kind = k.PassErrorKind()
		}
		switch kind {
		case "busy":
			s.st.Busy.Add(1)
			s.warn.Log(s.log, "busy bus", "pass-through refused: the bus's queue is full", "client", origin, "device", dev)
			return exception(fc, ExBusy)
		case "timeout", "failed":
			return exception(fc, ExTargetFailed)
		}
		return exception(fc, ExPathUnavailable)
	}
	return reply
}

func addrOf(pdu []byte) int {
	if len(pdu) < 3 {
		return -1
	}
	return int(binary.BigEndian.Uint16(pdu[1:]))
}

func resultText(reply []byte, err error) string {
	switch {
	case err != nil:
		return "failed"
	case len(reply) == 2 && reply[0]&0x80 != 0:
		return "exception " + strconv.Itoa(int(reply[1]))
	}
	return "ok"
}

func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

func (s *Server) acquire(a netip.Addr) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.inFlight[a] >= s.cfg.MaxInFlight {
		return false
	}
	s.inFlight[a]++
	return true
}

func (s *Server) release(a netip.Addr) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.inFlight[a]--; s.inFlight[a] <= 0 {
		delete(s.inFlight, a)
	}
}

// UnitsSorted lists the mapped unit ids in order (for display).
func UnitsSorted(m map[uint8]string) []uint8 {
	out := make([]uint8, 0, len(m))
	for u := range m {
		out = append(out, u)
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}
