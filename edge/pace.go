package edge

import (
	"time"

	"edgegw/edge/modbus"
)

// pacer keeps a pause between the requests of one connection: the next
// request starts no earlier than pause after the previous one ended. It
// belongs to the bus goroutine that owns the connection.
type pacer struct {
	pause time.Duration
	last  time.Time // end of the previous request
}

func (p *pacer) wait() {
	if p.last.IsZero() {
		return
	}
	if w := time.Until(p.last.Add(p.pause)); w > 0 {
		time.Sleep(w) // the bus has nothing else to do on this connection meanwhile
	}
}

func (p *pacer) done() { p.last = time.Now() }

// pacedConn is a connection whose requests go through a pacer.
type pacedConn struct {
	c readWriter
	p *pacer
}

var (
	_ readWriter = (*pacedConn)(nil)
	_ counted    = (*pacedConn)(nil)
)

func (c *pacedConn) ReadCoils(addr, qty uint16) ([]byte, error) {
	c.p.wait()
	defer c.p.done()
	return c.c.ReadCoils(addr, qty)
}

func (c *pacedConn) ReadDiscreteInputs(addr, qty uint16) ([]byte, error) {
	c.p.wait()
	defer c.p.done()
	return c.c.ReadDiscreteInputs(addr, qty)
}

func (c *pacedConn) ReadHoldingRegisters(addr, qty uint16) ([]byte, error) {
	c.p.wait()
	defer c.p.done()
	return c.c.ReadHoldingRegisters(addr, qty)
}

func (c *pacedConn) ReadInputRegisters(addr, qty uint16) ([]byte, error) {
	c.p.wait()
	defer c.p.done()
	return c.c.ReadInputRegisters(addr, qty)
}

func (c *pacedConn) WriteSingleCoil(addr uint16, on bool) error {
	c.p.wait()
	defer c.p.done()
	return c.c.WriteSingleCoil(addr, on)
}

func (c *pacedConn) WriteSingleRegister(addr, value uint16) error {
	c.p.wait()
	defer c.p.done()
	return c.c.WriteSingleRegister(addr, value)
}

func (c *pacedConn) WriteMultipleRegisters(addr uint16, values []byte) error {
	c.p.wait()
	defer c.p.done()
	return c.c.WriteMultipleRegisters(addr, values)
}

func (c *pacedConn) Counters() modbus.Counters {
	if cc, ok := c.c.(counted); ok {
		return cc.Counters()
	}
	return modbus.Counters{}
}

func (c *pacedConn) Close() error {
	if cl, ok := c.c.(interface{ Close() error }); ok {
		return cl.Close()
	}
	return nil
}

// paced wraps c in p when p is not nil.
func paced(c readWriter, p *pacer) Conn {
	if p == nil {
		return c
	}
	return &pacedConn{c: c, p: p}
}
