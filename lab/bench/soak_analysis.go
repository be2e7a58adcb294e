// The soak's analysis: valid rates, resource trends and what the receiver
// stored.

package bench

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"time"
)

// untouchedRates sets the valid rate of the untouched loggers from two
// /api/devices snapshots span apart and returns their names. Every window
// of the span counts, polled or not (overrun, or skipped while demoted):
// the clock, not the gateway, says how many.
func (r *SoakReport) untouchedRates(loggers []soakLogger, a0, b0 map[string]soakDevice, span time.Duration, cfg SoakConfig) map[string]bool {
	untouched := map[string]bool{}
	for _, l := range loggers {
		if !l.untouched {
			continue
		}
		untouched[l.name] = true
		a, b := a0[l.name], b0[l.name]
		r.UntouchedSched += uint64(span / cfg.Interval)
		r.UntouchedGood += b.GoodPolls - a.GoodPolls
		r.Demotions += b.Demotions - a.Demotions
	}
	r.Untouched = len(untouched)
	if r.UntouchedSched > 0 {
		r.ValidRate = min(1, float64(r.UntouchedGood)/float64(r.UntouchedSched))
	}
	r.ValidBound = SoakBound(cfg.Loss, cfg.Retries, r.UntouchedSched)
	return untouched
}

// trends fills the resource trends from the samples after warm-up.
func (r *SoakReport) trends(warmup time.Duration) {
	r.GoroutinesFrom = "go_goroutines"
	for _, s := range r.Samples {
		if s.Goroutines < 0 {
			r.GoroutinesFrom = "not exposed by /metrics (threads shown instead)"
		}
	}
	var first bool
	for _, s := range r.Samples {
		if s.T < warmup.Seconds() {
			continue
		}
		g := float64(s.Goroutines)
		if !first {
			first = true
			r.RSSMiB.First, r.FDs.First, r.Threads.First, r.Goroutine.First = s.RSSMiB, float64(s.FDs), float64(s.Threads), g
		}
		r.RSSMiB.Last, r.FDs.Last, r.Threads.Last, r.Goroutine.Last = s.RSSMiB, float64(s.FDs), float64(s.Threads), g
		r.RSSMiB.Max, r.FDs.Max = max(r.RSSMiB.Max, s.RSSMiB), max(r.FDs.Max, float64(s.FDs))
		r.Threads.Max, r.Goroutine.Max = max(r.Threads.Max, float64(s.Threads)), max(r.Goroutine.Max, g)
	}
	if r.GoroutinesFrom != "go_goroutines" {
		r.Goroutine = Trend{}
	}
}

// received reads the receiver's JSON lines: dedup by (gateway, epoch, seq)
// against 1..Numbered, and the gaps between good samples of the untouched
// loggers up to endUS.
func (r *SoakReport) received(f io.Reader, untouched map[string]bool, iv time.Duration, endUS int64) error {
	type key struct {
		gw    string
		epoch string // 16 hex digits; "" in version 1 frames
	}
	seen := map[key][]uint64{} // bitmaps over 1..Numbered
	words := (r.Numbered + 64) / 64
	ts := map[string][]int64{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		var s struct {
			Gateway string `json:"gateway"`
			Epoch   string `json:"epoch"`
			Seq     uint64 `json:"seq"`
			Device  string `json:"device"`
			Tag     string `json:"tag"`
			Quality string `json:"quality"`
			TS      int64  `json:"ts"`
		}
		if err := json.Unmarshal(sc.Bytes(), &s); err != nil {
			return fmt.Errorf("bench: soak: received.jsonl: %w", err)
		}
		k := key{gw: s.Gateway, epoch: s.Epoch}
		bm := seen[k]
		if bm == nil {
			bm = make([]uint64, words)
			seen[k] = bm
		}
		if s.Seq >= 1 && s.Seq <= r.Numbered {
			w, bit := s.Seq/64, uint64(1)<<(s.Seq%64)
			if bm[w]&bit != 0 {
				r.Duplicates++
				continue
			}
			bm[w] |= bit
			r.Received++
		}
		if untouched[s.Device] && s.Tag == "temperature" && s.Quality == "good" && s.TS <= endUS {
			ts[s.Device] = append(ts[s.Device], s.TS)
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("bench: soak: received.jsonl: %w", err)
	}
	for k := range seen {
		if k.epoch != "" {
			r.Epochs++
		}
	}
	r.Lost = r.Numbered - min(r.Received, r.Numbered)
	ivUS := float64(iv.Microseconds())
	for dev := range untouched {
		t := ts[dev]
		slices.Sort(t)
		for i := 1; i < len(t); i++ {
			g := float64(t[i]-t[i-1]) / ivUS
			r.MaxGapIntervals = max(r.MaxGapIntervals, g)
			switch {
			case g >= 3:
				r.DoubleMisses++
			case g >= 1.5:
				r.SingleMisses++
			}
		}
	}
	return nil
}
