package bench

import (
	"net"
	"sync/atomic"
)

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
