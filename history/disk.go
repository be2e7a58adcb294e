package history

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"

	"log/slog"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"
)

// On disk (Config.Dir): one file per process start and UTC day,
// "h-<unix ns>.hist", appended to once per step, never rewritten:
//
//	header  "EGHIST1\n" step_us:int64
//	batch   len:uint32 crc32(payload):uint32 payload      (one write per step)
//	payload records, all little-endian:
//	  define  0x03 id:uint16 len:uint8 device len:uint8 tag  (tag "" = the device's health)
//	  tag     0x01 id:uint16 bucket:uint32 min max mean last:float32 good bad:uint16   (27 bytes)
//	  health  0x02 id:uint16 bucket:uint32 sched good:uint32 rtt_mean_us rtt_p99_us:float32 (23 bytes)
//
// bucket is the bucket's start / step. Ids are per file. A batch that does
// not check (a torn tail after power loss) ends the reading of its file.
// Files whose last write is older than Keep are removed.

const (
	fileMagic = "EGHIST1\n"
	recTag    = 1
	recHealth = 2
	recDefine = 3
	tagRecLen = 27
	hRecLen   = 23
)

// record is one closed fine bucket on its way to or from the disk.
type record struct {
	kind        uint8
	device, tag string
	idx         int64
	c           cell
	h           hcell
}

type disk struct {
	dir    string
	stepUS int64
	keep   time.Duration
	log    *slog.Logger

	f    *os.File
	day  int64 // UTC day of f
	ids  map[key]uint16
	buf  []byte
	torn int // batches that did not check while loading
}

// openDisk never fails on the disk itself: a directory that cannot be
// created (a card remounted read-only, a full disk) leaves the history in
// RAM, and every write tries again (Store.Run counts and logs the failures).
func openDisk(dir string, stepUS int64, keep time.Duration, log *slog.Logger) *disk {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		log.Warn("history: cannot create the directory; closed buckets stay in RAM until it can be written", "dir", dir, "err", err)
	}
	return &disk{dir: dir, stepUS: stepUS, keep: keep, log: log}
}

func (d *disk) files() ([]string, error) {
	names, err := filepath.Glob(filepath.Join(d.dir, "h-*.hist"))
	if err != nil {
		return nil, err
	}
	sort.Slice(names, func(i, j int) bool { return fileTime(names[i]) < fileTime(names[j]) })
	return names, nil
}

func fileTime(name string) int64 {
	n, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimPrefix(filepath.Base(name), "h-"), ".hist"), 10, 64)
	return n
}

// load reads every file in order and hands each record younger than keep to put.
func (d *disk) load(now time.Time, put func(record)) error {
	names, err := d.files()
	if err != nil {
		return fmt.Errorf("history: %w", err)
	}
	oldest := floorDiv(now.Add(-d.keep).UnixMicro(), d.stepUS)
	var n, files int
	for _, name := range names {
		b, err := os.ReadFile(name)
		if err != nil {
			// An unreadable file (a bad block) loses its buckets, not the rest.
			d.log.Warn("history: file not readable; its buckets are lost", "file", name, "err", err)
			continue
		}
		files++
		c, err := d.parse(b, oldest, put)
		n += c
		if err != nil {
			d.torn++
			d.log.Warn("history: file cut short; what follows is lost", "file", name, "err", err)
		}
	}
	if files > 0 {
		d.log.Info("history: loaded", "dir", d.dir, "files", files, "buckets", n)
	}
	return nil
}

var errTorn = errors.New("batch does not check")

func (d *disk) parse(b []byte, oldest int64, put func(record)) (int, error) {
	if len(b) < len(fileMagic)+8 || string(b[:len(fileMagic)]) != fileMagic {
		return 0, errors.New("not a history file")
	}
	if step := int64(binary.LittleEndian.Uint64(b[len(fileMagic):])); step != d.stepUS {
		return 0, fmt.Errorf("written with a step of %d µs, not %d", step, d.stepUS)
	}
	b = b[len(fileMagic)+8:]
	names := map[uint16]key{}
	n := 0
	for len(b) > 0 {
		if len(b) < 8 {
			return n, errTorn
		}
		l, sum := binary.LittleEndian.Uint32(b), binary.LittleEndian.Uint32(b[4:])
		if uint64(len(b)-8) < uint64(l) || crc32.ChecksumIEEE(b[8:8+l]) != sum {
			return n, errTorn
		}
		p := b[8 : 8+l]
		b = b[8+l:]
		for len(p) > 0 {
			r, rest, err := decodeRecord(p, names)
			if err != nil {
				return n, err
			}
			p = rest
			if r.kind != recDefine && r.idx >= oldest {
				put(r)
				n++
			}
		}
	}
	return n, nil
}

func decodeRecord(p []byte, names map[uint16]key) (record, []byte, error) {
	le := binary.LittleEndian
	f32 := func(b []byte) float32 { return math.Float32frombits(le.Uint32(b)) }
	bad := errors.New("malformed record")
	if len(p) < 3 {
		return record{}, nil, bad
	}
	id := le.Uint16(p[1:])
	switch p[0] {
	case recDefine:
		if len(p) < 4 || len(p) < 5+int(p[3]) {
			return record{}, nil, bad
		}
		dl := int(p[3])
		dev := string(p[4 : 4+dl])
		tl := int(p[4+dl])
		if len(p) < 5+dl+tl {
			return record{}, nil, bad
		}
		names[id] = key{dev, string(p[5+dl : 5+dl+tl])}
		return record{kind: recDefine}, p[5+dl+tl:], nil
	case recTag, recHealth:
		k, ok := names[id]
		l := tagRecLen
		if p[0] == recHealth {
			l = hRecLen
		}
		if !ok || len(p) < l {
			return record{}, nil, bad
		}
		r := record{kind: p[0], device: k.device, tag: k.tag, idx: int64(le.Uint32(p[3:]))}
		q := p[7:]
		if p[0] == recTag {
			r.c = cell{min: f32(q), max: f32(q[4:]), mean: f32(q[8:]), last: f32(q[12:]), good: le.Uint16(q[16:]), bad: le.Uint16(q[18:])}
		} else {
			r.h = hcell{sched: le.Uint32(q), good: le.Uint32(q[4:]), rttMeanUS: f32(q[8:]), rttP99US: f32(q[12:])}
		}
		return r, p[l:], nil
	}
	return record{}, nil, bad
}

// write appends recs as one batch (one write and one fsync), starting a new
// file on a new UTC day, and removes files older than keep. It returns the
// bytes written.
func (d *disk) write(now time.Time, recs []record) (int, error) {
	day := now.UTC().Unix() / 86400
	written := 0
	if d.f == nil || day != d.day {
		if d.f != nil {
			_ = d.f.Close()
			d.f = nil
		}
		if err := os.MkdirAll(d.dir, 0o755); err != nil {
			return 0, err
		}
		name := filepath.Join(d.dir, "h-"+strconv.FormatInt(now.UnixNano(), 10)+".hist")
		f, err := os.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL|os.O_APPEND, 0o644)
		if err != nil {
			return 0, err
		}
		hdr := binary.LittleEndian.AppendUint64([]byte(fileMagic), uint64(d.stepUS))
		if _, err := f.Write(hdr); err != nil {
			f.Close()
			return 0, err
		}
		written += len(hdr)
		d.f, d.day, d.ids = f, day, make(map[key]uint16)
		d.prune(now)
	}
	le := binary.LittleEndian
	p := d.buf[:0]
	p = append(p, 0, 0, 0, 0, 0, 0, 0, 0)
	f32 := func(p []byte, v float32) []byte { return le.AppendUint32(p, math.Float32bits(v)) }
	for _, r := range recs {
		if r.idx < 0 || r.idx > math.MaxUint32 || len(r.device) > 255 || len(r.tag) > 255 {
			continue
		}
		k := key{r.device, r.tag}
		id, ok := d.ids[k]
		if !ok {
			if len(d.ids) >= math.MaxUint16 {
				continue
			}
			id = uint16(len(d.ids))
			d.ids[k] = id
			p = append(p, recDefine)
			p = le.AppendUint16(p, id)
			p = append(p, byte(len(r.device)))
			p = append(p, r.device...)
			p = append(p, byte(len(r.tag)))
			p = append(p, r.tag...)
		}
		p = append(p, r.kind)
		p = le.AppendUint16(p, id)
		p = le.AppendUint32(p, uint32(r.idx))
		if r.kind == recTag {
			p = f32(f32(f32(f32(p, r.c.min), r.c.max), r.c.mean), r.c.last)
			p = le.AppendUint16(le.AppendUint16(p, r.c.good), r.c.bad)
		} else {
			p = le.AppendUint32(le.AppendUint32(p, r.h.sched), r.h.good)
			p = f32(f32(p, r.h.rttMeanUS), r.h.rttP99US)
		}
	}
	le.PutUint32(p, uint32(len(p)-8))
	le.PutUint32(p[4:], crc32.ChecksumIEEE(p[8:]))
	d.buf = p
	if _, err := d.f.Write(p); err != nil {
		// What follows a torn batch would not be read back: the next write
		// starts a new file.
		_ = d.f.Close()
		d.f = nil
		return written, err
	}
	written += len(p)
	return written, d.f.Sync()
}

// prune removes files last written before now - keep (a file is written
// until the next one starts).
func (d *disk) prune(now time.Time) {
	names, err := d.files()
	if err != nil {
		return
	}
	for _, name := range names {
		st, err := os.Stat(name)
		if err == nil && st.ModTime().Before(now.Add(-d.keep-time.Hour)) {
			if err := os.Remove(name); err == nil {
				d.log.Info("history: removed old file", "file", name)
			}
		}
	}
}

func (d *disk) close() error {
	if d.f == nil {
		return nil
	}
	err := d.f.Close()
	d.f = nil
	return err
}
