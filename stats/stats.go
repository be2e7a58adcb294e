package stats

import (
	"math"
	"sort"
	"sync/atomic"
	"time"
)

// RTT histogram buckets: upper bounds in microseconds, roughly 4 per decade
// from 50 µs to 10 s, plus +Inf. Fixed so Prometheus series stay stable.
var BucketBounds = []float64{
	50, 100, 200, 300, 500, 750,
	1000, 2000, 3000, 5000, 7500,
	10000, 20000, 30000, 50000, 75000,
	100000, 200000, 300000, 500000, 750000,
	1000000, 2000000, 5000000, 10000000,
}

// Histogram counts durations into BucketBounds. Safe for concurrent use.
type Histogram struct {
	counts [26]atomic.Uint64 // len(BucketBounds)+1, last is +Inf
	sumUS  atomic.Uint64
	n      atomic.Uint64
}

// Observe records one duration.
func (h *Histogram) Observe(d time.Duration) {
	us := float64(d.Microseconds())
	i := 0
	for i < len(BucketBounds) && us > BucketBounds[i] {
		i++
	}
	h.counts[i].Add(1)
	h.sumUS.Add(uint64(max(d.Microseconds(), 0)))
	h.n.Add(1)
}

// HistogramSnapshot is a copy of a Histogram. Counts are per bucket, not cumulative.
type HistogramSnapshot struct {
	Counts [26]uint64
	SumUS  uint64
	N      uint64
}

// Snapshot copies the histogram.
func (h *Histogram) Snapshot() HistogramSnapshot {
	var s HistogramSnapshot
	for i := range h.counts {
		s.Counts[i] = h.counts[i].Load()
	}
	s.SumUS = h.sumUS.Load()
	s.N = h.n.Load()
	return s
}

// Quantile estimates the q-quantile (0..1) by linear interpolation inside the
// bucket, in microseconds. 0 when empty.
func (s HistogramSnapshot) Quantile(q float64) float64 {
	var total uint64
	for _, c := range s.Counts {
		total += c
	}
	if total == 0 {
		return 0
	}
	rank := q * float64(total)
	var cum float64
	for i, c := range s.Counts {
		if c == 0 {
			continue
		}
		if cum+float64(c) >= rank {
			lo := 0.0
			if i > 0 {
				lo = BucketBounds[i-1]
			}
			hi := lo * 2
			if i < len(BucketBounds) {
				hi = BucketBounds[i]
			}
			return lo + (hi-lo)*(rank-cum)/float64(c)
		}
		cum += float64(c)
	}
	return BucketBounds[len(BucketBounds)-1]
}

// Device is the live health record of one device. The zero value is ready.
type Device struct {
	Requests   atomic.Uint64 // requests completed: answered, timed out or failed (retries included)
	Responses  atomic.Uint64 // valid responses matched to their request
	Timeouts   atomic.Uint64 // requests that got no answer in time
	Exceptions atomic.Uint64 // Modbus exception replies
	Errors     atomic.Uint64 // other failures: transport, malformed, wrong length
	Reconnects atomic.Uint64 // TCP dials after the first, serial reopens
	Late       atomic.Uint64 // responses that came after their request gave up (UDP)
	Duplicates atomic.Uint64 // second response to one request (UDP)
	Dropped    atomic.Uint64 // datagrams/frames dropped: unknown source, malformed, wrong unit

	Polls      atomic.Uint64 // scheduled polls done (one per window polled), counted at their end
	GoodPolls  atomic.Uint64 // polls that produced good samples within their interval
	Overruns   atomic.Uint64 // windows skipped because the previous poll was still running
	Skipped    atomic.Uint64 // windows not polled because the device is demoted
	Demotions  atomic.Uint64 // times the device was demoted
	Demoted    atomic.Bool   // currently polled at a reduced rate
	LastGoodUS atomic.Int64  // Unix µs of the last good poll, 0 if never
	Down       atomic.Bool   // the transport cannot be opened (missing port, unresolvable host): retried with backoff
	reason     atomic.Pointer[string]

	RTT   Histogram // one request's round trip (good responses only)
	Cycle Histogram // one whole poll (all reads of the device, retries included)
}

// Snapshot is a plain copy of a Device for display and export.
type Snapshot struct {
	Requests, Responses, Timeouts, Exceptions, Errors, Reconnects uint64
	Late, Duplicates, Dropped                                     uint64
	Polls, GoodPolls, Overruns, Skipped, Demotions                uint64
	Demoted                                                       bool
	LastGoodUS                                                    int64
	Down                                                          bool
	Reason                                                        string // why the device is down or its last poll failed; "" when good
	RTT, Cycle                                                    HistogramSnapshot
}

// SetReason records why the device is down or its last poll failed ("" clears it).
func (d *Device) SetReason(r string) {
	if cur := d.reason.Load(); (cur == nil && r == "") || (cur != nil && *cur == r) {
		return
	}
	if r == "" {
		d.reason.Store(nil)
		return
	}
	d.reason.Store(&r)
}

// Reason is the last SetReason ("" when none).
func (d *Device) Reason() string {
	if r := d.reason.Load(); r != nil {
		return *r
	}
	return ""
}

// Snapshot copies the record.
func (d *Device) Snapshot() Snapshot {
	return Snapshot{
		Requests: d.Requests.Load(), Responses: d.Responses.Load(), Timeouts: d.Timeouts.Load(),
		Exceptions: d.Exceptions.Load(), Errors: d.Errors.Load(), Reconnects: d.Reconnects.Load(),
		Late: d.Late.Load(), Duplicates: d.Duplicates.Load(), Dropped: d.Dropped.Load(),
		Polls: d.Polls.Load(), GoodPolls: d.GoodPolls.Load(), Overruns: d.Overruns.Load(), Skipped: d.Skipped.Load(),
		Demotions: d.Demotions.Load(), Demoted: d.Demoted.Load(), LastGoodUS: d.LastGoodUS.Load(),
		Down: d.Down.Load(), Reason: d.Reason(),
		RTT: d.RTT.Snapshot(), Cycle: d.Cycle.Snapshot(),
	}
}

// LossRate is the share of requests that got no valid response (0..1).
func (s Snapshot) LossRate() float64 {
	if s.Requests == 0 {
		return 0
	}
	lost := float64(s.Requests) - float64(s.Responses) - float64(s.Exceptions)
	return math.Max(0, lost/float64(s.Requests))
}

// ValidRate is the share of scheduled polls (started, skipped as overruns or
// skipped while demoted) that produced a good sample within their interval
// (0..1): the study's "valid sample rate".
func (s Snapshot) ValidRate() float64 {
	sched := s.Polls + s.Overruns + s.Skipped
	if sched == 0 {
		return 0
	}
	return min(1, float64(s.GoodPolls)/float64(sched)) // counters are read one by one
}

// Info names a device for display. Filled once by edge from the config.
type Info struct {
	Name      string `json:"name"`
	Transport string `json:"transport"` // tcp | udp | rtu | rtuovertcp
	Address   string `json:"address"`
	Unit      uint8  `json:"unit"`
	Interval  time.Duration
	Tags      []TagInfo
}

// TagInfo describes one tag for display (the page's table, /api/devices).
type TagInfo struct {
	Name     string  `json:"name"`
	Unit     string  `json:"unit,omitempty"`
	Writable bool    `json:"writable,omitempty"`
	Deadband float64 `json:"deadband,omitempty"` // the page's sparkline spans at least this
	// IntervalMS: the tag's own poll interval when it has one (a multiple of
	// its device's), in ms; 0: the device's.
	IntervalMS int64 `json:"interval_ms,omitempty"`
	// DeadbandPercent, MaxSilenceMS: the tag's report by exception (a
	// value kept only when it moved more than this % of the last one kept,
	// and at least every MaxSilenceMS); 0: none.
	DeadbandPercent float64 `json:"deadband_percent,omitempty"`
	MaxSilenceMS    int64   `json:"max_silence_ms,omitempty"`
}

// UnitIndex is a lookup of tag units among n devices sorted by name, the
// i-th being info(i): "" for a device or tag it does not know.
func UnitIndex(n int, info func(i int) *Info) func(device, tag string) string {
	return func(device, tag string) string {
		i := sort.Search(n, func(i int) bool { return info(i).Name >= device })
		if i == n || info(i).Name != device {
			return ""
		}
		for _, t := range info(i).Tags {
			if t.Name == tag {
				return t.Unit
			}
		}
		return ""
	}
}

// Entry is one device's identity and live record, as edge publishes them.
type Entry struct {
	Info  Info
	Stats *Device
}
