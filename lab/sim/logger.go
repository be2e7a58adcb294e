package sim

import (
	"log/slog"
	"math/rand/v2"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"
)

// Faults are the misbehaviours a logger injects. Probabilities are per
// request, in [0, 1]; the zero value is a well-behaved device.
type Faults struct {
	Delay  time.Duration // fixed extra time before every reply
	Jitter time.Duration // plus uniform random 0..Jitter

	DropRequest  float64 // request ignored (not executed, no reply)
	DropResponse float64 // request executed, reply not sent
	Exception    float64 // reply exception 4 (server device failure), not executed
	Duplicate    float64 // reply sent twice
	WrongTID     float64 // TCP/UDP: reply carries transaction id + 1
	OtherPort    float64 // UDP: reply sent from a second socket (another port)
	Truncate     float64 // reply loses its last byte
	BadCRC       float64 // RTU and RTU over TCP: reply CRC corrupted
}

// Counters of one logger. Faults counts every fault injected (one request
// may get several; a delayed reply is one); Replies counts replies as they
// are written (a duplicate once); Dropped counts requests that got no reply because of a
// fault; Malformed counts frames that could not be parsed.
type Counters struct {
	Requests  uint64
	Replies   uint64
	Dropped   uint64
	Faults    uint64
	Malformed uint64
}

type counters struct {
	requests, replies, dropped, faults, malformed atomic.Uint64
}

// Logger is one simulated device: its register bank and model, its fault
// knobs, counters and (over TCP or UDP) its socket. Over RTU it is one unit
// of an RTUBus.
type Logger struct {
	name      string
	transport string         // tcp | udp | rtutcp | rtu
	addr      netip.AddrPort // tcp/udp: fixed after the first bind
	eng       engine
	faults    atomic.Pointer[Faults]
	ctr       counters
	log       *slog.Logger

	rngMu sync.Mutex
	rng   *rand.Rand

	mu      sync.Mutex
	closed  bool          // shut down for good (fleet ended)
	off     bool          // stopped (device powered off)
	stop    chan struct{} // closed by Stop: ends delayed replies of this power cycle
	changed chan struct{} // closed when Start binds a new socket
	ln      *net.TCPListener
	conns   map[net.Conn]struct{}
	uc      *net.UDPConn
	uc2     *net.UDPConn // second socket for OtherPort replies, opened on first use
	timers  map[*time.Timer]struct{}
	wg      sync.WaitGroup // connection goroutines and delayed-reply timers
}

// loggerConfig is what Fleet and RTUBus hand to each logger.
type loggerConfig struct {
	name      string
	transport string
	seed      uint64
	tick      time.Duration
	registers int
	maxRead   int
	faults    Faults
	clock     func() time.Time
	log       *slog.Logger
}

func newLogger(c loggerConfig) *Logger {
	l := &Logger{
		name:      c.name,
		transport: c.transport,
		log:       c.log.With("logger", c.name),
		rng:       rand.New(rand.NewPCG(c.seed, mix(c.seed))),
		stop:      make(chan struct{}),
		changed:   make(chan struct{}),
	}
	l.eng = engine{limit: c.registers, maxRead: c.maxRead, clock: c.clock, model: newModel(c.seed, c.tick)}
	l.eng.boot = l.eng.now()
	f := c.faults
	l.faults.Store(&f)
	return l
}

// Name is the logger's name (sim-0001 …, or rtu-unit-N).
func (l *Logger) Name() string { return l.name }

// Addr is host:port of a TCP or UDP logger, "" over RTU.
func (l *Logger) Addr() string {
	if !l.addr.IsValid() {
		return ""
	}
	return l.addr.String()
}

// SetFaults replaces the fault knobs; it takes effect on the next request.
func (l *Logger) SetFaults(f Faults) { l.faults.Store(&f) }

// Faults returns the current fault knobs.
func (l *Logger) Faults() Faults { return *l.faults.Load() }

// Counters returns a snapshot of the counters.
func (l *Logger) Counters() Counters {
	return Counters{
		Requests:  l.ctr.requests.Load(),
		Replies:   l.ctr.replies.Load(),
		Dropped:   l.ctr.dropped.Load(),
		Faults:    l.ctr.faults.Load(),
		Malformed: l.ctr.malformed.Load(),
	}
}

// Handle serves one request PDU and returns the response PDU (nil for an
// empty request). No faults are applied and no counter moves.
func (l *Logger) Handle(pdu []byte) []byte { return l.eng.appendHandle(nil, pdu) }

// SetHolding stores holding registers from addr on; a write to a model
// register (0..6) pins it to the written value.
func (l *Logger) SetHolding(addr uint16, v ...uint16) { l.eng.setHolding(addr, v) }

// SetInput stores input registers from addr on (pinning model registers 0..2).
func (l *Logger) SetInput(addr uint16, v ...uint16) { l.eng.setInput(addr, v) }

// SetCoils stores coils from addr on.
func (l *Logger) SetCoils(addr uint16, v ...bool) { l.eng.setBits(&l.eng.coils, addr, v) }

// SetDiscrete stores discrete inputs from addr on (discrete input 0 is the model's alarm).
func (l *Logger) SetDiscrete(addr uint16, v ...bool) { l.eng.setBits(&l.eng.discrete, addr, v) }

// Holding returns n holding registers from addr as a read would serve them now.
func (l *Logger) Holding(addr uint16, n int) []uint16 { return l.eng.regs(3, addr, n) }

// Input returns n input registers from addr as a read would serve them now.
func (l *Logger) Input(addr uint16, n int) []uint16 { return l.eng.regs(4, addr, n) }

// Coils returns n coils from addr.
func (l *Logger) Coils(addr uint16, n int) []bool { return l.eng.bitsAt(1, addr, n) }

// roll draws true with probability p.
func (l *Logger) roll(p float64) bool {
	if p <= 0 {
		return false
	}
	l.rngMu.Lock()
	x := l.rng.Float64()
	l.rngMu.Unlock()
	return x < p
}

// delay draws the reply delay; a non-zero one counts as a fault.
func (l *Logger) delay(f *Faults) time.Duration {
	d := f.Delay
	if f.Jitter > 0 {
		l.rngMu.Lock()
		d += time.Duration(l.rng.Int64N(int64(f.Jitter) + 1))
		l.rngMu.Unlock()
	}
	if d > 0 {
		l.ctr.faults.Add(1)
	}
	return d
}

func (l *Logger) rtuFraming() bool { return l.transport == "rtu" || l.transport == "rtutcp" }

// reply is what the fault pipeline decided for one request.
type reply struct {
	frame     []byte // nil: no reply
	delay     time.Duration
	duplicate bool
	otherPort bool
}

// serve runs one request (adu, whose PDU is pdu) through the fault knobs
// and the engine, and appends the framed response (MBAP for tcp/udp, RTU
// otherwise) to dst.
func (l *Logger) serve(dst, adu, pdu []byte) reply {
	f := l.faults.Load() // before counting: once a request is counted, its faults are fixed
	l.ctr.requests.Add(1)
	if l.roll(f.DropRequest) {
		l.ctr.faults.Add(1)
		l.ctr.dropped.Add(1)
		return reply{}
	}
	var buf [maxPDULen]byte
	var resp []byte
	if l.roll(f.Exception) {
		l.ctr.faults.Add(1)
		resp = exception(buf[:0], pdu[0], ExcServerDeviceFailed)
	} else {
		resp = l.eng.appendHandle(buf[:0], pdu)
	}
	if len(resp) == 0 {
		return reply{}
	}
	if l.roll(f.DropResponse) {
		l.ctr.faults.Add(1)
		l.ctr.dropped.Add(1)
		return reply{}
	}
	var tidDelta uint16
	if l.roll(f.WrongTID) {
		l.ctr.faults.Add(1)
		tidDelta = 1
	}
	var r reply
	if l.rtuFraming() {
		r.frame = appendRTU(dst, adu[0], resp)
	} else {
		r.frame = appendMBAP(dst, adu, tidDelta, resp)
	}
	if l.roll(f.BadCRC) && l.rtuFraming() {
		l.ctr.faults.Add(1)
		r.frame[len(r.frame)-1] ^= 0xFF
	}
	if l.roll(f.Truncate) {
		l.ctr.faults.Add(1)
		r.frame = r.frame[:len(r.frame)-1]
	}
	if l.roll(f.Duplicate) {
		l.ctr.faults.Add(1)
		r.duplicate = true
	}
	if l.roll(f.OtherPort) && l.transport == "udp" {
		l.ctr.faults.Add(1)
		r.otherPort = true
	}
	r.delay = l.delay(f)
	return r
}
