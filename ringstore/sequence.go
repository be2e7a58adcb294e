package ringstore

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"
)

// SeqBlock is how many sequence numbers one write of the high-water mark
// reserves. A restart skips what was reserved and not used (at most this many).
const SeqBlock = 1 << 20

const hwmFile = "seq.hwm"

// Sequence hands out the global sequence numbers. With a directory it keeps
// a high-water mark there: before any number above the mark is handed out,
// a new mark (SeqBlock higher) is written to a temporary file, synced and
// renamed over the old one, then the directory is synced. A crash at any
// point leaves a mark at least as high as every number handed out, so the
// sequence never goes backwards across restarts, SIGKILL included.
//
// Without a directory (memory-only mode) it starts at the current Unix time
// in microseconds: numbers stay unique across restarts as long as the clock
// does not step back and fewer than a million samples a second are made.
type Sequence struct {
	mu   sync.Mutex
	dir  string
	last uint64 // last number handed out
	mark uint64 // reserved ceiling; last <= mark
}

// OpenSequence loads (or creates) the high-water mark in dir; dir "" means memory only.
func OpenSequence(dir string) (*Sequence, error) {
	if dir == "" {
		now := uint64(time.Now().UnixMicro())
		return &Sequence{last: now, mark: ^uint64(0)}, nil
	}
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, fmt.Errorf("ringstore: sequence: %w", err)
	}
	s := &Sequence{dir: dir}
	b, err := os.ReadFile(filepath.Join(dir, hwmFile))
	switch {
	case os.IsNotExist(err):
	case err != nil:
		return nil, fmt.Errorf("ringstore: sequence: %w", err)
	default:
		v, perr := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
		if perr != nil {
			return nil, fmt.Errorf("ringstore: sequence: %s: corrupt high-water mark %q", filepath.Join(dir, hwmFile), b)
		}
		s.last, s.mark = v, v
	}
	return s, nil
}

// Last is the last number handed out (0 before the first).
func (s *Sequence) Last() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.last
}

// Reserve hands out n consecutive numbers and returns the first. It writes
// the high-water mark first when the block is used up.
func (s *Sequence) Reserve(n int) (uint64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.last+uint64(n) > s.mark {
		mark := s.last + uint64(n) + SeqBlock
		if err := s.writeMark(mark); err != nil {
			return 0, err
		}
		s.mark = mark
	}
	first := s.last + 1
	s.last += uint64(n)
	return first, nil
}

func (s *Sequence) writeMark(mark uint64) error {
	path := filepath.Join(s.dir, hwmFile)
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o640)
	if err != nil {
		return fmt.Errorf("ringstore: sequence: %w", err)
	}
	_, err = f.WriteString(strconv.FormatUint(mark, 10) + "\n")
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err == nil {
		err = syncDir(s.dir)
	}
	if err != nil {
		return fmt.Errorf("ringstore: sequence: write high-water mark: %w", err)
	}
	return nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
