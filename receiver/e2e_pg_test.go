package receiver

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"edgegw/internal/pgtest"
	"edgegw/internal/testenv"
	"edgegw/lab/sim"
)

// The end-to-end tests of the receiving side run real processes: the lab
// gateway (edgegw run), edgegw-receiver, PostgreSQL and HAProxy, built and
// started by the tests.

var (
	buildOnce       sync.Once
	labBin, recvBin string
	buildErr        error
)

// binaries builds the lab gateway and edgegw-receiver once per test run.
func binaries(t *testing.T) (lab, recv string) {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "receiver-e2e-")
		if err != nil {
			buildErr = err
			return
		}
		labBin, recvBin = filepath.Join(dir, "edgegw"), filepath.Join(dir, "edgegw-receiver")
		for _, b := range [][2]string{{labBin, "edgegw"}, {recvBin, "edgegw/cmd/edgegw-receiver"}} {
			if out, err := exec.Command("go", "build", "-o", b[0], b[1]).CombinedOutput(); err != nil {
				buildErr = fmt.Errorf("build %s: %v\n%s", b[1], err, out)
				return
			}
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return labBin, recvBin
}

// recvProc is one edgegw-receiver on a fixed port (kept across restarts);
// args are its flags after -listen, -postgres and -id.
type recvProc struct {
	id, addr string
	args     []string
	p        *testenv.Proc
}

func startReceiverProc(t *testing.T, bin, db string, r *recvProc) {
	t.Helper()
	r.p = testenv.StartProc(t, r.id, bin, append([]string{"-listen", r.addr, "-postgres", db, "-id", r.id}, r.args...)...)
	r.p.WaitLine("receiving on", 30*time.Second)
}

// e2eGateway is one lab gateway polling the shared simulated loggers;
// mqtt, if set, is its [upstream.mqtt] section (MQTT fallback after 1 s
// without a WebSocket).
type e2eGateway struct {
	id, dir, cfg, page, mqtt string
	p                        *testenv.Proc
}

// upstreams are the receivers' addresses in the gateway's urls, in order
// (back to the first after primary_retry).
func (g *e2eGateway) writeConfig(t *testing.T, upstreams []string, fleet *sim.Fleet, devices int) {
	t.Helper()
	var b strings.Builder
	fmt.Fprintf(&b, "allow_empty = true\n[gateway]\nid = %q\ndata_dir = %q\n[http]\nlisten = \"127.0.0.1:0\"\n[poll]\nudp_listen = \"127.0.0.1:0\"\n", g.id, filepath.Join(g.dir, "data"))
	var urls []string
	for _, u := range upstreams {
		urls = append(urls, fmt.Sprintf("%q", "ws://"+u+"/ingest"))
	}
	fmt.Fprintf(&b, "[upstream.websocket]\nurls = [%s]\nprimary_retry = \"10s\"\nbatch_wait = \"100ms\"\n", strings.Join(urls, ", "))
	if g.mqtt != "" {
		b.WriteString("fallback_after = \"1s\"\n" + g.mqtt)
	}
	b.WriteString("[[profile]]\nname = \"th\"\ntags = [ { name = \"temperature\", address = 0, type = \"int16\", scale = 0.1 }, { name = \"humidity\", address = 1, scale = 0.1 } ]\n")
	for i := 0; i < devices; i++ {
		fmt.Fprintf(&b, "[[device]]\nname = \"logger-%02d\"\ntransport = \"udp\"\naddress = %q\nprofile = \"th\"\ninterval = \"100ms\"\ntimeout = \"80ms\"\n", i+1, fleet.Addr(i%fleet.Len()))
	}
	if err := os.WriteFile(g.cfg, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
}

func startGatewayProc(t *testing.T, bin string, g *e2eGateway) {
	t.Helper()
	g.p = testenv.StartProc(t, g.id, bin, "run", "-config", g.cfg)
	line := g.p.WaitLine("edgegw running", 30*time.Second)
	g.page = line[strings.Index(line, "page=")+len("page="):]
}

type gwStatus struct {
	Seq      uint64 `json:"seq"`
	Epoch    string `json:"epoch"`
	Upstream struct {
		Path         string `json:"path"`
		QueueSamples int64  `json:"queue_samples"`
		WSURL        string `json:"ws_url"`
		MQTTBroker   string `json:"mqtt_broker"`
	} `json:"upstream"`
}

func (g *e2eGateway) status(t *testing.T) (gwStatus, bool) {
	var s gwStatus
	code, body := getQuiet(g.page + "api/status")
	if code != 200 {
		return s, false
	}
	return s, json.Unmarshal([]byte(body), &s) == nil
}

// metric is the line of the receiver's /metrics at addr that starts with
// name and a space, or "none".
func metric(addr, name string) string {
	_, m := getQuiet("http://" + addr + "/metrics")
	for _, l := range strings.Split(m, "\n") {
		if strings.HasPrefix(l, name+" ") {
			return l
		}
	}
	return "none"
}

// getQuiet is a GET that reports failure as code 0 (the test polls).
func getQuiet(url string) (int, string) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", url, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// stopAcquiring reloads every gateway without devices (allow_empty), waits
// until each has its sequence still and its queue empty (everything
// acked), and returns each one's last seq: the samples it acquired.
func stopAcquiring(t *testing.T, gws []*e2eGateway, upstreams []string, fleet *sim.Fleet, limit time.Duration) map[string]uint64 {
	t.Helper()
	for _, g := range gws {
		g.writeConfig(t, upstreams, fleet, 0)
		_ = g.p.Cmd.Process.Signal(syscall.SIGHUP)
	}
	acquired := map[string]uint64{}
	for _, g := range gws {
		var last gwStatus
		stable := 0
		testenv.WaitFor(t, limit, g.id+": sequence still and queue drained", func() bool {
			s, ok := g.status(t)
			if !ok {
				return false
			}
			if s.Seq == last.Seq && s.Upstream.QueueSamples == 0 {
				stable++
			} else {
				stable = 0
			}
			last = s
			return stable >= 5
		})
		acquired[g.id] = last.Seq
	}
	return acquired
}

// checkStored asserts, per gateway, that the database holds exactly the
// seqs 1..acquired of one epoch (count = acquired, no hole, no duplicate:
// the primary key), and that the gaps command finds no hole.
func checkStored(t *testing.T, db *pgtest.Server, recvBin string, acquired map[string]uint64) {
	t.Helper()
	if got := db.Psql(`SELECT pg_get_constraintdef(oid) FROM pg_constraint WHERE conrelid = 'edgegw_samples'::regclass AND contype = 'p'`); got != "PRIMARY KEY (gateway, epoch, seq)" {
		t.Fatalf("primary key of edgegw_samples: %q", got)
	}
	var produced, stored uint64
	for _, gw := range slices.Sorted(maps.Keys(acquired)) {
		n := acquired[gw]
		got := db.Psql(fmt.Sprintf(`SELECT count(*), count(DISTINCT epoch), coalesce(min(seq), 0), coalesce(max(seq), 0) FROM edgegw_samples WHERE gateway = '%s'`, gw))
		f := strings.Split(got, "|")
		count, _ := strconv.ParseUint(f[0], 10, 64)
		produced += n
		stored += count
		t.Logf("%s: acquired (its seq) %d, stored %d (epochs %s, seq %s..%s)", gw, n, count, f[1], f[2], f[3])
		if count != n || f[1] != "1" || f[2] != "1" || f[3] != strconv.FormatUint(n, 10) {
			t.Errorf("%s: stored count|epochs|min|max = %s, want %d|1|1|%d", gw, got, n, n)
		}
	}
	t.Logf("produced %d samples, stored %d", produced, stored)
	out, err := exec.Command(recvBin, "gaps", "-postgres", db.URL()).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "gaps: 0 holes") {
		t.Errorf("edgegw-receiver gaps: %v\n%s", err, out)
	}
}

// haproxyConfig balances /ingest over the receivers by the gateway id
// (consistent hash of the Edgegw-Gateway header), with /healthz checks
// every 300 ms so that a killed receiver is out at once.
func haproxyConfig(listen string, rs []*recvProc) string {
	var b strings.Builder
	fmt.Fprintf(&b, "global\n  maxconn 4000\ndefaults\n  mode http\n  timeout connect 2s\n  timeout client 120s\n  timeout server 120s\n  timeout tunnel 120s\n  option redispatch\n  retries 3\n")
	fmt.Fprintf(&b, "frontend gateways\n  bind %s\n  default_backend receivers\n", listen)
	b.WriteString("backend receivers\n  balance hdr(Edgegw-Gateway)\n  hash-type consistent\n  option httpchk GET /healthz\n  http-check expect status 200\n")
	for _, r := range rs {
		fmt.Fprintf(&b, "  server %s %s check inter 300ms fall 1 rise 2\n", r.id, r.addr)
	}
	return b.String()
}

// Three receivers behind HAProxy and also in the gateways' urls after it,
// each killed with SIGKILL and started again in turn while the gateways run: afterwards every gateway's
// acquired samples are in the table exactly once, and gaps finds no hole.
// make test runs 4 gateways for ~40 s with a kill every 8 s; EDGEGW_FULL=1
// runs 20 gateways for 3 minutes with a kill every 15 s.
func TestE2EReceiversKilledBehindHAProxy(t *testing.T) {
	haproxy := testenv.Need(t, "haproxy")
	gateways, run, every, devices := 4, 40*time.Second, 8*time.Second, 10 // 10 loggers x 2 tags x 10/s = 200 samples/s each
	if os.Getenv("EDGEGW_FULL") == "1" {
		gateways, run, every, devices = 20, 3*time.Minute, 15*time.Second, 5 // 100 samples/s each
	}
	lab, rbin := binaries(t)
	db := pgtest.Start(t)
	fleet := runSimFleet(t, 10)
	var rs []*recvProc
	for i := 1; i <= 3; i++ {
		r := &recvProc{id: fmt.Sprintf("r%d", i), addr: fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))}
		startReceiverProc(t, rbin, db.URL(), r)
		rs = append(rs, r)
	}
	front := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	cfg := filepath.Join(t.TempDir(), "haproxy.cfg")
	if err := os.WriteFile(cfg, []byte(haproxyConfig(front, rs)), 0o600); err != nil {
		t.Fatal(err)
	}
	testenv.StartProc(t, "haproxy", haproxy, "-f", cfg, "-db")
	testenv.WaitFor(t, 20*time.Second, "haproxy accepting", func() bool {
		code, _ := getQuiet("http://" + front + "/healthz")
		return code == 200
	})
	// The gateways dial HAProxy first, and each receiver directly after it
	// in their urls: HAProxy's backend down (between a kill and its health
	// check) sends them on down the list, and back to HAProxy after
	// primary_retry.
	upstreams := []string{front}
	name := map[string]string{"ws://" + front + "/ingest": "haproxy"}
	for _, r := range rs {
		upstreams = append(upstreams, r.addr)
		name["ws://"+r.addr+"/ingest"] = r.id
	}
	var gws []*e2eGateway
	for i := 1; i <= gateways; i++ {
		g := &e2eGateway{id: fmt.Sprintf("gw-%02d", i), dir: t.TempDir()}
		g.cfg = filepath.Join(g.dir, "edgegw.toml")
		g.writeConfig(t, upstreams, fleet, devices)
		startGatewayProc(t, lab, g)
		gws = append(gws, g)
	}
	testenv.WaitFor(t, 60*time.Second, "every gateway storing", func() bool {
		return db.Psql("SELECT count(DISTINCT gateway) FROM edgegw_samples") == strconv.Itoa(gateways)
	})
	start := time.Now()
	kills := 0
	on := map[string]int{} // the url each gateway is on, looked at after each restart
	for k := 0; time.Since(start) < run; k++ {
		tick := time.NewTimer(every)
		testenv.Recv(t, tick.C, every+time.Second, "the kill period")
		r := rs[k%len(rs)]
		r.p.Kill()
		kills++
		startReceiverProc(t, rbin, db.URL(), r)
		for _, g := range gws {
			if s, ok := g.status(t); ok {
				on[cmp.Or(name[s.Upstream.WSURL], s.Upstream.WSURL)]++
			}
		}
	}
	t.Logf("%d receiver kills over %v; gateways seen on %v", kills, time.Since(start).Round(time.Second), on)
	acquired := stopAcquiring(t, gws, upstreams, fleet, 120*time.Second)
	checkStored(t, db, rbin, acquired)
	for _, g := range gws {
		g.p.Stop(syscall.SIGTERM, 20*time.Second)
	}
}

// A receiver whose database goes away (pg_ctl stop -m immediate) acks
// nothing while it is away, its /healthz answers 503 naming the database,
// and the gateway's queue holds the samples; once the database is back,
// nothing is lost.
func TestE2EDatabaseOutage(t *testing.T) {
	lab, rbin := binaries(t)
	db := pgtest.Start(t)
	fleet := runSimFleet(t, 10)
	r := &recvProc{id: "r1", addr: fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))}
	startReceiverProc(t, rbin, db.URL(), r)
	g := &e2eGateway{id: "gw-db", dir: t.TempDir()}
	g.cfg = filepath.Join(g.dir, "edgegw.toml")
	g.writeConfig(t, []string{r.addr}, fleet, 10)
	startGatewayProc(t, lab, g)
	testenv.WaitFor(t, 60*time.Second, "samples stored", func() bool {
		n, _ := strconv.Atoi(db.Psql("SELECT count(*) FROM edgegw_samples"))
		return n >= 1000
	})
	db.Stop("immediate")
	var h Health
	testenv.WaitFor(t, 30*time.Second, "healthz 503 naming the database", func() bool {
		code, body := getQuiet("http://" + r.addr + "/healthz")
		return code == 503 && json.Unmarshal([]byte(body), &h) == nil && strings.Contains(h.Reason, "database")
	})
	t.Logf("healthz while the database is down: %+v", h)
	batches := func() string { return metric(r.addr, "edgegw_receiver_batches_total") }
	before := batches()
	var s0, s1 gwStatus
	testenv.WaitFor(t, 10*time.Second, "the gateway's status", func() bool { var ok bool; s0, ok = g.status(t); return ok })
	testenv.WaitFor(t, 30*time.Second, "the gateway acquiring 2000 samples more", func() bool {
		var ok bool
		s1, ok = g.status(t)
		return ok && s1.Seq >= s0.Seq+2000
	})
	// Nothing acked since before: every seq after s0's is in the queue. The
	// status's queue figures are the pusher's snapshot, taken on its tick:
	// they catch up with s1 within a few ticks, and only grow meanwhile.
	var s2 gwStatus
	testenv.WaitFor(t, 20*time.Second, fmt.Sprintf("the gateway's queue holding at least the %d samples acquired during the outage (seq %d..%d)", s1.Seq-s0.Seq, s0.Seq+1, s1.Seq), func() bool {
		var ok bool
		s2, ok = g.status(t)
		return ok && s2.Upstream.QueueSamples >= int64(s1.Seq-s0.Seq)
	})
	if after := batches(); after != before {
		t.Fatalf("batches acked while the database was down: %s, then %s", before, after)
	}
	t.Logf("during the outage: %s; the gateway acquired seq %d..%d, its queue holds %d samples", before, s0.Seq+1, s1.Seq, s2.Upstream.QueueSamples)
	db.Restart()
	acquired := stopAcquiring(t, []*e2eGateway{g}, []string{r.addr}, fleet, 120*time.Second)
	checkStored(t, db, rbin, acquired)
	g.p.Stop(syscall.SIGTERM, 20*time.Second)
	r.p.Stop(syscall.SIGTERM, 10*time.Second)
}

// MQTT fallback into PostgreSQL, with real processes: the gateway stores
// over the WebSocket until its receiver is killed (SIGKILL), then
// publishes to the first of two mosquitto brokers (brokers = [m1, m2]);
// m1 is killed (SIGKILL) while the gateway is on it, the gateway moves to
// m2. One edgegw-receiver per broker takes the batch topic's shared
// subscription into the same database (two mosquittos share no
// subscriptions, so each broker needs its subscriber before the gateway
// comes). Afterwards the table holds the gateway's acquired seqs exactly
// once and gaps finds no hole.
func TestE2EMQTTFallbackBrokerKilled(t *testing.T) {
	lab, rbin := binaries(t)
	db := pgtest.Start(t)
	fleet := runSimFleet(t, 10)
	m1, m2 := testenv.StartMosquitto(t), testenv.StartMosquitto(t)
	b1, b2 := "tcp://"+m1.Addr, "tcp://"+m2.Addr
	var rs []*recvProc
	for i, m := range []*testenv.Mosquitto{m1, m2} {
		id := fmt.Sprintf("mq%d", i+1)
		r := &recvProc{id: id, addr: fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t)),
			args: []string{"-mqtt", "tcp://" + m.Addr, "-mqtt-client-id", "e2e-" + id}}
		startReceiverProc(t, rbin, db.URL(), r)
		rs = append(rs, r)
		// The subscription is up once a probe batch published to the
		// broker is in the table (the broker drops it while nobody is
		// subscribed: published again every second until then).
		c := publisher(t, m.Addr)
		var sent time.Time
		testenv.WaitFor(t, 30*time.Second, id+"'s subscription storing a probe batch", func() bool {
			if time.Since(sent) >= time.Second {
				publish(t, c, "edgegw/probe-"+id+"/batch", gwBatch("probe-"+id, 1, 1))
				sent = time.Now()
			}
			return db.Psql(fmt.Sprintf("SELECT count(*) FROM edgegw_samples WHERE gateway = 'probe-%s'", id)) == "1"
		})
		c.Disconnect(100)
	}
	ws := &recvProc{id: "ws", addr: fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))}
	startReceiverProc(t, rbin, db.URL(), ws)
	g := &e2eGateway{id: "gw-mq", dir: t.TempDir(),
		mqtt: fmt.Sprintf("[upstream.mqtt]\nbrokers = [%q, %q]\nper_tag_topics = false\n", b1, b2)}
	g.cfg = filepath.Join(g.dir, "edgegw.toml")
	g.writeConfig(t, []string{ws.addr}, fleet, 10)
	startGatewayProc(t, lab, g)
	stored := func() int {
		n, _ := strconv.Atoi(db.Psql("SELECT count(*) FROM edgegw_samples WHERE gateway = '" + g.id + "'"))
		return n
	}
	testenv.WaitFor(t, 60*time.Second, "samples stored over the WebSocket", func() bool { return stored() >= 1000 })
	ws.p.Kill()
	n := stored()
	testenv.WaitFor(t, 60*time.Second, "the gateway on mqtt via m1, 1000 more samples stored", func() bool {
		s, ok := g.status(t)
		return ok && s.Upstream.Path == "mqtt" && s.Upstream.MQTTBroker == b1 && stored() >= n+1000
	})
	m1.Kill()
	n = stored()
	testenv.WaitFor(t, 60*time.Second, "the gateway on mqtt via m2, 1000 more samples stored", func() bool {
		s, ok := g.status(t)
		return ok && s.Upstream.Path == "mqtt" && s.Upstream.MQTTBroker == b2 && stored() >= n+1000
	})
	acquired := stopAcquiring(t, []*e2eGateway{g}, []string{ws.addr}, fleet, 60*time.Second)
	// The gateway's queue is acked by the broker's PUBACK: the receiver
	// may still be storing the last batches.
	testenv.WaitFor(t, 30*time.Second, "the receivers storing what m2 acked", func() bool { return uint64(stored()) >= acquired[g.id] })
	checkStored(t, db, rbin, acquired)
	g.p.Stop(syscall.SIGTERM, 20*time.Second)
	for _, r := range rs {
		t.Logf("%s: %s, %s", r.id, metric(r.addr, "edgegw_receiver_samples_total"), metric(r.addr, "edgegw_receiver_duplicates_total"))
		r.p.Stop(syscall.SIGTERM, 10*time.Second)
	}
}

// runSimFleet runs n simulated UDP loggers in the test process.
func runSimFleet(t *testing.T, n int) *sim.Fleet {
	t.Helper()
	fleet, err := sim.NewFleet(sim.Config{Devices: n, Transport: "udp"})
	return testenv.Running(t, 10*time.Second, "the simulated fleet", fleet, err)
}
