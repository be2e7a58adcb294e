package web

import (
	"net"
	"sync/atomic"
)

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
