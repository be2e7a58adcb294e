package edge

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"time"

	"edgegw/edge/modbus"
)

// runState is what Run owns while it runs: the shared transports and the
// bus goroutines. Only Run's goroutine touches it.
type runState struct {
	s     *Scheduler
	ctx   context.Context
	wg    sync.WaitGroup // the UDP reader and the bus goroutines
	udp   *modbus.UDPSocket
	ports map[string]*portRef // serial port or RTU-over-TCP gateway → port
	buses map[*bus]*busRunner
}

type portRef struct {
	port *modbus.RTUPort
	refs int
}

type busRunner struct {
	cancel context.CancelFunc
	done   chan struct{}
}

// Run opens the transports (serial ports first: goburrow/serial uses
// select(), which fails on descriptors ≥ 1024), polls until ctx is done —
// applying the device sets Reload hands it — then closes everything. It
// returns after every goroutine has exited.
func (s *Scheduler) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	rs := &runState{s: s, ctx: ctx, ports: map[string]*portRef{}, buses: map[*bus]*busRunner{}}
	defer func() {
		cancel()
		rs.stopBuses(nil)
		rs.wg.Wait()
		s.stopWrites() // answers queued writes "stopped"
		s.mu.RLock()
		for _, d := range s.devices {
			rs.detach(d)
		}
		s.mu.RUnlock()
		if rs.udp != nil {
			_ = rs.udp.Close()
		}
	}()
	s.mu.RLock()
	devs := append([]*device(nil), s.devices...)
	buses := s.buses
	s.mu.RUnlock()
	if err := rs.attachAll(devs); err != nil {
		return err
	}
	s.startWrites()
	start := time.Now()
	for _, b := range buses {
		rs.startBus(b, start)
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case req := <-s.reload:
			req.res, req.err = rs.apply(req.devs)
			close(req.done)
		}
	}
}

// attachAll opens the connections of devs: serial ports first, then the
// UDP socket, then TCP (which dials lazily).
func (rs *runState) attachAll(devs []*device) error {
	order := append([]*device(nil), devs...)
	rank := map[string]int{TransportRTU: 0, TransportRTUOverTCP: 1, TransportUDP: 2, TransportTCP: 3}
	sort.SliceStable(order, func(i, j int) bool { return rank[order[i].cfg.Transport] < rank[order[j].cfg.Transport] })
	for _, d := range order {
		if err := rs.attach(d); err != nil {
			return err
		}
	}
	return nil
}

// attach opens d's connection (sharing the UDP socket and serial ports).
func (rs *runState) attach(d *device) error {
	s := rs.s
	switch d.cfg.Transport {
	case TransportTCP:
		d.conn = modbus.NewTCP(modbus.TCPConfig{Address: d.cfg.Address, Unit: d.cfg.Unit, Timeout: d.cfg.Timeout, Logger: d.log})
	case TransportUDP:
		if rs.udp == nil {
			sock, err := modbus.NewUDPSocket(modbus.UDPConfig{Listen: s.cfg.UDPListen, BufferBytes: s.cfg.UDPBufferBytes, Logger: s.log, UnknownSource: s.cfg.Acquisition.UDPUnknown()})
			if err != nil {
				return fmt.Errorf("edge: %w", err)
			}
			rs.udp = sock
			rs.wg.Add(1)
			go func() {
				defer rs.wg.Done()
				if err := sock.Run(rs.ctx); err != nil && rs.ctx.Err() == nil {
					s.log.Error("udp socket stopped", "err", err)
				}
			}()
		}
		c, err := rs.udp.Device(d.cfg.Address, d.cfg.Unit, d.cfg.Timeout)
		if err != nil {
			return fmt.Errorf("edge: device %q: %w", d.cfg.Name, err)
		}
		d.conn = c
	case TransportRTU, TransportRTUOverTCP:
		key := portKey(d.cfg)
		p := rs.ports[key]
		if p == nil {
			p = &portRef{}
			if d.cfg.Transport == TransportRTU {
				sc := d.cfg.Serial
				sc.Path = d.cfg.Address
				sc.Logger = s.log.With("port", d.cfg.Address)
				var err error
				if p.port, err = modbus.OpenRTU(sc); err != nil {
					return fmt.Errorf("edge: device %q: %w", d.cfg.Name, err)
				}
			} else {
				p.port = modbus.NewRTUOverTCP(modbus.TCPConfig{Address: d.cfg.Address, Timeout: d.cfg.Timeout, Logger: s.log.With("bus", d.cfg.Address)})
			}
			rs.ports[key] = p
		}
		p.refs++
		d.conn = p.port.Unit(d.cfg.Unit, d.cfg.Timeout)
	default:
		return fmt.Errorf("edge: device %q: unknown transport %q", d.cfg.Name, d.cfg.Transport)
	}
	return nil
}

// portKey names a shared port: the same path with other serial settings is
// another port (conf refuses that within one file).
func portKey(dc DeviceConfig) string {
	return fmt.Sprintf("%s %s %+v", dc.Transport, dc.Address, dc.Serial)
}

// detach closes d's connection, and its port when d was its last unit.
func (rs *runState) detach(d *device) {
	if d.conn == nil {
		return
	}
	if c, ok := d.conn.(interface{ Close() error }); ok {
		_ = c.Close()
	}
	if d.cfg.Transport == TransportRTU || d.cfg.Transport == TransportRTUOverTCP {
		key := portKey(d.cfg)
		if p := rs.ports[key]; p != nil {
			if p.refs--; p.refs == 0 {
				_ = p.port.Close()
				delete(rs.ports, key)
			}
		}
	}
	d.conn = nil
}

// startBus runs b in its own goroutine until stopBuses.
func (rs *runState) startBus(b *bus, start time.Time) {
	ctx, cancel := context.WithCancel(rs.ctx)
	r := &busRunner{cancel: cancel, done: make(chan struct{})}
	rs.buses[b] = r
	rs.wg.Add(1)
	go func() {
		defer rs.wg.Done()
		defer close(r.done)
		b.run(ctx, start, rs.s.cfg.Sink)
	}()
}

// stopBuses stops the buses for which keep is false (all when keep is nil)
// and waits for them: each finishes the poll it is in.
func (rs *runState) stopBuses(keep func(*bus) bool) {
	var stopped []*busRunner
	for b, r := range rs.buses {
		if keep != nil && keep(b) {
			continue
		}
		r.cancel()
		stopped = append(stopped, r)
		delete(rs.buses, b)
	}
	for _, r := range stopped {
		<-r.done
	}
}
