package sparkplug

import (
	"bufio"
	"bytes"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"
)

// firstTagAlias is the alias of the first tag ever seen; 1..firstTagAlias-1
// are the node metrics (bdSeq has none).
const firstTagAlias = 16

// writeFileAtomic writes data to path through a temp file, fsync and rename.
func writeFileAtomic(path string, data []byte) error {
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o640)
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		return err
	}
	if d, err := os.Open(filepath.Dir(path)); err == nil {
		_ = d.Sync()
		d.Close()
	}
	return nil
}

// bdSeqStore keeps the last bdSeq handed out in dir/bdseq ("" dir: memory).
// The disk never stops the node: a file that cannot be read or holds
// garbage is logged and numbering starts at a random value (so a host is
// unlikely to match a new NBIRTH to an old NDEATH), and a bdSeq that
// cannot be saved is logged and used anyway.
type bdSeqStore struct {
	path string
	last int // -1 before the first
	log  *slog.Logger
	wh   *writeHealth
}

// writeHealth records the state writes (bdseq, aliases) for WriteHealth.
type writeHealth struct {
	mu        sync.Mutex
	failing   error // the last state write's error; nil once one succeeds
	lastErr   error
	lastErrAt time.Time
}

func (w *writeHealth) note(err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.failing = err
	if err != nil {
		w.lastErr, w.lastErrAt = err, time.Now()
	}
}

func openBdSeq(dir string, log *slog.Logger, wh *writeHealth) *bdSeqStore {
	s := &bdSeqStore{last: -1, log: log, wh: wh}
	if dir == "" {
		return s
	}
	s.path = filepath.Join(dir, "bdseq")
	b, err := os.ReadFile(s.path)
	if os.IsNotExist(err) {
		return s
	}
	n, perr := strconv.Atoi(strings.TrimSpace(string(b)))
	if err == nil && (perr != nil || n < 0 || n > 255) {
		err = fmt.Errorf("%s holds %q, want 0..255", s.path, bytes.TrimSpace(b))
	}
	if err != nil {
		s.last = rand.IntN(256)
		log.Warn("sparkplug: bdseq not readable; numbering from a random value", "err", err, "last", s.last)
		return s
	}
	s.last = n
	return s
}

// next returns the bdSeq of a new connection (0..255, wrapping) and saves
// it before the connection is made, so a crash never reuses one.
func (s *bdSeqStore) next() uint64 {
	n := (s.last + 1) % 256
	if s.path != "" {
		err := writeFileAtomic(s.path, []byte(strconv.Itoa(n)+"\n"))
		s.wh.note(err)
		if err != nil {
			s.log.Warn("sparkplug: bdseq not saved; a restart may reuse it", "bdseq", n, "err", err)
		}
	}
	s.last = n
	return uint64(n)
}

// aliasKey names one tag.
type aliasKey struct{ device, tag string }

// loadAliases returns the alias of every tag of devs. Aliases already in
// dir/aliases keep their number (so a host's alias table stays valid across
// restarts and config edits); new tags get the next free numbers in config
// order, and the file is rewritten when any was added. Without dir the
// aliases follow the config order (stable while the config is). A file that
// cannot be read or parsed is logged and the aliases start again from the
// config order, and one that cannot be written is logged: the births carry
// the aliases, so a host follows either way.
func loadAliases(dir string, devs []Device, log *slog.Logger, wh *writeHealth) map[aliasKey]uint64 {
	path := ""
	if dir != "" {
		path = filepath.Join(dir, "aliases")
	}
	m, next, err := readAliases(path)
	if err != nil {
		log.Warn("sparkplug: aliases not readable; numbering them again from the config order", "err", err)
		m, next = map[aliasKey]uint64{}, uint64(firstTagAlias)
	}
	added := false
	for _, d := range devs {
		for _, t := range d.Tags {
			k := aliasKey{d.Name, t.Name}
			if _, ok := m[k]; !ok {
				m[k] = next
				next++
				added = true
			}
		}
	}
	if added && path != "" {
		var b bytes.Buffer
		for k, a := range m {
			fmt.Fprintf(&b, "%d\t%s\t%s\n", a, k.device, k.tag)
		}
		err := writeFileAtomic(path, b.Bytes())
		wh.note(err)
		if err != nil {
			log.Warn("sparkplug: aliases not saved; a restart may number new tags differently", "err", err)
		}
	}
	return m
}

// readAliases reads path ("" or missing: none) and returns the aliases and
// the next free one.
func readAliases(path string) (map[aliasKey]uint64, uint64, error) {
	m := map[aliasKey]uint64{}
	next := uint64(firstTagAlias)
	if path == "" {
		return m, next, nil
	}
	f, err := os.Open(path)
	switch {
	case os.IsNotExist(err):
		return m, next, nil
	case err != nil:
		return nil, 0, fmt.Errorf("sparkplug: aliases: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	line := 0
	for sc.Scan() {
		line++
		fs := strings.Split(sc.Text(), "\t")
		if len(fs) != 3 {
			return nil, 0, fmt.Errorf("sparkplug: aliases: %s:%d: want alias<TAB>device<TAB>tag", path, line)
		}
		a, err := strconv.ParseUint(fs[0], 10, 64)
		if err != nil || a < firstTagAlias {
			return nil, 0, fmt.Errorf("sparkplug: aliases: %s:%d: alias %q", path, line, fs[0])
		}
		m[aliasKey{fs[1], fs[2]}] = a
		next = max(next, a+1)
	}
	if err := sc.Err(); err != nil {
		return nil, 0, fmt.Errorf("sparkplug: aliases: %w", err)
	}
	return m, next, nil
}
