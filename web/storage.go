package web

import (
	"sort"
	"sync"
	"time"
)

// Storage is data_dir as /api/status and /healthz see it: main's adapter
// over the writers of the durable queue, the sequence mark, the history
// and the Sparkplug state. nil: no storage shown or checked.
type Storage interface {
	StorageState() StorageState
}

// StorageState is the data directory and its writers.
type StorageState struct {
	DataDir   string // "" = memory only (State "memory")
	State     string // "ok", "memory", "failing" (a writer cannot write), "full" (0 bytes free) or why it is not usable ("missing", …)
	FreeBytes int64  // bytes available to the gateway (statfs); -1 = unknown
	Writers   []WriterState
}

// WriterState is one writer of data_dir.
type WriterState struct {
	Name        string    // "queue", "sequence", "history", "sparkplug queue", "sparkplug state"
	Failing     error     // the error of its last write while it fails; nil = writing
	LastError   error     // its last write error since start, kept after a success; nil = none
	LastErrorAt time.Time // when LastError happened
}

// DefaultHealthzHold is Config.HealthzHold's default.
const DefaultHealthzHold = 10 * time.Second

// Wire layout of /api/status's storage object:
//
//	"storage":{"data_dir":"/var/lib/edgegw","state":"ok","free_bytes":1048576,
//	           "writers":{"sequence":{"state":"ok"},
//	                      "history":{"state":"failing","error":"…: no space left on device",
//	                                 "last_error":"…: no space left on device","last_error_us":1764450000123456}}}
//	    state of a writer: "ok" or "failing" (its last write failed with error); last_error and
//	    last_error_us: its last write error since start, kept after writes succeed again.

type writerJSON struct {
	State       string `json:"state"`
	Error       string `json:"error,omitempty"`
	LastError   string `json:"last_error,omitempty"`
	LastErrorUS int64  `json:"last_error_us,omitempty"`
}

type storageJSON struct {
	DataDir   string                `json:"data_dir"`
	State     string                `json:"state"`
	FreeBytes int64                 `json:"free_bytes"`
	Writers   map[string]writerJSON `json:"writers"`
}

func storageOf(st StorageState) *storageJSON {
	out := &storageJSON{DataDir: st.DataDir, State: st.State, FreeBytes: st.FreeBytes, Writers: map[string]writerJSON{}}
	for _, w := range st.Writers {
		j := writerJSON{State: "ok"}
		if w.Failing != nil {
			j.State, j.Error = "failing", w.Failing.Error()
		}
		if w.LastError != nil {
			j.LastError, j.LastErrorUS = w.LastError.Error(), w.LastErrorAt.UnixMicro()
		}
		out.Writers[w.Name] = j
	}
	return out
}

// storageReasons are /healthz's reasons for the writers that cannot write,
// in name order.
func storageReasons(st StorageState) []string {
	var out []string
	for _, w := range st.Writers {
		if w.Failing != nil {
			out = append(out, "storage: "+w.Name+" cannot write to "+st.DataDir+": "+w.Failing.Error())
		}
	}
	sort.Strings(out)
	return out
}

// healthHold keeps /healthz from flapping. A fault begins at the first
// failing check and ends once every check has passed for hold; /healthz
// turns 503 at a failing check made when the fault has lasted hold (passes
// shorter than hold do not end it, so a disk that fails every few seconds
// is unhealthy) and back to 200 when the fault ends. Checks are made at
// each /healthz request.
type healthHold struct {
	hold time.Duration

	mu        sync.Mutex
	unhealthy bool
	since     time.Time // the fault's first failing check; zero: no fault
	lastFail  time.Time
	reasons   []string // of the last failing check
}

// check takes the reasons of one check made at now and returns what
// /healthz answers: unhealthy with reasons, or healthy with the failing
// checks still pending (not held for long enough).
func (h *healthHold) check(now time.Time, raw []string) (unhealthy bool, reasons, pending []string, recovering bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(raw) > 0 {
		if h.since.IsZero() {
			h.since = now
		}
		h.lastFail, h.reasons = now, raw
		if now.Sub(h.since) >= h.hold {
			h.unhealthy = true
		}
	} else if !h.since.IsZero() && now.Sub(h.lastFail) >= h.hold {
		h.since, h.unhealthy, h.reasons = time.Time{}, false, nil
	}
	switch {
	case h.unhealthy:
		return true, h.reasons, nil, len(raw) == 0
	case len(raw) > 0:
		return false, nil, raw, false
	}
	return false, nil, nil, false
}

// holdOf is Config.HealthzHold with its default.
func holdOf(d time.Duration) time.Duration {
	switch {
	case d == 0:
		return DefaultHealthzHold
	case d < 0:
		return 0
	}
	return d
}
