package web

import (
	"encoding/json"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"edgegw/history"
	"edgegw/ringstore"
)

type historyReply struct {
	Device    string     `json:"device"`
	Tag       string     `json:"tag"`
	Unit      string     `json:"unit"`
	Kind      string     `json:"kind"`
	StepUS    int64      `json:"step_us"`
	MaxPoints int        `json:"max_points"`
	TS        []int64    `json:"ts"`
	Value     []*float64 `json:"value"`
	Quality   []string   `json:"quality"`
	Mean      []*float64 `json:"mean"`
	Good      []uint32   `json:"good"`
	Bad       []uint32   `json:"bad"`
	ValidRate []*float64 `json:"valid_rate"`
	RTTMeanMS []*float64 `json:"rtt_mean_ms"`
	Error     string     `json:"error"`
}

// historyServer: a server over a history holding 10 minutes of logger-01/t00
// at 1 s (the last one bad) ending now.
func historyServer(t *testing.T, maxPoints int) (*testServer, int64) {
	t.Helper()
	h, err := history.Open(history.Config{MaxPoints: maxPoints})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now().UnixMicro()
	for i := 600; i > 0; i-- {
		s := ringstore.Sample{Device: "logger-01", Tag: "t00", Value: float64(i), TS: now - int64(i)*1e6}
		if i == 1 {
			s.Quality = ringstore.Timeout
		}
		h.Add([]ringstore.Sample{s})
	}
	return startServer(t, Config{Devices: someDevices(), History: h}), now
}

func getHistory(t *testing.T, ts *testServer, q url.Values) (int, historyReply) {
	t.Helper()
	code, h, b := ts.get(t, "/api/history?"+q.Encode())
	var r historyReply
	if err := json.Unmarshal(b, &r); err != nil || h.Get("Content-Type") != "application/json" {
		t.Fatalf("%s: %d %q: %v", q.Encode(), code, b, err)
	}
	return code, r
}

func TestHistoryAPI(t *testing.T) {
	ts, now := historyServer(t, 300)
	q := func(kv ...string) url.Values {
		v := url.Values{}
		for i := 0; i < len(kv); i += 2 {
			v.Set(kv[i], kv[i+1])
		}
		return v
	}
	us := func(d time.Duration) string { return fmt.Sprint(now - d.Microseconds()) }

	// The last 2 minutes: raw samples, the bad one as null with its quality.
	code, r := getHistory(t, ts, q("device", "logger-01", "tag", "t00", "from", us(2*time.Minute), "to", us(0)))
	if code != 200 || r.Kind != "raw" || r.Unit != "°C" || len(r.TS) != 120 || len(r.Value) != 120 || r.MaxPoints != 300 {
		t.Fatalf("raw: %d %+v", code, r)
	}
	if n := len(r.Value); r.Value[n-1] != nil || r.Quality[n-1] != "timeout" || r.Value[0] == nil || *r.Value[0] != 120 {
		t.Errorf("raw values: first %v, last %v %q", r.Value[0], r.Value[n-1], r.Quality[n-1])
	}
	// The default range (the last hour): 600 raw > 300 points, so 1-minute buckets.
	code, r = getHistory(t, ts, q("device", "logger-01", "tag", "t00"))
	if code != 200 || r.Kind != "buckets" || r.StepUS != 60e6 || len(r.TS) != 61 || len(r.Mean) != 61 {
		t.Fatalf("buckets: %d kind %s step %d, %d points", code, r.Kind, r.StepUS, len(r.TS))
	}
	if r.Mean[0] != nil || r.Good[0] != 0 { // an hour ago: nothing polled, a gap (null), not 0
		t.Errorf("first bucket of the hour: mean %v good %d", r.Mean[0], r.Good[0])
	}
	var good uint32
	for _, g := range r.Good {
		good += g
	}
	if good != 599 {
		t.Errorf("good polls over the hour: %d, want 599", good)
	}
	// An explicit step, as a duration and in µs.
	for _, step := range []string{"5m", "300000000"} {
		code, r = getHistory(t, ts, q("device", "logger-01", "tag", "t00", "step", step))
		if code != 200 || r.StepUS != 300e6 || len(r.TS) > 13 {
			t.Errorf("step %s: %d step %d, %d points", step, code, r.StepUS, len(r.TS))
		}
	}
	// The device's health (no tag); a configured tag with nothing recorded yet is empty, not an error.
	if code, r = getHistory(t, ts, q("device", "logger-02")); code != 200 || r.Kind != "health" || len(r.TS) != 0 {
		t.Errorf("health of a device with no history yet: %d %+v", code, r)
	}
	if code, r = getHistory(t, ts, q("device", "logger-02", "tag", "t01")); code != 200 || len(r.TS) != 0 {
		t.Errorf("configured tag without samples: %d %+v", code, r)
	}

	// Errors: 400 with a message that says what is wrong.
	for _, c := range []struct {
		q    url.Values
		want string
	}{
		{q("device", "logger-01", "tag", "nope"), `unknown tag "nope" of device "logger-01"`},
		{q("device", "nope", "tag", "t00"), `unknown device "nope"`},
		{q("tag", "t00"), "device is required"},
		{q("device", "logger-01", "tag", "t00", "from", us(0), "to", us(time.Minute)), "from is after to"},
		{q("device", "logger-01", "tag", "t00", "from", us(5*time.Hour), "to", us(0), "step", "1m"), "too many points"},
		{q("device", "logger-01", "tag", "t00", "from", "yesterday"), `from: "yesterday" is not an integer`},
		{q("device", "logger-01", "tag", "t00", "step", "1s"), "step below the bucket step"},
		{q("device", "logger-01", "tag", "t00", "step", "-5m"), "step"},
		{q("device", "logger-01", "tag", "t00", "to", "-1"), "negative"},
		{q("device", strings.Repeat("\xce", 5000), "tag", "t00"), `... (5000 bytes)`},
		{q("device", "logger-01", "tag", "t00", "from", strings.Repeat("9", 5000)), `... (5000 bytes) is not an integer`},
		{q("device", "logger-01", "tag", "t00", "step", strings.Repeat("\xce", 5000)), `... (5000 bytes) is not a duration`},
	} {
		code, r := getHistory(t, ts, c.q)
		if code != 400 || !strings.Contains(r.Error, c.want) || len(r.Error) > 400 {
			t.Errorf("%.80s: %d %.400q, want 400 with %q", c.q.Encode(), code, r.Error, c.want)
		}
	}
	// Its counters are on /metrics.
	if _, _, b := ts.get(t, "/metrics"); !strings.Contains(string(b), "\nedgegw_history_samples_total 600\n") ||
		!strings.Contains(string(b), "\nedgegw_history_series 1\n") {
		t.Errorf("history counters not in /metrics")
	}
	// A week in one request is bounded too: coarse buckets, at most max_points.
	code, r = getHistory(t, ts, q("device", "logger-01", "tag", "t00", "from", us(7*24*time.Hour), "to", us(0)))
	if code != 200 || len(r.TS) > 300 || r.StepUS%600e6 != 0 {
		t.Errorf("a week: %d, %d points of %d µs", code, len(r.TS), r.StepUS)
	}
}

func TestHistoryAPIOffAndAssets(t *testing.T) {
	ts := startServer(t, Config{Devices: someDevices(), RingInfo: RingInfo{Size: 5760, Window: time.Minute}})
	if code, _, b := ts.get(t, "/api/history?device=logger-01&tag=t00"); code != 404 {
		t.Errorf("no history: %d %s", code, b)
	}
	code, h, b := ts.get(t, "/assets/uplot-1.6.32.min.js")
	if code != 200 || !strings.HasPrefix(h.Get("Content-Type"), "text/javascript") || !strings.Contains(string(b), "uPlot") {
		t.Errorf("uPlot: %d %q %d bytes", code, h.Get("Content-Type"), len(b))
	}
	if code, _, b := ts.get(t, "/assets/uplot.LICENSE.txt"); code != 200 || !strings.Contains(string(b), "MIT") {
		t.Errorf("licence: %d %s", code, b)
	}
	if code, _, _ := ts.get(t, "/assets/../page.go"); code != 404 {
		t.Errorf("asset outside the list: %d", code)
	}
	var st struct {
		Ring struct {
			Size          int     `json:"size"`
			ResumeWindowS float64 `json:"resume_window_s"`
		} `json:"ring"`
	}
	_, _, b = ts.get(t, "/api/status")
	if err := json.Unmarshal(b, &st); err != nil || st.Ring.Size != 5760 || st.Ring.ResumeWindowS != 60 {
		t.Errorf("status ring: %v %s", err, b)
	}
}

// /api/trends: every configured tag in one reply, each as /api/history
// answers it (a tag with nothing recorded has no points), in device order.
func TestTrendsAPI(t *testing.T) {
	ts, now := historyServer(t, 2000)
	from := fmt.Sprint(now - (2 * time.Minute).Microseconds())
	code, _, b := ts.get(t, "/api/trends?from="+from+"&to="+fmt.Sprint(now))
	var r struct {
		From, To int64
		Series   []historyReply
	}
	if err := json.Unmarshal(b, &r); err != nil || code != 200 {
		t.Fatalf("%d %s: %v", code, b, err)
	}
	var names []string
	for _, s := range r.Series {
		names = append(names, s.Device+"/"+s.Tag)
	}
	if want := "logger-02/t00 logger-02/t01 logger-01/t00 logger-01/t01 odd \"name\"\\\n/t00 odd \"name\"\\\n/t01"; strings.Join(names, " ") != want {
		t.Fatalf("series %q", names)
	}
	s := r.Series[2]
	if s.Kind != "raw" || len(s.TS) != 120 || len(s.Value) != 120 || s.Unit != "°C" || len(r.Series[0].TS) != 0 {
		t.Errorf("logger-01/t00: %+v", s)
	}
	if code, _, b := ts.get(t, "/api/trends?from=x"); code != 400 || !strings.Contains(string(b), "from") {
		t.Errorf("bad from: %d %s", code, b)
	}
	plain := startServer(t, Config{})
	if code, _, _ := plain.get(t, "/api/trends"); code != 404 {
		t.Errorf("no history: %d", code)
	}
}
