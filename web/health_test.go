package web

import (
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"

	"edgegw/stats"
)

type fakeStorage struct {
	mu  sync.Mutex
	ok  bool
	why string
}

func (f *fakeStorage) QueueHealth() (bool, string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.ok, f.why
}

func (f *fakeStorage) set(ok bool, why string) {
	f.mu.Lock()
	f.ok, f.why = ok, why
	f.mu.Unlock()
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
	storage := &fakeStorage{ok: true}
	up := new(stats.Upstream)
	up.Path.Store(stats.PathWebSocket)
	up.PathSinceUS.Store(time.Now().Add(-time.Hour).UnixMicro())
	devs := fakeDevices{
		device("good", time.Second, 100*time.Millisecond, true),
		device("dead", time.Second, time.Hour, true),
		device("never", time.Second, -1, true),
		device("starting", time.Second, -1, false),
	}
	ts := startServer(t, Config{Devices: devs, Storage: storage, Upstream: up, HealthzUpstreamMaxDown: 10 * time.Minute})
	code, h := ts.health(t)
	if code != 200 || strings.Join(h.Down, ",") != "dead,never" {
		t.Fatalf("one good device: %d %+v", code, h)
	}

	storage.set(false, "disk full: queue in memory")
	code, h = ts.health(t)
	if code != 503 || len(h.Reasons) != 1 || !strings.Contains(h.Reasons[0], "not storing samples: disk full") {
		t.Fatalf("storage: %d %+v", code, h)
	}
	storage.set(true, "")

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
	ts0 := startServer(t, Config{Upstream: up})
	up.Path.Store(stats.PathBuffering)
	if code, h := ts0.health(t); code != 200 {
		t.Fatalf("max down 0: %d %+v", code, h)
	}
}
