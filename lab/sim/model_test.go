package sim

import (
	"math"
	"testing"
	"time"
)

type fakeClock struct{ t time.Time }

func (c *fakeClock) now() time.Time { return c.t }

func modelLogger(seed uint64, clock func() time.Time) *Logger {
	return newLogger(loggerConfig{name: "m", transport: "tcp", seed: seed, tick: 100 * time.Millisecond,
		registers: 65536, maxRead: 125, clock: clock, log: discard()})
}

func TestModelRegisters(t *testing.T) {
	clk := &fakeClock{t: time.Date(2026, 6, 1, 12, 0, 0, 0, time.UTC)}
	l := modelLogger(42, clk.now)
	clk.t = clk.t.Add(90*time.Second + 350*time.Millisecond)
	r := l.Holding(0, 7)
	temp := float64(int16(r[0])) / 10
	if temp < 13 || temp > 30 {
		t.Errorf("temperature %.1f °C out of the model's range", temp)
	}
	if hum := float64(r[1]) / 10; hum < 30 || hum > 70 {
		t.Errorf("humidity %.1f %%RH out of 30..70", hum)
	}
	if r[2] != 903 {
		t.Errorf("sequence counter = %d, want 903 ticks", r[2])
	}
	if up := uint32(r[3])<<16 | uint32(r[4]); up != 90 {
		t.Errorf("uptime = %d, want 90", up)
	}
	if f := math.Float32frombits(uint32(r[5])<<16 | uint32(r[6])); f != float32(int16(r[0]))/10 {
		t.Errorf("float32 %v != int16 temperature %v", f, temp)
	}
	in := l.Input(0, 3)
	for i := range in {
		if in[i] != r[i] {
			t.Errorf("input %d = %d, holding %d", i, in[i], r[i])
		}
	}
	// Deterministic: same seed and clock, same values; another seed differs in base.
	l2 := modelLogger(42, clk.now)
	if got := l2.Holding(0, 2); got[0] != r[0] || got[1] != r[1] {
		t.Errorf("same seed: %v, want %v", got, r[:2])
	}
	// Sequence counter wraps at 65536 ticks.
	clk.t = clk.t.Add(-90*time.Second - 350*time.Millisecond + 65537*100*time.Millisecond)
	if got := l.Holding(2, 1)[0]; got != 1 {
		t.Errorf("sequence after 65537 ticks = %d, want 1", got)
	}
}

// The temperature moves (a slow walk), stays bounded and changes little
// from one tick to the next.
func TestModelDrift(t *testing.T) {
	start := time.Date(2026, 6, 1, 0, 0, 0, 0, time.UTC)
	for seed := uint64(0); seed < 20; seed++ {
		m := newModel(seed, 100*time.Millisecond)
		if m.base < 18 || m.base > 25 {
			t.Fatalf("seed %d: base %.2f outside 18..25", seed, m.base)
		}
		lo, hi := math.Inf(1), math.Inf(-1)
		prev, _ := m.env(start)
		for i := 0; i < 48*60; i++ { // two days, a sample a minute
			now := start.Add(time.Duration(i) * time.Minute)
			t10, h10 := m.env(now)
			v := float64(t10) / 10
			lo, hi = math.Min(lo, v), math.Max(hi, v)
			if math.Abs(v-m.base) > 1.5+1.2+0.5+0.1+0.05 {
				t.Fatalf("seed %d: %.1f °C too far from base %.2f", seed, v, m.base)
			}
			if h10 < 300 || h10 > 700 {
				t.Fatalf("seed %d: humidity %d", seed, h10)
			}
			if d := math.Abs(float64(t10-prev)) / 10; d > 0.5 {
				t.Fatalf("seed %d: jump of %.1f °C in one minute", seed, d)
			}
			prev = t10
		}
		if hi-lo < 1 {
			t.Errorf("seed %d: temperature range %.1f..%.1f: does not move", seed, lo, hi)
		}
	}
}

// Writes to model registers are stored and read back; coil 0 is writable.
func TestModelWrites(t *testing.T) {
	clk := &fakeClock{t: time.Unix(1_750_000_000, 0)}
	l := modelLogger(1, clk.now)
	if got := l.Handle(h(0x06, 0x00, 0x00, 0x01, 0x2C)); len(got) != 5 {
		t.Fatalf("write: % X", got)
	}
	clk.t = clk.t.Add(time.Hour)
	if got := l.Holding(0, 3); got[0] != 300 || got[2] != 36000 {
		t.Errorf("after write: %v, want 300 pinned and counter 36000", got)
	}
	if got := l.Input(0, 1)[0]; got == 300 {
		t.Errorf("input 0 follows the write; it mirrors the measurement")
	}
	if got := l.Handle(h(0x05, 0x00, 0x00, 0xFF, 0x00)); len(got) != 5 {
		t.Fatalf("coil write: % X", got)
	}
	if got := l.Handle(h(0x01, 0x00, 0x00, 0x00, 0x01)); got[2] != 1 {
		t.Errorf("coil 0 read back % X", got)
	}
}

// 1000 loggers with the model and a few writes each fit in a few MB.
func TestFleetMemory(t *testing.T) {
	var before, after runtimeMem
	before.read()
	ls := make([]*Logger, 1000)
	for i := range ls {
		ls[i] = modelLogger(uint64(i), nil)
		ls[i].SetHolding(10, 1, 2, 3)
		ls[i].SetCoils(0, true)
	}
	after.read()
	per := float64(after.heap-before.heap) / float64(len(ls))
	t.Logf("%.0f bytes per logger", per)
	if per > 4096 {
		t.Errorf("%.0f bytes per logger: 1000 loggers would not fit in a few MB", per)
	}
	_ = ls[999].Holding(10, 1)
}
