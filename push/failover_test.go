package push

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"edgegw/receiver"
	"edgegw/stats"
)

// URLs: the uplink moves to the second receiver when the first stops, and
// back to the first once PrimaryRetry has passed; every sample reaches one
// of them (the two keep separate dedup state, so the union of their output
// holds each seq at least once), and each change of receiver is logged once.
func TestWebSocketURLsFailoverAndBack(t *testing.T) {
	var outA, outB syncBuffer
	ra := receiver.New(receiver.Config{Out: &outA, Logger: testLogger(t)})
	rb := receiver.New(receiver.Config{Out: &outB, Logger: testLogger(t)})
	addrA, stopA := serveReceiver(t, ra)
	addrB, _ := serveReceiver(t, rb)
	urlA, urlB := "ws://"+addrA.String()+"/ingest", "ws://"+addrB.String()+"/ingest"
	g := newGateway(t, "")
	st := new(stats.Upstream)
	var lines logLines
	w := wsConfig(addrA.String(), "")
	w.URL, w.URLs, w.PrimaryRetry = "", []string{urlA, urlB}, 1500*time.Millisecond
	w.AckTimeout = 5 * time.Second // a loaded machine must not flip receivers by ack timeouts
	p, err := New(Config{GatewayID: gwID, WS: w, Queue: g.q, State: st, Logger: lines.logger()})
	if err != nil {
		t.Fatal(err)
	}
	if got := st.Snapshot().WSURLs; len(got) != 2 || got[0] != urlA || got[1] != urlB {
		t.Fatalf("status urls %v", got)
	}
	first := g.ring.Seq() + 1
	runPusher(t, p)
	prod := startProducer(g, 1000) // 2000 samples at 200/s: 5 s
	waitFor(t, 10*time.Second, "samples stored by the first receiver", func() bool { return ra.Stats().Samples > 50 })
	if u := st.Snapshot().WSURL; u != urlA {
		t.Fatalf("current url %q, want %q", u, urlA)
	}
	stopA()
	waitFor(t, 10*time.Second, "samples stored by the second receiver", func() bool {
		return rb.Stats().Samples > 50 && st.Snapshot().WSURL == urlB
	})
	// The first comes back (same address, same dedup state); the uplink
	// returns to it after PrimaryRetry, handing over without loss.
	if _, err := ra.Listen(); err != nil {
		t.Fatal(err)
	}
	addrA2, _ := serveReceiver(t, ra)
	if addrA2.String() != addrA.String() {
		t.Fatalf("receiver A moved: %v", addrA2)
	}
	before := ra.Stats().Samples
	waitFor(t, 15*time.Second, "back on the first receiver", func() bool {
		return st.Snapshot().WSURL == urlA && ra.Stats().Samples > before+50
	})
	prod.finished(30 * time.Second)
	last := g.ring.Seq()
	waitFor(t, 15*time.Second, "queue drained", func() bool { return g.q.Stats().Samples == 0 })

	seen := map[uint64]int{}
	for _, s := range append(outA.seqs(t, gwID), outB.seqs(t, gwID)...) {
		seen[s]++
	}
	dups := 0
	for s := first; s <= last; s++ {
		if seen[s] == 0 {
			t.Fatalf("seq %d lost (%d..%d)", s, first, last)
		}
		dups += seen[s] - 1
	}
	t.Logf("%d samples, A stored %d, B stored %d, %d stored by both (in flight when A stopped)",
		last-first+1, ra.Stats().Samples, rb.Stats().Samples, dups)
	// Logged once per change of receiver: A, B, A again at least, each
	// line naming another URL than the one before (a session that fails
	// under load and moves on is one more change, never a repeat).
	got := lines.with(`msg="push: websocket: receiver" url=`)
	if len(got) < 3 {
		t.Fatalf("want at least 3 receiver lines (A, B, A), got %d:\n%s", len(got), strings.Join(got, "\n"))
	}
	prev := ""
	for _, l := range got {
		u := l[strings.Index(l, " url=")+5:]
		u = u[:strings.IndexByte(u, ' ')]
		if u == prev {
			t.Fatalf("receiver %s logged twice in a row:\n%s", u, strings.Join(got, "\n"))
		}
		prev = u
	}
	if got := lines.with("back to the first receiver url"); len(got) < 1 {
		t.Fatal("no hand-back line")
	}
}

// url and urls both set is refused, naming both.
func TestWebSocketURLAndURLsRefused(t *testing.T) {
	g := newGateway(t, "")
	_, err := New(Config{GatewayID: gwID, Queue: g.q, WS: WSConfig{URL: "ws://a/ingest", URLs: []string{"ws://b/ingest"}}})
	if err == nil || !strings.Contains(err.Error(), "both url and urls") {
		t.Fatalf("err %v", err)
	}
	_, err = New(Config{GatewayID: gwID, Queue: g.q, MQTT: MQTTConfig{Broker: "tcp://a:1883", Brokers: []string{"tcp://b:1883"}}})
	if err == nil || !strings.Contains(err.Error(), "both broker and brokers") {
		t.Fatalf("err %v", err)
	}
}

// permessage-deflate: negotiated with the reference receiver by default
// (the connected line says compressed=true), not offered with
// NoCompression (plain frames, every sample stored all the same).
func TestWebSocketCompression(t *testing.T) {
	for _, off := range []bool{false, true} {
		var out syncBuffer
		r := receiver.New(receiver.Config{Out: &out, Logger: testLogger(t)})
		addr, stopR := serveReceiver(t, r)
		g := newGateway(t, "")
		var lines logLines
		w := wsConfig(addr.String(), "")
		w.NoCompression = off
		p, err := New(Config{GatewayID: gwID, WS: w, Queue: g.q, Logger: lines.logger()})
		if err != nil {
			t.Fatal(err)
		}
		first := g.ring.Seq() + 1
		stop := runPusher(t, p)
		prod := startProducer(g, 100)
		prod.finished(30 * time.Second)
		last := g.ring.Seq()
		waitFor(t, 10*time.Second, "every sample stored", func() bool { return r.Stats().Samples == last-first+1 })
		checkExactlyOnce(t, out.seqs(t, gwID), first, last)
		stop()
		stopR()
		want := fmt.Sprintf("compressed=%v", !off)
		if got := lines.with("push: websocket: connected", want); len(got) == 0 {
			t.Fatalf("no connected line with %s:\n%s", want, strings.Join(lines.with("push: websocket"), "\n"))
		}
	}
}
