package edge

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"time"

	"edgegw/edge/modbus"
	"edgegw/internal/backoff"
)

// runState is what Run owns while it runs: the shared transports and the
// bus goroutines. Only Run's goroutine touches buses; the transports
// (udp, ports, failed) are also opened from bus goroutines retrying a
// device that is down, under mu.
type runState struct {
	s     *Scheduler
	ctx   context.Context
	epoch time.Time      // Run's start: every device's windows are aligned to it (aligned)
	wg    sync.WaitGroup // the UDP reader, the clock, the UDP round and the bus goroutines
	buses map[*bus]*busRunner
	clock *clock
	round *udpRound     // started with the first UDP bus
	stopR func()        // stops round
	udpB  map[*bus]bool // the buses in round

	mu     sync.Mutex
	udp    *modbus.UDPSocket
	ports  map[string]*portRef     // serial port or RTU-over-TCP gateway → port
	failed map[string]*openFailure // open key → when it may be tried again
}

// portRef is a connection shared by the devices of one bus: a serial
// line or RTU-over-TCP stream (rtu), or a Modbus TCP stream (tcp), with
// the pacer of its pause.
type portRef struct {
	rtu  *modbus.RTUPort
	tcp  *modbus.TCPPort
	pace *pacer
	refs int
}

func (p *portRef) close() error {
	if p.rtu != nil {
		return p.rtu.Close()
	}
	return p.tcp.Close()
}

func newPacer(pause time.Duration) *pacer {
	if pause <= 0 {
		return nil
	}
	return &pacer{pause: pause}
}

type busRunner struct {
	cancel context.CancelFunc
	done   chan struct{}
}

// Backoff of a transport that cannot be opened: the n-th consecutive
// failure waits a random time in [d/2, d], d = min(OpenRetryMax, OpenRetryMin·2^(n-1)).
const (
	OpenRetryMin = time.Second
	OpenRetryMax = 30 * time.Second
)

// openFailure is the backoff of one transport that did not open.
type openFailure struct {
	gate backoff.Gate
	err  error
}

func (f *openFailure) failed(now time.Time, err error) {
	f.gate.Failed(now)
	f.err = err
}

// Run opens the transports (serial ports first: goburrow/serial uses
// select(), which fails on descriptors ≥ 1024), polls until ctx is done —
// applying the device sets Reload hands it — then closes everything. It
// returns after every goroutine has exited. A transport that cannot be
// opened (a missing serial port, an unresolvable host, no descriptor left)
// is its devices' problem only: they are down, with the reason in their
// stats, and their bus retries the open with backoff (OpenRetryMin to
// OpenRetryMax, jittered) while everything else polls.
func (s *Scheduler) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	rs := &runState{s: s, ctx: ctx, epoch: time.Now(), ports: map[string]*portRef{}, failed: map[string]*openFailure{}, buses: map[*bus]*busRunner{},
		clock: newClock(), udpB: map[*bus]bool{}}
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
	rs.attachAll(devs)
	s.startWrites()
	rs.wg.Add(1)
	go func() {
		defer rs.wg.Done()
		rs.clock.run(ctx)
	}()
	rs.startBuses(buses, rs.epoch)
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
// UDP socket, then TCP (which dials lazily). A device whose transport does
// not open is marked down; its bus retries.
func (rs *runState) attachAll(devs []*device) {
	order := append([]*device(nil), devs...)
	rank := map[string]int{TransportRTU: 0, TransportASCII: 0, TransportRTUOverTCP: 1, TransportASCIIOverTCP: 1, TransportUDP: 2, TransportTCP: 3}
	sort.SliceStable(order, func(i, j int) bool { return rank[order[i].cfg.Transport] < rank[order[j].cfg.Transport] })
	for _, d := range order {
		if _, err := rs.attach(d, true); err != nil {
			d.markDown(err)
		}
	}
}

// openKey names what must open for d: the serial port, or the resolution
// of a UDP device's address ("" for transports that connect lazily).
func openKey(dc DeviceConfig) string {
	switch dc.Transport {
	case TransportRTU, TransportASCII:
		return portKey(dc)
	case TransportUDP:
		return "udp " + dc.Address
	}
	return ""
}

// attach opens d's connection (sharing the UDP socket and serial ports).
// Unless force, a transport that failed to open is not tried again before
// its backoff has passed: tried is false and err is the last failure.
// Safe to call from any goroutine that owns d.
func (rs *runState) attach(d *device, force bool) (tried bool, err error) {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	key := openKey(d.cfg)
	now := time.Now()
	f := rs.failed[key]
	if f != nil && !force && f.gate.Wait(now) > 0 {
		return false, f.err
	}
	if err = rs.open(d); err != nil {
		if key == "" { // nothing to back off from: report it, retry at the next window
			return true, err
		}
		if f == nil {
			f = &openFailure{gate: backoff.Gate{Delay: backoff.Delay{Min: OpenRetryMin, Max: OpenRetryMax}}}
			rs.failed[key] = f
		}
		f.failed(now, err)
		return true, err
	}
	delete(rs.failed, key)
	return true, nil
}

// open is attach without the backoff; rs.mu is held.
func (rs *runState) open(d *device) error {
	s := rs.s
	switch d.cfg.Transport {
	case TransportTCP, TransportRTU, TransportRTUOverTCP, TransportASCII, TransportASCIIOverTCP:
		if d.slot.key == "" {
			return fmt.Errorf("edge: device %q: no connection assigned", d.cfg.Name)
		}
	}
	switch {
	case d.cfg.Transport == TransportTCP && d.slot.alone:
		c := modbus.NewTCP(modbus.TCPConfig{Address: d.cfg.Address, Unit: d.cfg.Unit, Timeout: d.cfg.Timeout, Logger: d.log})
		d.conn, d.port = paced(c, newPacer(d.cfg.Pause)), "alone "+d.slot.key
	case d.cfg.Transport == TransportUDP:
		if rs.udp == nil {
			sock, err := modbus.NewUDPSocket(modbus.UDPConfig{Listen: s.cfg.UDPListen, BufferBytes: s.cfg.UDPBufferBytes, NoBatch: s.cfg.UDPNoBatch,
				Logger: s.log, UnknownSource: s.cfg.Acquisition.UDPUnknown()})
			if err != nil {
				return fmt.Errorf("edge: device %q: %w", d.cfg.Name, err)
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
	case d.cfg.Transport == TransportTCP || serialBus(d.cfg.Transport) || serialOverTCP(d.cfg.Transport):
		key := d.slot.key
		p := rs.ports[key]
		if p == nil {
			p = &portRef{pace: newPacer(d.cfg.Pause)}
			switch d.cfg.Transport {
			case TransportRTU, TransportASCII:
				sc := d.cfg.Serial
				sc.Path = d.cfg.Address
				sc.Logger = s.log.With("port", d.cfg.Address)
				open := modbus.OpenRTU
				if d.cfg.Transport == TransportASCII {
					open = modbus.OpenASCII
				}
				var err error
				if p.rtu, err = open(sc); err != nil {
					return fmt.Errorf("edge: device %q: %w", d.cfg.Name, err)
				}
			case TransportRTUOverTCP, TransportASCIIOverTCP:
				tc := modbus.TCPConfig{Address: d.cfg.Address, Timeout: d.cfg.Timeout, Logger: s.log.With("bus", key)}
				if d.cfg.Transport == TransportASCIIOverTCP {
					p.rtu = modbus.NewASCIIOverTCP(tc)
				} else {
					p.rtu = modbus.NewRTUOverTCP(tc)
				}
			default:
				p.tcp = modbus.NewTCPPort(modbus.TCPConfig{Address: d.cfg.Address, Timeout: d.cfg.Timeout, Logger: s.log.With("bus", key)})
			}
			rs.ports[key] = p
		}
		p.refs++
		if p.rtu != nil {
			d.conn = paced(p.rtu.Unit(d.cfg.Unit, d.cfg.Timeout), p.pace)
		} else {
			d.conn = paced(p.tcp.Unit(d.cfg.Unit, d.cfg.Timeout), p.pace)
		}
		d.port = key
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
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if d.conn == nil {
		return
	}
	if c, ok := d.conn.(interface{ Close() error }); ok {
		_ = c.Close()
	}
	if p := rs.ports[d.port]; p != nil {
		if p.refs--; p.refs == 0 {
			_ = p.close()
			delete(rs.ports, d.port)
		}
	}
	d.conn, d.port = nil, ""
}

// slotPort is the port key d has when attached to its slot.
func slotPort(d *device) string {
	switch {
	case d.cfg.Transport == TransportUDP:
		return ""
	case d.slot.alone:
		return "alone " + d.slot.key
	}
	return d.slot.key
}

// udpSocket is the shared UDP socket (nil before a UDP device opened it).
func (rs *runState) udpSocket() *modbus.UDPSocket {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	return rs.udp
}

// openDue reports whether the open of d's transport, which is down, may
// be tried now (its backoff has passed).
func (rs *runState) openDue(d *device) bool {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	f := rs.failed[openKey(d.cfg)]
	return f == nil || f.gate.Wait(time.Now()) == 0
}

// startBuses starts bs: a goroutine each for TCP and RTU buses, the UDP
// ones into the UDP round (started with the first of them).
func (rs *runState) startBuses(bs []*bus, start time.Time) {
	var udp []*bus
	for _, b := range bs {
		b.open = func(d *device) (bool, error) { return rs.attach(d, false) }
		if !b.udp {
			rs.startBus(b, start)
			continue
		}
		udp = append(udp, b)
		rs.udpB[b] = true
	}
	if len(udp) == 0 {
		return
	}
	if rs.round == nil {
		ctx, cancel := context.WithCancel(rs.ctx)
		r := newUDPRound(rs)
		rs.round = r
		rs.stopR = func() { cancel(); <-r.exited }
		rs.wg.Add(1)
		go func() {
			defer rs.wg.Done()
			r.run(ctx)
		}()
	}
	rs.round.change(udp, nil, start)
}

// startBus runs b in its own goroutine until stopBuses. Its new devices'
// first windows start on the run's grid (aligned) at or after start, plus
// their stagger offset; a device taken over by a reload keeps its schedule.
func (rs *runState) startBus(b *bus, start time.Time) {
	for _, d := range b.devices {
		if d.next.IsZero() {
			d.next = aligned(rs.epoch, start, d.cfg.Interval).Add(d.offset)
		}
	}
	ctx, cancel := context.WithCancel(rs.ctx)
	r := &busRunner{cancel: cancel, done: make(chan struct{})}
	rs.buses[b] = r
	if b.wake == nil {
		b.wake = make(chan struct{}, 1)
	}
	rs.wg.Add(1)
	go func() {
		defer rs.wg.Done()
		defer close(r.done)
		b.run(ctx, rs.s.cfg.Sink, rs.clock)
	}()
}

// stopBuses stops the buses for which keep is false (all when keep is nil)
// and waits for them: each finishes the poll it is in.
func (rs *runState) stopBuses(keep func(*bus) bool) {
	if rs.round != nil {
		var out []*bus
		for b := range rs.udpB {
			if keep == nil || !keep(b) {
				out = append(out, b)
				delete(rs.udpB, b)
			}
		}
		switch {
		case keep == nil:
			rs.stopR()
		case len(out) > 0:
			rs.round.change(nil, out, time.Time{})
		}
	}
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

// aligned is the first start of an interval iv after epoch (epoch + k·iv)
// at or after t: a device added by a reload joins the wake-ups of the
// devices already there (the UDP round's rounds, the clock's firings for
// the buses) instead of making wake-ups of its own.
func aligned(epoch, t time.Time, iv time.Duration) time.Time {
	if epoch.IsZero() || !t.After(epoch) {
		return t
	}
	k := (t.Sub(epoch) + iv - 1) / iv
	return epoch.Add(k * iv)
}
