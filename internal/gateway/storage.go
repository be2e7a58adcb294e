package gateway

import (
	"errors"
	"io/fs"
	"time"

	"edgegw/web"
)

// writeHealther is a writer of data_dir: spool.Queue, ringstore.Sequence,
// history.Store, sparkplug.Node.
type writeHealther interface {
	WriteHealth() (at time.Time, failing, last error)
}

type namedWriter struct {
	name string
	w    writeHealther
}

// dataDir is data_dir and the writers of its files as web.Storage, for
// /api/status's storage object and /healthz's storage reasons.
type dataDir struct {
	dir     string
	writers []namedWriter
}

var _ web.Storage = dataDir{}

// storage lists the gateway's writers of dir (each built: call it after
// the queue, the sequence, the history and the Sparkplug node).
func (g *gateway) storage(dir string) dataDir {
	d := dataDir{dir: dir}
	if g.queue != nil {
		d.writers = append(d.writers, namedWriter{"queue", g.queue})
	}
	d.writers = append(d.writers, namedWriter{"sequence", g.seq}, namedWriter{"history", g.hist})
	if g.spb != nil {
		d.writers = append(d.writers, namedWriter{"sparkplug_state", g.spb.node})
	}
	return d
}

// StorageState is the directory's state, its free bytes (statfs) and each
// writer's health. Without a directory: "memory", no writers.
func (d dataDir) StorageState() web.StorageState {
	st := web.StorageState{DataDir: d.dir, State: "memory", FreeBytes: -1}
	if d.dir == "" {
		return st
	}
	failing := false
	for _, n := range d.writers {
		at, f, last := n.w.WriteHealth()
		st.Writers = append(st.Writers, web.WriterState{Name: n.name, Failing: f, LastError: last, LastErrorAt: at})
		failing = failing || f != nil
	}
	free, err := freeBytes(d.dir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		st.State = "missing"
	case err != nil:
		st.State = err.Error()
	case failing:
		st.State = "failing"
	case free == 0:
		st.State = "full"
	default:
		st.State = "ok"
	}
	if err == nil {
		st.FreeBytes = free
	}
	return st
}
