package history

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"edgegw/internal/backoff"
	"edgegw/ringstore"
	"edgegw/stats"
)

// Defaults for the zero values of Config.
const (
	DefaultRawWindow = 10 * time.Minute
	// DefaultMaxRAM bounds the raw window's encoded chunks of every tag
	// together: at the 2.3 to 3.3 bytes a point measured on simulated and
	// recorded loggers (docs/BENCHMARKS.md) it holds the whole 10 minutes of
	// 2,100 to 3,000 points a second; 48 loggers × 2 tags at 1 s use 4% of it.
	// Beyond it the oldest chunks go first, counted (Counters.RawEvicted).
	DefaultMaxRAM     = 4 << 20
	DefaultStep       = time.Minute
	DefaultFineKeep   = 6 * time.Hour
	DefaultCoarseStep = 10 * time.Minute
	DefaultKeep       = 7 * 24 * time.Hour
	DefaultMaxPoints  = 2000
)

// Config is the store's configuration; its zero value means "defaults".
type Config struct {
	Dir string // "" = RAM only; else closed fine buckets are kept in Dir (created)

	RawWindow    time.Duration // 10 min of raw samples per tag
	RawMaxPoints int           // 0: no bound per tag (MaxRAM bounds them all); > 0: at most about this many per tag (whole chunks drop)
	MaxRAM       int64         // 4 MiB: bytes of raw chunks of every tag together
	Step         time.Duration // 1 min: the fine buckets
	FineKeep     time.Duration // 6 h of fine buckets in RAM (Dir keeps them for Keep)
	CoarseStep   time.Duration // 10 min: the coarse buckets, merged from the fine ones; a multiple of Step
	Keep         time.Duration // 7 days of coarse buckets in RAM, of fine ones on disk
	MaxPoints    int           // 2000: the most points one query may return

	// Devices lists the polled devices with their live records; nil: no
	// health history. Sampled once per Step by Run.
	Devices func() []stats.Entry

	Logger *slog.Logger // nil: discard
}

func (c *Config) fill() error {
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&c.RawWindow, DefaultRawWindow)
	def(&c.Step, DefaultStep)
	def(&c.FineKeep, DefaultFineKeep)
	def(&c.CoarseStep, DefaultCoarseStep)
	def(&c.Keep, DefaultKeep)
	if c.RawMaxPoints < 0 {
		c.RawMaxPoints = 0
	}
	if c.MaxRAM <= 0 {
		c.MaxRAM = DefaultMaxRAM
	}
	if c.MaxPoints <= 0 {
		c.MaxPoints = DefaultMaxPoints
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if c.Step%time.Microsecond != 0 || c.CoarseStep%c.Step != 0 || c.CoarseStep < c.Step {
		return fmt.Errorf("history: coarse step %v is not a multiple of the step %v", c.CoarseStep, c.Step)
	}
	if c.FineKeep < c.Step || c.Keep < c.CoarseStep {
		return fmt.Errorf("history: keep %v / fine keep %v shorter than one bucket", c.Keep, c.FineKeep)
	}
	return nil
}

type key struct{ device, tag string }

// series is one tag's history.
type series struct {
	key
	isBool bool
	raw    raw
	fine   tier[cell]
	coarse tier[cell]
	open   acc // the fine bucket being filled
	copen  acc // the coarse bucket being filled, from closed fine cells
}

// device is one device's health history.
type device struct {
	name   string
	fine   tier[hcell]
	coarse tier[hcell]
	open   hacc
	copen  hacc
	prev   stats.Snapshot // the record at the last tick
	seen   bool           // prev is set
}

// Store is the history. Build it with Open.
type Store struct {
	cfg         Config
	log         *slog.Logger
	step, cstep int64 // µs
	k           int64 // fine buckets per coarse bucket
	nFine, nCrs int
	rawWindowUS int64
	lastTickIdx int64
	disk        *disk       // nil without Dir
	diskErrLog  backoff.Log // failed writes: a line at most once an hour

	mu      sync.Mutex
	series  map[key]*series
	devices map[string]*device
	// rows is each device's series in the order of its last batch (a
	// poll's tags come in the config's order), so Add looks up the map
	// once a batch, not once a sample. Series are never removed.
	rows    map[string][]*series
	pending []record // closed fine buckets not yet written

	rawBytes   int64         // encoded raw chunks with their overhead (heads included)
	budget     []budgetEntry // sealed chunks in the order they were sealed: MaxRAM evicts from budget[bhead]
	bhead      int
	budgetDead int // entries of budget[bhead:] whose chunk the window dropped

	added, late, dropped   atomic.Uint64
	evicted, evictedPoints atomic.Uint64
	corrupt                atomic.Uint64 // raw chunks that did not decode (a bug if ever > 0)
	written, writeErrs     atomic.Uint64

	emu       sync.Mutex // guards the write health
	failing   error      // the last write's error; nil once one succeeds
	lastErr   error      // the last write error since Open (WriteHealth)
	lastErrAt time.Time
}

// maxPending bounds the closed buckets waiting for the disk (Run writes them
// every Step; this only matters when the disk fails or Run is not running).
const maxPending = 1 << 17

// Open fills cfg's defaults, reads what Dir holds (dropping a torn tail) and
// returns the store. It starts no goroutine.
func Open(cfg Config) (*Store, error) {
	if err := cfg.fill(); err != nil {
		return nil, err
	}
	s := &Store{diskErrLog: backoff.Log{Every: time.Hour, Level: slog.LevelError},
		cfg: cfg, log: cfg.Logger,
		step: cfg.Step.Microseconds(), cstep: cfg.CoarseStep.Microseconds(),
		nFine: int(cfg.FineKeep / cfg.Step), nCrs: int(cfg.Keep / cfg.CoarseStep),
		rawWindowUS: cfg.RawWindow.Microseconds(), lastTickIdx: noBucket,
		series: make(map[key]*series), devices: make(map[string]*device), rows: make(map[string][]*series),
	}
	s.k = s.cstep / s.step
	if cfg.Dir != "" {
		d := openDisk(cfg.Dir, s.step, cfg.Keep, s.log)
		s.disk = d
		if err := d.load(time.Now(), s.restore); err != nil {
			d.close()
			return nil, err
		}
	}
	return s, nil
}

// Close closes the directory (Run writes what is pending before it returns).
func (s *Store) Close() error {
	if s.disk == nil {
		return nil
	}
	return s.disk.close()
}

func (s *Store) newSeries(k key) *series {
	return &series{key: k, raw: raw{maxPoints: s.cfg.RawMaxPoints, spanUS: max(1, s.rawWindowUS/4)}, fine: newTier[cell](s.nFine),
		coarse: newTier[cell](s.nCrs), open: newAcc(), copen: newAcc()}
}

func (s *Store) newDevice(name string) *device {
	return &device{name: name, fine: newTier[hcell](s.nFine), coarse: newTier[hcell](s.nCrs), open: newHacc(), copen: newHacc()}
}

// Add records one poll's samples (what edge handed to the ring). It does
// no I/O and holds the lock for one map look-up per batch (the batch's
// device's row of series), more only for a tag the row does not hold at
// that position (the first batches, or a reload that changed the tags).
func (s *Store) Add(batch []ringstore.Sample) {
	if len(batch) == 0 {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.added.Add(uint64(len(batch)))
	dev := batch[0].Device
	row := s.rows[dev]
	rowChanged := false
	for i := range batch {
		smp := &batch[i]
		var sr *series
		if i < len(row) && row[i].tag == smp.Tag && row[i].device == smp.Device {
			sr = row[i]
		} else {
			k := key{smp.Device, smp.Tag}
			if sr = s.series[k]; sr == nil {
				sr = s.newSeries(k)
				s.series[k] = sr
			}
			if smp.Device == dev && i <= len(row) {
				if i == len(row) {
					row = append(row, sr)
				} else {
					row[i] = sr
				}
				rowChanged = true
			}
		}
		sr.isBool = smp.Bool
		idx := floorDiv(smp.TS, s.step)
		switch {
		case (!sr.open.open() && idx <= sr.fine.head) || (sr.open.open() && idx < sr.open.idx):
			s.late.Add(1) // its bucket is closed (a clock step back): the raw window keeps it
		case !sr.open.open() || idx > sr.open.idx:
			s.closeFine(sr, idx)
		}
		if idx == sr.open.idx {
			sr.open.add(smp.Value, smp.Quality == ringstore.Good)
		}
		s.rawAdd(sr, smp.TS, smp.Value, smp.Quality, smp.TS-s.rawWindowUS)
	}
	if rowChanged {
		s.rows[dev] = row
	}
}

// closeFine closes sr's open fine bucket (if any) and opens bucket next.
// Called with mu held.
func (s *Store) closeFine(sr *series, next int64) {
	if sr.open.open() {
		c := sr.open.cell()
		sr.fine.put(sr.open.idx, c)
		s.foldCoarse(sr, sr.open.idx, c)
		if s.disk != nil {
			if len(s.pending) >= maxPending {
				s.dropped.Add(1)
			} else {
				s.pending = append(s.pending, record{kind: recTag, device: sr.device, tag: sr.tag, idx: sr.open.idx, c: c})
			}
		}
	}
	sr.open.reset(next)
}

func (s *Store) foldCoarse(sr *series, fineIdx int64, c cell) {
	ci := floorDiv(fineIdx, s.k)
	if sr.copen.open() && ci > sr.copen.idx {
		sr.coarse.put(sr.copen.idx, sr.copen.cell())
		sr.copen.reset(ci)
	} else if !sr.copen.open() {
		sr.copen.reset(ci)
	}
	if ci == sr.copen.idx {
		sr.copen.merge(c)
	}
}

func (s *Store) foldCoarseHealth(d *device, fineIdx int64, c hcell) {
	ci := floorDiv(fineIdx, s.k)
	if d.copen.open() && ci > d.copen.idx {
		d.coarse.put(d.copen.idx, d.copen.cell())
		d.copen.reset(ci)
	} else if !d.copen.open() {
		d.copen.reset(ci)
	}
	if ci == d.copen.idx {
		d.copen.merge(c)
	}
}

// restore puts one bucket read from disk (in file order) back in RAM.
func (s *Store) restore(r record) {
	switch r.kind {
	case recTag:
		k := key{r.device, r.tag}
		sr := s.series[k]
		if sr == nil {
			sr = s.newSeries(k)
			s.series[k] = sr
		}
		sr.fine.put(r.idx, r.c)
		s.foldCoarse(sr, r.idx, r.c)
	case recHealth:
		d := s.devices[r.device]
		if d == nil {
			d = s.newDevice(r.device)
			s.devices[r.device] = d
		}
		d.fine.put(r.idx, r.h)
		s.foldCoarseHealth(d, r.idx, r.h)
	}
}

// Tick closes every bucket that ended before now (tags that got no sample
// since), closes the health bucket of the step that just ended from the
// device records, and returns. Run calls it at each step boundary.
func (s *Store) Tick(now time.Time) {
	var entries []stats.Entry
	if s.cfg.Devices != nil {
		entries = s.cfg.Devices()
	}
	snaps := make([]stats.Snapshot, len(entries))
	for i, e := range entries {
		if e.Stats != nil {
			snaps[i] = e.Stats.Snapshot()
		}
	}
	nowIdx := floorDiv(now.UnixMicro(), s.step)
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, sr := range s.series {
		if sr.open.open() && sr.open.idx < nowIdx {
			s.closeFine(sr, noBucket)
		}
	}
	// The health of the step before now: the records' change since the last tick.
	for i, e := range entries {
		d := s.devices[e.Info.Name]
		if d == nil {
			d = s.newDevice(e.Info.Name)
			s.devices[e.Info.Name] = d
		}
		cur := snaps[i]
		switch {
		case !d.seen:
			d.prev, d.seen = cur, true
		case nowIdx > s.lastTickIdx:
			c := healthDelta(d.prev, cur)
			idx := nowIdx - 1
			d.fine.put(idx, c)
			s.foldCoarseHealth(d, idx, c)
			if s.disk != nil && len(s.pending) < maxPending {
				s.pending = append(s.pending, record{kind: recHealth, device: d.name, idx: idx, h: c})
			}
			d.prev = cur
		}
	}
	s.lastTickIdx = nowIdx
}

// healthDelta is the health of one step from two records of a device.
func healthDelta(a, b stats.Snapshot) hcell {
	sub := func(x, y uint64) uint64 {
		if y < x { // a new record (reload): take it whole
			return y
		}
		return y - x
	}
	c := hcell{
		sched: sat32(sub(a.Polls+a.Overruns+a.Skipped, b.Polls+b.Overruns+b.Skipped)),
		good:  sat32(sub(a.GoodPolls, b.GoodPolls)),
	}
	var d stats.HistogramSnapshot
	for i := range d.Counts {
		d.Counts[i] = sub(a.RTT.Counts[i], b.RTT.Counts[i])
	}
	d.N, d.SumUS = sub(a.RTT.N, b.RTT.N), sub(a.RTT.SumUS, b.RTT.SumUS)
	if d.N > 0 {
		c.rttMeanUS = float32(float64(d.SumUS) / float64(d.N))
		c.rttP99US = float32(d.Quantile(0.99))
		if c.rttMeanUS == 0 {
			c.rttMeanUS = 1e-3 // an answer under 1 µs is still an answer
		}
	}
	return c
}

// Flush writes the closed buckets waiting for the disk in one batch.
func (s *Store) Flush() error {
	if s.disk == nil {
		return nil
	}
	s.mu.Lock()
	recs := s.pending
	s.pending = nil
	s.mu.Unlock()
	if len(recs) == 0 {
		return nil
	}
	n, err := s.disk.write(time.Now(), recs)
	s.written.Add(uint64(n))
	s.emu.Lock()
	s.failing = err
	if err != nil {
		s.lastErr, s.lastErrAt = err, time.Now()
	}
	s.emu.Unlock()
	if err != nil {
		s.writeErrs.Add(1)
		s.dropped.Add(uint64(len(recs)))
		return fmt.Errorf("history: write %d buckets: %w", len(recs), err)
	}
	return nil
}

// WriteHealth is the writer of Dir: failing is the error of the last write
// when it failed (nil once one succeeds; writes happen once a Step), last
// the last write error since Open and at when it happened (zero: none).
func (s *Store) WriteHealth() (at time.Time, failing, last error) {
	s.emu.Lock()
	defer s.emu.Unlock()
	return s.lastErrAt, s.failing, s.lastErr
}

// Run ticks at every step boundary (closing buckets, sampling the device
// records, writing the step's closed buckets in one batch) until ctx is
// done, then writes what is pending and returns.
func (s *Store) Run(ctx context.Context) error {
	s.Tick(time.Now())
	for {
		now := time.Now()
		next := time.UnixMicro((floorDiv(now.UnixMicro(), s.step) + 1) * s.step).Add(50 * time.Millisecond)
		t := time.NewTimer(next.Sub(now))
		select {
		case <-ctx.Done():
			t.Stop()
			err := s.Flush()
			if err != nil {
				s.log.Error("history: final write failed", "err", err)
			}
			return nil
		case <-t.C:
		}
		s.Tick(time.Now())
		if err := s.Flush(); err != nil {
			s.diskErrLog.Log(s.log, "write", "history: write failed (logged once an hour)", "err", err)
		}
	}
}

// Counters is a copy of the store's counters.
type Counters struct {
	Samples          uint64 // samples added
	Late             uint64 // samples whose bucket had closed (kept in the raw window only)
	Dropped          uint64 // closed buckets not written: the disk failed or fell behind
	BytesWritten     uint64 // bytes written to Dir since start
	WriteErrors      uint64
	Series           int
	Devices          int
	RawBytes         int64  // RAM of the raw window's chunks (bounded by Config.MaxRAM)
	RawEvicted       uint64 // chunks dropped before their time for MaxRAM
	RawEvictedPoints uint64
	RawCorrupt       uint64 // raw chunks a query could not decode (0 unless there is a bug)
}

// Counters copies the counters.
func (s *Store) Counters() Counters {
	s.mu.Lock()
	n, d, rb := len(s.series), len(s.devices), s.rawBytes
	s.mu.Unlock()
	return Counters{Samples: s.added.Load(), Late: s.late.Load(), Dropped: s.dropped.Load(),
		BytesWritten: s.written.Load(), WriteErrors: s.writeErrs.Load(), Series: n, Devices: d,
		RawBytes: rb, RawEvicted: s.evicted.Load(), RawEvictedPoints: s.evictedPoints.Load(), RawCorrupt: s.corrupt.Load()}
}

// Errors of Query and Health; web turns them into 400s.
var (
	ErrUnknown    = errors.New("history: no such series")
	ErrRange      = errors.New("history: from is after to")
	ErrTooMany    = errors.New("history: too many points")
	ErrBadStep    = errors.New("history: step below the bucket step")
	ErrNoInterval = errors.New("history: empty range")
)
