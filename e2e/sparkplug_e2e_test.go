package e2e

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"

	"edgegw/internal/testenv"
	"edgegw/lab/sim"
	"edgegw/sparkplug"
)

// spMetric is a metric as Tahu's decodePayload gives it.
type spMetric struct {
	Name         string          `json:"name"`
	Alias        *uint64         `json:"alias"`
	Type         string          `json:"type"`
	Value        json.RawMessage `json:"value"`
	Timestamp    uint64          `json:"timestamp"`
	IsHistorical bool            `json:"isHistorical"`
	Properties   map[string]struct {
		Type  string          `json:"type"`
		Value json.RawMessage `json:"value"`
	} `json:"properties"`
}

func (m spMetric) num(t *testing.T) float64 {
	t.Helper()
	var f float64
	if string(m.Value) == "true" {
		return 1
	}
	if string(m.Value) == "false" {
		return 0
	}
	if err := json.Unmarshal(m.Value, &f); err != nil {
		t.Fatalf("metric %q (alias %v): value %s is not a number", m.Name, m.Alias, m.Value)
	}
	return f
}

// spMsg is one line of host.js: a decoded message.
type spMsg struct {
	Topic   string `json:"topic"`
	Bytes   int    `json:"bytes"`
	State   string `json:"state"`
	Error   string `json:"error"`
	Payload struct {
		Timestamp uint64     `json:"timestamp"`
		Seq       *uint64    `json:"seq"`
		Metrics   []spMetric `json:"metrics"`
	} `json:"payload"`
	Ready     bool   `json:"ready"`
	Published string `json:"published"`
}

func (m *spMsg) typ() string {
	p := strings.Split(m.Topic, "/")
	if len(p) < 3 {
		return ""
	}
	return p[2]
}

func (m *spMsg) device() string {
	p := strings.Split(m.Topic, "/")
	if len(p) < 5 {
		return ""
	}
	return p[4]
}

func (m *spMsg) metric(name string) *spMetric {
	for i := range m.Payload.Metrics {
		if m.Payload.Metrics[i].Name == name {
			return &m.Payload.Metrics[i]
		}
	}
	return nil
}

// tahuHost is a running host.js: Eclipse Tahu's decoder behind the mqtt
// npm client, subscribed to spBv1.0/# on a real mosquitto.
type tahuHost struct {
	t     *testing.T
	in    io.WriteCloser
	mu    sync.Mutex
	msgs  []spMsg
	done  chan struct{}
	ended bool
}

// needTahu skips (fails under CI) when node or the npm modules are missing.
func needTahu(t *testing.T) string {
	t.Helper()
	node := testenv.Need(t, "node")
	for _, m := range []string{"sparkplug-payload", "mqtt"} {
		if _, err := os.Stat(filepath.Join("test", "sparkplug", "node_modules", m, "package.json")); err != nil {
			testenv.Missing(t, fmt.Sprintf("npm module %s not installed (make npm-deps)", m))
		}
	}
	return node
}

func startTahuHost(t *testing.T, broker, hostID string) *tahuHost {
	t.Helper()
	node := needTahu(t)
	args := []string{filepath.Join("test", "sparkplug", "host.js"), "mqtt://" + broker}
	if hostID != "" {
		args = append(args, hostID)
	}
	cmd := exec.Command(node, args...)
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	h := &tahuHost{t: t, in: in, done: make(chan struct{})}
	go func() {
		defer close(h.done)
		sc := bufio.NewScanner(out)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			var m spMsg
			if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
				t.Errorf("host.js: %v: %s", err, sc.Text())
				continue
			}
			if m.Error != "" {
				t.Errorf("host.js: %s: %s", m.Topic, m.Error)
			}
			h.mu.Lock()
			h.msgs = append(h.msgs, m)
			h.mu.Unlock()
		}
		_ = cmd.Wait()
	}()
	t.Cleanup(func() {
		h.end()
		_ = cmd.Process.Kill()
		testenv.Closed(t, h.done, 20*time.Second, "the Sparkplug host (node) to exit after SIGKILL")
	})
	h.wait(20*time.Second, "host.js ready", func(m *spMsg) bool { return m.Ready })
	return h
}

func (h *tahuHost) send(cmd any) {
	b, _ := json.Marshal(cmd)
	if _, err := h.in.Write(append(b, '\n')); err != nil {
		h.t.Fatalf("host.js: %v", err)
	}
}

// end disconnects the host and waits for it to exit.
func (h *tahuHost) end() {
	if h.ended {
		return
	}
	h.ended = true
	h.send(map[string]any{"op": "end"})
	select {
	case <-h.done:
	case <-time.After(10 * time.Second):
	}
}

func (h *tahuHost) all() []spMsg {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]spMsg(nil), h.msgs...)
}

func (h *tahuHost) count() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.msgs)
}

// wait returns the index of the first message from index 0 that matches.
func (h *tahuHost) wait(limit time.Duration, what string, match func(*spMsg) bool) int {
	return h.waitFrom(0, limit, what, match)
}

// waitFrom returns the index of the first message at or after from that matches.
func (h *tahuHost) waitFrom(from int, limit time.Duration, what string, match func(*spMsg) bool) int {
	h.t.Helper()
	idx := -1
	testenv.WaitFor(h.t, limit, what, func() bool {
		h.mu.Lock()
		defer h.mu.Unlock()
		for i := from; i < len(h.msgs); i++ {
			if match(&h.msgs[i]) {
				idx = i
				return true
			}
		}
		return false
	})
	return idx
}

func isType(typ string) func(*spMsg) bool { return func(m *spMsg) bool { return m.typ() == typ } }

func isDev(typ, dev string) func(*spMsg) bool {
	return func(m *spMsg) bool { return m.typ() == typ && m.device() == dev }
}

const spProfile = `[[profile]]
name = "spl"
tags = [
  { name = "temperature", address = 0, type = "int16", scale = 0.1, unit = "°C" },
  { name = "counter", address = 2, type = "uint16" },
  { name = "uptime", address = 3, type = "uint32", unit = "s" },
  { name = "tf", address = 5, type = "float32", unit = "°C" },
  { name = "alarm", register = "coil", address = 0, writable = true },
  { name = "setpoint", address = 10, type = "int16", writable = true, min = -100, max = 100 },
]
`

// spConfig writes a gateway config with [upstream.sparkplug] for the fleet.
func spConfig(t *testing.T, dir, broker string, fleet *sim.Fleet, extra string) string {
	t.Helper()
	var b strings.Builder
	fmt.Fprintf(&b, "[gateway]\nid = \"e2e\"\ndata_dir = %q\n[http]\nlisten = \"127.0.0.1:0\"\n[ring]\nsize = 200000\n", filepath.Join(dir, "data"))
	fmt.Fprintf(&b, "[upstream.mqtt]\nbroker = \"tcp://%s\"\nmode = \"off\"\n[upstream.sparkplug]\ngroup_id = \"plant\"\n%s\n", broker, extra)
	b.WriteString(spProfile)
	for i := 0; i < fleet.Len(); i++ {
		fmt.Fprintf(&b, "[[device]]\nname = \"logger-%02d\"\ntransport = \"tcp\"\naddress = %q\nprofile = \"spl\"\ninterval = \"100ms\"\ntimeout = \"80ms\"\n", i+1, fleet.Addr(i))
	}
	path := filepath.Join(dir, "edgegw.toml")
	if err := os.WriteFile(path, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// aliasesOf maps metric name -> alias of a birth.
func aliasesOf(t *testing.T, m *spMsg) map[string]uint64 {
	t.Helper()
	out := map[string]uint64{}
	for _, mt := range m.Payload.Metrics {
		if mt.Alias != nil {
			out[mt.Name] = *mt.Alias
		}
	}
	return out
}

// checkSeqs checks that the messages of one session (from the NBIRTH at
// start on) carry seq 0, 1, … 255, 0, … with nothing missing, and returns
// how often it wrapped.
func checkSeqs(t *testing.T, msgs []spMsg) int {
	t.Helper()
	wraps := 0
	var prev uint64
	started := false
	for i := range msgs {
		m := &msgs[i]
		switch m.typ() {
		case "NBIRTH":
			if m.Payload.Seq == nil || *m.Payload.Seq != 0 {
				t.Fatalf("message %d: NBIRTH seq %v, want 0", i, m.Payload.Seq)
			}
			prev, started = 0, true
			continue
		case "", "NDEATH", "NCMD", "DCMD", "STATE":
			continue
		}
		if !started {
			continue
		}
		if m.Payload.Seq == nil {
			t.Fatalf("message %d %s: no seq", i, m.Topic)
		}
		s := *m.Payload.Seq
		if s != (prev+1)%256 {
			t.Fatalf("message %d %s: seq %d after %d", i, m.Topic, s, prev)
		}
		if s == 0 {
			wraps++
		}
		prev = s
	}
	return wraps
}

// The gateway as a Sparkplug B edge node, seen by Eclipse Tahu's decoder
// through a real mosquitto: births, data by alias, seq wrap, DCMD write,
// rebirth, DDEATH/DBIRTH of a stopped logger, NDEATH (the will) on SIGKILL,
// bdSeq and aliases across a restart, DCMD refused with writes off.
func TestSparkplugInterop(t *testing.T) {
	needTahu(t)
	mosq := testenv.StartMosquitto(t)
	fleet := runFleet(t, sim.Config{Devices: 3, Transport: "tcp", Tick: 10 * time.Millisecond})
	for i := 0; i < fleet.Len(); i++ {
		fleet.Logger(i).SetHolding(10, 42)
	}
	host := startTahuHost(t, mosq.Addr, "")
	dir := t.TempDir()
	cfg := spConfig(t, dir, mosq.Addr, fleet, "writes = true")
	gw, _ := runGateway(t, cfg)

	// NBIRTH: bdSeq 0 (first connect), Rebirth false, seq 0.
	nb := host.wait(20*time.Second, "NBIRTH", isType("NBIRTH"))
	birth := host.all()[nb]
	bd := birth.metric("bdSeq")
	if bd == nil || bd.num(t) != 0 || bd.Type != "Int64" {
		t.Fatalf("NBIRTH bdSeq = %+v", bd)
	}
	if r := birth.metric("Node Control/Rebirth"); r == nil || string(r.Value) != "false" || r.Type != "Boolean" {
		t.Fatalf("NBIRTH rebirth = %+v", r)
	}
	if v := birth.metric("Node Info/Version"); v == nil || v.Type != "String" {
		t.Fatalf("NBIRTH version = %+v", v)
	}

	// A DBIRTH per device: every tag with its datatype, unit, limits and value.
	wantType := map[string]string{"temperature": "Float", "counter": "UInt16", "uptime": "UInt32", "tf": "Float", "alarm": "Boolean", "setpoint": "Int16"}
	aliases := map[string]map[string]uint64{}
	for i := 0; i < fleet.Len(); i++ {
		dev := fmt.Sprintf("logger-%02d", i+1)
		k := host.waitFrom(nb, 20*time.Second, "DBIRTH "+dev, isDev("DBIRTH", dev))
		m := host.all()[k]
		if len(m.Payload.Metrics) != len(wantType) {
			t.Fatalf("%s DBIRTH: %d metrics, want %d", dev, len(m.Payload.Metrics), len(wantType))
		}
		for name, typ := range wantType {
			mt := m.metric(name)
			if mt == nil || mt.Type != typ || mt.Alias == nil {
				t.Fatalf("%s DBIRTH %s = %+v, want type %s with an alias", dev, name, mt, typ)
			}
			if q := mt.Properties["Quality"]; string(q.Value) != "192" {
				t.Errorf("%s DBIRTH %s: Quality %s, want 192", dev, name, q.Value)
			}
		}
		if u := m.metric("temperature").Properties["engUnit"]; string(u.Value) != `"°C"` {
			t.Errorf("%s temperature engUnit %s", dev, u.Value)
		}
		sp := m.metric("setpoint")
		if sp.num(t) != 42 || string(sp.Properties["engLow"].Value) != "-100" || string(sp.Properties["engHigh"].Value) != "100" {
			t.Errorf("%s setpoint = %s props %+v, want 42 in -100..100", dev, sp.Value, sp.Properties)
		}
		temp, tf := m.metric("temperature").num(t), m.metric("tf").num(t)
		simT := float64(int16(fleet.Logger(i).Holding(0, 1)[0])) / 10
		if d := temp - simT; d > 1 || d < -1 || temp-tf > 0.01 || tf-temp > 0.01 {
			t.Errorf("%s temperature %v tf %v, simulator %v", dev, temp, tf, simT)
		}
		aliases[dev] = aliasesOf(t, &m)
	}

	// DDATA by alias: the counter (register 2, +1 every 10 ms tick) moves
	// at every poll; its alias resolves to it.
	ctr := aliases["logger-01"]["counter"]
	var seen []float64
	testenv.WaitFor(t, 20*time.Second, "counter in 10 DDATA of logger-01", func() bool {
		seen = seen[:0]
		for _, m := range host.all() {
			if m.typ() != "DDATA" || m.device() != "logger-01" {
				continue
			}
			for _, mt := range m.Payload.Metrics {
				if mt.Alias != nil && *mt.Alias == ctr && mt.Name == "" {
					seen = append(seen, mt.num(t))
				}
			}
		}
		return len(seen) >= 10
	})
	for i := 1; i < len(seen); i++ {
		if seen[i] == seen[i-1] {
			t.Fatalf("counter DDATA repeats an unchanged value: %v", seen)
		}
	}

	// DCMD: setpoint of logger-02 to -7: the register changes, and the
	// next DDATA of logger-02 carries -7 under the setpoint's alias.
	before := host.count()
	host.send(map[string]any{"op": "publish", "topic": "spBv1.0/plant/DCMD/e2e/logger-02",
		"payload": map[string]any{"timestamp": time.Now().UnixMilli(), "metrics": []any{map[string]any{"name": "setpoint", "type": "Int16", "value": -7}}}})
	testenv.WaitFor(t, 20*time.Second, "simulator register written by DCMD", func() bool {
		return int16(fleet.Logger(1).Holding(10, 1)[0]) == -7
	})
	spAlias := aliases["logger-02"]["setpoint"]
	host.waitFrom(before, 20*time.Second, "DDATA with setpoint -7", func(m *spMsg) bool {
		if m.typ() != "DDATA" || m.device() != "logger-02" {
			return false
		}
		for _, mt := range m.Payload.Metrics {
			if mt.Alias != nil && *mt.Alias == spAlias && string(mt.Value) == "-7" {
				return true
			}
		}
		return false
	})

	// seq runs 0..255 and wraps, nothing missing (3 devices at 10 Hz).
	testenv.WaitFor(t, 60*time.Second, "seq wrap 255 -> 0", func() bool { return checkSeqs(t, host.all()) >= 1 })

	// NCMD rebirth: NBIRTH (same bdSeq, seq 0) and every DBIRTH again.
	before = host.count()
	host.send(map[string]any{"op": "publish", "topic": "spBv1.0/plant/NCMD/e2e",
		"payload": map[string]any{"timestamp": time.Now().UnixMilli(), "metrics": []any{map[string]any{"name": "Node Control/Rebirth", "type": "Boolean", "value": true}}}})
	rb := host.waitFrom(before, 20*time.Second, "NBIRTH after NCMD rebirth", isType("NBIRTH"))
	if m := host.all()[rb]; m.metric("bdSeq").num(t) != 0 {
		t.Fatalf("rebirth NBIRTH bdSeq %s, want 0 (same session)", m.metric("bdSeq").Value)
	}
	for i := 0; i < fleet.Len(); i++ {
		host.waitFrom(rb, 20*time.Second, "DBIRTH after rebirth", isDev("DBIRTH", fmt.Sprintf("logger-%02d", i+1)))
	}

	// A logger stops: DDEATH after 3 polls without an answer; it comes
	// back: DBIRTH.
	before = host.count()
	fleet.Logger(2).Stop()
	host.waitFrom(before, 20*time.Second, "DDEATH logger-03", isDev("DDEATH", "logger-03"))
	before = host.count()
	if err := fleet.Logger(2).Start(); err != nil {
		t.Fatal(err)
	}
	host.waitFrom(before, 30*time.Second, "DBIRTH logger-03 after restart", isDev("DBIRTH", "logger-03"))
	if n := checkSeqs(t, host.all()); n < 1 {
		t.Fatal("no wrap")
	}

	// SIGKILL: the broker publishes the will, NDEATH with bdSeq 0.
	before = host.count()
	gw.Kill()
	nd := host.waitFrom(before, 60*time.Second, "NDEATH (the will) after SIGKILL", isType("NDEATH"))
	if m := host.all()[nd]; m.metric("bdSeq") == nil || m.metric("bdSeq").num(t) != 0 {
		t.Fatalf("NDEATH bdSeq = %+v, want 0", m.metric("bdSeq"))
	}

	// Restart with writes off: bdSeq 1 (kept in data_dir), same aliases;
	// a DCMD is refused (counted in the NBIRTH) and the register keeps its value.
	cfg = spConfig(t, dir, mosq.Addr, fleet, "writes = false")
	before = host.count()
	gw, _ = runGateway(t, cfg)
	nb = host.waitFrom(before, 20*time.Second, "NBIRTH after restart", isType("NBIRTH"))
	if m := host.all()[nb]; m.metric("bdSeq").num(t) != 1 || string(m.metric("Node Control/Writes Enabled").Value) != "false" {
		t.Fatalf("NBIRTH after restart: bdSeq %s writes %s, want 1 and false", m.metric("bdSeq").Value, m.metric("Node Control/Writes Enabled").Value)
	}
	for i := 0; i < fleet.Len(); i++ {
		dev := fmt.Sprintf("logger-%02d", i+1)
		k := host.waitFrom(nb, 20*time.Second, "DBIRTH after restart", isDev("DBIRTH", dev))
		m := host.all()[k]
		if got := aliasesOf(t, &m); fmt.Sprint(got) != fmt.Sprint(aliases[dev]) {
			t.Fatalf("%s aliases after restart %v, before %v", dev, got, aliases[dev])
		}
	}
	host.send(map[string]any{"op": "publish", "topic": "spBv1.0/plant/DCMD/e2e/logger-01",
		"payload": map[string]any{"timestamp": time.Now().UnixMilli(), "metrics": []any{map[string]any{"name": "setpoint", "type": "Int16", "value": 9}}}})
	host.waitFrom(before, 20*time.Second, "DCMD echoed by the broker", isDev("DCMD", "logger-01"))
	// The refusal is counted in "Commands Refused"; ask for births until it shows.
	refused := false
	for try := 0; try < 20 && !refused; try++ {
		before = host.count()
		host.send(map[string]any{"op": "publish", "topic": "spBv1.0/plant/NCMD/e2e",
			"payload": map[string]any{"timestamp": time.Now().UnixMilli(), "metrics": []any{map[string]any{"name": "Node Control/Rebirth", "type": "Boolean", "value": true}}}})
		k := host.waitFrom(before, 20*time.Second, "NBIRTH", isType("NBIRTH"))
		m := host.all()[k]
		refused = m.metric("Node Info/Commands Refused").num(t) >= 1
	}
	if !refused {
		t.Fatal("DCMD with writes off not counted as refused")
	}
	if v := int16(fleet.Logger(0).Holding(10, 1)[0]); v != 42 {
		t.Fatalf("register written to %d with writes off", v)
	}
	msgs := host.all()
	kinds := map[string]int{}
	for i := range msgs {
		kinds[msgs[i].typ()]++
	}
	t.Logf("%d messages %v, seq wraps %d, counter DDATA %v", len(msgs), kinds, checkSeqs(t, msgs), seen)
	if code := gw.Stop(os.Interrupt, 20*time.Second); code != 0 {
		t.Errorf("gateway exited %d", code)
	}
}

type ringSample struct {
	Device, Tag, Quality string
	Value                json.RawMessage
	TS                   int64
}

// The primary host goes offline (STATE offline), the edge node publishes
// NDEATH and stores; the host comes back: NBIRTH, DBIRTHs, then what was
// stored, flagged is_historical, in order, before live data. Every counter
// sample the gateway acquired over the whole run reached one of the two
// host sessions (the counter moves at every poll; an unchanged live value
// may be left out by report by exception, and is allowed for).
func TestSparkplugPrimaryHostNoLoss(t *testing.T) {
	needTahu(t)
	mosq := testenv.StartMosquitto(t)
	fleet := runFleet(t, sim.Config{Devices: 3, Transport: "tcp", Tick: 10 * time.Millisecond})
	a := startTahuHost(t, mosq.Addr, "scada")
	dir := t.TempDir()
	gw, page := runGateway(t, spConfig(t, dir, mosq.Addr, fleet, "primary_host_id = \"scada\""))
	_ = gw

	nb := a.wait(20*time.Second, "NBIRTH at host A", isType("NBIRTH"))
	ddata := func(h *tahuHost, from int) int {
		n := 0
		for _, x := range h.all()[from:] {
			if x.typ() == "DDATA" {
				n++
			}
		}
		return n
	}
	testenv.WaitFor(t, 20*time.Second, "30 DDATA at host A", func() bool { return ddata(a, nb) >= 30 })

	// The host says it goes offline; the node answers with NDEATH (and
	// stops publishing data) before the host leaves.
	before := a.count()
	a.send(map[string]any{"op": "state", "host": "scada", "online": false})
	a.waitFrom(before, 20*time.Second, "NDEATH after STATE offline", isType("NDEATH"))
	a.end()
	var st upstreamStatus
	if err := getJSON(t, page+"api/status", &st); err != nil {
		t.Fatal(err)
	}
	mark := st.Seq
	testenv.WaitFor(t, 30*time.Second, "600 samples acquired while the host is away", func() bool {
		var s upstreamStatus
		return getJSON(t, page+"api/status", &s) == nil && s.Seq >= mark+600
	})

	b := startTahuHost(t, mosq.Addr, "scada")
	nb = b.wait(20*time.Second, "NBIRTH at host B", isType("NBIRTH"))
	live := b.waitFrom(nb, 30*time.Second, "live DDATA at host B", func(m *spMsg) bool {
		return m.typ() == "DDATA" && len(m.Payload.Metrics) > 0 && !m.Payload.Metrics[0].IsHistorical
	})
	testenv.WaitFor(t, 30*time.Second, "30 live DDATA at host B", func() bool { return ddata(b, live) >= 30 })
	var ring struct {
		Samples []ringSample `json:"samples"`
	}
	if err := getJSON(t, page+"api/longPolling?lastSequence=0", &ring); err != nil {
		t.Fatal(err)
	}
	if code := gw.Stop(os.Interrupt, 20*time.Second); code != 0 {
		t.Errorf("gateway exited %d", code)
	}

	// What the two host sessions got: (device, ms) of counter samples.
	type key struct {
		dev string
		ms  uint64
	}
	got := map[key]bool{}
	historical := 0
	var lastB uint64
	collect := func(msgs []spMsg, host string) {
		ctr := map[string]uint64{}
		liveSeen := false
		for i := range msgs {
			m := &msgs[i]
			switch m.typ() {
			case "DBIRTH":
				ctr[m.device()] = *m.metric("counter").Alias
			case "DDATA":
				for _, mt := range m.Payload.Metrics {
					if mt.IsHistorical && liveSeen {
						t.Fatalf("host %s: historical data after live data (message %d)", host, i)
					}
					if !mt.IsHistorical {
						liveSeen = true
					} else {
						historical++
					}
					if mt.Alias != nil && *mt.Alias == ctr[m.device()] {
						got[key{m.device(), mt.Timestamp}] = true
						if host == "B" {
							lastB = max(lastB, mt.Timestamp)
						}
					}
				}
			}
		}
	}
	collect(a.all(), "A")
	collect(b.all(), "B")
	var first uint64
	for k := range got {
		if first == 0 || k.ms < first {
			first = k.ms
		}
	}
	prev := map[string]ringSample{}
	checked, missing := 0, 0
	for _, s := range ring.Samples {
		if s.Tag != "counter" {
			continue
		}
		ms := uint64(s.TS / 1000)
		p, had := prev[s.Device]
		prev[s.Device] = s
		if ms < first || ms > lastB {
			continue
		}
		checked++
		if got[key{s.Device, ms}] {
			continue
		}
		unchanged := had && p.Quality == s.Quality && string(p.Value) == string(s.Value)
		if !unchanged {
			missing++
			t.Errorf("counter sample of %s at %d ms (%s %s) reached no host", s.Device, ms, s.Value, s.Quality)
		}
	}
	if historical < 300 {
		t.Errorf("only %d historical metrics at host B, want the 600 or more samples stored while it was away", historical)
	}
	if checked < 150 {
		t.Errorf("only %d counter samples checked", checked)
	}
	t.Logf("%d counter samples checked, %d missing, %d historical metrics replayed", checked, missing, historical)
}

// wireBytes is the size of an MQTT 3.1.1 PUBLISH packet: fixed header,
// remaining length, topic, packet id (QoS > 0), payload.
func wireBytes(topic string, qos byte, payload int) int {
	rem := 2 + len(topic) + payload
	if qos > 0 {
		rem += 2
	}
	n := 1 + rem
	for r := rem; ; r >>= 7 {
		n++
		if r < 128 {
			break
		}
	}
	return n
}

// Bytes on the wire per sample, Sparkplug DDATA vs the JSON per-tag topics
// vs the JSON batch topic, all published by one gateway at once: 48 UDP
// loggers, 2 tags, 1 s (docs/BENCHMARKS.md). EDGEGW_WIRE_SECONDS sets the
// measured window (10 s per run).
//
// Two runs: the simulator's temperature and humidity (they move slowly, so
// report by exception leaves most DDATA metrics out), and temperature with
// a counter that changes at every poll (the worst case for DDATA: every
// sample is sent).
func TestSparkplugWireBytes(t *testing.T) {
	for _, c := range []struct{ name, tag2 string }{
		{"temperature+humidity", `{ name = "humidity", address = 1, scale = 0.1, unit = "%RH" }`},
		{"temperature+counter", `{ name = "counter", address = 2 }`},
	} {
		t.Run(c.name, func(t *testing.T) { wireBytesRun(t, c.tag2) })
	}
}

func wireBytesRun(t *testing.T, tag2 string) {
	res, samples, _, secs := wireMeasure(t, `{ name = "temperature", address = 0, type = "int16", scale = 0.1, unit = "°C" }, `+tag2)
	if samples < 96*secs/2 {
		t.Fatalf("%d samples in %d s, want about %d", samples, secs, 96*secs)
	}
	for k, v := range res {
		if v.msgs == 0 {
			t.Fatalf("no %s messages in the window", k)
		}
		t.Logf("%-6s %6d msgs %8d bytes %6d samples sent: %6.1f B per acquired sample, %6.1f B per sample sent",
			k, v.msgs, v.bytes, v.metrics, float64(v.bytes)/float64(samples), float64(v.bytes)/float64(v.metrics))
	}
	dd, pt := res["ddata"], res["pertag"]
	if float64(dd.bytes)/float64(dd.metrics) >= float64(pt.bytes)/float64(pt.metrics) {
		t.Errorf("a DDATA metric costs more than a per-tag JSON message")
	}
}

// wireClass is what a wire count saw of one kind of message.
type wireClass struct {
	msgs, bytes, metrics int
}

// wireMeasure runs 48 simulated UDP loggers polled every second with the
// tags of a profile (TOML inline tables) through a gateway that publishes
// batches, per-tag topics and Sparkplug to a real mosquitto, and counts,
// over secs seconds (EDGEGW_WIRE_SECONDS, default 10) after a warm-up, the
// messages, MQTT wire bytes and samples of each kind (ddata, pertag,
// batch), the samples made (the sequence: kept by report by exception)
// and the samples acquired (polls × tags).
func wireMeasure(t *testing.T, tags string) (res map[string]wireClass, kept, acquired, secs int) {
	mosq := testenv.StartMosquitto(t)
	fleet := runFleet(t, sim.Config{Devices: 48, Transport: "udp"})
	secs = 10
	if s := os.Getenv("EDGEGW_WIRE_SECONDS"); s != "" {
		fmt.Sscan(s, &secs)
	}
	var mu sync.Mutex
	counting := false
	classes := map[string]*wireClass{"ddata": {}, "pertag": {}, "batch": {}}
	opts := mqtt.NewClientOptions().AddBroker("tcp://" + mosq.Addr).SetClientID("wire-counter").SetOrderMatters(false)
	c := mqtt.NewClient(opts)
	if tok := c.Connect(); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("connect: %v", tok.Error())
	}
	t.Cleanup(func() { c.Disconnect(100) })
	tok := c.SubscribeMultiple(map[string]byte{"spBv1.0/#": 1, "edgegw/wire/#": 1}, func(_ mqtt.Client, m mqtt.Message) {
		var k string
		metrics := 0
		switch {
		case strings.Contains(m.Topic(), "/DDATA/"):
			k = "ddata"
			p, err := sparkplug.DecodePayload(m.Payload())
			if err != nil {
				t.Errorf("DDATA: %v", err)
			}
			metrics = len(p.Metrics)
		case m.Topic() == "edgegw/wire/batch":
			k = "batch"
			metrics = strings.Count(string(m.Payload()), `"seq":`)
		case strings.HasPrefix(m.Topic(), "edgegw/wire/logger-") && !m.Retained():
			k, metrics = "pertag", 1
		default:
			return
		}
		mu.Lock()
		if counting {
			cl := classes[k]
			cl.msgs++
			cl.metrics += metrics
			cl.bytes += wireBytes(m.Topic(), m.Qos(), len(m.Payload()))
		}
		mu.Unlock()
	})
	if !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("subscribe: %v", tok.Error())
	}
	dir := t.TempDir()
	var b strings.Builder
	fmt.Fprintf(&b, "[gateway]\nid = \"wire\"\n[http]\nlisten = \"127.0.0.1:0\"\n[poll]\nudp_listen = \"127.0.0.1:0\"\n")
	fmt.Fprintf(&b, "[upstream.mqtt]\nbroker = \"tcp://%s\"\ntopic_prefix = \"edgegw/wire\"\nmode = \"fallback\"\nqos = 1\n", mosq.Addr)
	b.WriteString("[upstream.sparkplug]\ngroup_id = \"plant\"\n")
	fmt.Fprintf(&b, "[[profile]]\nname = \"th\"\ntags = [ %s ]\n", tags)
	for i := 0; i < fleet.Len(); i++ {
		fmt.Fprintf(&b, "[[device]]\nname = \"logger-%02d\"\ntransport = \"udp\"\naddress = %q\nprofile = \"th\"\ninterval = \"1s\"\n", i+1, fleet.Addr(i))
	}
	cfg := filepath.Join(dir, "edgegw.toml")
	if err := os.WriteFile(cfg, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	gw, page := runGateway(t, cfg)
	status := func() uint64 {
		var s upstreamStatus
		if err := getJSON(t, page+"api/status", &s); err != nil {
			t.Fatal(err)
		}
		return s.Seq
	}
	polls := func() (n uint64) {
		for _, d := range rbeDevices(t, page) {
			n += d.Polls
		}
		return n
	}
	// Warm up: births done, every path flowing (the sequence starts from
	// the clock, not 0: count polls).
	testenv.WaitFor(t, 30*time.Second, "3 polls of every logger", func() bool { return polls() >= 3*uint64(fleet.Len()) })
	mu.Lock()
	counting = true
	mu.Unlock()
	s0, p0, t0 := status(), polls(), time.Now()
	deadline := t0.Add(time.Duration(secs) * time.Second)
	testenv.WaitFor(t, time.Duration(secs+30)*time.Second, "the measured window", func() bool { return time.Now().After(deadline) })
	s1, p1 := status(), polls()
	mu.Lock()
	counting = false
	res = map[string]wireClass{}
	for k, v := range classes {
		res[k] = *v
	}
	mu.Unlock()
	gw.Stop(os.Interrupt, 20*time.Second)
	t.Logf("%d samples made, %d polls in %v", s1-s0, p1-p0, time.Since(t0).Round(time.Millisecond))
	return res, int(s1 - s0), int(p1-p0) * (strings.Count(tags, "name =")), secs
}

// `edgegw demo -sparkplug` prints the topic and the mosquitto_sub line of
// its embedded broker, and an edge node answers there: a rebirth request
// brings NBIRTH and a DBIRTH per simulated logger with its two tags.
func TestDemoSparkplug(t *testing.T) {
	p, _ := startDemo(t, "-sparkplug", "-devices", "4", "-interval", "200ms")
	p.WaitLine("sparkplug: topic spBv1.0/demo/+/demo/#", 10*time.Second)
	line := p.WaitLine("mosquitto_sub -h 127.0.0.1 -p ", 10*time.Second)
	var port int
	if _, err := fmt.Sscanf(line[strings.Index(line, "-p ")+3:], "%d", &port); err != nil || !strings.Contains(line, "-t 'spBv1.0/#'") {
		t.Fatalf("watch line %q", line)
	}
	var mu sync.Mutex
	births := map[string]sparkplug.Payload{}
	c := mqtt.NewClient(mqtt.NewClientOptions().AddBroker(fmt.Sprintf("tcp://127.0.0.1:%d", port)).SetClientID("demo-host").SetAutoReconnect(false))
	if tok := c.Connect(); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("connect: %v", tok.Error())
	}
	defer c.Disconnect(100)
	tok := c.Subscribe("spBv1.0/demo/+/demo/#", 1, func(_ mqtt.Client, m mqtt.Message) {
		if !strings.Contains(m.Topic(), "BIRTH") {
			return
		}
		pl, err := sparkplug.DecodePayload(m.Payload())
		if err != nil {
			t.Errorf("%s: %v", m.Topic(), err)
		}
		mu.Lock()
		births[m.Topic()] = pl
		mu.Unlock()
	})
	if !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("subscribe: %v", tok.Error())
	}
	rebirth := sparkplug.Payload{Timestamp: uint64(time.Now().UnixMilli()), HasTimestamp: true, Metrics: []sparkplug.Metric{
		{Name: sparkplug.MetricRebirth, HasName: true, Datatype: sparkplug.TypeBoolean, Value: sparkplug.Value{Kind: sparkplug.KindBool, B: true}}}}
	if tok := c.Publish("spBv1.0/demo/NCMD/demo", 0, false, sparkplug.AppendPayload(nil, &rebirth)); !tok.WaitTimeout(10 * time.Second) {
		t.Fatal("publish NCMD timed out")
	}
	testenv.WaitFor(t, 20*time.Second, "NBIRTH and 4 DBIRTHs", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(births) == 5
	})
	c.Disconnect(100) // no callback after this
	mu.Lock()
	defer mu.Unlock()
	for i := 1; i <= 4; i++ {
		if pl := births[fmt.Sprintf("spBv1.0/demo/DBIRTH/demo/logger-%02d", i)]; len(pl.Metrics) != 2 || pl.Metrics[0].Name != "temperature" {
			t.Errorf("DBIRTH logger-%02d: %+v", i, pl)
		}
	}
	if code := p.Stop(os.Interrupt, 15*time.Second); code != 0 {
		t.Fatalf("demo exited %d on SIGINT", code)
	}
}
