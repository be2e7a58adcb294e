package edge

import (
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"testing"
	"time"

	"edgegw/internal/testenv"
	"edgegw/ringstore"
)

// The reads of each set of due rates: tags due together coalesce, the
// slow ones joining the fast reads they are next to.
func TestPlanRates(t *testing.T) {
	u16 := func(name string, a uint16, iv time.Duration) Tag {
		return Tag{Name: name, Register: Holding, Address: a, Type: Uint16, Interval: iv}
	}
	tags := []Tag{u16("power", 0, 0), u16("energy", 1, time.Minute), u16("temp", 2, 10*time.Second), u16("far", 40, 10*time.Second), u16("volt", 3, time.Second)}
	r, err := newRates("m", tags, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(r.mult, r.group) != "[1 10 60] [0 2 1 1 0]" {
		t.Fatalf("rates %v, groups %v", r.mult, r.group)
	}
	plans := r.plan(tags, 8, 125, 2000)
	want := map[uint8]string{
		0b001: "[holding 0+4 (2 tags)]",                       // power, volt: the gap over energy and temp is read
		0b011: "[holding 0+4 (3 tags) holding 40+1 (1 tags)]", // and temp; far is too far: a read of its own
		0b101: "[holding 0+4 (3 tags)]",                       // and energy (after a skipped window)
		0b111: "[holding 0+4 (4 tags) holding 40+1 (1 tags)]", // everything
	}
	for mask, w := range want {
		if got := fmt.Sprint(plans[mask>>1]); got != w {
			t.Errorf("mask %03b: %s, want %s", mask, got, w)
		}
	}
	names := func(rd Read) string {
		var s []string
		for _, i := range rd.Tags {
			s = append(s, tags[i].Name)
		}
		return strings.Join(s, ",")
	}
	if got := names(plans[0b011>>1][0]); got != "power,temp,volt" {
		t.Errorf("tags of the 10 s poll's first read: %s (indices into the device's tags)", got)
	}
	for n, w := range map[int64]uint8{0: 0b111, 1: 0b001, 10: 0b011, 30: 0b011, 60: 0b111, 61: 0b001} {
		if got := r.tickMask(n); got != w {
			t.Errorf("tick %d: mask %03b, want %03b", n, got, w)
		}
	}
	for _, c := range []struct {
		tags []Tag
		want string
	}{
		{[]Tag{u16("a", 0, 0), u16("b", 1, 1500*time.Millisecond)}, `tag "b": interval 1.5s is not a multiple of the device's interval 1s`},
		{[]Tag{u16("a", 0, 0), u16("b", 1, 500*time.Millisecond)}, `tag "b": interval 500ms is not a multiple`},
		{[]Tag{u16("a", 0, 2*time.Second), u16("b", 1, 4*time.Second)}, `no tag is polled at the device's interval 1s`},
	} {
		if _, err := newRates("m", c.tags, time.Second); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: err %v, want %q", c.tags, err, c.want)
		}
	}
	var many []Tag
	for i := range MaxRates + 1 {
		many = append(many, u16(strconv.Itoa(i), uint16(i), time.Duration(i+1)*time.Second))
	}
	if _, err := newRates("m", many, time.Second); err == nil || !strings.Contains(err.Error(), "more than 8") {
		t.Errorf("%d rates: err %v", MaxRates+1, err)
	}
}

// A slow tag's window is its own interval: read at the first polled window
// of the device inside it, once.
func TestDueCatchesUpSkippedWindows(t *testing.T) {
	tags := []Tag{{Name: "fast", Type: Uint16}, {Name: "slow", Address: 1, Type: Uint16, Interval: 10 * time.Second}}
	d, err := newDevice(devCfg("d", TransportTCP, "127.0.0.1:1", time.Second, time.Second, tags), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	var slowAt []int
	for _, n := range []int{0, 1, 2, 9, 10, 11, 15, 23, 24, 29, 31, 39} { // windows polled; the others overran
		d.next = t0.Add(time.Duration(n) * time.Second)
		if m := d.due(); m&2 != 0 {
			slowAt = append(slowAt, n)
		} else if m != 1 {
			t.Fatalf("window %d: mask %b", n, m)
		}
	}
	if got := fmt.Sprint(slowAt); got != "[0 10 23 31]" { // window 20 overran: 23 reads it
		t.Errorf("slow read at windows %s, want [0 10 23 31]", got)
	}
}

// A 100 ms tag and a 1 s tag of one device, adjacent registers, against
// pymodbus over 3 s: 30 and 3 samples, one request a poll (counted at the
// peer), both registers read every 10th poll and the fast one alone
// otherwise.
func TestPerTagRatesAgainstPymodbus(t *testing.T) {
	py := testenv.PymodbusSequence(t, []uint16{7, 8}, nil)
	tags := []Tag{{Name: "fast", Register: Holding, Address: 0, Type: Uint16}, {Name: "slow", Register: Holding, Address: 1, Type: Uint16, Interval: time.Second}}
	dc := devCfg("m", TransportTCP, "127.0.0.1:"+strconv.Itoa(py.Port), 100*time.Millisecond, 90*time.Millisecond, tags)
	dc.Retries = 0
	ring := newRing(t, 1000)
	s, err := New(Config{Sink: ring, Devices: []DeviceConfig{dc}})
	if err != nil {
		t.Fatal(err)
	}
	if rp := s.RatePlans()["m"]; fmt.Sprint(rp) != "[{100ms [holding 0+1 (1 tags)]} {1s [holding 0+2 (2 tags)]}]" {
		t.Errorf("rate plans: %v", rp)
	}
	from := time.Now()
	stop := runSched(t, s)
	d := s.devices[0]
	waitFor(t, time.Minute, "30 polls", func() bool { return d.stats.Polls.Load() >= 30 })
	stop()
	to := time.Now()

	checkSchedule(t, ring, d, "fast", from, to)
	sn := d.stats.Snapshot()
	var fast, slow, fastGood int
	polls := map[int64]string{} // ts → tags of that poll
	for _, x := range ring.Since(0, nil).Samples {
		polls[x.TS] += x.Tag + " "
		switch {
		case x.Tag == "fast":
			fast++
		case x.Tag == "slow":
			slow++
		}
		if x.Quality == ringstore.Good && (x.Tag == "fast" && x.Value != 7 || x.Tag == "slow" && x.Value != 8) {
			t.Errorf("sample %+v", x)
		}
		if x.Quality == ringstore.Good && x.Tag == "fast" {
			fastGood++
		}
	}
	for ts, tg := range polls {
		if tg != "fast " && tg != "fast slow " {
			t.Errorf("poll at %d: tags %q, want fast, or fast and slow", ts, tg)
		}
	}
	windows := sn.Polls + sn.Overruns + sn.Skipped // the device's windows, polled or counted lost
	t.Logf("%d polls (%d good, %d windows lost), fast %d samples, slow %d; peer served %d reads", sn.Polls, sn.GoodPolls, sn.Overruns+sn.Skipped, fast, slow, len(py.Reads()))
	if uint64(fast) != sn.Polls || uint64(fastGood) < sn.GoodPolls {
		t.Errorf("fast: %d samples (%d good) for %d polls (%d good)", fast, fastGood, sn.Polls, sn.GoodPolls)
	}
	// Every window of the slow tag (10 of the device's) with a poll in it
	// reads it once: at least one per 10 polls, at most one per 10 windows
	// begun.
	if lo, hi := (sn.Polls+9)/10, windows/10+1; uint64(slow) < lo || uint64(slow) > hi {
		t.Errorf("slow: %d samples, want %d..%d (%d polls, %d windows)", slow, lo, hi, sn.Polls, windows)
	}
	if sn.Requests != sn.Polls {
		t.Errorf("%d requests for %d polls: want one a poll", sn.Requests, sn.Polls)
	}
	waitFor(t, time.Minute, "pymodbus's log of every good poll's read", func() bool { return uint64(len(py.Reads())) >= sn.GoodPolls })
	var both, one int
	for _, r := range py.Reads() {
		switch {
		case r.Address == 0 && r.Count == 2:
			both++
		case r.Address == 0 && r.Count == 1:
			one++
		default:
			t.Errorf("peer served read %+v: want 0+1 or 0+2", r)
		}
	}
	if uint64(both+one) > sn.Requests || both < slow || uint64(both+one) < sn.GoodPolls {
		t.Errorf("peer served %d reads of both and %d of the fast one; the gateway sent %d requests, %d good polls, %d slow samples",
			both, one, sn.Requests, sn.GoodPolls, slow)
	}
}
