package web

import (
	"context"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// Connection bounds: MaxConns TCP connections in all (closed at accept
// beyond it), and RateLimits.ConnsPerClient held connections per client.
//
//	429 {"error":"too many open connections from 192.0.2.7 (at most 2000)"} with Retry-After: 1

// connLimiter accepts at most max connections at once; beyond it a new
// connection is closed at once and counted (memory stays bounded whatever
// the flood; the kernel backlog is not left to fill).
type connLimiter struct {
	net.Listener
	s   *Server
	max int64
}

func (l *connLimiter) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if l.s.connsOpen.Add(1) > l.max {
			l.s.connsOpen.Add(-1)
			l.s.connsRefused.Add(1)
			_ = c.Close()
			l.s.rlog.Log(l.s.log, "conns", "web: connection limit reached; closing new connections", "max_conns", l.max)
			continue
		}
		return &countedConn{Conn: c, s: l.s}, nil
	}
}

type countedConn struct {
	net.Conn
	s      *Server
	closed atomic.Bool
}

func (c *countedConn) Close() error {
	if c.closed.CompareAndSwap(false, true) {
		c.s.connsOpen.Add(-1)
	}
	return c.Conn.Close()
}

// connSlots counts the held connections of each client IP (WebSocket
// connections, waiting long polls). An entry lives while its count is > 0,
// so the map is bounded by the connections open (themselves bounded by
// MaxConns).
type connSlots struct {
	mu      sync.Mutex
	n       map[netip.Addr]int
	limited atomic.Uint64 // refused: the client had RateLimits.ConnsPerClient open
}

func (c *connSlots) take(ip netip.Addr, max int) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n[ip] >= max {
		return false
	}
	if c.n == nil {
		c.n = make(map[netip.Addr]int)
	}
	c.n[ip]++
	return true
}

func (c *connSlots) put(ip netip.Addr) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n[ip] <= 1 {
		delete(c.n, ip)
		return
	}
	c.n[ip]--
}

// slot wraps a handler that holds its connection (a WebSocket, a long
// poll): it runs with one of the client's ConnsPerClient slots, or the
// client gets 429 + Retry-After: 1.
func (s *Server) slot(next http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		max := s.lim.cfg.ConnsPerClient
		ip := s.clientIP(r)
		if max < 0 || (ip.IsLoopback() && s.lim.cfg.ExemptLoopback) {
			next(w, r)
			return
		}
		if !s.slots.take(ip, max) {
			s.slots.limited.Add(1)
			s.rlog.Log(s.log, "conns per client", "web: client at its connection limit", "client", ip.String(), "max", max)
			s.tooMany(w, r, time.Second, "too many open connections from "+ip.String()+" (at most "+strconv.Itoa(max)+")")
			return
		}
		h := &slotHold{ip: ip}
		defer func() {
			if !h.kept {
				s.slots.put(ip)
			}
		}()
		next(w, r.WithContext(context.WithValue(r.Context(), slotKey{}, h)))
	}
}

// slotHold is the slot a request runs with; kept: its handler took it over.
type slotHold struct {
	ip   netip.Addr
	kept bool
}

type slotKey struct{}

// keepSlot hands the request's slot to a handler that returns before its
// connection ends (a WebSocket served by goroutines of its own): release
// gives it back once the connection is over.
func (s *Server) keepSlot(r *http.Request) (release func()) {
	h, _ := r.Context().Value(slotKey{}).(*slotHold)
	if h == nil {
		return func() {}
	}
	h.kept = true
	return func() { s.slots.put(h.ip) }
}
