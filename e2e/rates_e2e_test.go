package e2e

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"edgegw/internal/testenv"
)

// check prints the reads of each rate's polls: the slow tags join the fast
// read they are next to.
func TestCheckPrintsThePlanPerRate(t *testing.T) {
	path := filepath.Join(t.TempDir(), "rates.toml")
	body := `[gateway]
id = "gw"
[[device]]
name = "meter"
transport = "tcp"
address = "127.0.0.1:1"
interval = "1s"
tags = [
  { name = "power", address = 0 },
  { name = "energy", address = 1, type = "uint32", interval = "1m" },
  { name = "temp", address = 3, interval = "10s" },
]
`
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(bin, "check", "-config", path).CombinedOutput()
	if err != nil {
		t.Fatalf("check: %v\n%s", err, out)
	}
	for _, want := range []string{
		"meter                    every 1s     holding 0+1 (1 tags)\n",
		"meter                    every 10s    holding 0+4 (2 tags)\n",
		"meter                    every 1m0s   holding 0+4 (3 tags)\n",
	} {
		if !strings.Contains(string(out), want) {
			t.Errorf("check output lacks %q:\n%s", want, out)
		}
	}
	bad := strings.Replace(body, `interval = "10s"`, `interval = "2500ms"`, 1)
	if err := os.WriteFile(path, []byte(bad), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "check", "-config", path)
	out, _ = cmd.CombinedOutput()
	if code := cmd.ProcessState.ExitCode(); code != 1 || !strings.Contains(string(out), `tag "temp": interval 2.5s is not a multiple of the device's interval 1s`) {
		t.Errorf("check of a 2.5 s tag on a 1 s device: exit %d\n%s", code, out)
	}
}

// rbeDevice is a device of /api/devices, the counters the RBE tests read.
type rbeDevice struct {
	Name      string `json:"name"`
	Requests  uint64 `json:"requests"`
	Responses uint64 `json:"responses"`
	Polls     uint64 `json:"polls"`
	GoodPolls uint64 `json:"good_polls"`
	Overruns  uint64 `json:"overruns"`
}

func rbeDevices(t *testing.T, page string) map[string]rbeDevice {
	t.Helper()
	var out struct {
		Devices []rbeDevice `json:"devices"`
	}
	if err := getJSON(t, page+"api/devices", &out); err != nil {
		t.Fatal(err)
	}
	m := map[string]rbeDevice{}
	for _, d := range out.Devices {
		m[d.Name] = d
	}
	return m
}

// tagTopic is a mosquitto_sub on one gateway's per-tag topics: every
// message, in order, by tag.
type tagTopic struct {
	mu   sync.Mutex
	msgs map[string][]tagMsg // "device/tag" → messages
}

type tagMsg struct {
	Value   *float64 `json:"value"`
	Quality string   `json:"quality"`
	TS      int64    `json:"ts"`
	Seq     uint64   `json:"seq"`
}

// subscribeTags runs mosquitto_sub on prefix/# and returns once it has
// seen a marker published after it subscribed (so it misses nothing the
// gateway publishes later).
func subscribeTags(t *testing.T, broker, prefix string) *tagTopic {
	t.Helper()
	host, port, _ := strings.Cut(broker, ":")
	sc := testenv.Start(t, exec.Command(testenv.Need(t, "mosquitto_sub"), "-h", host, "-p", port, "-q", "1", "-v", "-t", prefix+"/#"))
	tt := &tagTopic{msgs: map[string][]tagMsg{}}
	marker := make(chan struct{}, 1)
	go func() {
		for sc.Scan() {
			topic, payload, _ := strings.Cut(sc.Text(), " ")
			if topic == prefix+"/marker" {
				select {
				case marker <- struct{}{}:
				default:
				}
				continue
			}
			var m tagMsg
			key := strings.TrimPrefix(topic, prefix+"/")
			if strings.Count(key, "/") != 1 || json.Unmarshal([]byte(payload), &m) != nil {
				continue // status, batch, or not a tag's
			}
			tt.mu.Lock()
			tt.msgs[key] = append(tt.msgs[key], m)
			tt.mu.Unlock()
		}
	}()
	pub := testenv.Need(t, "mosquitto_pub")
	testenv.WaitFor(t, 20*time.Second, "mosquitto_sub to see a marker published after it subscribed", func() bool {
		_ = exec.Command(pub, "-h", host, "-p", port, "-t", prefix+"/marker", "-m", "x").Run()
		select {
		case <-marker:
			return true
		case <-time.After(200 * time.Millisecond):
			return false
		}
	})
	return tt
}

func (tt *tagTopic) of(key string) []tagMsg {
	tt.mu.Lock()
	defer tt.mu.Unlock()
	return append([]tagMsg(nil), tt.msgs[key]...)
}

// keptRef is the reference report by exception over values v: a value is
// kept when it moved more than pct % of |the last value kept| (the first
// always).
func keptRef(v []float64, pct float64) []float64 {
	var out []float64
	for i, x := range v {
		if i == 0 || math.Abs(x-out[len(out)-1]) > math.Abs(out[len(out)-1])*pct/100 {
			out = append(out, x)
		}
	}
	return out
}

// A register stepping by 0.1 (pymodbus, the sequence set here: down from
// 30.0, then through 0 to negative values, then constant) with
// deadband_percent: the per-tag topic (mosquitto_sub) and DDATA (Eclipse
// Tahu's decoder) carry exactly the values a reference computation over
// the values pymodbus served keeps. A constant register with a deadband
// and max_silence = 500ms is kept once every 500 ms: never sooner, and
// later only by the polls the gateway counts late or lost.
//
// The reference needs every poll answered in time (a poll that timed out
// did not see a value pymodbus served, and makes an error sample that
// passes any band). A loaded machine can make one time out: such a run
// proves nothing and is tried again, at most three times; each run that
// has every poll good must match exactly.
func TestDeadbandPercentAndMaxSilence(t *testing.T) {
	var why []string
	for attempt := 1; attempt <= 3; attempt++ {
		var retry string
		t.Run(fmt.Sprintf("run %d", attempt), func(t *testing.T) { retry = deadbandRun(t) })
		if retry == "" || t.Failed() {
			return
		}
		t.Logf("run %d proves nothing, tried again: %s", attempt, retry)
		why = append(why, retry)
	}
	t.Fatalf("no run with every poll answered in time in 3: %v", why)
}

// deadbandRun is one run of TestDeadbandPercentAndMaxSilence; it returns
// why it proves nothing ("" when it checked everything).
func deadbandRun(t *testing.T) (retry string) {
	var seq []uint16
	for raw := 300; raw >= 270; raw-- {
		seq = append(seq, uint16(raw))
	}
	for raw := 5; raw >= -5; raw-- {
		seq = append(seq, uint16(int16(raw)))
	}
	for last := seq[len(seq)-1]; len(seq) < 46; {
		seq = append(seq, last) // constant: nothing kept
	}
	ramp := testenv.PymodbusSequence(t, []uint16{0}, seq)
	still := testenv.PymodbusSequence(t, []uint16{70}, nil)
	mosq := testenv.StartMosquitto(t)
	host := startTahuHost(t, mosq.Addr, "")
	tags := subscribeTags(t, mosq.Addr, "edgegw/rbe")

	const pct = 1.7
	dir := t.TempDir()
	cfg := fmt.Sprintf(`[gateway]
id = "rbe"
[http]
listen = "127.0.0.1:0"
[upstream.websocket]
batch_wait = "20ms"
[upstream.mqtt]
broker = "tcp://%s"
topic_prefix = "edgegw/rbe"
mode = "fallback"
[upstream.sparkplug]
group_id = "plant"
[[device]]
name = "ramp"
transport = "tcp"
address = "127.0.0.1:%d"
interval = "200ms"
timeout = "200ms"
retries = 0
tags = [ { name = "v", address = 0, type = "int16", scale = 0.1, deadband_percent = %g } ]
[[device]]
name = "still"
transport = "tcp"
address = "127.0.0.1:%d"
interval = "100ms"
timeout = "100ms"
retries = 0
tags = [ { name = "c", address = 0, scale = 0.1, deadband = 1, max_silence = "500ms" } ]
`, mosq.Addr, ramp.Port, pct, still.Port)
	path := filepath.Join(dir, "edgegw.toml")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	gw, page := runGateway(t, path)
	testenv.WaitFor(t, 2*time.Minute, "pymodbus to serve the whole sequence and 5 more", func() bool { return len(ramp.Reads()) >= len(seq)+5 })
	stillFrom := time.Now()
	testenv.WaitFor(t, time.Minute, "3 s of the constant register", func() bool { return time.Since(stillFrom) > 3*time.Second })
	devs := rbeDevices(t, page)
	if code := gw.Stop(os.Interrupt, 20*time.Second); code != 0 {
		t.Errorf("gateway exit %d", code)
	}

	// The reference: over what pymodbus served, every read answered in time.
	rd, sd := devs["ramp"], devs["still"]
	if rd.Requests != rd.Responses || rd.GoodPolls != rd.Polls {
		return fmt.Sprintf("ramp: %+v: a poll failed, so the gateway did not see every value served (the reference needs them all)", rd)
	}
	if sd.GoodPolls != sd.Polls {
		return fmt.Sprintf("still: %+v: a poll failed (its error sample passes the band)", sd)
	}
	testenv.WaitFor(t, time.Minute, "pymodbus's log of every poll's read", func() bool { return uint64(len(ramp.Reads())) >= rd.Polls })
	var served []float64
	for _, r := range ramp.Reads() {
		served = append(served, float64(int16(r.Reg0))/10)
	}
	if uint64(len(served)) != rd.Polls {
		t.Fatalf("pymodbus served %d reads, the gateway polled %d times", len(served), rd.Polls)
	}
	want := keptRef(served, pct)
	t.Logf("%d values served, %d kept: %v", len(served), len(want), want)
	if len(want) < 10 || len(want) > len(served)-10 {
		t.Fatalf("the sequence does not test the band: %d of %d kept", len(want), len(served))
	}

	testenv.WaitFor(t, time.Minute, "the per-tag topic to carry as many values as the reference keeps", func() bool { return len(tags.of("ramp/v")) >= len(want) })
	testenv.WaitFor(t, time.Minute, "a DDATA of ramp with the last value kept", func() bool {
		all := host.all()
		for i := len(all) - 1; i >= 0; i-- {
			if all[i].typ() == "DDATA" && all[i].device() == "ramp" {
				for _, mt := range all[i].Payload.Metrics {
					if float32(mt.num(t)) == float32(want[len(want)-1]) {
						return true
					}
				}
				return false
			}
		}
		return false
	})
	var topic []float64
	for _, m := range tags.of("ramp/v") {
		if m.Quality != "good" || m.Value == nil {
			t.Fatalf("ramp/v: %+v", m)
		}
		topic = append(topic, *m.Value)
	}
	if fmt.Sprint(topic) != fmt.Sprint(want) {
		t.Errorf("per-tag topic carried %v,\nwant %v", topic, want)
	}

	// DDATA: the values after the DBIRTH (which carries the value it
	// found), in order; they end the reference list.
	msgs := host.all()
	birth := -1
	for i := range msgs {
		if msgs[i].typ() == "DBIRTH" && msgs[i].device() == "ramp" {
			birth = i
		}
	}
	if birth < 0 {
		t.Fatal("no DBIRTH of ramp")
	}
	alias := aliasesOf(t, &msgs[birth])["v"]
	var ddata []float64
	for _, m := range msgs[birth+1:] {
		if m.typ() != "DDATA" || m.device() != "ramp" {
			continue
		}
		for _, mt := range m.Payload.Metrics {
			if mt.Alias != nil && *mt.Alias == alias {
				ddata = append(ddata, mt.num(t))
			}
		}
	}
	f32 := func(v []float64) string { // a scaled tag is a Float in Sparkplug
		out := make([]float32, len(v))
		for i, x := range v {
			out[i] = float32(x)
		}
		return fmt.Sprint(out)
	}
	if n := len(want) - len(ddata); n < 0 || n > 2 || f32(ddata) != f32(want[n:]) {
		t.Errorf("DDATA carried %v,\nwant the end of %v (all but the first or two, in the DBIRTH)", ddata, want)
	}

	t.Logf("per-tag topic: %d values, DDATA: %d", len(topic), len(ddata))

	// max_silence: the constant register's samples on its per-tag topic.
	lost := sd.Overruns + sd.Polls - sd.GoodPolls
	cs := tags.of("still/c")
	if len(cs) < 4 {
		t.Fatalf("still/c: %d samples in more than 3 s", len(cs))
	}
	for i := 1; i < len(cs); i++ {
		gap := time.Duration(cs[i].TS-cs[i-1].TS) * time.Microsecond
		if gap < 500*time.Millisecond || gap > 500*time.Millisecond+time.Duration(2+lost)*100*time.Millisecond {
			t.Errorf("still/c: %v between samples %d and %d, want 500ms..%v (%d polls late or lost)", gap, i-1, i,
				500*time.Millisecond+time.Duration(2+lost)*100*time.Millisecond, lost)
		}
		if cs[i].Value == nil || *cs[i].Value != 7 {
			t.Errorf("still/c: %+v", cs[i])
		}
	}
	var stillDD int
	for i := range msgs {
		if msgs[i].typ() == "DDATA" && msgs[i].device() == "still" {
			stillDD += len(msgs[i].Payload.Metrics)
		}
	}
	t.Logf("still/c: %d samples over %d polls (%d late or lost); %d DDATA metrics", len(cs), sd.Polls, lost, stillDD)
	return ""
}

// Bytes on the wire per sample acquired (polled), on the per-tag topics
// and in Sparkplug DDATA, for the demo's loggers (48 th-loggers over UDP
// at 1 s) without a band and with report by exception. The figures are in
// docs/BENCHMARKS.md; run with -v (EDGEGW_WIRE_SECONDS=60 for the
// published ones; make test measures two of the four rows, EDGEGW_FULL=1
// or EDGEGW_WIRE_SECONDS every row).
func TestWireBytesReportByException(t *testing.T) {
	demo := func(tempBand, humBand string) string { // cmd_demo.go's th-logger, with bands
		return `{ name = "temperature", register = "holding", address = 0, type = "int16", scale = 0.1, unit = "°C"` + tempBand + ` },
  { name = "humidity", register = "holding", address = 1, type = "uint16", scale = 0.1, unit = "%RH"` + humBand + ` }`
	}
	perAcq := map[string][2]float64{}
	cases := []struct{ name, temp, hum string }{
		{"no band", "", ""},
		{"deadband_percent 1, max_silence 30s", `, deadband_percent = 1, max_silence = "30s"`, `, deadband_percent = 1, max_silence = "30s"`},
		{"deadband 0.1 (any change)", ", deadband = 0.1", ", deadband = 0.1"},
		{"deadband 0.2 °C, 0.5 %RH", ", deadband = 0.2", ", deadband = 0.5"},
	}
	if os.Getenv("EDGEGW_FULL") == "" && os.Getenv("EDGEGW_WIRE_SECONDS") == "" {
		cases = cases[:2] // make test: with and without report by exception; the table's rows by EDGEGW_FULL=1 or EDGEGW_WIRE_SECONDS
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			res, kept, acquired, secs := wireMeasure(t, demo(c.temp, c.hum))
			if acquired < 96*secs/2 {
				t.Fatalf("%d samples acquired in %d s, want about %d", acquired, secs, 96*secs)
			}
			pt, dd := res["pertag"], res["ddata"]
			b := [2]float64{float64(pt.bytes) / float64(acquired), float64(dd.bytes) / float64(acquired)}
			perAcq[c.name] = b
			t.Logf("%s: %d s, %d samples acquired, %d kept (%.1f %%); per-tag topics %d msgs %d B: %.1f B per sample acquired; DDATA %d msgs %d metrics %d B: %.1f B per sample acquired",
				c.name, secs, acquired, kept, 100*float64(kept)/float64(acquired), pt.msgs, pt.bytes, b[0], dd.msgs, dd.metrics, dd.bytes, b[1])
			if c.temp == "" && float64(kept) < 0.9*float64(acquired) {
				t.Errorf("no band: %d samples kept of %d acquired", kept, acquired)
			}
			if c.temp != "" && kept >= acquired {
				t.Errorf("%s: %d samples kept of %d acquired: the band left nothing out", c.name, kept, acquired)
			}
		})
	}
	none := perAcq["no band"]
	for k, v := range perAcq {
		if k != "no band" && (v[0] >= none[0] || v[1] > none[1]) {
			t.Errorf("%s: %.1f B per-tag, %.1f B DDATA per sample acquired; without a band %.1f, %.1f", k, v[0], v[1], none[0], none[1])
		}
	}
}
