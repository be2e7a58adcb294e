package receiver

import (
	"encoding/json"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"sort"

	"edgegw/wire"
)

// maxEpochs is how many epochs of one gateway the receiver remembers: the
// current one and a few before it, for late copies (MQTT redeliveries).
const maxEpochs = 4

// gwState is the dedup state of one gateway: a record per recent epoch.
// It is what the state file holds (JSON).
type gwState struct {
	Gateway string   `json:"gateway"`
	Current string   `json:"current"` // the newest epoch seen
	Epochs  []*dedup `json:"epochs"`  // most recently used last
}

func (g *gwState) epoch(e string) *dedup {
	for i, d := range g.Epochs {
		if d.Epoch == e {
			copy(g.Epochs[i:], g.Epochs[i+1:])
			g.Epochs[len(g.Epochs)-1] = d
			return d
		}
	}
	return nil
}

// epochOrNew is epoch(e), or a new record for e (the oldest beyond
// maxEpochs forgotten) and true.
func (g *gwState) epochOrNew(e string, maxPending int) (*dedup, bool) {
	if d := g.epoch(e); d != nil {
		return d, false
	}
	d := &dedup{Epoch: e, max: maxPending}
	g.Epochs = append(g.Epochs, d)
	if len(g.Epochs) > maxEpochs {
		g.Epochs = slices.Delete(g.Epochs, 0, len(g.Epochs)-maxEpochs)
	}
	return d, true
}

func (g *gwState) clone() *gwState {
	c := &gwState{Gateway: g.Gateway, Current: g.Current, Epochs: make([]*dedup, len(g.Epochs))}
	for i, d := range g.Epochs {
		dd := *d
		dd.Above = slices.Clone(d.Above)
		c.Epochs[i] = &dd
	}
	return c
}

// state returns the gateway's dedup state, loaded from its file the first
// time when StateDir is set. r.mu held.
func (r *Receiver) state(gateway string) *gwState {
	if g := r.gws[gateway]; g != nil {
		return g
	}
	g := &gwState{Gateway: gateway}
	if r.cfg.StateDir != "" {
		path := r.statePath(gateway)
		b, err := os.ReadFile(path)
		switch {
		case err == nil:
			var l gwState
			if err := json.Unmarshal(b, &l); err != nil || l.Gateway != gateway {
				r.log.Error("receiver: dedup state unreadable; starting afresh (duplicates possible)", "file", path, "err", err)
			} else {
				g = &l
				r.log.Info("receiver: dedup state loaded", "gateway", gateway, "epoch", g.Current, "file", path)
			}
		case !os.IsNotExist(err):
			r.log.Error("receiver: dedup state unreadable; starting afresh (duplicates possible)", "file", path, "err", err)
		}
	}
	for _, d := range g.Epochs {
		d.max = r.cfg.MaxPending
	}
	r.gws[gateway] = g
	return g
}

// statePath is <StateDir>/<gateway, path-escaped>.json.
func (r *Receiver) statePath(gateway string) string {
	return filepath.Join(r.cfg.StateDir, url.PathEscape(gateway)+".json")
}

// saveState replaces the gateway's state file (temporary file, rename).
func (r *Receiver) saveState(g *gwState) error {
	b, err := json.Marshal(g)
	if err != nil {
		return err
	}
	path := r.statePath(g.Gateway)
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, append(b, '\n'), 0o640); err != nil {
		_ = os.Remove(tmp)
		return err
	}
	return os.Rename(tmp, path)
}

// dedup is the record of the seqs of one (gateway, epoch) seen: everything
// <= HWM, plus ranges above it (out of order, or after a hole). When the
// ranges grow beyond max, the oldest hole is given up: HWM jumps over it.
// Skipped ranges (never given to a sample) count as seen.
type dedup struct {
	Epoch   string       `json:"epoch"`
	Started bool         `json:"started"`
	HWM     uint64       `json:"hwm"`              // every seq <= HWM has been seen (or given up)
	Top     uint64       `json:"top"`              // highest seq seen
	Above   []wire.Range `json:"above"`            // sorted, disjoint, not adjacent, all above HWM+1
	Lost    uint64       `json:"lost,omitempty"`   // samples the gateway reported lost (loss ranges, seqs not seen before)
	Losses  []lossRecord `json:"losses,omitempty"` // the latest loss ranges reported (at most maxLossRecords)
	max     int
}

// add records seq and reports whether it is new, and the hole it opens
// above the highest seq seen so far (zero range if none).
func (d *dedup) add(seq uint64) (isNew bool, gap wire.Range) {
	if !d.Started { // the first seq (0 included: no seq-1 underflow)
		d.Started, d.HWM, d.Top = true, seq, seq
		return true, gap
	}
	if d.seen(seq) {
		return false, gap
	}
	return true, d.insert(seq, seq)
}

// skip records [a,b] as numbers never given to a sample, and reports the
// hole it opens above the highest seq seen so far (a real gap: samples
// before the skip that never came).
func (d *dedup) skip(a, b uint64) (gap wire.Range) {
	if !d.Started {
		d.Started, d.HWM, d.Top = true, b, b
		return gap
	}
	a = max(a, d.HWM+1)
	if a > b {
		return gap
	}
	return d.insert(a, b)
}

// maxLossRecords bounds the loss ranges kept in a state file per epoch.
const maxLossRecords = 64

// lossRecord is a loss range as the state file keeps it.
type lossRecord struct {
	First  uint64 `json:"first"`
	Last   uint64 `json:"last"`
	Lost   uint64 `json:"lost"` // of them not seen before
	Reason string `json:"reason"`
}

// lose records [a,b] as lost at the gateway: it returns how many of its
// seqs were not seen (those are the loss) and the hole it opens above the
// highest seq seen (a real gap), and counts the range as seen.
func (d *dedup) lose(a, b uint64, reason string) (lost uint64, gap wire.Range) {
	lost = d.unseen(a, b)
	gap = d.skip(a, b)
	d.Lost += lost
	if lost > 0 {
		d.Losses = append(d.Losses, lossRecord{First: a, Last: b, Lost: lost, Reason: reason})
		if len(d.Losses) > maxLossRecords {
			d.Losses = slices.Delete(d.Losses, 0, len(d.Losses)-maxLossRecords)
		}
	}
	return lost, gap
}

// unseen counts the seqs of [a,b] not seen yet.
func (d *dedup) unseen(a, b uint64) uint64 {
	if !d.Started {
		return b - a + 1
	}
	a = max(a, d.HWM+1)
	if a > b {
		return 0
	}
	n := b - a + 1
	for _, r := range d.Above {
		lo, hi := max(r.First, a), min(r.Last, b)
		if lo <= hi {
			n -= hi - lo + 1
		}
	}
	return n
}

func (d *dedup) seen(seq uint64) bool {
	if seq <= d.HWM {
		return true
	}
	i, _ := slices.BinarySearchFunc(d.Above, seq, func(r wire.Range, s uint64) int {
		switch {
		case r.Last < s:
			return -1
		case r.First > s:
			return 1
		}
		return 0
	})
	return i < len(d.Above) && d.Above[i].First <= seq && seq <= d.Above[i].Last
}

// insert adds [a,b] (a > HWM) to the seen ranges.
func (d *dedup) insert(a, b uint64) (gap wire.Range) {
	if a > d.Top+1 {
		gap = wire.Range{First: d.Top + 1, Last: a - 1}
	}
	d.Top = max(d.Top, b)
	// the first range that ends at or after a-1 (touching or overlapping)
	i := sort.Search(len(d.Above), func(i int) bool { return d.Above[i].Last+1 >= a })
	j := i
	for j < len(d.Above) && d.Above[j].First <= b+1 {
		a, b = min(a, d.Above[j].First), max(b, d.Above[j].Last)
		j++
	}
	d.Above = slices.Replace(d.Above, i, j, wire.Range{First: a, Last: b})
	d.absorb()
	for d.max > 0 && len(d.Above) > d.max {
		d.HWM = d.Above[0].Last // give up the hole below the lowest range
		d.Above = slices.Delete(d.Above, 0, 1)
		d.absorb()
	}
	return gap
}

// absorb moves the ranges that touch HWM into it.
func (d *dedup) absorb() {
	for len(d.Above) > 0 && d.Above[0].First <= d.HWM+1 {
		d.HWM = max(d.HWM, d.Above[0].Last)
		d.Above = slices.Delete(d.Above, 0, 1)
	}
}
