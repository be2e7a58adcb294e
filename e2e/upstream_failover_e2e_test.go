package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"edgegw/internal/testenv"
	"edgegw/lab/sim"
	"edgegw/receiver"
)

// failoverStatus is the part of /api/status these tests read.
type failoverStatus struct {
	Seq      uint64 `json:"seq"`
	Upstream struct {
		Path         string   `json:"path"`
		QueueSamples int64    `json:"queue_samples"`
		WSURL        string   `json:"ws_url"`
		WSURLs       []string `json:"ws_urls"`
		MQTTBroker   string   `json:"mqtt_broker"`
		MQTTBrokers  []string `json:"mqtt_brokers"`
	} `json:"upstream"`
}

// loggersConfig writes a gateway config for the fleet's UDP loggers (2 tags
// each, polled every interval) with upstream as its [upstream…] sections,
// and returns its path.
func loggersConfig(t *testing.T, id string, fleet *sim.Fleet, upstream, interval, timeout string) string {
	t.Helper()
	dir := t.TempDir()
	var b strings.Builder
	fmt.Fprintf(&b, "[gateway]\nid = %q\ndata_dir = %q\n[http]\nlisten = \"127.0.0.1:0\"\n[poll]\nudp_listen = \"127.0.0.1:0\"\n", id, filepath.Join(dir, "data"))
	b.WriteString(upstream)
	b.WriteString("[[profile]]\nname = \"th\"\ntags = [ { name = \"temperature\", address = 0, type = \"int16\", scale = 0.1, unit = \"°C\" }, { name = \"humidity\", address = 1, scale = 0.1, unit = \"%RH\" } ]\n")
	for i := 0; i < fleet.Len(); i++ {
		fmt.Fprintf(&b, "[[device]]\nname = \"logger-%02d\"\ntransport = \"udp\"\naddress = %q\nprofile = \"th\"\ninterval = %q\ntimeout = %q\n", i+1, fleet.Addr(i), interval, timeout)
	}
	cfg := filepath.Join(dir, "edgegw.toml")
	if err := os.WriteFile(cfg, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	return cfg
}

// failoverGateway runs the gateway binary with 48 simulated UDP loggers at
// 200 ms and upstream as its [upstream…] sections.
func failoverGateway(t *testing.T, fleet *sim.Fleet, upstream string) (gw *proc, status func() failoverStatus) {
	t.Helper()
	cfg := loggersConfig(t, "e2e", fleet, upstream, "200ms", "100ms")
	gw, page := runGateway(t, cfg)
	status = func() failoverStatus {
		var s failoverStatus
		if err := getJSON(t, page+"api/status", &s); err != nil {
			t.Logf("status: %v", err)
		}
		return s
	}
	return gw, status
}

// noHole checks that seqs (any order, duplicates allowed) cover
// min..max without a hole, and returns how many there are and how many
// were duplicates.
func noHole(t *testing.T, what string, seqs []uint64) (n, dups int) {
	t.Helper()
	if len(seqs) == 0 {
		t.Fatalf("%s: nothing stored", what)
	}
	s := append([]uint64(nil), seqs...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	for i := 1; i < len(s); i++ {
		switch d := s[i] - s[i-1]; {
		case d == 0:
			dups++
		case d > 1:
			t.Fatalf("%s: seqs %d..%d lost (of %d..%d)", what, s[i-1]+1, s[i]-1, s[0], s[len(s)-1])
		}
	}
	return len(s) - dups, dups
}

// lockedLines is an Out for receivers in the test process: the seqs of
// the JSON lines written.
type lockedLines struct {
	mu   sync.Mutex
	seqs []uint64
}

func (l *lockedLines) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	sc := bufio.NewScanner(bytes.NewReader(p))
	for sc.Scan() {
		var s struct{ Seq uint64 }
		if err := json.Unmarshal(sc.Bytes(), &s); err != nil {
			return 0, err
		}
		l.seqs = append(l.seqs, s.Seq)
	}
	return len(p), nil
}

func (l *lockedLines) snapshot() []uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]uint64(nil), l.seqs...)
}

// MQTT fallback to a broker cluster: the WebSocket receiver is down from
// the start, the gateway publishes its batches to the first of two
// mosquitto brokers (brokers = [m1, m2]), and the receiver takes them from
// both (one MQTT ingest per broker, one dedup). The broker the gateway is
// connected to is killed (SIGKILL): the gateway moves to the second, and
// the receiver stores every sample once, without a hole.
//
// Two mosquitto brokers, not a NATS cluster: Debian's nats-server 2.9.10
// speaks MQTT 3.1.1 only (it answers an MQTT 5 CONNECT with "unacceptable
// protocol version of 5" and closes), so the receiver's MQTT 5 shared
// subscription cannot run on it (README, "Receiving side" / broker cluster).
func TestMQTTBrokerClusterFailover(t *testing.T) {
	m1, m2 := testenv.StartMosquitto(t), testenv.StartMosquitto(t)
	fleet := runFleet(t, sim.Config{Devices: 48, Transport: "udp"})
	out := &lockedLines{}
	r := receiver.New(receiver.Config{Out: out})
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for i, m := range []*testenv.Mosquitto{m1, m2} {
		in, err := receiver.NewMQTT(r, receiver.MQTTConfig{Brokers: []string{"tcp://" + m.Addr}, ClientID: fmt.Sprintf("e2e-recv-%d", i)})
		if err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() { defer wg.Done(); _ = in.Run(ctx) }()
	}
	defer func() {
		cancel()
		testenv.Wait(t, 10*time.Second, "the MQTT ingests to return", wg.Wait)
	}()

	b1, b2 := "tcp://"+m1.Addr, "tcp://"+m2.Addr
	up := fmt.Sprintf("[upstream.websocket]\nurl = \"ws://%s/ingest\"\nfallback_after = \"1s\"\nbatch_wait = \"100ms\"\n", refusedAddr(t)) +
		fmt.Sprintf("[upstream.mqtt]\nbrokers = [%q, %q]\ntopic_prefix = \"edgegw/e2e\"\nper_tag_topics = false\n", b1, b2)
	gw, status := failoverGateway(t, fleet, up)
	if s := status(); len(s.Upstream.MQTTBrokers) != 2 {
		t.Fatalf("status brokers %v", s.Upstream.MQTTBrokers)
	}
	waitFor(t, 30*time.Second, "samples over mqtt via the first broker", func() bool {
		s := status()
		return s.Upstream.Path == "mqtt" && s.Upstream.MQTTBroker == b1 && r.Stats().Samples >= 1000
	})
	m1.Kill()
	n := r.Stats().Samples
	waitFor(t, 60*time.Second, "the gateway on the second broker, samples stored again", func() bool {
		s := status()
		return s.Upstream.MQTTBroker == b2 && s.Upstream.Path == "mqtt" && r.Stats().Samples >= n+2000
	})
	// Drained: what is left is the last batch window of a live stream.
	waitFor(t, 30*time.Second, "queue drained over the second broker", func() bool { return status().Upstream.QueueSamples < 200 })
	if code := gw.Stop(os.Interrupt, 20*time.Second); code != 0 {
		t.Errorf("gateway exited %d", code)
	}
	got, dups := noHole(t, "stored", out.snapshot())
	st := r.Stats()
	t.Logf("stored %d samples once each (%d arrived twice and were dropped by the dedup), %d gaps", got, st.Duplicates, st.Gaps)
	if dups != 0 || st.Gaps != 0 {
		t.Fatalf("%d duplicates written, %d gaps: %+v", dups, st.Gaps, st)
	}
}

// urls failover: two reference receivers (edgegw receive processes) in
// urls; the first is killed (SIGKILL), the gateway moves to the second;
// the first comes back and after primary_retry the gateway returns to it.
// The union of the two receivers' output holds every seq, no hole; a
// sample both stored is one that was in flight when the first died.
func TestWebSocketURLsFailoverE2E(t *testing.T) {
	fleet := runFleet(t, sim.Config{Devices: 48, Transport: "udp"})
	dir := t.TempDir()
	addrA := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	addrB := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	outA, outB := filepath.Join(dir, "a.jsonl"), filepath.Join(dir, "b.jsonl")
	startReceiver := func(addr, out string) *proc {
		p := startProc(t, "receive", "-listen", addr, "-out", out)
		p.WaitLine("receiving on", 10*time.Second)
		return p
	}
	recvA := startReceiver(addrA, outA)
	recvB := startReceiver(addrB, outB)
	urlA, urlB := "ws://"+addrA+"/ingest", "ws://"+addrB+"/ingest"
	up := fmt.Sprintf("[upstream.websocket]\nurls = [%q, %q]\nprimary_retry = \"5s\"\nbatch_wait = \"100ms\"\n", urlA, urlB)
	gw, status := failoverGateway(t, fleet, up)
	if s := status(); len(s.Upstream.WSURLs) != 2 {
		t.Fatalf("status urls %v", s.Upstream.WSURLs)
	}
	waitFor(t, 30*time.Second, "samples at the first receiver", func() bool {
		return status().Upstream.WSURL == urlA && len(readReceived(t, outA)) >= 1000
	})
	recvA.Kill()
	waitFor(t, 30*time.Second, "the gateway on the second receiver", func() bool {
		return status().Upstream.WSURL == urlB && len(readReceived(t, outB)) >= 1000
	})
	recvA = startReceiver(addrA, outA)
	nA := len(readReceived(t, outA))
	waitFor(t, 30*time.Second, "back on the first receiver after primary_retry", func() bool {
		s := status()
		return s.Upstream.WSURL == urlA && s.Upstream.Path == "websocket" && len(readReceived(t, outA)) >= nA+1000
	})
	waitFor(t, 30*time.Second, "queue drained", func() bool { return status().Upstream.QueueSamples < 200 })
	if code := gw.Stop(os.Interrupt, 20*time.Second); code != 0 {
		t.Errorf("gateway exited %d", code)
	}
	recvA.Stop(os.Interrupt, 10*time.Second)
	recvB.Stop(os.Interrupt, 10*time.Second)
	a, b := readReceived(t, outA), readReceived(t, outB)
	got, dups := noHole(t, "stored by the two", append(a, b...))
	t.Logf("first receiver %d lines, second %d; %d seqs without a hole, %d stored by both (in flight at the SIGKILL, or a batch the killed receiver wrote but had not acked)", len(a), len(b), got, dups)
}
