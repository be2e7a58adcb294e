package ringstore

import (
	"math"
	"math/rand/v2"
	"reflect"
	"strconv"
	"testing"
)

// plainRing is the ring as it was before its compact slots: every Sample
// kept whole, in order. The reference the ring is checked against.
type plainRing struct {
	size int
	all  []Sample
}

func (p *plainRing) add(batch []Sample) {
	p.all = append(p.all, batch...)
	if len(p.all) > p.size {
		p.all = p.all[len(p.all)-p.size:]
	}
}

// since is what Since must return for after (Reset as the ring decides it:
// after older than the oldest kept or newer than the last).
func (p *plainRing) since(after, last uint64, n int) ([]Sample, bool) {
	if after > last {
		return nil, true
	}
	if len(p.all) == 0 || after == last {
		return nil, false
	}
	if after+1 < p.all[0].Seq {
		return nil, true
	}
	out := p.all[after+1-p.all[0].Seq:]
	if n > 0 && len(out) > n {
		out = out[:n]
	}
	return out, false
}

// The compact ring gives back, for every reader position, exactly the
// samples a plain ring of Samples would: names, values bit for bit (NaN
// payloads, -0, ±Inf), bools, qualities, kinds, string texts, timestamps,
// sequence numbers and epochs, across wrap-arounds and epoch changes.
func TestRingSlotsMatchPlain(t *testing.T) {
	for _, size := range []int{1, 7, 64, 150} {
		t.Run(strconv.Itoa(size), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(uint64(size), 42))
			r := memRing(t, size)
			ref := &plainRing{size: size}
			devices := []string{"plc", "logger-01", "logger-02", "meter"}
			tags := []string{"temperature", "humidity", "state", "label", "alarm"}
			texts := []string{"", "run", "stop", "fault ümlaut"}
			values := []float64{0, math.Copysign(0, -1), 1.5, -273.15, math.Inf(1), math.Inf(-1),
				math.Float64frombits(0x7ff8000000000123), math.MaxFloat64, math.SmallestNonzeroFloat64}
			for step := 0; step < 1200; step++ {
				if rng.IntN(100) == 0 { // the sequence goes on under a new epoch
					r.seq.mu.Lock()
					r.seq.newEpochLocked("test")
					r.seq.mu.Unlock()
				}
				b := make([]Sample, 1+rng.IntN(min(size, 5)))
				dev := devices[rng.IntN(len(devices))]
				for i := range b {
					s := Sample{Device: dev, Tag: tags[rng.IntN(len(tags))], TS: rng.Int64(),
						Quality: Quality(rng.IntN(4))}
					switch rng.IntN(4) {
					case 0:
						s.Bool = true
						s.Value = float64(rng.IntN(2))
					case 1:
						s.Kind = KindString
						txt := texts[rng.IntN(len(texts))]
						if rng.IntN(5) > 0 {
							s.Text = &txt
						}
					case 2:
						s.Kind = KindFloat32
						s.Value = float64(rng.Float32())
					default:
						s.Value = values[rng.IntN(len(values))]
					}
					b[i] = s
				}
				if _, _, err := r.Append(b); err != nil {
					t.Fatal(err)
				}
				ref.add(b) // Append numbered b in place
				last := r.Seq()
				for k := 0; k < 3; k++ {
					after := last - uint64(rng.IntN(size+3))
					if rng.IntN(10) == 0 {
						after = last + 1
					}
					n := rng.IntN(4) * rng.IntN(size+1)
					res := r.SinceN(after, n, nil)
					want, reset := ref.since(after, last, n)
					if res.Reset != reset {
						t.Fatalf("step %d: SinceN(%d, %d) reset %v, want %v (last %d)", step, after, n, res.Reset, reset, last)
					}
					if res.Epoch != r.Epoch() {
						t.Fatalf("step %d: result epoch %x, ring's %x", step, res.Epoch, r.Epoch())
					}
					if len(res.Samples) != len(want) {
						t.Fatalf("step %d: SinceN(%d, %d) gave %d samples, want %d", step, after, n, len(res.Samples), len(want))
					}
					for i := range want {
						got, w := res.Samples[i], want[i]
						gv, wv := math.Float64bits(got.Value), math.Float64bits(w.Value)
						got.Value, w.Value = 0, 0
						gt, wt := got.Text, w.Text
						got.Text, w.Text = nil, nil
						if gv != wv || !reflect.DeepEqual(got, w) || (gt == nil) != (wt == nil) || (gt != nil && *gt != *wt) {
							t.Fatalf("step %d: sample %d: got %+v (value %x, text %v), want %+v (value %x, text %v)", step, i, got, gv, gt, w, wv, wt)
						}
					}
				}
				if len(r.texts) > size {
					t.Fatalf("step %d: %d texts kept for a ring of %d", step, len(r.texts), size)
				}
				if len(r.epochs) > size+1 {
					t.Fatalf("step %d: %d epochs kept for a ring of %d", step, len(r.epochs), size)
				}
			}
		})
	}
}

// A slot is 24 bytes on every target, and holds no pointer: the ring is
// never scanned by the garbage collector.
func TestRingSlotHasNoPointers(t *testing.T) {
	if SlotBytes != 24 {
		t.Fatalf("SlotBytes %d, want 24", SlotBytes)
	}
	typ := reflect.TypeFor[slot]()
	for i := range typ.NumField() {
		switch typ.Field(i).Type.Kind() {
		case reflect.Pointer, reflect.String, reflect.Slice, reflect.Map, reflect.Interface, reflect.Chan, reflect.Func, reflect.UnsafePointer:
			t.Fatalf("slot field %s is a %s: the GC would scan the ring", typ.Field(i).Name, typ.Field(i).Type.Kind())
		}
	}
}
