package web

import (
	"bufio"
	"bytes"
	"encoding/json"
	"math"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"edgegw/history"
	"edgegw/stats"
)

func TestDevicesEndpoint(t *testing.T) {
	devs := someDevices()
	devs[0].Stats.Demoted.Store(true) // logger-02
	ts := startServer(t, Config{Devices: devs})
	b := mustGet(t, ts, "/api/devices")
	var r struct {
		Devices []struct {
			Name       string  `json:"name"`
			Transport  string  `json:"transport"`
			Address    string  `json:"address"`
			Unit       int     `json:"unit"`
			IntervalMS int64   `json:"interval_ms"`
			State      string  `json:"state"`
			LossRate   float64 `json:"loss_rate"`
			ValidRate  float64 `json:"valid_rate"`
			Requests   uint64  `json:"requests"`
			Timeouts   uint64  `json:"timeouts"`
			LastGoodUS int64   `json:"last_good_us"`
			RTT        struct {
				P50, P95, P99 float64
			} `json:"rtt_ms"`
			Tags []stats.TagInfo `json:"tags"`
		} `json:"devices"`
	}
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatalf("%v in %s", err, b)
	}
	if len(r.Devices) != 3 {
		t.Fatalf("got %d devices: %s", len(r.Devices), b)
	}
	d := r.Devices[0] // sorted by name
	if d.Name != "logger-01" || d.Transport != "udp" || d.Address != "127.0.0.1:1503" || d.Unit != 1 ||
		d.IntervalMS != 60000 || d.State != "ok" || d.Requests != 4 || d.Timeouts != 2 || d.LastGoodUS == 0 ||
		len(d.Tags) != 2 || d.Tags[0].Unit != "°C" {
		t.Errorf("logger-01: %+v", d)
	}
	if math.Abs(d.LossRate-0.5) > 1e-9 || d.ValidRate != 1 {
		t.Errorf("logger-01 rates: loss %v valid %v", d.LossRate, d.ValidRate)
	}
	if d.RTT.P50 <= 0.1 || d.RTT.P50 > 0.5 || d.RTT.P99 < d.RTT.P50 {
		t.Errorf("logger-01 rtt_ms: %+v (observed 0.2 and 0.4 ms)", d.RTT)
	}
	if r.Devices[1].Name != "logger-02" || r.Devices[1].State != "demoted" {
		t.Errorf("logger-02: %+v", r.Devices[1])
	}
	if r.Devices[2].State != "down" {
		t.Errorf("a device never good: %+v", r.Devices[2])
	}
}

func TestHealthAndStatus(t *testing.T) {
	up := &stats.Upstream{}
	up.Path.Store(stats.PathMQTT)
	up.QueueSamples.Store(12)
	up.OldestUnackUS.Store(time.Now().Add(-3 * time.Second).UnixMicro())
	up.WSURLs.Store([]string{"wss://a/ingest", "wss://b/ingest"})
	up.WSURL.Store("wss://b/ingest")
	up.MQTTBrokers.Store([]string{"tcp://m1:1883", "tcp://m2:1883"})
	up.MQTTBroker.Store("tcp://m2:1883")
	ts := startServer(t, Config{GatewayID: "gw-test", Version: "1.2.3", Upstream: up})
	_, last := appendBatch(t, ts.ring, "logger-01", 2, 1)

	var h struct {
		Status  string `json:"status"`
		Seq     uint64 `json:"seq"`
		UptimeS *int64 `json:"uptime_s"`
	}
	if err := json.Unmarshal(mustGet(t, ts, "/healthz"), &h); err != nil || h.Status != "ok" || h.Seq != last || h.UptimeS == nil {
		t.Fatalf("healthz: %+v %v", h, err)
	}
	var s struct {
		Gateway  string       `json:"gateway"`
		Version  string       `json:"version"`
		Seq      uint64       `json:"seq"`
		Upstream upstreamJSON `json:"upstream"`
	}
	if err := json.Unmarshal(mustGet(t, ts, "/api/status"), &s); err != nil {
		t.Fatal(err)
	}
	if s.Gateway != "gw-test" || s.Version != "1.2.3" || s.Seq != last || s.Upstream.Path != "mqtt" ||
		s.Upstream.QueueSamples != 12 || s.Upstream.OldestUnackAgeS < 2.5 {
		t.Fatalf("status: %+v", s)
	}
	if u := s.Upstream; u.WSURL != "wss://b/ingest" || len(u.WSURLs) != 2 || u.MQTTBroker != "tcp://m2:1883" || len(u.MQTTBrokers) != 2 {
		t.Fatalf("status urls and brokers: %+v", u)
	}
	// No upstream configured: path off.
	ts2 := startServer(t, Config{})
	if err := json.Unmarshal(mustGet(t, ts2, "/api/status"), &s); err != nil || s.Upstream.Path != "off" {
		t.Fatalf("status without upstream: %+v %v", s, err)
	}
}

// TestMetricsFormat parses the exposition line by line: HELP then TYPE before
// each family's samples, valid names and escaped labels, cumulative buckets,
// +Inf == _count, and the values it should carry.
func TestMetricsFormat(t *testing.T) {
	up := &stats.Upstream{}
	up.Path.Store(stats.PathWebSocket)
	up.SentWS.Store(77)
	acq := &stats.Acquisition{}
	acq.UDPUnknownSource.Store(9)
	h, err := history.Open(history.Config{})
	if err != nil {
		t.Fatal(err)
	}
	ts := startServer(t, Config{Devices: someDevices(), Upstream: up, History: h, Acquisition: acq, GatewayID: "gw\"1", Version: "v1"})
	appendBatch(t, ts.ring, "logger-01", 2, 1)
	code, hdr, body := ts.get(t, "/metrics")
	if code != 200 || hdr.Get("Content-Type") != metricsContentType {
		t.Fatalf("metrics: %d %q", code, hdr.Get("Content-Type"))
	}

	var (
		nameRe   = regexp.MustCompile(`^[a-zA-Z_:][a-zA-Z0-9_:]*$`)
		sampleRe = regexp.MustCompile(`^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})? (\S+)$`)
		labelRe  = regexp.MustCompile(`^([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\\n]|\\[\\"n])*)"(,|$)`)
		help     = map[string]bool{}
		typ      = map[string]string{}
		values   = map[string]float64{} // name{labels} -> value
		buckets  = map[string][]float64{}
		les      = map[string][]string{}
	)
	family := func(name string) string {
		for _, suf := range []string{"_bucket", "_sum", "_count"} {
			if b, ok := strings.CutSuffix(name, suf); ok && typ[b] == "histogram" {
				return b
			}
		}
		return name
	}
	sc := bufio.NewScanner(bytes.NewReader(body))
	ln := 0
	for sc.Scan() {
		ln++
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "# HELP "):
			f := strings.SplitN(line[7:], " ", 2)
			if len(f) != 2 || !nameRe.MatchString(f[0]) || help[f[0]] {
				t.Fatalf("line %d: bad or repeated HELP: %q", ln, line)
			}
			help[f[0]] = true
			continue
		case strings.HasPrefix(line, "# TYPE "):
			f := strings.Fields(line[7:])
			if len(f) != 2 || !help[f[0]] || typ[f[0]] != "" {
				t.Fatalf("line %d: TYPE without HELP or repeated: %q", ln, line)
			}
			switch f[1] {
			case "counter", "gauge", "histogram":
			default:
				t.Fatalf("line %d: type %q", ln, f[1])
			}
			typ[f[0]] = f[1]
			continue
		case strings.HasPrefix(line, "#") || line == "":
			t.Fatalf("line %d: unexpected %q", ln, line)
		}
		m := sampleRe.FindStringSubmatch(line)
		if m == nil {
			t.Fatalf("line %d: not a sample: %q", ln, line)
		}
		name, labels, val := m[1], m[3], m[4]
		fam := family(name)
		if typ[fam] == "" {
			t.Fatalf("line %d: sample of %s before its TYPE", ln, fam)
		}
		if typ[fam] == "counter" && !strings.HasSuffix(name, "_total") {
			t.Errorf("line %d: counter %s without _total", ln, name)
		}
		v, err := strconv.ParseFloat(val, 64)
		if err != nil {
			t.Fatalf("line %d: value %q: %v", ln, val, err)
		}
		var le string
		var rest []string
		for l := labels; l != ""; {
			lm := labelRe.FindStringSubmatch(l)
			if lm == nil {
				t.Fatalf("line %d: bad labels %q", ln, labels)
			}
			if lm[1] == "le" {
				le = lm[2]
			} else {
				rest = append(rest, lm[1]+"="+lm[2])
			}
			l = l[len(lm[0]):]
		}
		key := name + "{" + strings.Join(rest, ",") + "}"
		if strings.HasSuffix(name, "_bucket") {
			buckets[key] = append(buckets[key], v)
			les[key] = append(les[key], le)
			continue
		}
		if _, dup := values[key]; dup {
			t.Fatalf("line %d: duplicate series %s", ln, key)
		}
		values[key] = v
	}
	if len(buckets) == 0 {
		t.Fatal("no histogram buckets")
	}
	for key, bs := range buckets {
		l := les[key]
		if l[len(l)-1] != "+Inf" || len(bs) != len(stats.BucketBounds)+1 {
			t.Errorf("%s: %d buckets, last le %q", key, len(bs), l[len(l)-1])
		}
		prevLE := -1.0
		for i := range bs {
			if i > 0 && bs[i] < bs[i-1] {
				t.Errorf("%s: bucket le=%s (%v) below the previous (%v)", key, l[i], bs[i], bs[i-1])
			}
			if x, err := strconv.ParseFloat(l[i], 64); err != nil || x <= prevLE {
				t.Errorf("%s: le %q not increasing", key, l[i])
			} else {
				prevLE = x
			}
		}
		count := strings.Replace(key, "_bucket{", "_count{", 1)
		if c, ok := values[count]; !ok || c != bs[len(bs)-1] {
			t.Errorf("%s: +Inf %v != _count %v", key, bs[len(bs)-1], c)
		}
	}
	for key, want := range map[string]float64{
		`edgegw_device_rtt_seconds_count{device=logger-01}`:        2,
		`edgegw_device_requests_total{device=logger-02}`:           5,
		`edgegw_device_timeouts_total{device=logger-01}`:           2,
		`edgegw_device_loss_ratio{device=logger-01}`:               0.5,
		`edgegw_device_valid_sample_ratio{device=logger-01}`:       1,
		`edgegw_device_up{device=odd \"name\"\\\n}`:                0,
		`edgegw_ring_sequence{}`:                                   float64(ts.ring.Seq()),
		`edgegw_web_clients{method=longPolling}`:                   0,
		`edgegw_web_rejected_total{method=websocket}`:              0,
		`edgegw_upstream_path{path=websocket}`:                     1,
		`edgegw_upstream_path{path=mqtt}`:                          0,
		`edgegw_upstream_sent_total{path=websocket}`:               77,
		`edgegw_udp_unknown_source_total{}`:                        9,
		`edgegw_build_info{gateway=gw\"1,version=v1}`:              1,
		`edgegw_device_rtt_seconds_count{device=odd \"name\"\\\n}`: 1,
	} {
		if got, ok := values[key]; !ok || got != want {
			t.Errorf("%s = %v (present %v), want %v", key, got, ok, want)
		}
	}
	// Bucket placement: logger-01 saw 200 µs and 400 µs.
	b := buckets[`edgegw_device_rtt_seconds_bucket{device=logger-01}`]
	l := les[`edgegw_device_rtt_seconds_bucket{device=logger-01}`]
	for i := range b {
		x, _ := strconv.ParseFloat(l[i], 64)
		want := 0.0
		if x >= 0.0002 {
			want = 1
		}
		if x >= 0.0005 {
			want = 2
		}
		if b[i] != want {
			t.Errorf("logger-01 bucket le=%s: %v, want %v", l[i], b[i], want)
		}
	}
}
