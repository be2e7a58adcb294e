package edge

import (
	"fmt"
	"log/slog"
	"reflect"
	"sync"
	"time"

	"edgegw/edge/modbus"
	"edgegw/ringstore"
	"edgegw/stats"
)

// Sink receives the samples of each poll; *ringstore.Ring satisfies it.
type Sink interface {
	Append(batch []ringstore.Sample) (first, last uint64, err error)
}

var _ Sink = (*ringstore.Ring)(nil)

// TCP scheduling modes (issue: TCP hides loss as latency; compare them).
const (
	TCPParallel = "parallel" // one connection and one goroutine per device (default)
	TCPSerial   = "serial"   // every TCP device polled one after another by one goroutine
)

// Transports.
const (
	TransportTCP        = "tcp"
	TransportUDP        = "udp"
	TransportRTU        = "rtu"
	TransportRTUOverTCP = "rtuovertcp"
	// Modbus ASCII: the serial bus and the stream of RTU and RTU over TCP,
	// with ASCII framing (':', hex, LRC, CRLF).
	TransportASCII        = "ascii"
	TransportASCIIOverTCP = "asciiovertcp"
)

// serialBus reports a transport on a serial line (rtu, ascii).
func serialBus(tr string) bool { return tr == TransportRTU || tr == TransportASCII }

// serialOverTCP reports a serial framing carried over a TCP stream (rtuovertcp, asciiovertcp).
func serialOverTCP(tr string) bool { return tr == TransportRTUOverTCP || tr == TransportASCIIOverTCP }

// Defaults applied by New to zero fields.
const (
	DefaultInterval  = time.Second
	DefaultTimeout   = 500 * time.Millisecond
	DefaultMaxGap    = 8
	DemoteAfter      = 3                // consecutive polls without any answer
	MaxDemotedPeriod = 30 * time.Second // slowest poll of a demoted device
)

// Config is the acquisition side of the gateway.
type Config struct {
	Devices        []DeviceConfig
	TCPMode        string // TCPParallel (default) or TCPSerial
	UDPListen      string // local address of the shared UDP socket; default ":0"
	UDPBufferBytes int    // SO_RCVBUF/SO_SNDBUF asked for; default 4 MiB
	// UDPNoBatch sends and reads one datagram per syscall even where
	// sendmmsg/recvmmsg exist; the results are the same (a way out, and
	// for comparison).
	UDPNoBatch bool
	Sink       Sink
	Logger     *slog.Logger

	Acquisition *stats.Acquisition // gateway-wide counters (UDP datagrams from no device); nil: not kept
}

// DeviceConfig is one device as resolved by conf.
type DeviceConfig struct {
	Name      string
	Transport string // tcp | udp | rtu | rtuovertcp | ascii | asciiovertcp
	Address   string // host:port, or a serial device path for rtu and ascii
	Unit      uint8
	Interval  time.Duration
	Timeout   time.Duration
	Retries   int
	MaxGap    int // registers read and thrown away to join two reads (0: never join)
	MaxRegs   int // registers per read (≤125, 0: 125); lowered at run time on exception 2
	MaxBits   int // coils or discrete inputs per read (≤2000, 0: 2000); lowered likewise
	Serial    modbus.SerialConfig
	Tags      []Tag
	// WriteTransport: a udp device writes over tcp to the same host:port
	// unless this is "udp" (write.go); ignored for other transports.
	WriteTransport string
	// MaxConnections (tcp, rtuovertcp): connections to this device's
	// endpoint (host:port), each with its own bus goroutine; the endpoint's
	// devices are dealt over them in order. 0 or 1: one connection and one
	// bus for all. Every device of an endpoint gives the same value.
	MaxConnections int
	// Pause (tcp, rtuovertcp, rtu): silence between the end of one request
	// and the start of the next on this device's connection or serial line,
	// for slow converters. Every device of an endpoint gives the same value.
	Pause time.Duration
}

// Scheduler polls every configured device.
type Scheduler struct {
	cfg     Config
	log     *slog.Logger
	wr      schedWrites     // write path (write.go)
	reload  chan *reloadReq // Reload → Run (reload.go)
	udpKick chan struct{}   // capacity 1: Write → the UDP round: a write was queued

	mu      sync.RWMutex // guards devices and buses: Run swaps them on a reload
	devices []*device
	buses   []*bus
}

// New checks the config, fills defaults and plans the reads. It opens
// nothing and starts no goroutine.
func New(cfg Config) (*Scheduler, error) {
	if cfg.TCPMode == "" {
		cfg.TCPMode = TCPParallel
	}
	if cfg.TCPMode != TCPParallel && cfg.TCPMode != TCPSerial {
		return nil, fmt.Errorf("edge: tcp mode %q is not %q or %q", cfg.TCPMode, TCPParallel, TCPSerial)
	}
	if cfg.UDPListen == "" {
		cfg.UDPListen = ":0"
	}
	if cfg.UDPBufferBytes == 0 {
		cfg.UDPBufferBytes = 4 << 20
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	s := &Scheduler{cfg: cfg, log: cfg.Logger, reload: make(chan *reloadReq), udpKick: make(chan struct{}, 1)}
	devs, err := s.buildDevices(cfg.Devices, nil)
	if err != nil {
		return nil, err
	}
	if err := checkEndpoints(devs); err != nil {
		return nil, err
	}
	s.devices = devs
	var slots map[*device]connSlot
	s.buses, slots = s.groupBuses(devs)
	for d, sl := range slots {
		d.slot = sl
	}
	s.initWrites()
	return s, nil
}

// StaggerSlots is how many start times the RTU devices of one interval
// are spread over (a serial line is slow: its polls are spread over the
// interval, each with room for its retries). Devices of one slot are woken
// by one timer event (the clock). TCP and UDP devices are not staggered:
// every one of an interval is due at its start, which costs far less than
// a wake-up per slot: the UDP ones are polled by one wake-up of the UDP
// round, their requests sent back to back in one batch; the TCP buses are
// woken together by one firing of the clock, each then polling its own
// connection (one request at a time per connection: no device or gateway
// gets a burst).
const StaggerSlots = 8

// staggerOffset is device i of n's start within its interval: slot i mod
// StaggerSlots (or i of n when there are fewer devices than slots).
func staggerOffset(interval time.Duration, i, n int) time.Duration {
	slots := min(max(n, 1), StaggerSlots)
	return time.Duration(int64(interval) * int64(i%slots) / int64(slots))
}

// buildDevices makes the devices of a config, in order. A device of old
// whose resolved config is unchanged is taken over as it is (statistics,
// connection, schedule). New RTU devices are staggered (staggerOffset);
// TCP and UDP devices start together.
func (s *Scheduler) buildDevices(dcs []DeviceConfig, old map[string]*device) ([]*device, error) {
	seen := map[string]bool{}
	devs := make([]*device, 0, len(dcs))
	for i, dc := range dcs {
		if seen[dc.Name] {
			return nil, fmt.Errorf("edge: device %q twice", dc.Name)
		}
		seen[dc.Name] = true
		d, err := newDevice(dc, s.log)
		if err != nil {
			return nil, err
		}
		if o := old[dc.Name]; o != nil && reflect.DeepEqual(o.cfg, d.cfg) {
			d = o
		} else {
			if serialBus(dc.Transport) {
				d.offset = staggerOffset(d.cfg.Interval, i, len(dcs))
			}
		}
		devs = append(devs, d)
	}
	return devs, nil
}

// endpointKey names the endpoint a device shares with others ("" for a
// UDP device, which has a request stream of its own).
func endpointKey(dc DeviceConfig) string {
	switch dc.Transport {
	case TransportTCP, TransportRTUOverTCP, TransportRTU, TransportASCII, TransportASCIIOverTCP:
		return dc.Transport + " " + dc.Address
	}
	return ""
}

// groupBuses assigns devices to the goroutines that will own their bus
// and each device to its connection (returned, not stored: a device of a
// running bus must not be written). The devices of one TCP or RTU-over-TCP
// endpoint are dealt over its MaxConnections connections in order, each
// connection a bus (in TCPSerial mode every TCP connection is on one
// bus); a serial port is one bus; a UDP device is a bus of its own.
func (s *Scheduler) groupBuses(devs []*device) ([]*bus, map[*device]connSlot) {
	var buses []*bus
	byKey := map[string]*bus{}
	slots := make(map[*device]connSlot, len(devs))
	seen := map[string]int{} // endpoint → devices dealt so far
	perConn := map[string]int{}
	for _, d := range devs {
		ep := endpointKey(d.cfg)
		var key string
		switch d.cfg.Transport {
		case TransportTCP, TransportRTUOverTCP, TransportASCIIOverTCP:
			n := max(1, d.cfg.MaxConnections)
			conn := fmt.Sprintf("%s #%d", ep, seen[ep]%n)
			seen[ep]++
			slots[d] = connSlot{key: conn}
			perConn[conn]++
			key = conn
			if d.cfg.Transport == TransportTCP && s.cfg.TCPMode == TCPSerial {
				key = "tcp-serial"
			}
		case TransportRTU, TransportASCII:
			key = ep
			slots[d] = connSlot{key: portKey(d.cfg)}
		}
		if key == "" { // a bus of its own, in the UDP round
			buses = append(buses, &bus{name: d.cfg.Name, devices: []*device{d}, udp: true})
			continue
		}
		b := byKey[key]
		if b == nil {
			b = &bus{name: key}
			byKey[key] = b
			buses = append(buses, b)
		}
		b.devices = append(b.devices, d)
	}
	for d, sl := range slots { // a TCP device alone on its connection keeps a connection of its own
		if d.cfg.Transport == TransportTCP && perConn[sl.key] == 1 {
			slots[d] = connSlot{key: sl.key, alone: true}
		}
	}
	return buses, slots
}

// checkEndpoints refuses devices of one endpoint that disagree on its
// settings, and more than one connection to a serial line.
func checkEndpoints(devs []*device) error {
	first := map[string]*device{}
	for _, d := range devs {
		ep := endpointKey(d.cfg)
		if ep == "" {
			continue
		}
		if serialBus(d.cfg.Transport) && d.cfg.MaxConnections > 1 {
			return fmt.Errorf("edge: device %q: a serial line has one connection (max_connections %d)", d.cfg.Name, d.cfg.MaxConnections)
		}
		f := first[ep]
		if f == nil {
			first[ep] = d
			continue
		}
		if max(1, f.cfg.MaxConnections) != max(1, d.cfg.MaxConnections) || f.cfg.Pause != d.cfg.Pause {
			return fmt.Errorf("edge: devices %q and %q share %s but not its max_connections and pause", f.cfg.Name, d.cfg.Name, d.cfg.Address)
		}
	}
	return nil
}

// BusInfo describes one bus goroutine for display (edgegw check).
type BusInfo struct {
	Name    string
	Devices []string
	Pause   time.Duration
}

// Buses lists the bus goroutines Run starts, in start order.
func (s *Scheduler) Buses() []BusInfo {
	s.mu.RLock()
	defer s.mu.RUnlock()
	out := make([]BusInfo, 0, len(s.buses))
	for _, b := range s.buses {
		bi := BusInfo{Name: b.name}
		for _, d := range b.devices {
			bi.Devices = append(bi.Devices, d.cfg.Name)
			bi.Pause = max(bi.Pause, d.cfg.Pause)
		}
		out = append(out, bi)
	}
	return out
}

// Devices returns every device's identity and live statistics.
func (s *Scheduler) Devices() []stats.Entry {
	s.mu.RLock()
	defer s.mu.RUnlock()
	out := make([]stats.Entry, len(s.devices))
	for i, d := range s.devices {
		out[i] = stats.Entry{Info: d.info, Stats: &d.stats}
	}
	return out
}

// Plan returns the reads each device's poll issues, in device order.
func (s *Scheduler) Plan() map[string][]Read {
	s.mu.RLock()
	defer s.mu.RUnlock()
	out := make(map[string][]Read, len(s.devices))
	for _, d := range s.devices {
		out[d.cfg.Name] = append([]Read(nil), d.currentPlan()...) // the caller's own copy
	}
	return out
}

// RatePlans returns, per device with tags of more than one rate, the reads
// of the polls at which each rate is due (with the faster rates due then).
func (s *Scheduler) RatePlans() map[string][]RatePlan {
	s.mu.RLock()
	defer s.mu.RUnlock()
	out := map[string][]RatePlan{}
	for _, d := range s.devices {
		if len(d.rates.mult) < 2 {
			continue
		}
		for _, m := range d.rates.mult {
			reads := d.planOf(d.rates.tickMask(m))
			out[d.cfg.Name] = append(out[d.cfg.Name], RatePlan{Every: time.Duration(m) * d.cfg.Interval, Reads: append([]Read(nil), reads...)})
		}
	}
	return out
}

// Healthy returns an error when some bus has been inside one poll for
// longer than limit (and at least 3 of its devices' intervals): its
// goroutine is stuck. A dead device is healthy: its polls time out.
func (s *Scheduler) Healthy(limit time.Duration) error {
	s.mu.RLock()
	defer s.mu.RUnlock()
	now := time.Now()
	for _, b := range s.buses {
		l := limit
		for _, d := range b.devices {
			reqs := time.Duration(len(d.currentPlan()) * (d.cfg.Retries + 1))
			l = max(l, 3*(d.cfg.Interval+time.Duration(d.cfg.Retries+1)*d.cfg.Timeout+reqs*d.cfg.Pause))
		}
		if err := b.stuck(now, l); err != nil {
			return err
		}
	}
	return nil
}
