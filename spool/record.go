package spool

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"math"

	"edgegw/ringstore"
)

// Segment record, as written by appendRecord and read by decodeRecord:
//
//	offset size  field
//	0      4     payload length L (uint32, little endian), 1 <= L <= maxRecord,
//	             bit 31 set: the payload starts with the epoch
//	4      4     CRC-32C (Castagnoli) of the payload
//	8      L     payload
//
// payload:
//
//	[8 bytes] epoch (uint64 LE) of every sample of the record, when bit 31
//	         of the length is set (always, since epochs; records written by
//	         older versions have none and read as epoch 0)
//	uvarint  first seq (the record's samples are seq first, first+1, ... : a
//	         record never spans a gap in the sequence)
//	uvarint  n, the number of samples
//	n times:
//	  byte     flags: bits 0-1 quality, bit 2 the sample's Kind is
//	           ringstore.KindFloat32, bit 3 bool tag, bit 4 device is the
//	           previous sample's device (no device string follows),
//	           bits 5-7 value kind: 0 zero, 1 integer (zig-zag varint),
//	           2 decimal (a byte k, then the zig-zag varint m: value m/10^k,
//	           k 1..4, used only when it decodes to the very same float64),
//	           3 float32 (exact), 4 float64, 5 text (ringstore.KindString: uvarint
//	           len, bytes)
//	  [uvarint len, bytes]  device (only when bit 4 is clear)
//	  uvarint len, bytes    tag
//	  value:   nothing | varint | k, varint | 4 bytes LE | 8 bytes LE | len, bytes
//	  varint   ts: the first sample's TS, then the difference to the previous
//	           sample's TS (0 for the samples of one poll: one byte)
//
// A sample of tag "temperature" (value 21.5, a scaled register) costs
// 1 flags + 12 tag + 3 value + 1 ts = 17 bytes, plus 10 for "logger-01"
// when the device changes, plus 8+8+2 per record (a record holds up to 256
// consecutive samples: one per write of the queue's writer at low rates).
// BenchmarkQueueAppendRun reports the measured disk bytes per sample.
const recordHeader = 8

// maxRecord bounds one record's payload; larger lengths are corruption.
const maxRecord = 16 << 20

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// lenEpoch is the length word's flag for a payload that starts with the epoch.
const lenEpoch = 1 << 31

const (
	flagFloat32    = 1 << 2
	flagBool       = 1 << 3
	flagSameDevice = 1 << 4
	kindShift      = 5
	kindZero       = 0
	kindInt        = 1
	kindDec        = 2
	kindF32        = 3
	kindF64        = 4
	kindText       = 5
)

var pow10 = [...]float64{1, 10, 100, 1000, 10000}

// decimal finds the smallest k in 1..4 with v == m/10^k exactly.
func decimal(v float64) (k int, m int64, ok bool) {
	if v == 0 {
		return 0, 0, false // +0 has its own kind; -0 must keep its sign
	}
	for k = 1; k < len(pow10); k++ {
		f := math.Round(v * pow10[k])
		if math.Abs(f) < 1<<53 && f/pow10[k] == v {
			return k, int64(f), true
		}
	}
	return 0, 0, false
}

// appendRecord appends one record holding samples (consecutive seqs, one
// epoch: samples[0]'s) to b.
func appendRecord(b []byte, samples []ringstore.Sample) []byte {
	start := len(b)
	b = append(b, 0, 0, 0, 0, 0, 0, 0, 0)
	b = binary.LittleEndian.AppendUint64(b, samples[0].Epoch)
	b = binary.AppendUvarint(b, samples[0].Seq)
	b = binary.AppendUvarint(b, uint64(len(samples)))
	var prevTS int64
	for i := range samples {
		s := &samples[i]
		flags := byte(s.Quality) & 3
		if s.Kind == ringstore.KindFloat32 {
			flags |= flagFloat32
		}
		if s.Bool {
			flags |= flagBool
		}
		same := i > 0 && samples[i-1].Device == s.Device
		if same {
			flags |= flagSameDevice
		}
		v := s.Value
		var kind byte
		k, m, isDec := decimal(v)
		switch {
		case s.Kind == ringstore.KindString:
			kind = kindText
		case v == 0 && !math.Signbit(v):
			kind = kindZero
		case v != 0 && v == math.Trunc(v) && math.Abs(v) < 1<<53:
			kind = kindInt
		case isDec:
			kind = kindDec
		case float64(float32(v)) == v:
			kind = kindF32
		default:
			kind = kindF64 // NaN, Inf and everything else
		}
		flags |= kind << kindShift
		b = append(b, flags)
		if !same {
			b = binary.AppendUvarint(b, uint64(len(s.Device)))
			b = append(b, s.Device...)
		}
		b = binary.AppendUvarint(b, uint64(len(s.Tag)))
		b = append(b, s.Tag...)
		switch kind {
		case kindInt:
			b = binary.AppendVarint(b, int64(v))
		case kindDec:
			b = append(b, byte(k))
			b = binary.AppendVarint(b, m)
		case kindF32:
			b = binary.LittleEndian.AppendUint32(b, math.Float32bits(float32(v)))
		case kindF64:
			b = binary.LittleEndian.AppendUint64(b, math.Float64bits(v))
		case kindText:
			var t string
			if s.Text != nil {
				t = *s.Text
			}
			b = binary.AppendUvarint(b, uint64(len(t)))
			b = append(b, t...)
		}
		b = binary.AppendVarint(b, s.TS-prevTS)
		prevTS = s.TS
	}
	payload := b[start+recordHeader:]
	binary.LittleEndian.PutUint32(b[start:], uint32(len(payload))|lenEpoch)
	binary.LittleEndian.PutUint32(b[start+4:], crc32.Checksum(payload, castagnoli))
	return b
}

var (
	errShort    = errors.New("short record")
	errChecksum = errors.New("record checksum mismatch")
)

// recordEpoch is the epoch of a record recordSpan accepted (0 for a record
// written before epochs).
func recordEpoch(b []byte) uint64 {
	if binary.LittleEndian.Uint32(b)&lenEpoch == 0 {
		return 0
	}
	return binary.LittleEndian.Uint64(b[recordHeader:])
}

// recordSpan reads a record header at the start of b and checks its CRC. It
// returns the record's total size, first seq and sample count. errShort means
// b ends inside the record (a torn tail when b is the rest of a file).
func recordSpan(b []byte) (size int, first uint64, n int, err error) {
	if len(b) < recordHeader {
		return 0, 0, 0, errShort
	}
	lw := binary.LittleEndian.Uint32(b)
	l := lw &^ lenEpoch
	if l == 0 || l > maxRecord {
		return 0, 0, 0, fmt.Errorf("bad record length %d", l)
	}
	if len(b) < recordHeader+int(l) {
		return 0, 0, 0, errShort
	}
	payload := b[recordHeader : recordHeader+int(l)]
	if crc32.Checksum(payload, castagnoli) != binary.LittleEndian.Uint32(b[4:]) {
		return 0, 0, 0, errChecksum
	}
	if lw&lenEpoch != 0 {
		if len(payload) < 8 {
			return 0, 0, 0, errors.New("bad record epoch")
		}
		payload = payload[8:]
	}
	first, k := binary.Uvarint(payload)
	if k <= 0 {
		return 0, 0, 0, errors.New("bad record seq")
	}
	cnt, k2 := binary.Uvarint(payload[k:])
	if k2 <= 0 || cnt == 0 || cnt > uint64(l) {
		return 0, 0, 0, errors.New("bad record count")
	}
	return recordHeader + int(l), first, int(cnt), nil
}

// decodeRecord appends the samples of the (CRC-checked) record at the start
// of b whose seq is > after, at most max of them, to dst.
// names interns device and tag names (nil: allocate each).
func decodeRecord(b []byte, after uint64, max int, dst []ringstore.Sample, names map[string]string) ([]ringstore.Sample, error) {
	lw := binary.LittleEndian.Uint32(b)
	p := b[recordHeader : recordHeader+int(lw&^lenEpoch)]
	var epoch uint64
	if lw&lenEpoch != 0 {
		epoch, p = binary.LittleEndian.Uint64(p), p[8:]
	}
	first, k := binary.Uvarint(p)
	p = p[k:]
	n, k := binary.Uvarint(p)
	p = p[k:]
	var ts int64
	var device string
	got := 0
	for i := uint64(0); i < n; i++ {
		if len(p) < 1 {
			return dst, errors.New("record truncated")
		}
		flags := p[0]
		p = p[1:]
		if flags&flagSameDevice == 0 {
			var s string
			var err error
			if s, p, err = readString(p, names); err != nil {
				return dst, err
			}
			if s != device {
				device = s
			}
		}
		tag, rest, err := readString(p, names)
		if err != nil {
			return dst, err
		}
		p = rest
		var v float64
		var text *string
		switch flags >> kindShift {
		case kindZero:
		case kindInt:
			x, k := binary.Varint(p)
			if k <= 0 {
				return dst, errors.New("bad value")
			}
			v, p = float64(x), p[k:]
		case kindDec:
			if len(p) < 2 || p[0] == 0 || int(p[0]) >= len(pow10) {
				return dst, errors.New("bad value")
			}
			e := pow10[p[0]]
			x, k := binary.Varint(p[1:])
			if k <= 0 {
				return dst, errors.New("bad value")
			}
			v, p = float64(x)/e, p[1+k:]
		case kindF32:
			if len(p) < 4 {
				return dst, errors.New("bad value")
			}
			v, p = float64(math.Float32frombits(binary.LittleEndian.Uint32(p))), p[4:]
		case kindF64:
			if len(p) < 8 {
				return dst, errors.New("bad value")
			}
			v, p = math.Float64frombits(binary.LittleEndian.Uint64(p)), p[8:]
		case kindText:
			t, rest, err := readString(p, nil)
			if err != nil {
				return dst, errors.New("bad value")
			}
			text, p = &t, rest
		default:
			return dst, errors.New("bad value kind")
		}
		d, k := binary.Varint(p)
		if k <= 0 {
			return dst, errors.New("bad ts")
		}
		p = p[k:]
		ts += d
		seq := first + i
		if seq <= after {
			continue
		}
		if got >= max {
			break
		}
		kind := ringstore.KindFloat64
		switch {
		case text != nil:
			kind = ringstore.KindString
		case flags&flagFloat32 != 0:
			kind = ringstore.KindFloat32
		}
		dst = append(dst, ringstore.Sample{Seq: seq, Epoch: epoch, Device: device, Tag: tag, Value: v, Text: text, Kind: kind,
			Bool: flags&flagBool != 0, Quality: ringstore.Quality(flags & 3), TS: ts})
		got++
	}
	return dst, nil
}

func readString(p []byte, names map[string]string) (string, []byte, error) {
	n, k := binary.Uvarint(p)
	if k <= 0 || uint64(len(p)-k) < n {
		return "", p, errors.New("bad string")
	}
	b := p[k : k+int(n)]
	if names == nil {
		return string(b), p[k+int(n):], nil
	}
	s, ok := names[string(b)]
	if !ok {
		if len(names) > 1<<16 {
			clear(names)
		}
		s = string(b)
		names[s] = s
	}
	return s, p[k+int(n):], nil
}
