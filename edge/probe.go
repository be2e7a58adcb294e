package edge

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"edgegw/edge/modbus"
)

// A ProbeBus is one transport opened for one-off requests, outside a
// Scheduler (edgegw read and scan, on site): the serial line, TCP stream or
// UDP socket that Run would open for a device of the same transport,
// address and serial settings, with edge/modbus's framing, timeouts and
// checks. Its units (Unit) are asked one request at a time, from one
// goroutine.
type ProbeBus struct {
	dc   DeviceConfig
	rtu  *modbus.RTUPort
	tcp  *modbus.TCPPort
	udp  *modbus.UDPSocket
	stop context.CancelFunc
	wg   sync.WaitGroup // the UDP socket's reader
}

// OpenProbeBus opens dc's transport (dc.Unit and dc.Tags are not used):
// a serial port now, a TCP stream on the first request, a UDP socket on
// ":0" with its reader goroutine (Close stops it).
func OpenProbeBus(dc DeviceConfig, log *slog.Logger) (*ProbeBus, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if dc.Timeout <= 0 {
		dc.Timeout = DefaultTimeout
	}
	b := &ProbeBus{dc: dc}
	tc := modbus.TCPConfig{Address: dc.Address, Timeout: dc.Timeout, Logger: log}
	switch dc.Transport {
	case TransportRTU, TransportASCII:
		sc := dc.Serial
		sc.Path, sc.Timeout, sc.Logger = dc.Address, dc.Timeout, log
		open := modbus.OpenRTU
		if dc.Transport == TransportASCII {
			open = modbus.OpenASCII
		}
		var err error
		if b.rtu, err = open(sc); err != nil {
			return nil, fmt.Errorf("edge: %w", err)
		}
	case TransportRTUOverTCP:
		b.rtu = modbus.NewRTUOverTCP(tc)
	case TransportASCIIOverTCP:
		b.rtu = modbus.NewASCIIOverTCP(tc)
	case TransportTCP:
		b.tcp = modbus.NewTCPPort(tc)
	case TransportUDP:
		sock, err := modbus.NewUDPSocket(modbus.UDPConfig{Listen: ":0", Logger: log})
		if err != nil {
			return nil, fmt.Errorf("edge: %w", err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		b.udp, b.stop = sock, cancel
		b.wg.Add(1)
		go func() {
			defer b.wg.Done()
			_ = sock.Run(ctx)
		}()
	default:
		return nil, fmt.Errorf("edge: unknown transport %q", dc.Transport)
	}
	return b, nil
}

// Close closes the transport and waits for the UDP reader.
func (b *ProbeBus) Close() error {
	var err error
	switch {
	case b.rtu != nil:
		err = b.rtu.Close()
	case b.tcp != nil:
		err = b.tcp.Close()
	case b.udp != nil:
		b.stop()
		err = b.udp.Close()
		b.wg.Wait()
	}
	return err
}

// probeConn is what a Probe asks of a unit's connection: the reads and the
// identification functions every connection of edge/modbus has.
type probeConn interface {
	Conn
	ReadDeviceIdentification() (modbus.DeviceID, error)
	ReportServerID() ([]byte, error)
}

var (
	_ probeConn = (*modbus.RTUConn)(nil)
	_ probeConn = (*modbus.TCPUnitConn)(nil)
	_ probeConn = (*modbus.UDPConn)(nil)
)

// A Probe is one unit of a ProbeBus.
type Probe struct {
	conn probeConn
	err  error // the UDP destination did not resolve
}

// Unit returns unit u of the bus with reply timeout timeout (the bus's if 0).
func (b *ProbeBus) Unit(u uint8, timeout time.Duration) *Probe {
	if timeout <= 0 {
		timeout = b.dc.Timeout
	}
	switch {
	case b.rtu != nil:
		return &Probe{conn: b.rtu.Unit(u, timeout)}
	case b.tcp != nil:
		return &Probe{conn: b.tcp.Unit(u, timeout)}
	}
	c, err := b.udp.Device(b.dc.Address, u, timeout)
	if err != nil {
		return &Probe{err: fmt.Errorf("edge: %w", err)}
	}
	return &Probe{conn: c}
}

// Read does one read of qty registers or bits of table r from addr and
// returns the reply's data (registers big-endian, bits packed LSB first,
// lengths checked) and the round-trip time. An exception is a
// *modbus.ModbusError (modbus.IsException), no reply modbus.ErrTimeout.
func (p *Probe) Read(r Register, addr, qty uint16) ([]byte, time.Duration, error) {
	if p.err != nil {
		return nil, 0, p.err
	}
	t0 := time.Now()
	var data []byte
	var err error
	switch r {
	case Holding:
		data, err = p.conn.ReadHoldingRegisters(addr, qty)
	case Input:
		data, err = p.conn.ReadInputRegisters(addr, qty)
	case Coil:
		data, err = p.conn.ReadCoils(addr, qty)
	default:
		data, err = p.conn.ReadDiscreteInputs(addr, qty)
	}
	return data, time.Since(t0), err
}

// DeviceIdentification reads the basic identification objects (43/14).
func (p *Probe) DeviceIdentification() (modbus.DeviceID, error) {
	if p.err != nil {
		return modbus.DeviceID{}, p.err
	}
	return p.conn.ReadDeviceIdentification()
}

// ServerID sends Report Server ID (17) and returns the reply's data.
func (p *Probe) ServerID() ([]byte, error) {
	if p.err != nil {
		return nil, p.err
	}
	return p.conn.ReportServerID()
}

// Normalize returns the bytes of a value's registers regs (as on the wire)
// in big-endian ABCD order, as DecodeRegisters reads them: for showing a
// value in every byte order (edgegw read).
func Normalize(regs []byte, o Order) []byte {
	b := make([]byte, len(regs)&^1)
	normalize(b, regs[:len(b)], o)
	return b
}
