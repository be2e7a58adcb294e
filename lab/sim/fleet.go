package sim

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"sync"
	"time"
)

// Config of a Fleet. The zero value is one TCP logger on a random port.
type Config struct {
	Devices   int           // number of loggers; default 1, at most 254*254
	Transport string        // "tcp" (default), "udp", or "rtutcp" (RTU frames over TCP)
	Port      int           // port of every logger; 0 = a random port each
	Seed      int64         // model and fault randomness; logger i uses Seed and i
	Tick      time.Duration // model update tick; default 100 ms
	Faults    Faults        // initial faults of every logger
	Registers int           // addresses served per table; default 65536
	MaxRead   int           // largest register read served; default 125
	Clock     func() time.Time
	Logger    *slog.Logger // nil: discard
}

// fill returns the config with defaults set.
func (c Config) fill() (Config, error) {
	if c.Devices <= 0 {
		c.Devices = 1
	}
	if c.Devices > 254*254 {
		return c, fmt.Errorf("sim: %d devices: at most %d", c.Devices, 254*254)
	}
	switch c.Transport {
	case "":
		c.Transport = "tcp"
	case "tcp", "udp", "rtutcp":
	default:
		return c, fmt.Errorf("sim: transport %q: want tcp, udp or rtutcp (serial rtu: NewRTUBus)", c.Transport)
	}
	if c.Port < 0 || c.Port > 65535 {
		return c, fmt.Errorf("sim: port %d out of range", c.Port)
	}
	var err error
	c.Tick, c.Registers, c.MaxRead, c.Logger, err = fillModel(c.Tick, c.Registers, c.MaxRead, c.Logger)
	return c, err
}

func fillModel(tick time.Duration, regs, maxRead int, log *slog.Logger) (time.Duration, int, int, *slog.Logger, error) {
	if tick <= 0 {
		tick = 100 * time.Millisecond
	}
	if regs <= 0 {
		regs = 65536
	}
	if regs > 65536 {
		return 0, 0, 0, nil, fmt.Errorf("sim: registers %d > 65536", regs)
	}
	if maxRead <= 0 || maxRead > maxReadRegs {
		maxRead = maxReadRegs
	}
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return tick, regs, maxRead, log, nil
}

// DeviceAddr is the loopback address of logger i (0-based): 127.0.1.1 …
// 127.0.1.254, then 127.0.2.1 …
func DeviceAddr(i int) netip.Addr {
	return netip.AddrFrom4([4]byte{127, 0, byte(1 + i/254), byte(1 + i%254)})
}

// Fleet is N simulated loggers over TCP or UDP, each on its own loopback
// address.
type Fleet struct {
	cfg     Config
	loggers []*Logger

	mu      sync.Mutex
	started bool
}

// NewFleet binds every logger's socket (so Addr is known) and starts no
// goroutine. Close releases the sockets if Run is never called.
func NewFleet(cfg Config) (*Fleet, error) {
	cfg, err := cfg.fill()
	if err != nil {
		return nil, err
	}
	f := &Fleet{cfg: cfg, loggers: make([]*Logger, cfg.Devices)}
	for i := range f.loggers {
		l := newLogger(loggerConfig{
			name:      fmt.Sprintf("sim-%04d", i+1),
			transport: cfg.Transport,
			seed:      mix(uint64(cfg.Seed)) ^ uint64(i),
			tick:      cfg.Tick,
			registers: cfg.Registers,
			maxRead:   cfg.MaxRead,
			faults:    cfg.Faults,
			clock:     cfg.Clock,
			log:       cfg.Logger,
		})
		l.addr = netip.AddrPortFrom(DeviceAddr(i), uint16(cfg.Port))
		l.mu.Lock()
		err := l.bindLocked()
		l.mu.Unlock()
		if err != nil {
			f.Close()
			return nil, err
		}
		f.loggers[i] = l
	}
	return f, nil
}

// Len is the number of loggers.
func (f *Fleet) Len() int { return len(f.loggers) }

// Addr is host:port of logger i.
func (f *Fleet) Addr(i int) string { return f.loggers[i].Addr() }

// Logger is logger i (0-based).
func (f *Fleet) Logger(i int) *Logger { return f.loggers[i] }

// Run serves every logger until ctx is done, then closes every socket and
// returns after every goroutine exited. It may be called once.
func (f *Fleet) Run(ctx context.Context) error {
	f.mu.Lock()
	if f.started {
		f.mu.Unlock()
		return errors.New("sim: fleet already ran")
	}
	f.started = true
	f.mu.Unlock()
	var wg sync.WaitGroup
	for _, l := range f.loggers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l.run(ctx)
		}()
	}
	f.cfg.Logger.Info("sim: fleet serving", "devices", len(f.loggers), "transport", f.cfg.Transport,
		"first", f.loggers[0].Addr())
	<-ctx.Done()
	for _, l := range f.loggers {
		l.shutdown()
	}
	wg.Wait()
	return nil
}

// Close shuts every logger down and closes its sockets. Use it instead of
// Run, or after Run returned; it is idempotent.
func (f *Fleet) Close() error {
	for _, l := range f.loggers {
		if l != nil {
			l.shutdown()
		}
	}
	return nil
}
