package web

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"edgegw/internal/testenv"
	"edgegw/ringstore"
	"edgegw/stats"
)

// tagBatch puts one sample of every kind into the ring: good numbers (with
// and without unit), a bool, a float32, a timeout, a NaN, good and failed
// strings.
func tagBatch(t testing.TB, r *ringstore.Ring) {
	t.Helper()
	sn := "SN-4711 \"β\""
	ts := time.Now().UnixMicro()
	batch := []ringstore.Sample{
		{Device: "logger-01", Tag: "t00", Value: 21.5, TS: ts},
		{Device: "logger-01", Tag: "t01", Value: 3000000000, TS: ts},
		{Device: "logger-01", Tag: "pump", Value: 1, Bool: true, TS: ts},
		{Device: "logger-01", Tag: "flow", Value: float64(float32(123.456)), Kind: ringstore.KindFloat32, TS: ts},
		{Device: "logger-01", Tag: "lost", Value: 7, Quality: ringstore.Timeout, TS: ts - 5e6},
		{Device: "logger-01", Tag: "nan", Value: math.NaN(), Kind: ringstore.KindFloat32, TS: ts},
		{Device: "logger-01", Tag: "serial", Kind: ringstore.KindString, Text: &sn, TS: ts},
		{Device: "logger-01", Tag: "fw", Kind: ringstore.KindString, Quality: ringstore.Error, TS: ts},
	}
	if _, _, err := r.Append(batch); err != nil {
		t.Fatal(err)
	}
}

func TestTagAndProcessMetrics(t *testing.T) {
	ts := startServer(t, Config{Devices: someDevices()})
	tagBatch(t, ts.ring)
	_, _, body := ts.get(t, "/metrics")
	m := string(body)
	for _, want := range []string{
		`edgegw_tag_value{device="logger-01",tag="t00",unit="°C"} 21.5` + "\n",
		`edgegw_tag_value{device="logger-01",tag="t01",unit="%RH"} 3e+09` + "\n",
		`edgegw_tag_value{device="logger-01",tag="pump",unit=""} 1` + "\n",
		`edgegw_tag_value{device="logger-01",tag="flow",unit=""} 123.456` + "\n",
		`edgegw_tag_good{device="logger-01",tag="t00"} 1` + "\n",
		`edgegw_tag_good{device="logger-01",tag="lost"} 0` + "\n",
		`edgegw_tag_good{device="logger-01",tag="nan"} 0` + "\n",
		`edgegw_tag_good{device="logger-01",tag="fw"} 0` + "\n",
		`edgegw_tag_info{device="logger-01",tag="serial",value="SN-4711 \"β\""} 1` + "\n",
		"# TYPE process_cpu_seconds_total counter\n",
		"# TYPE go_goroutines gauge\n",
		`go_info{version="` + runtime.Version() + `"} 1` + "\n",
	} {
		if !strings.Contains(m, want) {
			t.Errorf("metrics lack %q", want)
		}
	}
	for _, absent := range []string{`tag="lost",unit`, `tag="nan",unit`, `edgegw_tag_value{device="logger-01",tag="serial"`, `tag="fw",value`} {
		if strings.Contains(m, absent) {
			t.Errorf("metrics have %q: a tag that is not good has no value", absent)
		}
	}
	vals := map[string]float64{}
	for _, line := range strings.Split(m, "\n") {
		if f := strings.Fields(line); len(f) == 2 && !strings.HasPrefix(line, "#") {
			v, _ := strconv.ParseFloat(f[1], 64)
			vals[f[0]] = v
		}
	}
	now := float64(time.Now().UnixMicro()) / 1e6
	if age := vals[`edgegw_tag_sample_age_seconds{device="logger-01",tag="lost"}`]; age < 5 || age > 60 {
		t.Errorf("age of a 5 s old sample: %v", age)
	}
	if v := vals["process_resident_memory_bytes"]; v < 1<<20 {
		t.Errorf("process_resident_memory_bytes %v", v)
	}
	if v := vals["process_open_fds"]; v < 3 {
		t.Errorf("process_open_fds %v", v)
	}
	if v := vals["process_start_time_seconds"]; v > now || v < now-3600 {
		t.Errorf("process_start_time_seconds %v, now %v", v, now)
	}
	if v := vals["go_goroutines"]; v < 2 {
		t.Errorf("go_goroutines %v", v)
	}
}

// promtool (Prometheus' own parser and linter) accepts the whole exposition.
func TestMetricsPromtool(t *testing.T) {
	promtool := testenv.Need(t, "promtool")
	up := &stats.Upstream{}
	up.Path.Store(stats.PathWebSocket)
	ts := startServer(t, Config{Devices: someDevices(), Upstream: up})
	appendBatch(t, ts.ring, "logger-02", 2, 5)
	tagBatch(t, ts.ring)
	_, _, body := ts.get(t, "/metrics")
	cmd := exec.Command(promtool, "check", "metrics")
	cmd.Stdin = bytes.NewReader(body)
	if out, err := cmd.CombinedOutput(); err != nil || len(bytes.TrimSpace(out)) != 0 {
		t.Fatalf("promtool check metrics: %v\n%s", err, out)
	}
}

// A real Prometheus scrapes /metrics and answers a query for a tag value
// (and its unit) through its HTTP API.
func TestMetricsScrapedByPrometheus(t *testing.T) {
	bin := testenv.Need(t, "prometheus")
	ts := startServer(t, Config{Devices: someDevices()})
	tagBatch(t, ts.ring)
	target := strings.TrimPrefix(ts.base, "http://")
	dir := t.TempDir()
	cfg := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(cfg, []byte(fmt.Sprintf(
		"global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\nscrape_configs:\n  - job_name: edgegw\n    static_configs:\n      - targets: ['%s']\n", target)), 0o600); err != nil {
		t.Fatal(err)
	}
	var api string
	for attempt := 0; attempt < 5 && api == ""; attempt++ { // a free port may be taken before prometheus binds it
		listen := "127.0.0.1:" + strconv.Itoa(testenv.FreePort(t))
		cmd := exec.Command(bin, "--config.file="+cfg, "--storage.tsdb.path="+filepath.Join(dir, fmt.Sprint("data", attempt)),
			"--web.listen-address="+listen, "--log.level=info")
		if ready := startPrometheus(t, cmd); ready {
			api = "http://" + listen
		}
	}
	if api == "" {
		t.Fatal("prometheus did not start")
	}
	q := api + "/api/v1/query?query=" + url.QueryEscape(`edgegw_tag_value{device="logger-01",tag="t00"}`)
	var got struct {
		Status string
		Data   struct {
			Result []struct {
				Metric map[string]string
				Value  [2]any
			}
		}
	}
	testenv.WaitFor(t, 30*time.Second, "prometheus to have scraped a tag value", func() bool {
		resp, err := http.Get(q)
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		got.Data.Result = nil
		return json.NewDecoder(resp.Body).Decode(&got) == nil && len(got.Data.Result) == 1
	})
	r := got.Data.Result[0]
	if r.Value[1] != "21.5" || r.Metric["unit"] != "°C" || r.Metric["job"] != "edgegw" {
		t.Fatalf("query result %+v", r)
	}
}

// startPrometheus starts cmd and reports whether it got ready (false: it
// exited, e.g. its port was taken).
func startPrometheus(t *testing.T, cmd *exec.Cmd) bool {
	t.Helper()
	sc := testenv.Start(t, cmd)
	ready := make(chan bool, 1)
	go func() {
		for sc.Scan() {
			if strings.Contains(sc.Text(), "Server is ready to receive web requests") {
				ready <- true
				for sc.Scan() { // drain: prometheus must never block on its log
				}
				return
			}
		}
		ready <- false
	}()
	select {
	case ok := <-ready:
		return ok
	case <-time.After(60 * time.Second):
		t.Fatal("prometheus not ready within 60 s")
	}
	return false
}

// BenchmarkMetrics1000 encodes the whole /metrics exposition for 1000
// devices × 2 tags (each device with RTT and cycle histograms filled), the
// size the issue asks to scrape every 5 s on armv7. Reports the body size.
func BenchmarkMetrics1000(b *testing.B) {
	const nDev = 1000
	devs := make(fakeDevices, nDev)
	ring := newRing(b, 4*nDev)
	ts := time.Now().UnixMicro()
	for i := range devs {
		d := &stats.Device{}
		for r := 0; r < 50; r++ {
			d.Requests.Add(1)
			d.Responses.Add(1)
			d.RTT.Observe(time.Duration(200+r*37) * time.Microsecond)
			d.Cycle.Observe(time.Duration(300+r*41) * time.Microsecond)
		}
		d.Polls.Add(50)
		d.GoodPolls.Add(50)
		d.LastGoodUS.Store(ts)
		name := fmt.Sprintf("logger-%04d", i)
		devs[i] = stats.Entry{Info: stats.Info{Name: name, Transport: "udp", Address: "127.0.0.1:502", Unit: 1, Interval: time.Second,
			Tags: []stats.TagInfo{{Name: "temperature", Unit: "°C"}, {Name: "humidity", Unit: "%RH"}}}, Stats: d}
		if _, _, err := ring.Append([]ringstore.Sample{
			{Device: name, Tag: "temperature", Value: 21.5 + float64(i%100)/10, TS: ts},
			{Device: name, Tag: "humidity", Value: 45.2, TS: ts},
		}); err != nil {
			b.Fatal(err)
		}
	}
	s := New(Config{Listen: "127.0.0.1:0", Ring: ring, Devices: devs, Upstream: &stats.Upstream{}})
	b.Run("all", func(b *testing.B) {
		buf := s.appendMetrics(nil, time.Now())
		b.ReportAllocs()
		for b.Loop() {
			buf = s.appendMetrics(buf[:0], time.Now())
		}
		b.ReportMetric(float64(len(buf)), "bytes/scrape")
		b.ReportMetric(float64(bytes.Count(buf, []byte("\nedgegw_tag_value{"))), "tag_values")
	})
	b.Run("tags+process", func(b *testing.B) { // the part metrics_tags.go adds
		p := &promWriter{}
		b.ReportAllocs()
		for b.Loop() {
			p.b = p.b[:0]
			devs := s.devices()
			s.appendTagMetrics(p, devs, time.Now())
			appendProcessMetrics(p)
		}
		b.ReportMetric(float64(len(p.b)), "bytes/scrape")
	})
}
