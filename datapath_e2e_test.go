package main

import (
	"path/filepath"
	"testing"
	"time"

	"edgegw/internal/testenv"
)

// max_bytes = "16KiB" with a healthy uplink: segments follow the bound, so
// nothing unacknowledged is dropped (it was: a 64 KiB segment minimum made
// every roll drop the previous segment).
func TestSmallQueueHealthyUplinkDropsNothing(t *testing.T) {
	r := newEpochRig(t, 8)
	r.startReceiver()
	gw := r.startGateway(r.config("small", filepath.Join(r.dir, "data"), "[buffer]\nmax_bytes = \"16KiB\"\n"))
	start := time.Now()
	n := gw.status(t).Seq
	// 8 loggers x 2 tags at 20 Hz: 320 samples/s; 10 s is about 3,200
	// samples, 60 KiB on disk: four times the bound.
	testenv.WaitFor(t, 60*time.Second, "10 s and 3,000 samples", func() bool {
		return time.Since(start) >= 10*time.Second && gw.status(t).Seq >= n+3000
	})
	_, last := r.waitDelivered(gw, 1, 30*time.Second)
	st := gw.status(t)
	gw.term(20 * time.Second)
	r.stopReceiver()
	if st.Upstream.Dropped != 0 {
		t.Fatalf("dropped %d of %d with a healthy uplink", st.Upstream.Dropped, last)
	}
	t.Logf("%d samples through a 16 KiB queue, 0 dropped", last)
}
