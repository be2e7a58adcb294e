package edge

import (
	"context"
	"fmt"
	"sync"
	"time"

	"edgegw/ringstore"
)

// PollResult is one device's poll by PollOnce.
type PollResult struct {
	Device string
	Tags   []TagValue    // one per tag, in the device's tag order
	RTT    time.Duration // mean round trip of the poll's answered requests; 0 if none
	Good   bool          // every tag good
	Down   bool          // the transport did not open
	Reason string        // why the poll failed (the device's reason, as /api/devices shows it)
}

// TagValue is a tag's sample from one poll, with its unit.
type TagValue struct {
	Name, Unit string
	Sample     ringstore.Sample
}

// collect is a Sink that keeps one poll's samples.
type collect struct{ got []ringstore.Sample }

func (c *collect) Append(b []ringstore.Sample) (uint64, uint64, error) {
	c.got = append(c.got, b...)
	return 0, 0, nil
}

// PollOnce polls each device once (only the one named only, unless it is
// ""), through the code Run polls with: the transports opened as Run
// opens them (serial ports first, shared ports and sockets shared), each
// bus's devices one after another with the device's timeout and retries,
// the buses at the same time; then it closes everything. The samples go
// to the results, not to the Sink. It must not run beside Run.
func (s *Scheduler) PollOnce(ctx context.Context, only string) ([]PollResult, error) {
	s.mu.RLock()
	buses := s.buses
	s.mu.RUnlock()
	var picked [][]*device
	n := 0
	for _, b := range buses {
		var ds []*device
		for _, d := range b.devices {
			if only == "" || d.cfg.Name == only {
				ds = append(ds, d)
			}
		}
		if len(ds) > 0 {
			picked = append(picked, ds)
			n += len(ds)
		}
	}
	if n == 0 {
		return nil, fmt.Errorf("edge: no device %q", only)
	}
	parent := ctx
	ctx, cancel := context.WithCancel(ctx)
	rs := &runState{s: s, ctx: ctx, epoch: time.Now(), ports: map[string]*portRef{}, failed: map[string]*openFailure{},
		buses: map[*bus]*busRunner{}, udpB: map[*bus]bool{}}
	var all []*device
	for _, ds := range picked {
		all = append(all, ds...)
	}
	rs.attachAll(all)
	results := make(map[*device]PollResult, n)
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, ds := range picked {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for _, d := range ds {
				if ctx.Err() != nil {
					return
				}
				r := d.pollOnce()
				mu.Lock()
				results[d] = r
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	for _, d := range all {
		rs.detach(d)
	}
	if rs.udp != nil {
		_ = rs.udp.Close()
	}
	cancel()
	rs.wg.Wait() // the UDP reader
	out := make([]PollResult, 0, n)
	for _, d := range all {
		if r, ok := results[d]; ok {
			out = append(out, r)
		}
	}
	return out, parent.Err()
}

// pollOnce polls d once, as its bus would in one window.
func (d *device) pollOnce() PollResult {
	r := PollResult{Device: d.cfg.Name}
	if d.conn == nil {
		r.Down, r.Reason = true, d.stats.Reason()
		return r
	}
	before := d.stats.RTT.Snapshot()
	var c collect
	_, r.Good = d.poll(time.Now().Add(d.cfg.Interval), &c)
	after := d.stats.RTT.Snapshot()
	if k := after.N - before.N; k > 0 {
		r.RTT = time.Duration((after.SumUS-before.SumUS)/k) * time.Microsecond
	}
	if !r.Good {
		r.Reason = d.stats.Reason()
	}
	byName := make(map[string]ringstore.Sample, len(c.got))
	for _, smp := range c.got {
		byName[smp.Tag] = smp
	}
	for _, t := range d.cfg.Tags {
		r.Tags = append(r.Tags, TagValue{Name: t.Name, Unit: t.Unit, Sample: byName[t.Name]})
	}
	return r
}
