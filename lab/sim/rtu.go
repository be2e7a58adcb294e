package sim

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/goburrow/serial"
)

// RTUConfig of an RTUBus. The zero value (with Path set) is unit 1 at 9600 8N1.
type RTUConfig struct {
	Path      string        // serial device, e.g. /dev/ttyS1 or a pty
	Baud      int           // default 9600; a pty ignores it
	Units     []uint8       // units served on the bus (1..247); default [1]
	Seed      int64         // as Config.Seed; unit u uses Seed and u
	Tick      time.Duration // default 100 ms
	Faults    Faults        // initial faults of every unit
	Registers int           // default 65536
	MaxRead   int           // default 125
	Clock     func() time.Time
	Logger    *slog.Logger // nil: discard
}

// BusCounters count what the bus saw before a frame reached a unit.
type BusCounters struct {
	Frames  uint64 // frames with a valid CRC
	BadCRC  uint64 // frames dropped for their CRC (no reply)
	Ignored uint64 // valid frames for units not served (or powered off), broadcast reads
	Garbage uint64 // bytes discarded while resynchronising
}

// RTUBus serves several units (each a Logger) on one serial line.
type RTUBus struct {
	cfg   RTUConfig
	port  serial.Port
	units map[uint8]*Logger
	gap   time.Duration // t3.5

	frames, badCRC, ignored, garbage atomic.Uint64

	mu      sync.Mutex
	started bool
	closed  bool
}

// NewRTUBus opens the serial port (8N1, Parity "N" explicitly, with a read
// timeout) and starts no goroutine. Open serial ports early: goburrow/serial
// uses select(), which fails for descriptors ≥ 1024.
func NewRTUBus(cfg RTUConfig) (*RTUBus, error) {
	if cfg.Path == "" {
		return nil, errors.New("sim: rtu: no serial path")
	}
	if cfg.Baud <= 0 {
		cfg.Baud = 9600
	}
	if len(cfg.Units) == 0 {
		cfg.Units = []uint8{1}
	}
	var err error
	cfg.Tick, cfg.Registers, cfg.MaxRead, cfg.Logger, err = fillModel(cfg.Tick, cfg.Registers, cfg.MaxRead, cfg.Logger)
	if err != nil {
		return nil, err
	}
	b := &RTUBus{cfg: cfg, units: make(map[uint8]*Logger)}
	for _, u := range cfg.Units {
		if u < 1 || u > 247 {
			return nil, fmt.Errorf("sim: rtu %s: unit %d: want 1..247", cfg.Path, u)
		}
		if b.units[u] != nil {
			return nil, fmt.Errorf("sim: rtu %s: unit %d listed twice", cfg.Path, u)
		}
		b.units[u] = newLogger(loggerConfig{
			name:      fmt.Sprintf("rtu-unit-%d", u),
			transport: "rtu",
			seed:      mix(uint64(cfg.Seed)) ^ uint64(u)<<32,
			tick:      cfg.Tick,
			registers: cfg.Registers,
			maxRead:   cfg.MaxRead,
			faults:    cfg.Faults,
			clock:     cfg.Clock,
			log:       cfg.Logger.With("path", cfg.Path),
		})
	}
	// t3.5: 3.5 characters of 11 bits; fixed 1.75 ms above 19200 baud (spec).
	b.gap = 1750 * time.Microsecond
	if cfg.Baud <= 19200 {
		b.gap = time.Duration(3.5 * 11 * float64(time.Second) / float64(cfg.Baud))
	}
	p, err := serial.Open(&serial.Config{
		Address:  cfg.Path,
		BaudRate: cfg.Baud,
		DataBits: 8,
		StopBits: 1,
		Parity:   "N",
		Timeout:  max(20*time.Millisecond, 4*b.gap), // also how often Run checks ctx
	})
	if err != nil {
		return nil, fmt.Errorf("sim: rtu %s: open: %w", cfg.Path, err)
	}
	b.port = p
	return b, nil
}

// Logger is the unit's logger, nil if the bus does not serve it.
func (b *RTUBus) Logger(unit uint8) *Logger { return b.units[unit] }

// Counters returns the bus counters.
func (b *RTUBus) Counters() BusCounters {
	return BusCounters{Frames: b.frames.Load(), BadCRC: b.badCRC.Load(), Ignored: b.ignored.Load(), Garbage: b.garbage.Load()}
}

// Close closes the serial port. Use it instead of Run or after Run returned.
func (b *RTUBus) Close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return nil
	}
	b.closed = true
	return b.port.Close()
}

// Run reads requests from the line and answers them until ctx is done, then
// closes the port. One goroutine (the caller's) does every read and write.
func (b *RTUBus) Run(ctx context.Context) error {
	b.mu.Lock()
	if b.started || b.closed {
		b.mu.Unlock()
		return errors.New("sim: rtu bus already ran or closed")
	}
	b.started = true
	b.mu.Unlock()
	defer b.Close()
	b.cfg.Logger.Info("sim: rtu bus serving", "path", b.cfg.Path, "units", b.cfg.Units)

	var tmp [256]byte
	buf := make([]byte, 0, 1024)
	out := make([]byte, 0, 512)
	for ctx.Err() == nil {
		n, err := b.port.Read(tmp[:])
		if errors.Is(err, serial.ErrTimeout) {
			// Silence: a frame whose length the function code does not tell ends here.
			if len(buf) > 0 {
				if rtuCRCOK(buf) {
					b.frame(ctx, out[:0], buf)
				} else {
					b.garbage.Add(uint64(len(buf)))
				}
				buf = buf[:0]
			}
			continue
		}
		if err != nil || n == 0 {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("sim: rtu %s: read: %v", b.cfg.Path, cmpErr(err))
		}
		buf = append(buf, tmp[:n]...)
		for len(buf) > 0 {
			need := rtuRequestLen(buf)
			if need <= 0 || len(buf) < need {
				break // more bytes, or the silence, will tell
			}
			b.frame(ctx, out[:0], buf[:need])
			buf = append(buf[:0], buf[need:]...)
		}
		if len(buf) > 512 {
			b.garbage.Add(uint64(len(buf)))
			buf = buf[:0]
		}
	}
	return nil
}

func cmpErr(err error) error {
	if err == nil {
		return errors.New("end of file")
	}
	return err
}

// frame handles one complete request frame (unit, PDU, CRC).
func (b *RTUBus) frame(ctx context.Context, out, f []byte) {
	if !rtuCRCOK(f) {
		b.badCRC.Add(1)
		return
	}
	b.frames.Add(1)
	unit, pdu := f[0], f[1:len(f)-2]
	if unit == 0 {
		// Broadcast: writes go to every unit that is on, nobody replies.
		if !slices.Contains([]byte{5, 6, 15, 16}, pdu[0]) {
			b.ignored.Add(1)
			return
		}
		for _, l := range b.units {
			l.mu.Lock()
			off := l.off
			l.mu.Unlock()
			if !off {
				l.ctr.requests.Add(1)
				l.eng.appendHandle(out[:0], pdu)
			}
		}
		return
	}
	l := b.units[unit]
	if l == nil {
		b.ignored.Add(1)
		return
	}
	l.mu.Lock()
	off, stop := l.off, l.stop
	l.mu.Unlock()
	if off {
		b.ignored.Add(1)
		return
	}
	r := l.serve(out, f, pdu)
	if r.frame == nil {
		return
	}
	if !wait(b.gap+r.delay, stop, ctx.Done()) {
		return
	}
	l.ctr.replies.Add(1)
	if _, err := b.port.Write(r.frame); err != nil {
		l.log.Warn("sim: rtu write", "err", err)
		return
	}
	if r.duplicate {
		if !wait(b.gap+time.Duration(len(r.frame))*b.gap/3, stop, ctx.Done()) {
			return
		}
		_, _ = b.port.Write(r.frame)
	}
}
