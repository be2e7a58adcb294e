package web

import (
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"edgegw/stats"
)

type fakeStorage struct {
	mu sync.Mutex
	st StorageState
}

func (f *fakeStorage) StorageState() StorageState {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.st
}

// set makes the history writer fail with why ("" = writing again).
func (f *fakeStorage) set(ok bool, why string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.st = StorageState{DataDir: "/data", State: "ok", FreeBytes: 1 << 20,
		Writers: []WriterState{{Name: "sequence"}, {Name: "history"}}}
	if !ok {
		f.st.State, f.st.FreeBytes = "failing", 0
		f.st.Writers[1].Failing = errors.New(why)
		f.st.Writers[1].LastError, f.st.Writers[1].LastErrorAt = f.st.Writers[1].Failing, time.UnixMicro(1764450000123456)
	}
}

var _ Storage = (*fakeStorage)(nil)

type healthReply struct {
	Status  string   `json:"status"`
	Reasons []string `json:"reasons"`
	Down    []string `json:"down"`
}

func (ts *testServer) health(t *testing.T) (int, healthReply) {
	t.Helper()
	code, _, body := ts.get(t, "/healthz")
	var h healthReply
	if err := json.Unmarshal(body, &h); err != nil {
		t.Fatalf("healthz body %q: %v", body, err)
	}
	if (code == 200) != (h.Status == "ok") || (code == 503) != (h.Status == "unhealthy") || (code == 503) != (len(h.Reasons) > 0) {
		t.Fatalf("healthz %d with %+v", code, h)
	}
	return code, h
}

// device is one stats entry polled at interval whose last good poll was
// ago (never when ago < 0); polled says whether it has been polled at all.
func device(name string, interval, ago time.Duration, polled bool) stats.Entry {
	d := &stats.Device{}
	if polled {
		d.Polls.Add(5)
	}
	if ago >= 0 {
		d.GoodPolls.Add(1)
		d.LastGoodUS.Store(time.Now().Add(-ago).UnixMicro())
	}
	return stats.Entry{Info: stats.Info{Name: name, Transport: "udp", Interval: interval}, Stats: d}
}

// /healthz: 200 while something is polled well, stored and sent; 503 with
// every reason that holds, and the devices that are down either way.
func TestHealthz(t *testing.T) {
	storage := new(fakeStorage)
	storage.set(true, "")
	up := new(stats.Upstream)
	up.Path.Store(stats.PathWebSocket)
	up.PathSinceUS.Store(time.Now().Add(-time.Hour).UnixMicro())
	devs := fakeDevices{
		device("good", time.Second, 100*time.Millisecond, true),
		device("dead", time.Second, time.Hour, true),
		device("never", time.Second, -1, true),
		device("starting", time.Second, -1, false),
	}
	ts := startServer(t, Config{Devices: devs, Storage: storage, Upstream: up, HealthzUpstreamMaxDown: 10 * time.Minute,
		HealthzHold: -1}) // each check answered as it is (the hold: TestHealthzHold)
	code, h := ts.health(t)
	if code != 200 || strings.Join(h.Down, ",") != "dead,never" {
		t.Fatalf("one good device: %d %+v", code, h)
	}

	storage.set(false, "write h-1.hist: no space left on device")
	code, h = ts.health(t)
	if code != 503 || len(h.Reasons) != 1 || h.Reasons[0] != "storage: history cannot write to /data: write h-1.hist: no space left on device" {
		t.Fatalf("storage: %d %+v", code, h)
	}
	var st struct {
		Storage struct {
			DataDir   string `json:"data_dir"`
			State     string `json:"state"`
			FreeBytes int64  `json:"free_bytes"`
			Writers   map[string]struct {
				State       string `json:"state"`
				Error       string `json:"error"`
				LastError   string `json:"last_error"`
				LastErrorUS int64  `json:"last_error_us"`
			} `json:"writers"`
		} `json:"storage"`
	}
	if _, _, body := ts.get(t, "/api/status"); json.Unmarshal(body, &st) != nil || st.Storage.DataDir != "/data" || st.Storage.State != "failing" ||
		st.Storage.Writers["history"].State != "failing" || st.Storage.Writers["history"].LastErrorUS != 1764450000123456 ||
		!strings.Contains(st.Storage.Writers["history"].Error, "no space") || st.Storage.Writers["sequence"].State != "ok" {
		t.Fatalf("status storage: %s", body)
	}
	storage.set(true, "")
	if code, h := ts.health(t); code != 200 {
		t.Fatalf("storage writing again: %d %+v", code, h)
	}

	// Buffering for 5 minutes: within the limit; for 11: beyond it.
	up.Path.Store(stats.PathBuffering)
	up.PathSinceUS.Store(time.Now().Add(-5 * time.Minute).UnixMicro())
	if code, h := ts.health(t); code != 200 {
		t.Fatalf("upstream down 5m of 10m: %d %+v", code, h)
	}
	up.PathSinceUS.Store(time.Now().Add(-11 * time.Minute).UnixMicro())
	code, h = ts.health(t)
	if code != 503 || len(h.Reasons) != 1 || !strings.Contains(h.Reasons[0], "upstream down for 11m0s (path buffering, limit 10m0s)") {
		t.Fatalf("upstream: %d %+v", code, h)
	}
	up.Path.Store(stats.PathMQTT) // the fallback carries the batches: up
	if code, h := ts.health(t); code != 200 {
		t.Fatalf("on mqtt: %d %+v", code, h)
	}

	// No device polled well within 3 intervals (the good one's last good
	// poll 3.5 intervals ago): unhealthy, however many are configured.
	devs[0] = device("good", time.Second, 3500*time.Millisecond, true)
	devs[3] = device("starting", time.Second, -1, true)
	code, h = ts.health(t)
	if code != 503 || len(h.Reasons) != 1 || h.Reasons[0] != "no device had a good poll in 3 intervals (4 devices)" ||
		strings.Join(h.Down, ",") != "dead,good,never,starting" {
		t.Fatalf("all down: %d %+v", code, h)
	}

	// Limit 0: the upstream is not checked.
	ts0 := startServer(t, Config{Upstream: up, HealthzHold: -1})
	up.Path.Store(stats.PathBuffering)
	if code, h := ts0.health(t); code != 200 {
		t.Fatalf("max down 0: %d %+v", code, h)
	}
}

// The hold: a fault turns /healthz 503 once it has lasted the hold, passes
// shorter than the hold do not end it, and it turns 200 once the checks
// have passed for the hold. A blip shorter than the hold never shows.
func TestHealthzHold(t *testing.T) {
	h := &healthHold{hold: 10 * time.Second}
	t0 := time.Unix(1e9, 0)
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	bad := []string{"storage: queue cannot write to /d: no space left on device"}
	for _, c := range []struct {
		at                    float64
		raw                   []string
		unhealthy, recovering bool
		pending               bool
	}{
		{0, nil, false, false, false},
		{1, bad, false, false, true}, // a blip
		{2, nil, false, false, false},
		{20, nil, false, false, false}, // passed 18 s: the fault ended unseen
		{30, bad, false, false, true},  // a flapping disk: fails 2 s, passes 1 s
		{32, nil, false, false, false},
		{33, bad, false, false, true},
		{35, nil, false, false, false},
		{36, bad, false, false, true},
		{38, nil, false, false, false},
		{39, bad, false, false, true},
		{40, bad, true, false, false}, // 10 s since the fault began: 503
		{41, nil, true, true, false},  // passing, not for 10 s yet
		{45, bad, true, false, false},
		{50, nil, true, true, false},
		{54.9, nil, true, true, false},
		{55, nil, false, false, false}, // passed for 10 s: 200
		{56, bad, false, false, true},  // a new fault starts its own hold
	} {
		u, reasons, pending, rec := h.check(at(c.at), c.raw)
		if u != c.unhealthy || rec != c.recovering || (len(pending) > 0) != c.pending || (len(reasons) > 0) != c.unhealthy {
			t.Fatalf("at %v s (raw %v): unhealthy %v reasons %v pending %v recovering %v; want unhealthy %v pending %v recovering %v",
				c.at, c.raw, u, reasons, pending, rec, c.unhealthy, c.pending, c.recovering)
		}
	}
	if holdOf(0) != DefaultHealthzHold || holdOf(-1) != 0 || holdOf(time.Minute) != time.Minute {
		t.Fatal("holdOf")
	}
}
