package web

import (
	"encoding/json"
	"testing"
	"time"

	"edgegw/stats"
)

// A device not polled yet is "pending" in /api/devices (not "ok"), and it
// stays a starting device for /healthz (200 while none has been polled).
// After its first good poll it is "ok".
func TestDeviceStatePendingBeforeFirstPoll(t *testing.T) {
	d := &stats.Device{}
	ts := startServer(t, Config{Devices: fakeDevices{{Info: stats.Info{Name: "logger-01", Transport: "tcp",
		Address: "127.0.0.1:502", Unit: 1, Interval: time.Second, Tags: []stats.TagInfo{{Name: "t", Deadband: 0.5}}}, Stats: d}}})
	state := func() (string, float64) {
		t.Helper()
		code, _, b := ts.get(t, "/api/devices")
		var out struct {
			Devices []struct {
				State string
				Tags  []struct{ Deadband float64 }
			}
		}
		if err := json.Unmarshal(b, &out); err != nil || code != 200 || len(out.Devices) != 1 || len(out.Devices[0].Tags) != 1 {
			t.Fatalf("/api/devices: %d %s %v", code, b, err)
		}
		return out.Devices[0].State, out.Devices[0].Tags[0].Deadband
	}
	if st, db := state(); st != "pending" || db != 0.5 {
		t.Errorf("before the first poll: state %q deadband %v, want pending, 0.5", st, db)
	}
	if code, _, b := ts.get(t, "/healthz"); code != 200 {
		t.Errorf("/healthz with the only device pending: %d %s, want 200 (starting)", code, b)
	}
	d.Polls.Add(1)
	d.GoodPolls.Add(1)
	d.LastGoodUS.Store(time.Now().UnixMicro())
	if st, _ := state(); st != "ok" {
		t.Errorf("after a good poll: state %q, want ok", st)
	}
}
