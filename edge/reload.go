package edge

import (
	"context"
	"fmt"
	"slices"
	"time"
)

// ReloadResult says what a Reload changed.
type ReloadResult struct {
	Kept, Added, Changed, Removed []string // device names
}

func (r ReloadResult) String() string {
	return fmt.Sprintf("%d kept, %d added, %d changed, %d removed", len(r.Kept), len(r.Added), len(r.Changed), len(r.Removed))
}

type reloadReq struct {
	devs []DeviceConfig
	res  ReloadResult
	err  error
	done chan struct{}
}

// Reload replaces the device set while Run runs, atomically from the
// pollers' point of view. A device whose resolved config is unchanged keeps
// polling on its schedule, with its statistics and connection: no window is
// missed (a bus shared with a changed device restarts between two polls).
// Removed devices stop and their connections close; new and changed ones
// start on the run's grid (aligned), RTU devices staggered. Reads of Devices and Plan see either the old set or the
// new one. An invalid set is refused and the running one stays. A new
// device whose transport does not open is added down (see Run) and
// retried by its bus; that is no error. Reload returns an error if Run is not running (ctx decides how long to wait).
func (s *Scheduler) Reload(ctx context.Context, devs []DeviceConfig) (ReloadResult, error) {
	req := &reloadReq{devs: devs, done: make(chan struct{})}
	select {
	case s.reload <- req:
	case <-ctx.Done():
		return ReloadResult{}, fmt.Errorf("edge: reload: %w (is the scheduler running?)", ctx.Err())
	}
	<-req.done
	return req.res, req.err
}

// apply is Reload inside Run's goroutine.
func (rs *runState) apply(dcs []DeviceConfig) (ReloadResult, error) {
	s := rs.s
	s.mu.RLock()
	oldDevs, oldBuses := s.devices, s.buses
	s.mu.RUnlock()
	old := make(map[string]*device, len(oldDevs))
	for _, d := range oldDevs {
		old[d.cfg.Name] = d
	}
	devs, err := s.buildDevices(dcs, old)
	if err != nil {
		return ReloadResult{}, err
	}
	if err := checkEndpoints(devs); err != nil {
		return ReloadResult{}, err
	}
	var res ReloadResult
	inNew := make(map[*device]bool, len(devs))
	for _, d := range devs {
		inNew[d] = true
		switch o := old[d.cfg.Name]; {
		case o == d:
			res.Kept = append(res.Kept, d.cfg.Name)
		case o != nil:
			res.Changed = append(res.Changed, d.cfg.Name)
		default:
			res.Added = append(res.Added, d.cfg.Name)
		}
	}
	for _, d := range oldDevs {
		if !inNew[d] && !slices.Contains(res.Changed, d.cfg.Name) {
			res.Removed = append(res.Removed, d.cfg.Name)
		}
	}
	// A new bus whose devices are exactly those of a running bus is that bus.
	buses, slots := s.groupBuses(devs)
	same := func(a, b *bus) bool { return slices.Equal(a.devices, b.devices) }
	kept := map[*bus]bool{}
	for i, nb := range buses {
		for _, ob := range oldBuses {
			if same(nb, ob) {
				buses[i] = ob
				kept[ob] = true
				break
			}
		}
	}
	// Stop the other buses (each ends its current poll), then swap the
	// device set so writes and readers see the new one.
	rs.stopBuses(func(b *bus) bool { return kept[b] })
	s.swapWrites(oldBuses, kept, func() {
		s.mu.Lock()
		s.devices, s.buses = devs, buses
		s.mu.Unlock()
	})
	for _, d := range oldDevs {
		if !inNew[d] {
			rs.detach(d)
		}
	}
	// Open the transports of the buses about to start (a running bus
	// retries its own down devices). One that does not open leaves its
	// device down, retried by its bus: the rest of the set runs.
	// A kept device on a restarted bus whose connection changed (another
	// device joined its endpoint, max_connections changed) moves to its new
	// one.
	var added []*device
	for _, b := range buses {
		if kept[b] {
			continue
		}
		for _, d := range b.devices {
			d.slot = slots[d]
			if d.conn != nil && d.port != slotPort(d) {
				rs.detach(d)
			}
			if d.conn == nil {
				added = append(added, d)
			}
		}
	}
	rs.attachAll(added)
	var start []*bus
	for _, b := range buses {
		if !kept[b] {
			start = append(start, b) // kept devices keep their schedule (d.next)
		}
	}
	rs.startBuses(start, time.Now())
	s.log.Info("reload applied", "result", res.String(), "added", res.Added, "changed", res.Changed, "removed", res.Removed)
	return res, nil
}
