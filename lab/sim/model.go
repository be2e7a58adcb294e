package sim

import (
	"math"
	"time"
)

// The logger model. Holding registers (input registers 0..2 mirror 0..2):
//
//	0    temperature, 0.1 °C, int16
//	1    relative humidity, 0.1 %RH, uint16 (30.0..70.0)
//	2    sequence counter, uint16, +1 every tick since boot, wraps
//	3..4 uptime, seconds since boot, uint32, high word first (ABCD)
//	5..6 temperature in °C, float32, high word first (ABCD), equal to reg 0 / 10
//
// Coil 0 is the writable "alarm enable"; discrete input 0 is "alarm active"
// (coil 0 set and temperature more than 1 °C above the logger's base).
//
// Values are computed from the clock on every read, so no goroutine runs
// per logger: the environment (temperature, humidity) is a function of the
// wall-clock tick and the seed only, the counters of the time since boot.
// Temperature = base (18..25 °C per logger) + daily sine (±1.5 °C) + three
// octaves of smooth value noise (1 h ±1.2, 10 min ±0.5, 2 min ±0.1), which
// reads as a bounded slow random walk.
const (
	modelRegs   = 7
	modelInputs = 3
)

type model struct {
	seed  uint64
	tick  time.Duration
	base  float64 // °C
	hbase float64 // %RH
	phase float64 // of the daily sine, radians
}

func newModel(seed uint64, tick time.Duration) *model {
	return &model{
		seed:  seed,
		tick:  tick,
		base:  18 + 7*unit01(hash(seed, 1, 0)),
		hbase: 45 + 10*unit01(hash(seed, 2, 0)),
		phase: 0.5 * (unit01(hash(seed, 3, 0)) - 0.5),
	}
}

// env returns temperature (0.1 °C) and humidity (0.1 %RH) at the tick of now.
func (m *model) env(now time.Time) (t10 int16, h10 uint16) {
	k := now.UnixNano() / int64(m.tick)
	s := float64(k) * m.tick.Seconds() // seconds, quantised to the tick
	day := math.Sin(2*math.Pi*math.Mod(s, 86400)/86400 + m.phase)
	walk := 1.2*m.noise(10, s/3600) + 0.5*m.noise(11, s/600) + 0.1*m.noise(12, s/120)
	t := m.base + 1.5*day + walk
	h := m.hbase - 2*(t-m.base) + 4*m.noise(13, s/900)
	h = math.Max(30, math.Min(70, h))
	return int16(math.Round(t * 10)), uint16(math.Round(h * 10))
}

func (m *model) alarm(now time.Time) bool {
	t10, _ := m.env(now)
	return float64(t10)/10 > m.base+1
}

// registers computes holding registers 0..6 at now for a logger booted at boot.
func (m *model) registers(now, boot time.Time) (r [modelRegs]uint16) {
	t10, h10 := m.env(now)
	up := now.Sub(boot)
	if up < 0 {
		up = 0
	}
	secs := uint32(up / time.Second)
	f := math.Float32bits(float32(t10) / 10)
	r[0] = uint16(t10)
	r[1] = h10
	r[2] = uint16(up / m.tick)
	r[3], r[4] = uint16(secs>>16), uint16(secs)
	r[5], r[6] = uint16(f>>16), uint16(f)
	return r
}

// noise is smooth 1-D value noise in [-1, 1]: random knots at integer x,
// cosine-interpolated.
func (m *model) noise(octave uint64, x float64) float64 {
	i := math.Floor(x)
	fr := x - i
	a := 2*unit01(hash(m.seed, octave, uint64(int64(i)))) - 1
	b := 2*unit01(hash(m.seed, octave, uint64(int64(i)+1))) - 1
	w := (1 - math.Cos(fr*math.Pi)) / 2
	return a + (b-a)*w
}

// hash mixes its inputs with splitmix64 finalisers.
func hash(seed, a, b uint64) uint64 {
	return mix(mix(seed^mix(a)) ^ b)
}

func mix(z uint64) uint64 {
	z += 0x9E3779B97F4A7C15
	z = (z ^ z>>30) * 0xBF58476D1CE4E5B9
	z = (z ^ z>>27) * 0x94D049BB133111EB
	return z ^ z>>31
}

// unit01 maps a hash to [0, 1).
func unit01(h uint64) float64 { return float64(h>>11) / (1 << 53) }
