package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"edgegw/internal/testenv"
)

// The smoke runs check that a short bench produces a complete, consistent
// report. They never assert a timing figure.

func TestAcquireSmoke(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	rep, err := RunAcquire(ctx, AcquireConfig{
		Devices: 4, Interval: 100 * time.Millisecond, Duration: 1500 * time.Millisecond, Warmup: 300 * time.Millisecond,
		Loss: 0.05, RestartEvery: 400 * time.Millisecond, Telegraf: "off", Exec: testExec(t),
		Before: testExec(t), // the same binary as "before": the rows are there and filled alike
	})
	if err != nil {
		t.Fatal(err)
	}
	var modes []string
	for _, m := range rep.Modes {
		modes = append(modes, m.Mode)
		if m.Mode == "telegraf" {
			if m.Skipped == "" {
				t.Error("telegraf off but not skipped")
			}
			continue
		}
		if m.Skipped != "" {
			t.Errorf("%s skipped: %s", m.Mode, m.Skipped)
			continue
		}
		if m.Polls == 0 || m.Requests == 0 || m.SimRequests == 0 {
			t.Errorf("%s: polls %d requests %d sim requests %d: want all > 0", m.Mode, m.Polls, m.Requests, m.SimRequests)
		}
		if m.Responses > m.Requests || m.GoodPolls > m.Polls || m.Polls > m.Scheduled {
			t.Errorf("%s: responses %d > requests %d, or good %d > polls %d > scheduled %d", m.Mode, m.Responses, m.Requests, m.GoodPolls, m.Polls, m.Scheduled)
		}
		for name, v := range map[string]float64{"loss": m.LossRate, "valid": m.ValidRate} {
			if v < 0 || v > 1 {
				t.Errorf("%s: %s rate %v outside [0,1]", m.Mode, name, v)
			}
		}
		if m.LossRate == 0 {
			t.Errorf("%s: 5%% injected loss each way, loss rate 0 (requests %d responses %d)", m.Mode, m.Requests, m.Responses)
		}
		if m.SimDropped == 0 {
			t.Errorf("%s: the loggers dropped nothing under 5%% loss", m.Mode)
		}
		if m.RTTP50 <= 0 || m.RTTP99 < m.RTTP50 || m.CycleP99 < m.CycleP50 {
			t.Errorf("%s: rtt p50 %v p99 %v, cycle p50 %v p99 %v", m.Mode, m.RTTP50, m.RTTP99, m.CycleP50, m.CycleP99)
		}
		if m.RSSMiB <= 0 || m.HWMMiB < m.RSSMiB || m.CPUPercent < 0 || m.Seconds <= 0 {
			t.Errorf("%s: rss %v hwm %v cpu %v seconds %v", m.Mode, m.RSSMiB, m.HWMMiB, m.CPUPercent, m.Seconds)
		}
	}
	if got := strings.Join(modes, ","); got != "tcp-serial@before,tcp-serial,tcp-parallel@before,tcp-parallel,udp@before,udp,telegraf" {
		t.Errorf("modes %s", got)
	}
	var back AcquireReport
	roundTrip(t, rep, &back)
	if len(back.Modes) != len(rep.Modes) || back.Modes[2].Polls != rep.Modes[2].Polls || back.Modes[0].ValidRate != rep.Modes[0].ValidRate {
		t.Errorf("JSON round trip changed the report")
	}
	text, b := renderReport(t, rep.WriteText, rep.WriteMarkdown)
	for _, want := range []string{"tcp-serial", "tcp-parallel", "udp", "study udp"} {
		if !strings.Contains(text.String(), want) || !strings.Contains(string(b), "| "+want+" |") {
			t.Errorf("table lacks %q:\n%s\n%s", want, text.String(), b)
		}
	}
}

// renderReport writes a report as the text table and as Markdown appended
// to a file, as the commands do.
func renderReport(t *testing.T, writeText, writeMarkdown func(io.Writer)) (text *bytes.Buffer, md []byte) {
	t.Helper()
	text = new(bytes.Buffer)
	writeText(text)
	path := filepath.Join(t.TempDir(), "report.md")
	if err := appendMarkdown(path, writeMarkdown); err != nil {
		t.Fatal(err)
	}
	md, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return text, md
}

func roundTrip(t *testing.T, v, back any) {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, back); err != nil {
		t.Fatal(err)
	}
	b2, _ := json.Marshal(back)
	if !bytes.Equal(b, b2) {
		t.Fatalf("JSON does not round-trip:\n%s\n%s", b, b2)
	}
}

func checkStep(t *testing.T, s StepReport) {
	t.Helper()
	name := s.Method + "×" + itoa(s.Clients)
	method, _ := strings.CutSuffix(s.Method, "@before") // the other binary's gateway: the same guarantees
	if s.Skipped != "" {
		t.Errorf("%s skipped: %s", name, s.Skipped)
		return
	}
	if s.Connected != s.Clients {
		t.Errorf("%s: %d of %d clients served (errors %d)", name, s.Connected, s.Clients, s.Errors)
	}
	if s.Inconsistent != 0 || s.Received+s.Missed != s.Expected {
		t.Errorf("%s: %d clients where received + missed ≠ appended; total %d + %d vs %d", name, s.Inconsistent, s.Received, s.Missed, s.Expected)
	}
	if s.Sent == 0 || s.Received == 0 || s.Expected < s.Sent {
		t.Errorf("%s: sent %d received %d expected %d", name, s.Sent, s.Received, s.Expected)
	}
	if method != MethodShort && s.Duplicates != 0 {
		t.Errorf("%s: %d duplicates on a stream that promises each sample once", name, s.Duplicates)
	}
	if method == MethodLong && s.Missed != 0 {
		t.Errorf("%s: long polling missed %d samples (the ring holds 200: 5 s here)", name, s.Missed)
	}
	if s.LatN == 0 || s.LatP99 < s.LatP50 || s.LatMax*1000 < s.LatP99*1000-1 {
		t.Errorf("%s: latency n %d p50 %v p99 %v max %v", name, s.LatN, s.LatP50, s.LatP99, s.LatMax)
	}
	if s.UsefulBytes == 0 || s.UsefulBytes > s.PayloadBytes || s.PayloadBytes == 0 || s.WireBytes <= s.PayloadBytes || s.PayloadShare <= 0 || s.PayloadShare >= 1 {
		t.Errorf("%s: payload %d wire %d share %v", name, s.PayloadBytes, s.WireBytes, s.PayloadShare)
	}
	minDials := uint64(s.Clients) // each holds a connection open
	if method == MethodShort {
		minDials = 1 // requests share the keep-alive pool
	}
	if s.Dials < minDials || s.RSSMiB <= 0 || s.Seconds <= 0 {
		t.Errorf("%s: dials %d rss %v seconds %v", name, s.Dials, s.RSSMiB, s.Seconds)
	}
}

func itoa(n int) string { return joinInts([]int{n}) }

func TestDeliverSmoke(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	rep, err := RunDeliver(ctx, DeliverConfig{
		Clients: []int{1, 4}, Methods: []string{MethodShort, MethodLong, MethodWS},
		Duration: time.Second, Rate: 20, Batch: 2, Tags: 6, ShortPeriod: 50 * time.Millisecond,
		Ramp: 100 * time.Millisecond, Mosquitto: "off", Exec: testExec(t),
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Steps) != 6 {
		t.Fatalf("%d steps, want 6", len(rep.Steps))
	}
	for _, s := range rep.Steps {
		checkStep(t, s)
	}
	var back DeliverReport
	roundTrip(t, rep, &back)
	dir := t.TempDir()
	names, err := rep.WriteSVGs(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(names) != 7 {
		t.Errorf("charts %v", names)
	}
	for _, n := range names {
		b, err := os.ReadFile(filepath.Join(dir, n))
		if err != nil {
			t.Fatal(err)
		}
		checkXML(t, string(b), 3)
	}
	var text bytes.Buffer
	rep.WriteText(&text)
	for _, want := range []string{"short polling", "long polling", "websocket"} {
		if !strings.Contains(text.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, text.String())
		}
	}
}

// TestDeliverBefore runs long polling and WebSocket with a "before" binary
// (this test binary again, so both sides are alike) and two runs per side:
// the steps interleave in alternating order, both sides are complete, and
// the second table holds the medians of exactly those steps.
func TestDeliverBefore(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	rep, err := RunDeliver(ctx, DeliverConfig{
		Clients: []int{20}, Methods: []string{MethodLong, MethodWS}, Repeat: 2,
		Duration: time.Second, Rate: 20, Tags: 6, Ramp: 100 * time.Millisecond, Mosquitto: "off",
		Exec: testExec(t), Before: testExec(t),
	})
	if err != nil {
		t.Fatal(err)
	}
	var order []string
	for _, s := range rep.Steps {
		order = append(order, s.Method+"#"+itoa(s.Run))
		checkStep(t, s)
	}
	want := "long@before#1,long#1,long#2,long@before#2,ws@before#1,ws#1,ws#2,ws@before#2"
	if got := strings.Join(order, ","); got != want {
		t.Fatalf("steps %s, want %s", got, want)
	}
	if rep.Before == "" || rep.Repeat != 2 || len(rep.Compare) != 2 {
		t.Fatalf("before %q repeat %d compare %+v", rep.Before, rep.Repeat, rep.Compare)
	}
	for i, c := range rep.Compare {
		steps := rep.Steps[4*i : 4*i+4] // this method's: before, after, after, before
		b, a := []StepReport{steps[0], steps[3]}, []StepReport{steps[1], steps[2]}
		if c.Method != steps[1].Method || c.Clients != 20 || c.Before == nil || c.After.Runs != 2 || c.Before.Runs != 2 {
			t.Fatalf("compare %d: %+v", i, c)
		}
		mid := func(s []StepReport, f func(StepReport) float64) float64 { return (f(s[0]) + f(s[1])) / 2 }
		p99 := func(s StepReport) float64 { return s.LatP99 }
		checks := []struct {
			name      string
			got, want float64
		}{
			{"after p50", c.After.LatP50, mid(a, func(s StepReport) float64 { return s.LatP50 })},
			{"after p99", c.After.LatP99, mid(a, p99)},
			{"after cpu", c.After.CPU, mid(a, func(s StepReport) float64 { return s.CPUPercent })},
			{"before p50", c.Before.LatP50, mid(b, func(s StepReport) float64 { return s.LatP50 })},
			{"before p99", c.Before.LatP99, mid(b, p99)},
			{"before cpu", c.Before.CPU, mid(b, func(s StepReport) float64 { return s.CPUPercent })},
			{"p99 ratio", c.P99Ratio, mid(a, p99) / mid(b, p99)},
		}
		for _, k := range checks {
			if math.Abs(k.got-k.want) > 1e-9*math.Max(1, math.Abs(k.want)) {
				t.Errorf("%s × %d: %s %v, want %v", c.Method, c.Clients, k.name, k.got, k.want)
			}
		}
		if c.P99Ratio <= 0 {
			t.Errorf("%s: p99 ratio %v: both sides measured, want > 0", c.Method, c.P99Ratio)
		}
	}
	var back DeliverReport
	roundTrip(t, rep, &back)
	text, b := renderReport(t, rep.WriteText, rep.WriteMarkdown)
	for _, want := range []string{"| websocket@before #2 |", "| long polling #1 |", "| p99 after/before |", "| websocket | 20 | 2 |"} {
		if !strings.Contains(string(b), want) {
			t.Errorf("markdown lacks %q:\n%s", want, b)
		}
	}
	if !strings.Contains(text.String(), "p99 after/before") || !strings.Contains(text.String(), rep.Before) {
		t.Errorf("text lacks the comparison:\n%s", text.String())
	}
	charts := rep.Charts()
	if c := charts["latency_p99.svg"]; len(c.Series) != 4 || len(c.Series[0].X) != 1 {
		t.Errorf("p99 chart: %d series (want long polling, its @before, websocket, its @before; first runs only)", len(c.Series))
	}
}

func TestMedian(t *testing.T) {
	for _, c := range []struct {
		in   []float64
		want float64
	}{{nil, 0}, {[]float64{3}, 3}, {[]float64{5, 1}, 3}, {[]float64{9, 1, 4}, 4}, {[]float64{4, 1, 3, 100}, 3.5}} {
		in := append([]float64(nil), c.in...)
		if got := median(c.in); got != c.want {
			t.Errorf("median(%v) = %v, want %v", in, got, c.want)
		}
		for i := range in {
			if in[i] != c.in[i] {
				t.Errorf("median reordered its input: %v", c.in)
			}
		}
	}
}

func TestDeliverMosquittoSmoke(t *testing.T) {
	bin := testenv.Need(t, "mosquitto")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	rep, err := RunDeliver(ctx, DeliverConfig{
		Clients: []int{3}, Methods: []string{MethodMQTT}, Duration: time.Second, Rate: 20, Tags: 6,
		Ramp: 100 * time.Millisecond, Mosquitto: bin, Exec: testExec(t),
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Steps) != 1 {
		t.Fatalf("%d steps", len(rep.Steps))
	}
	checkStep(t, rep.Steps[0])
}

func TestMainFlags(t *testing.T) {
	var out bytes.Buffer
	if err := Main([]string{"nosuch"}, &out); err == nil {
		t.Error("unknown bench accepted")
	}
	if err := Main([]string{"deliver", "-clients", "1,x"}, &out); err == nil {
		t.Error("-clients 1,x accepted")
	}
	missing := filepath.Join(t.TempDir(), "no-such-edgegw")
	for _, bench := range []string{"deliver", "acquire"} {
		if err := Main([]string{bench, "-before", missing, "-quiet"}, &out); err == nil || !strings.Contains(err.Error(), "no-such-edgegw") {
			t.Errorf("%s -before a missing binary: %v", bench, err)
		}
	}
	if err := Main([]string{"deliver", "-before", t.TempDir(), "-quiet"}, &out); err == nil || !strings.Contains(err.Error(), "not an executable") {
		t.Errorf("deliver -before a directory: %v", err)
	}
	if err := Main([]string{"deliver", "-repeat", "0", "-quiet"}, &out); err == nil || !strings.Contains(err.Error(), "-repeat") {
		t.Errorf("deliver -repeat 0: %v", err)
	}
	if err := Main([]string{"acquire", "-modes", "bogus", "-telegraf", "off", "-quiet"}, &out); err == nil || !strings.Contains(err.Error(), "bogus") {
		t.Errorf("unknown mode: %v", err)
	}
	if err := RunChild("nosuch", strings.NewReader(""), &out); err == nil {
		t.Error("unknown child role accepted")
	}
}
