package edge

import (
	"context"
	"fmt"
	"log/slog"
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
)

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
	Sink           Sink
	Logger         *slog.Logger
}

// DeviceConfig is one device as resolved by conf.
type DeviceConfig struct {
	Name      string
	Transport string // tcp | udp | rtu | rtuovertcp
	Address   string // host:port, or a serial device path for rtu
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
}

// Scheduler polls every configured device.
type Scheduler struct {
	cfg     Config
	log     *slog.Logger
	devices []*device
	buses   []*bus
	wr      schedWrites // write path (write.go)

	mu     sync.Mutex
	closer []func() error // opened transports, closed when Run ends
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
	s := &Scheduler{cfg: cfg, log: cfg.Logger}
	seen := map[string]bool{}
	for i := range cfg.Devices {
		dc := cfg.Devices[i]
		if seen[dc.Name] {
			return nil, fmt.Errorf("edge: device %q twice", dc.Name)
		}
		seen[dc.Name] = true
		d, err := newDevice(dc, s.log)
		if err != nil {
			return nil, err
		}
		s.devices = append(s.devices, d)
	}
	s.buses = s.groupBuses()
	s.initWrites()
	// Stagger: device i of n starts i/n of its interval after the start,
	// so n devices at one interval never burst at the top of the second.
	for i, d := range s.devices {
		d.offset = time.Duration(int64(d.cfg.Interval) * int64(i) / int64(max(len(s.devices), 1)))
	}
	return s, nil
}

// groupBuses assigns devices to the goroutines that will own their bus.
func (s *Scheduler) groupBuses() []*bus {
	var buses []*bus
	byKey := map[string]*bus{}
	for _, d := range s.devices {
		var key string
		switch d.cfg.Transport {
		case TransportTCP:
			if s.cfg.TCPMode == TCPSerial {
				key = "tcp-serial"
			}
		case TransportRTU:
			key = "rtu " + d.cfg.Address
		case TransportRTUOverTCP:
			key = "rtuovertcp " + d.cfg.Address
		}
		if key == "" { // a bus of its own
			buses = append(buses, &bus{name: d.cfg.Name, devices: []*device{d}})
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
	return buses
}

// Devices returns every device's identity and live statistics.
func (s *Scheduler) Devices() []stats.Entry {
	out := make([]stats.Entry, len(s.devices))
	for i, d := range s.devices {
		out[i] = stats.Entry{Info: d.info, Stats: &d.stats}
	}
	return out
}

// Plan returns the reads each device's poll issues, in device order.
func (s *Scheduler) Plan() map[string][]Read {
	out := make(map[string][]Read, len(s.devices))
	for _, d := range s.devices {
		out[d.cfg.Name] = d.currentPlan()
	}
	return out
}

// Healthy returns an error when some bus has been inside one poll for
// longer than limit (and at least 3 of its devices' intervals): its
// goroutine is stuck. A dead device is healthy: its polls time out.
func (s *Scheduler) Healthy(limit time.Duration) error {
	now := time.Now()
	for _, b := range s.buses {
		l := limit
		for _, d := range b.devices {
			l = max(l, 3*(d.cfg.Interval+time.Duration(d.cfg.Retries+1)*d.cfg.Timeout))
		}
		if err := b.stuck(now, l); err != nil {
			return err
		}
	}
	return nil
}

// Run opens the transports (serial ports first: goburrow/serial uses
// select(), which fails on descriptors ≥ 1024), polls until ctx is done,
// then closes everything. It returns after every goroutine has exited.
func (s *Scheduler) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	defer func() {
		cancel()
		wg.Wait()
		s.stopWrites() // answers queued writes "stopped"
		s.closeAll()
	}()
	if err := s.openRTU(); err != nil {
		return err
	}
	if err := s.openUDP(ctx, &wg); err != nil {
		return err
	}
	s.openTCP()
	s.startWrites()
	start := time.Now()
	for _, b := range s.buses {
		wg.Add(1)
		go func() {
			defer wg.Done()
			b.run(ctx, start, s.cfg.Sink)
		}()
	}
	<-ctx.Done()
	return nil
}

func (s *Scheduler) addCloser(f func() error) {
	s.mu.Lock()
	s.closer = append(s.closer, f)
	s.mu.Unlock()
}

func (s *Scheduler) closeAll() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i := len(s.closer) - 1; i >= 0; i-- {
		_ = s.closer[i]()
	}
	s.closer = nil
}

func (s *Scheduler) openRTU() error {
	ports := map[string]*modbus.RTUPort{}
	for _, d := range s.devices {
		if d.cfg.Transport != TransportRTU && d.cfg.Transport != TransportRTUOverTCP {
			continue
		}
		p := ports[d.cfg.Transport+" "+d.cfg.Address]
		if p == nil {
			if d.cfg.Transport == TransportRTU {
				sc := d.cfg.Serial
				sc.Path = d.cfg.Address
				sc.Logger = s.log.With("port", d.cfg.Address)
				var err error
				if p, err = modbus.OpenRTU(sc); err != nil {
					return fmt.Errorf("edge: device %q: %w", d.cfg.Name, err)
				}
			} else {
				p = modbus.NewRTUOverTCP(modbus.TCPConfig{Address: d.cfg.Address, Timeout: d.cfg.Timeout, Logger: s.log.With("bus", d.cfg.Address)})
			}
			ports[d.cfg.Transport+" "+d.cfg.Address] = p
			s.addCloser(p.Close)
		}
		d.conn = p.Unit(d.cfg.Unit, d.cfg.Timeout)
	}
	return nil
}

func (s *Scheduler) openUDP(ctx context.Context, wg *sync.WaitGroup) error {
	var sock *modbus.UDPSocket
	for _, d := range s.devices {
		if d.cfg.Transport != TransportUDP {
			continue
		}
		if sock == nil {
			var err error
			sock, err = modbus.NewUDPSocket(modbus.UDPConfig{Listen: s.cfg.UDPListen, BufferBytes: s.cfg.UDPBufferBytes, Logger: s.log})
			if err != nil {
				return fmt.Errorf("edge: %w", err)
			}
			s.addCloser(sock.Close)
		}
		c, err := sock.Device(d.cfg.Address, d.cfg.Unit, d.cfg.Timeout)
		if err != nil {
			return fmt.Errorf("edge: device %q: %w", d.cfg.Name, err)
		}
		d.conn = c
	}
	if sock != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := sock.Run(ctx); err != nil && ctx.Err() == nil {
				s.log.Error("udp socket stopped", "err", err)
			}
		}()
	}
	return nil
}

func (s *Scheduler) openTCP() {
	for _, d := range s.devices {
		if d.cfg.Transport != TransportTCP {
			continue
		}
		c := modbus.NewTCP(modbus.TCPConfig{Address: d.cfg.Address, Unit: d.cfg.Unit, Timeout: d.cfg.Timeout, Logger: d.log})
		d.conn = c
		s.addCloser(c.Close)
	}
}
