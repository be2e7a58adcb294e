package sparkplug

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
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
type bdSeqStore struct {
	path string
	last int // -1 before the first
}

func openBdSeq(dir string) (*bdSeqStore, error) {
	s := &bdSeqStore{last: -1}
	if dir == "" {
		return s, nil
	}
	s.path = filepath.Join(dir, "bdseq")
	b, err := os.ReadFile(s.path)
	switch {
	case os.IsNotExist(err):
		return s, nil
	case err != nil:
		return nil, fmt.Errorf("sparkplug: bdseq: %w", err)
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || n < 0 || n > 255 {
		return nil, fmt.Errorf("sparkplug: bdseq: %s holds %q, want 0..255", s.path, bytes.TrimSpace(b))
	}
	s.last = n
	return s, nil
}

// next returns the bdSeq of a new connection (0..255, wrapping) and saves
// it before the connection is made, so a crash never reuses one.
func (s *bdSeqStore) next() (uint64, error) {
	n := (s.last + 1) % 256
	if s.path != "" {
		if err := writeFileAtomic(s.path, []byte(strconv.Itoa(n)+"\n")); err != nil {
			return 0, fmt.Errorf("sparkplug: bdseq: %w", err)
		}
	}
	s.last = n
	return uint64(n), nil
}

// aliasKey names one tag.
type aliasKey struct{ device, tag string }

// loadAliases returns the alias of every tag of devs. Aliases already in
// dir/aliases keep their number (so a host's alias table stays valid across
// restarts and config edits); new tags get the next free numbers in config
// order, and the file is rewritten when any was added. Without dir the
// aliases follow the config order (stable while the config is).
func loadAliases(dir string, devs []Device) (map[aliasKey]uint64, error) {
	m := map[aliasKey]uint64{}
	next := uint64(firstTagAlias)
	path := ""
	if dir != "" {
		path = filepath.Join(dir, "aliases")
		f, err := os.Open(path)
		switch {
		case os.IsNotExist(err):
		case err != nil:
			return nil, fmt.Errorf("sparkplug: aliases: %w", err)
		default:
			sc := bufio.NewScanner(f)
			line := 0
			for sc.Scan() {
				line++
				fs := strings.Split(sc.Text(), "\t")
				if len(fs) != 3 {
					f.Close()
					return nil, fmt.Errorf("sparkplug: aliases: %s:%d: want alias<TAB>device<TAB>tag", path, line)
				}
				a, err := strconv.ParseUint(fs[0], 10, 64)
				if err != nil || a < firstTagAlias {
					f.Close()
					return nil, fmt.Errorf("sparkplug: aliases: %s:%d: alias %q", path, line, fs[0])
				}
				m[aliasKey{fs[1], fs[2]}] = a
				next = max(next, a+1)
			}
			f.Close()
			if err := sc.Err(); err != nil {
				return nil, fmt.Errorf("sparkplug: aliases: %w", err)
			}
		}
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
		if err := writeFileAtomic(path, b.Bytes()); err != nil {
			return nil, fmt.Errorf("sparkplug: aliases: %w", err)
		}
	}
	return m, nil
}
