package edge

import (
	"errors"
	"fmt"
	"log/slog"
	"math"
	"sync"
	"time"

	"edgegw/edge/modbus"
	"edgegw/ringstore"
	"edgegw/stats"
)

// Conn is what a poll needs from a transport: one device's requests, one at
// a time. Every connection type of edge/modbus satisfies it.
type Conn interface {
	ReadCoils(addr, qty uint16) ([]byte, error)
	ReadDiscreteInputs(addr, qty uint16) ([]byte, error)
	ReadHoldingRegisters(addr, qty uint16) ([]byte, error)
	ReadInputRegisters(addr, qty uint16) ([]byte, error)
}

// counted is the optional side of a Conn that reports transport counters.
type counted interface{ Counters() modbus.Counters }

var (
	_ Conn    = (*modbus.TCPConn)(nil)
	_ Conn    = (*modbus.UDPConn)(nil)
	_ Conn    = (*modbus.RTUConn)(nil)
	_ counted = (*modbus.TCPConn)(nil)
)

// device is one configured device: its plan, its connection, its record.
// Everything but stats, info and the plan lock is touched only by its bus goroutine.
type device struct {
	cfg    DeviceConfig
	info   stats.Info
	log    *slog.Logger
	stats  stats.Device
	conn   Conn
	offset time.Duration // stagger inside the interval
	slot   connSlot      // the connection it goes over (set while its bus is stopped)
	port   string        // key of the port it is attached to ("" when not); under runState.mu

	planMu  sync.Mutex // guards plans, maxRegs, maxBits, maxGap (Plan may be called from anywhere)
	rates   rates      // the tags' poll rates (fixed)
	plans   [][]Read   // the reads of each set of due rates, by mask>>1 (rates.plan)
	maxRegs int
	maxBits int
	maxGap  int

	// bus-goroutine state
	next      time.Time // start of the next scheduled window
	origin    time.Time // start of the first window: window n starts at origin + n*interval
	lastWin   []int64   // per rate: its last window polled (-1: none)
	mask      uint8     // the rates due in the poll in progress
	deadPolls int       // consecutive polls without any answer
	backoff   time.Duration
	values    []float64
	texts     []*string // string tags: the value, the same pointer while unchanged
	text      []byte    // the text being decoded, reused by every poll
	nan       []bool    // the tag's last value was NaN or ±Inf (logged once per episode)
	quality   []ringstore.Quality
	last      []ringstore.Sample // last appended sample per tag, for deadband
	batch     []ringstore.Sample
	loggedErr bool           // an error was logged since the last good poll
	req       modbus.Request // reused by every read of a Do connection and of a round
	ps        pollState      // the poll in progress
}

// connSlot is the connection a device is assigned to: the key of a shared
// port in runState.ports, or alone (a TCP device with a connection of its own).
type connSlot struct {
	key   string
	alone bool
}

func newDevice(dc DeviceConfig, log *slog.Logger) (*device, error) {
	if dc.Interval <= 0 {
		dc.Interval = DefaultInterval
	}
	if dc.Timeout <= 0 {
		dc.Timeout = DefaultTimeout
	}
	if dc.Retries < 0 {
		dc.Retries = 0
	}
	if dc.MaxRegs <= 0 || dc.MaxRegs > MaxReadRegisters {
		dc.MaxRegs = MaxReadRegisters
	}
	if dc.MaxBits <= 0 || dc.MaxBits > MaxReadBits {
		dc.MaxBits = MaxReadBits
	}
	if dc.MaxGap < 0 {
		dc.MaxGap = DefaultMaxGap
	}
	if len(dc.Tags) == 0 {
		return nil, fmt.Errorf("edge: device %q has no tags", dc.Name)
	}
	for i := range dc.Tags {
		if dc.Tags[i].Scale == 0 {
			dc.Tags[i].Scale = 1
		}
	}
	d := &device{
		cfg:     dc,
		log:     log.With("device", dc.Name),
		maxRegs: dc.MaxRegs,
		maxBits: dc.MaxBits,
		maxGap:  dc.MaxGap,
		values:  make([]float64, len(dc.Tags)),
		texts:   make([]*string, len(dc.Tags)),
		nan:     make([]bool, len(dc.Tags)),
		quality: make([]ringstore.Quality, len(dc.Tags)),
		last:    make([]ringstore.Sample, len(dc.Tags)),
		batch:   make([]ringstore.Sample, 0, len(dc.Tags)),
	}
	d.info = stats.Info{Name: dc.Name, Transport: dc.Transport, Address: dc.Address, Unit: dc.Unit, Interval: dc.Interval}
	for _, t := range dc.Tags {
		ti := stats.TagInfo{Name: t.Name, Unit: t.Unit, Writable: t.Writable, Deadband: t.Deadband,
			DeadbandPercent: t.DeadbandPercent, MaxSilenceMS: t.MaxSilence.Milliseconds()}
		if t.Interval != 0 && t.Interval != dc.Interval {
			ti.IntervalMS = t.Interval.Milliseconds()
		}
		d.info.Tags = append(d.info.Tags, ti)
	}
	var err error
	if d.rates, err = newRates(dc.Name, dc.Tags, dc.Interval); err != nil {
		return nil, err
	}
	d.lastWin = make([]int64, len(d.rates.mult))
	for g := range d.lastWin {
		d.lastWin[g] = -1
	}
	d.plans = d.rates.plan(dc.Tags, d.maxGap, d.maxRegs, d.maxBits)
	return d, nil
}

// currentPlan returns the plan of a poll at which every rate is due. A
// plan is never changed in place (shrink installs new ones, poll splices
// into a copy), so the slice is shared without copying: one allocation
// less per poll.
func (d *device) currentPlan() []Read { return d.planOf(1<<len(d.rates.mult) - 1) }

// planOf returns the plan of a poll at which the rates in mask are due.
func (d *device) planOf(mask uint8) []Read {
	d.planMu.Lock()
	defer d.planMu.Unlock()
	return d.plans[mask>>1]
}

// due returns the rates due in d's current window (d.next) and marks
// their windows polled: rate 0 always; a slower rate when the window of
// its own that d.next is in has not been polled yet.
func (d *device) due() uint8 {
	if d.origin.IsZero() {
		d.origin = d.next
	}
	n := int64(d.next.Sub(d.origin) / d.cfg.Interval)
	mask := uint8(1)
	for g := 1; g < len(d.rates.mult); g++ {
		if w := n / d.rates.mult[g]; w != d.lastWin[g] {
			d.lastWin[g] = w
			mask |= 1 << g
		}
	}
	return mask
}

// shrink reacts to exception 2 on a read of several tags: first stop filling
// gaps (the hole may be what the device refuses), then halve the read size.
// It returns false when nothing smaller is possible.
func (d *device) shrink(r Read) bool {
	d.planMu.Lock()
	defer d.planMu.Unlock()
	if len(r.Tags) < 2 {
		return false
	}
	switch {
	case d.maxGap > 0:
		d.maxGap = 0
	case r.Register.Bits():
		d.maxBits = max(1, int(r.Quantity)/2)
	default:
		d.maxRegs = max(1, int(r.Quantity)/2)
	}
	d.plans = d.rates.plan(d.cfg.Tags, d.maxGap, d.maxRegs, d.maxBits)
	d.log.Warn("device refused a read (illegal data address): splitting reads",
		"read", r.String(), "max_gap", d.maxGap, "max_registers", d.maxRegs, "max_bits", d.maxBits)
	return true
}

// outcome of one request.
type outcome uint8

const (
	okReply outcome = iota
	exception
	timedOut
	failed
)

func classify(err error) outcome {
	switch {
	case err == nil:
		return okReply
	case errors.As(err, new(*modbus.ModbusError)):
		return exception
	case errors.Is(err, modbus.ErrTimeout):
		return timedOut
	}
	return failed
}

// doer is the allocation-free side of a connection (modbus.TCPConn,
// modbus.UDPConn): one prepared Request per call.
type doer interface{ Do(r *modbus.Request) }

var (
	_ doer = (*modbus.TCPConn)(nil)
	_ doer = (*modbus.UDPConn)(nil)
)

// readFC is the read function of a register table.
func readFC(r Register) byte { return [...]byte{3, 4, 1, 2}[r&3] }

// prepare sets d's reusable request to read r.
func (d *device) prepare(r Read) *modbus.Request {
	q := &d.req
	q.Func, q.Addr, q.Qty = readFC(r.Register), r.Address, r.Quantity
	return q
}

// read does one read. The data returned may be d's own buffer: valid
// until the next read of d.
func (d *device) read(r Read) ([]byte, error) {
	if c, ok := d.conn.(doer); ok {
		q := d.prepare(r)
		c.Do(q)
		return q.Data, q.Err
	}
	switch r.Register {
	case Holding:
		return d.conn.ReadHoldingRegisters(r.Address, r.Quantity)
	case Input:
		return d.conn.ReadInputRegisters(r.Address, r.Quantity)
	case Coil:
		return d.conn.ReadCoils(r.Address, r.Quantity)
	default:
		return d.conn.ReadDiscreteInputs(r.Address, r.Quantity)
	}
}

// pollState is one poll in progress: the blocking poll and a UDP round
// (round.go) advance it one request at a time through step.
type pollState struct {
	reads     []Read
	ri        int // read in progress
	attempt   int // of reads[ri]
	windowEnd time.Time
	start     time.Time
	sent      time.Time // the request in flight went out (round)
	peek      time.Time // the round looks at it even if its batch is not complete (round)
	answered  bool
	good      bool
	firstErr  error
}

func (p *pollState) done() bool { return p.ri >= len(p.reads) }

// read is the read in progress.
func (p *pollState) read() Read { return p.reads[p.ri] }

// beginPoll starts a poll that must end by windowEnd to be valid.
func (d *device) beginPoll(windowEnd time.Time) {
	d.mask = d.due()
	for i := range d.quality {
		if d.mask&(1<<d.rates.group[i]) != 0 { // a tag not due keeps its last poll's
			d.quality[i] = ringstore.Error
		}
	}
	d.ps = pollState{reads: d.planOf(d.mask), windowEnd: windowEnd, start: time.Now(), good: true}
}

// step takes the outcome of one request for the read in progress: the
// read is done (decoded, or failed for good) or is to be asked again (a
// retry, while another attempt can still end inside the window), or
// exception 2 splits it into smaller reads (shrink) asked next.
func (d *device) step(data []byte, err error, rtt time.Duration) {
	p := &d.ps
	r := p.read()
	d.stats.Requests.Add(1) // counted when done, so a request in flight never shows as lost
	q := ringstore.Error
	switch classify(err) {
	case okReply:
		d.stats.Responses.Add(1)
		d.stats.RTT.Observe(rtt)
		p.answered = true
		if err := d.decode(r, data); err != nil {
			p.fail(err)
			d.stats.Errors.Add(1)
		}
		p.ri, p.attempt = p.ri+1, 0
		return
	case exception:
		d.stats.Exceptions.Add(1)
		p.answered = true // the device answered; asking again gives the same answer
		if code, ok := modbus.IsException(err); ok && code == 2 && d.shrink(r) {
			// Re-plan and read the same tags again in smaller pieces.
			rest := append([]Read(nil), p.reads[p.ri+1:]...)
			p.reads = append(append(p.reads[:p.ri:p.ri], d.currentPlanFor(r.Tags)...), rest...)
			p.attempt = 0
			return
		}
	case timedOut:
		d.stats.Timeouts.Add(1)
		q = ringstore.Timeout
		if d.retry() {
			return
		}
	default:
		d.stats.Errors.Add(1)
		// ErrBackoff: the connection is down and waiting: no point retrying now.
		if !errors.Is(err, modbus.ErrBackoff) && d.retry() {
			return
		}
	}
	for _, ti := range r.Tags {
		d.quality[ti] = q
	}
	p.fail(err)
	p.ri, p.attempt = p.ri+1, 0
}

// retry reports whether the read in progress is asked again: retries are
// left and another attempt can still end inside the window.
func (d *device) retry() bool {
	p := &d.ps
	if p.attempt >= d.cfg.Retries || time.Now().Add(d.cfg.Timeout).After(p.windowEnd) {
		return false
	}
	p.attempt++
	return true
}

func (p *pollState) fail(err error) {
	p.good = false
	if p.firstErr == nil {
		p.firstErr = err
	}
}

// poll reads every tag once and appends one sample per tag to sink. It
// returns whether any request got an answer (exceptions count: the device
// is alive) and whether every tag is good.
func (d *device) poll(windowEnd time.Time, sink Sink) (answered, good bool) {
	d.beginPoll(windowEnd)
	for !d.ps.done() {
		t0 := time.Now()
		data, err := d.read(d.ps.read())
		d.step(data, err, time.Since(t0))
	}
	return d.finishPoll(sink)
}

// finishPoll appends the poll's samples and counts it.
func (d *device) finishPoll(sink Sink) (answered, good bool) {
	p := &d.ps
	now := time.Now()
	d.emit(now, sink) // samples first: whoever sees the counters move finds them in the ring
	d.stats.Cycle.Observe(now.Sub(p.start))
	if c, ok := d.conn.(counted); ok {
		cs := c.Counters()
		d.stats.Reconnects.Store(cs.Reconnects)
		d.stats.Late.Store(cs.Late)
		d.stats.Duplicates.Store(cs.Duplicates)
		d.stats.Dropped.Store(cs.Dropped)
	}
	d.stats.Polls.Add(1) // counted when done, so a poll in flight never shows as invalid
	if p.good && !now.After(p.windowEnd) {
		d.stats.GoodPolls.Add(1)
		d.stats.LastGoodUS.Store(now.UnixMicro())
	}
	if p.good {
		if d.stats.Reason() != "" { // SetReason's argument escapes: no call, no allocation
			d.stats.SetReason("")
		}
	} else if p.firstErr != nil {
		d.stats.SetReason(p.firstErr.Error())
	}
	d.logOutcome(p.good, p.firstErr)
	answered, good = p.answered, p.good
	p.reads, p.firstErr = nil, nil
	return answered, good
}

// currentPlanFor returns the reads of the current plan that cover any of tags.
func (d *device) currentPlanFor(tags []int) []Read {
	want := map[int]bool{}
	for _, t := range tags {
		want[t] = true
	}
	var out []Read
	for _, r := range d.planOf(d.mask) {
		for _, t := range r.Tags {
			if want[t] {
				out = append(out, r)
				break
			}
		}
	}
	return out
}

// decode fills values and quality for the tags of one read.
func (d *device) decode(r Read, data []byte) error {
	var firstErr error
	for _, ti := range r.Tags {
		t := &d.cfg.Tags[ti]
		off := int(t.Address) - int(r.Address)
		var raw float64
		var err error
		if r.Register.Bits() {
			if off/8 >= len(data) {
				err = fmt.Errorf("edge: device %q: tag %q: reply too short", d.cfg.Name, t.Name)
			} else if BitAt(data, off) {
				raw = 1
			}
		} else {
			end := 2 * (off + t.span())
			if end > len(data) {
				err = fmt.Errorf("edge: device %q: tag %q: reply too short", d.cfg.Name, t.Name)
			} else if t.Type == String {
				err = d.decodeText(ti, data[2*off:end])
			} else {
				raw, err = DecodeRegisters(t.Type, t.Order, t.Bit, data[2*off:end])
			}
		}
		v := scaled(t, raw)
		if err == nil && (math.IsNaN(v) || math.IsInf(v, 0)) {
			// The device answered: its register says "no number" (a probe
			// unplugged). The tag is in error, the poll and the device are not.
			d.quality[ti] = ringstore.Error
			if !d.nan[ti] {
				d.nan[ti] = true
				d.log.Warn("tag value is not a number: quality error until it is", "tag", t.Name,
					"err", fmt.Errorf("edge: device %q: tag %q: %w (%v)", d.cfg.Name, t.Name, ErrNotANumber, v))
			}
			continue
		}
		if err != nil {
			d.quality[ti] = ringstore.Error
			if firstErr == nil {
				firstErr = err
			}
			continue
		}
		d.values[ti] = v
		d.quality[ti] = ringstore.Good
		d.nan[ti] = false
	}
	return firstErr
}

// decodeText keeps a string tag's value, reusing the pointer while the text
// is unchanged (no allocation per poll for a serial number).
func (d *device) decodeText(ti int, regs []byte) error {
	t := &d.cfg.Tags[ti]
	var err error
	if d.text, err = AppendText(d.text[:0], t.Order, t.Location, regs); err != nil {
		return fmt.Errorf("edge: device %q: tag %q: %w", d.cfg.Name, t.Name, err)
	}
	if p := d.texts[ti]; p == nil || *p != string(d.text) {
		s := validText(d.text) // text that is not UTF-8 never equals *p: new each poll
		d.texts[ti] = &s
	}
	return nil
}

// scaled applies a tag's scale and offset. A scale that is 1/n for a whole
// n (0.1, 0.01, 0.5 …) divides by n instead: 559/10 is 55.9, while
// 559*0.1 is 55.900000000000006.
func scaled(t *Tag, raw float64) float64 {
	if t.Type == Bool {
		return raw
	}
	if inv := 1 / t.Scale; inv > 1 && math.Abs(inv-math.Round(inv)) < 1e-9*inv {
		return raw/math.Round(inv) + t.Offset
	}
	return raw*t.Scale + t.Offset
}

// emit appends one sample per tag due in this poll (d.mask), leaving out
// the good values a tag's deadband drops (keep).
func (d *device) emit(now time.Time, sink Sink) {
	ts := now.UnixMicro()
	d.batch = d.batch[:0]
	for i := range d.cfg.Tags {
		if d.mask&(1<<d.rates.group[i]) == 0 {
			continue // not due: its rate's window was polled already
		}
		t := &d.cfg.Tags[i]
		s := ringstore.Sample{Device: d.cfg.Name, Tag: t.Name, Value: d.values[i], Bool: t.Type == Bool, Quality: d.quality[i], TS: ts}
		switch t.Type {
		case Float32:
			s.Kind = ringstore.KindFloat32
		case String:
			s.Kind, s.Text, s.Value = ringstore.KindString, d.texts[i], 0
		}
		if s.Quality != ringstore.Good {
			s.Value, s.Text = 0, nil
		}
		if !keep(t, &d.last[i], &s) {
			continue
		}
		d.last[i] = s
		d.batch = append(d.batch, s)
	}
	if sink == nil || len(d.batch) == 0 {
		return
	}
	if _, _, err := sink.Append(d.batch); err != nil {
		d.log.Error("samples not stored", "err", err)
	}
}

// keep reports whether s, the new sample of t, is kept, last being the
// last sample of t kept (TS 0: none). Report by exception: a good value
// after a good one is left out when it moved less than t.Deadband, or not
// more than t.DeadbandPercent of |last| (at a last value of 0 every
// change is kept), unless the last value kept is t.MaxSilence old or
// older. Everything else is kept: the first sample, every sample that is
// not good, and the first good one after it.
func keep(t *Tag, last, s *ringstore.Sample) bool {
	if last.TS == 0 || last.Quality != ringstore.Good || s.Quality != ringstore.Good ||
		(t.Deadband <= 0 && t.DeadbandPercent <= 0) {
		return true
	}
	if t.MaxSilence > 0 && s.TS-last.TS >= t.MaxSilence.Microseconds() {
		return true
	}
	diff := math.Abs(s.Value - last.Value)
	if t.Deadband > 0 && diff < t.Deadband {
		return false
	}
	if t.DeadbandPercent > 0 && diff <= math.Abs(last.Value)*t.DeadbandPercent/100 {
		return false
	}
	return true
}

// markDown records that d's transport could not be opened: logged at the
// first failure and when the reason changes, not at every retry.
func (d *device) markDown(err error) {
	reason := err.Error()
	if !d.stats.Down.Load() || d.stats.Reason() != reason {
		d.log.Warn("device transport cannot open: device down, retrying with backoff", "err", err)
	}
	d.stats.SetReason(reason)
	d.stats.Down.Store(true)
}

// logOutcome logs the first failure after a good poll and the recovery, not
// every failure: a dead device must not flood the log.
func (d *device) logOutcome(good bool, err error) {
	switch {
	case !good && !d.loggedErr:
		d.log.Warn("poll failed", "err", err)
		d.loggedErr = true
	case good && d.loggedErr:
		d.log.Info("poll good again")
		d.loggedErr = false
	}
}
