package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"

	"edgegw/internal/testenv"
	"edgegw/lab/sim"
	"edgegw/ringstore"
)

// seqLog collects the seqs one path delivered, in arrival order.
type seqLog struct {
	mu   sync.Mutex
	seqs []uint64
}

func (l *seqLog) add(s ...uint64) {
	l.mu.Lock()
	l.seqs = append(l.seqs, s...)
	l.mu.Unlock()
}

func (l *seqLog) snapshot() []uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]uint64(nil), l.seqs...)
}

// subscribe follows <prefix>/batch as a persistent QoS 1 session (clean
// session off, fixed client id), so batches published while it is away are
// kept for it by the broker.
func subscribe(t *testing.T, addr, topic string, got *seqLog) {
	t.Helper()
	opts := mqtt.NewClientOptions().AddBroker("tcp://" + addr).SetClientID("e2e-subscriber").
		SetCleanSession(false).SetAutoReconnect(true).SetConnectRetry(true).
		SetConnectRetryInterval(50 * time.Millisecond).SetMaxReconnectInterval(200 * time.Millisecond).
		SetOrderMatters(true)
	opts.SetOnConnectHandler(func(c mqtt.Client) {
		c.Subscribe(topic, 1, func(_ mqtt.Client, m mqtt.Message) {
			var b struct {
				Samples []ringstore.Sample `json:"samples"`
			}
			if err := json.Unmarshal(m.Payload(), &b); err != nil {
				t.Errorf("bad batch on %s: %v", m.Topic(), err)
				return
			}
			for _, s := range b.Samples {
				got.add(s.Seq)
			}
		})
	})
	c := mqtt.NewClient(opts)
	if tok := c.Connect(); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("subscriber connect: %v", tok.Error())
	}
	t.Cleanup(func() { c.Disconnect(100) })
}

// readReceived returns the seqs in the receiver's JSON lines file.
func readReceived(t *testing.T, path string) []uint64 {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	var out []uint64
	for _, line := range strings.Split(string(b), "\n") {
		if line == "" {
			continue
		}
		var s struct{ Seq uint64 }
		if err := json.Unmarshal([]byte(line), &s); err != nil {
			continue // a line cut by a SIGKILL of the receiver
		}
		out = append(out, s.Seq)
	}
	return out
}

type upstreamStatus struct {
	Seq      uint64 `json:"seq"`
	Upstream struct {
		Path         string `json:"path"`
		QueueSamples int64  `json:"queue_samples"`
		Dropped      uint64 `json:"dropped"`
		SentWS       uint64 `json:"sent_ws"`
		SentMQTT     uint64 `json:"sent_mqtt"`
	} `json:"upstream"`
}

// 48 simulated loggers at 10 Hz against a real mosquitto and the reference
// receiver, while the test (a) kills the receiver (MQTT takes over), (b)
// stops mosquitto too (the queue grows on disk), (c) SIGKILLs the gateway
// and starts it again mid-outage, (d) brings both back. Afterwards the
// union of what the receiver and an MQTT subscriber got holds every
// sequence number exactly once after dedup, in order per path, and the
// queue drains to zero.
//
// Seqs jump once, at the restart: the new process starts above the
// high-water mark the first one had reserved (seq.hwm), never below.
// mosquitto is stopped with SIGTERM and runs with persistence, so what it
// acknowledged to the gateway reaches the subscriber after its restart (a
// broker that loses what it acknowledged is not the gateway's loss).
func TestUpstreamOutageLosesNothing(t *testing.T) {
	mosq := testenv.StartMosquittoPersistent(t)
	fleet := runFleet(t, sim.Config{Devices: 48, Transport: "udp"})

	dir := t.TempDir()
	recvAddr := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	recvOut := filepath.Join(dir, "received.jsonl")
	startReceiver := func() *proc {
		p := startProc(t, "receive", "-listen", recvAddr, "-out", recvOut)
		p.WaitLine("receiving on", 10*time.Second)
		return p
	}
	viaMQTT := &seqLog{}
	subscribe(t, mosq.Addr, "edgegw/e2e/batch", viaMQTT)

	var b strings.Builder
	fmt.Fprintf(&b, "[gateway]\nid = \"e2e\"\ndata_dir = %q\n[http]\nlisten = \"127.0.0.1:0\"\n[poll]\nudp_listen = \"127.0.0.1:0\"\n", filepath.Join(dir, "data"))
	fmt.Fprintf(&b, "[upstream.websocket]\nurl = \"ws://%s/ingest\"\nfallback_after = \"1s\"\nbatch_wait = \"100ms\"\n", recvAddr)
	fmt.Fprintf(&b, "[upstream.mqtt]\nbroker = \"tcp://%s\"\ntopic_prefix = \"edgegw/e2e\"\nmode = \"fallback\"\nqos = 1\nper_tag_topics = false\n", mosq.Addr)
	b.WriteString("[[profile]]\nname = \"th\"\ntags = [ { name = \"temperature\", address = 0, type = \"int16\", scale = 0.1 }, { name = \"humidity\", address = 1, scale = 0.1 } ]\n")
	for i := 0; i < fleet.Len(); i++ {
		fmt.Fprintf(&b, "[[device]]\nname = \"logger-%02d\"\ntransport = \"udp\"\naddress = %q\nprofile = \"th\"\ninterval = \"100ms\"\ntimeout = \"50ms\"\n", i+1, fleet.Addr(i))
	}
	cfg := filepath.Join(dir, "edgegw.toml")
	if err := os.WriteFile(cfg, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	var page string
	startGateway := func() *proc {
		p, u := runGateway(t, cfg)
		page = u
		return p
	}
	status := func() upstreamStatus {
		var s upstreamStatus
		if err := getJSON(t, page+"api/status", &s); err != nil {
			t.Logf("status: %v", err)
		}
		return s
	}
	waitPath := func(step, path string) {
		waitFor(t, 30*time.Second, step+": path "+path, func() bool { return status().Upstream.Path == path })
	}

	recv := startReceiver()
	gw := startGateway()
	waitFor(t, 30*time.Second, "(start) samples at the receiver", func() bool { return len(readReceived(t, recvOut)) >= 2000 })

	// (a) receiver down: after fallback_after, MQTT carries the batches.
	recv.Kill()
	waitPath("(a)", "mqtt")
	n := len(viaMQTT.snapshot())
	waitFor(t, 30*time.Second, "(a) samples over mqtt", func() bool { return len(viaMQTT.snapshot()) >= n+2000 })

	// (b) mosquitto down too: buffering, the queue grows on disk.
	mosq.Stop()
	waitPath("(b)", "buffering")
	waitFor(t, 30*time.Second, "(b) queue grows", func() bool { return status().Upstream.QueueSamples >= 2000 })

	// (c) SIGKILL the gateway mid-outage and start it again.
	mark := markOf(t, filepath.Join(dir, "data"))
	gw.Kill()
	gw = startGateway()
	waitFor(t, 30*time.Second, "(c) queue restored and growing", func() bool {
		s := status()
		return s.Upstream.Path == "buffering" && s.Upstream.QueueSamples >= 4000 && s.Seq > mark
	})

	// (d) both back: mosquitto first (MQTT drains for a while), then the
	// receiver (WebSocket takes over from the first sample MQTT did not get
	// acknowledged).
	mosq.Restart(t)
	waitPath("(d)", "mqtt")
	n = len(viaMQTT.snapshot())
	waitFor(t, 30*time.Second, "(d) mqtt drains", func() bool { return len(viaMQTT.snapshot()) >= n+1000 })
	before := len(readReceived(t, recvOut))
	recv = startReceiver()
	waitPath("(d)", "websocket")
	waitFor(t, 30*time.Second, "(d) samples over websocket again", func() bool { return len(readReceived(t, recvOut)) >= before+2000 })
	// drained: what is left is the last batch window of a live stream
	// (under 0.2 s of samples at this rate)
	waitFor(t, 60*time.Second, "(d) queue drained", func() bool { return status().Upstream.QueueSamples < 200 })
	st := status()
	if code := gw.Stop(os.Interrupt, 20*time.Second); code != 0 {
		t.Errorf("gateway exited %d", code)
	}
	recv.Stop(os.Interrupt, 10*time.Second)
	if st.Upstream.Dropped != 0 {
		t.Errorf("gateway dropped %d samples", st.Upstream.Dropped)
	}

	// The union, checked.
	ws, mq := readReceived(t, recvOut), viaMQTT.snapshot()
	union := map[uint64]bool{}
	for name, path := range map[string][]uint64{"websocket": ws, "mqtt": mq} {
		for i, s := range path {
			// receiver restarts and MQTT redeliveries may repeat a seq; a
			// path never goes backwards by more than that
			if i > 0 && s < path[i-1] && !union[s] {
				t.Fatalf("%s: seq %d after %d and not seen before: out of order", name, s, path[i-1])
			}
			union[s] = true
		}
	}
	all := make([]uint64, 0, len(union))
	for s := range union {
		all = append(all, s)
	}
	sort.Slice(all, func(i, j int) bool { return all[i] < all[j] })
	if len(all) == 0 || all[0] != 1 {
		t.Fatalf("first seq %v, want 1", all[:min(1, len(all))])
	}
	jumps := 0
	for i := 1; i < len(all); i++ {
		if all[i] == all[i-1]+1 {
			continue
		}
		if jumps == 0 && all[i-1] <= mark && all[i] == mark+1 {
			jumps++ // the restart: the new process starts above the old mark
			continue
		}
		t.Fatalf("gap: %d then %d (restart mark %d)", all[i-1], all[i], mark)
	}
	if jumps != 1 {
		t.Fatalf("no restart seen in the seqs (mark %d, last %d)", mark, all[len(all)-1])
	}
	t.Logf("%d samples, websocket %d, mqtt %d (with repeats), restart mark %d; final status %+v", len(all), len(ws), len(mq), mark, st.Upstream)
}
