package web_test

// End to end: HTTP client → web (POST /api/write) → the adapter main uses →
// edge's scheduler → Modbus → simulated loggers (sim), TCP and RTU. An
// external test package: web itself never imports edge.

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"edgegw/edge"
	"edgegw/edge/modbus"
	"edgegw/internal/testenv"
	"edgegw/lab/sim"
	"edgegw/ringstore"
	"edgegw/web"
)

// edgeWriter is the adapter main needs between web.Writer and edge.
type edgeWriter struct{ s *edge.Scheduler }

func (w edgeWriter) Write(ctx context.Context, device, tag string, value float64, origin string) (float64, float64, error) {
	r, err := w.s.Write(ctx, edge.WriteRequest{Device: device, Tag: tag, Value: value, Origin: origin})
	return r.Written, r.ReadBack, err
}

var _ web.Writer = edgeWriter{}

// run runs f(ctx) until the test ends.
func run(t *testing.T, name string, f func(context.Context) error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := testenv.Recv(t, done, 20*time.Second, name+" to return after cancel"); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	})
}

func fp(v float64) *float64 { return &v }

func TestWriteEndToEnd(t *testing.T) {
	ptyA, ptyB := testenv.PTYPair(t)
	bus, err := sim.NewRTUBus(sim.RTUConfig{Path: ptyB, Baud: 115200, Units: []uint8{1, 2}})
	if err != nil {
		t.Fatal(err)
	}
	run(t, "rtu bus", bus.Run)
	fleet, err := sim.NewFleet(sim.Config{Devices: 1, Transport: "tcp"})
	if err != nil {
		t.Fatal(err)
	}
	run(t, "fleet", fleet.Run)

	tags := []edge.Tag{
		{Name: "setpoint", Register: edge.Holding, Address: 10, Type: edge.Int16, Scale: 0.1, Writable: true, Min: fp(5), Max: fp(90)},
		{Name: "pump", Register: edge.Coil, Address: 3, Type: edge.Bool, Writable: true},
		{Name: "temperature", Register: edge.Holding, Address: 0, Type: edge.Int16, Scale: 0.1},
	}
	devs := []edge.DeviceConfig{{Name: "plc", Transport: edge.TransportTCP, Address: fleet.Addr(0), Unit: 1,
		Interval: 50 * time.Millisecond, Timeout: time.Second, Tags: tags}}
	for u := uint8(1); u <= 2; u++ {
		devs = append(devs, edge.DeviceConfig{Name: fmt.Sprintf("rtu%d", u), Transport: edge.TransportRTU, Address: ptyA, Unit: u,
			Interval: 100 * time.Millisecond, Timeout: 200 * time.Millisecond, Serial: modbus.SerialConfig{Baud: 115200}, Tags: tags})
	}
	seq, err := ringstore.OpenSequence(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	ring := ringstore.NewRing(1000, seq)
	sched, err := edge.New(edge.Config{Devices: devs, Sink: ring})
	if err != nil {
		t.Fatal(err)
	}
	run(t, "scheduler", sched.Run)
	const token = "e2e-write-token-0123456789"
	srv := web.New(web.Config{Listen: "127.0.0.1:0", Ring: ring, Devices: sched, Writer: edgeWriter{sched}, WriteToken: token,
		RateLimit: web.RateLimits{ExemptLoopback: true}})
	addr, err := srv.Listen()
	if err != nil {
		t.Fatal(err)
	}
	run(t, "web", srv.Serve)
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	cl := &http.Client{Transport: tr, Timeout: 20 * time.Second}

	post := func(tok, body string) (int, map[string]any) {
		req, _ := http.NewRequest("POST", "http://"+addr.String()+"/api/write", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		if tok != "" {
			req.Header.Set("Authorization", "Bearer "+tok)
		}
		resp, err := cl.Do(req)
		if err != nil {
			t.Errorf("POST: %v", err)
			return 0, nil
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		var m map[string]any
		if err := json.Unmarshal(b, &m); err != nil {
			t.Errorf("reply %q: %v", b, err)
		}
		return resp.StatusCode, m
	}
	// Wait until the scheduler takes writes (Run has started).
	deadline := time.Now().Add(5 * time.Second)
	for {
		code, m := post(token, `{"device":"plc","tag":"setpoint","value":21.7}`)
		if code == 200 {
			if m["read_back"] != 21.7 || m["written"] != 21.7 {
				t.Fatalf("allowed write: %v", m)
			}
			break
		}
		if code != 503 || time.Now().After(deadline) {
			t.Fatalf("allowed write: %d %v", code, m)
		}
		time.Sleep(5 * time.Millisecond) // condition poll: the scheduler is starting
	}
	if got := fleet.Logger(0).Holding(10, 1)[0]; got != 217 {
		t.Fatalf("bank holds %d, want 217", got)
	}
	if code, m := post(token, `{"device":"plc","tag":"pump","value":true}`); code != 200 || !fleet.Logger(0).Coils(3, 1)[0] {
		t.Fatalf("coil write: %d %v", code, m)
	}
	refused := []struct {
		tok, body string
		code      int
		msg       string
	}{
		{"", `{"device":"plc","tag":"setpoint","value":30}`, 401, "Bearer"},
		{"wrong", `{"device":"plc","tag":"setpoint","value":30}`, 401, "Bearer"},
		{token, `{"device":"plc","tag":"temperature","value":30}`, 422, "not writable"},
		{token, `{"device":"plc","tag":"setpoint","value":95}`, 422, "above max 90"},
		{token, `{"device":"plc","tag":"setpoint","value":21.75}`, 422, "not a whole number"},
		{token, `{"device":"plc","tag":"pump","value":2}`, 422, "0 or 1"},
		{token, `{"device":"nope","tag":"setpoint","value":30}`, 404, "unknown device"},
		{token, `{"device":"plc","tag":"nope","value":30}`, 404, "unknown tag"},
	}
	for _, c := range refused {
		code, m := post(c.tok, c.body)
		if e, _ := m["error"].(string); code != c.code || !strings.Contains(e, c.msg) {
			t.Errorf("%s: %d %v, want %d %q", c.body, code, m, c.code, c.msg)
		}
	}
	if got := fleet.Logger(0).Holding(10, 1)[0]; got != 217 {
		t.Errorf("a refused write changed the bank: %d", got)
	}

	// Concurrent HTTP writes to two units of one RTU line while both are polled.
	// A write may time out when the machine is slow (the unit's reply then
	// comes late, and is drained and counted Late); a collision on the line
	// shows otherwise: a wrong read-back, frame errors, exceptions, bytes the
	// slave could not frame, or a timeout with no late reply.
	const writers, each = 4, 10
	var wg sync.WaitGroup
	var timedOut atomic.Int64
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				v := 5 + float64(w*each+i)/10
				body := fmt.Sprintf(`{"device":"rtu%d","tag":"setpoint","value":%v}`, 1+(w+i)%2, v)
				code, m := post(token, body)
				if e, _ := m["error"].(string); code == 502 && m["kind"] == "device" && strings.Contains(e, ": timeout after ") {
					timedOut.Add(1)
					continue
				}
				if code != 200 || m["read_back"] != v {
					t.Errorf("%s: %d %v", body, code, m)
				}
			}
		}()
	}
	testenv.Wait(t, 2*time.Minute, "the writers' posts", wg.Wait)
	for _, e := range sched.Devices() {
		sn := e.Stats.Snapshot()
		// collisions show as frame errors, exceptions or timeouts whose
		// reply never came; overruns and timeouts with the reply late (one
		// of them maybe not drained yet) are a busy machine's, only reported
		if sn.Timeouts > sn.Late+1 || sn.Errors != 0 || sn.Exceptions != 0 || sn.Polls == 0 {
			t.Errorf("%s: polls %d good %d timeouts %d (late replies %d) errors %d exceptions %d overruns %d cycle p99 %.0f µs", e.Info.Name, sn.Polls, sn.GoodPolls, sn.Timeouts, sn.Late, sn.Errors, sn.Exceptions, sn.Overruns, sn.Cycle.Quantile(0.99))
		} else {
			t.Logf("%s: polls %d good %d timeouts %d (late replies %d) overruns %d", e.Info.Name, sn.Polls, sn.GoodPolls, sn.Timeouts, sn.Late, sn.Overruns)
		}
	}
	if bc := bus.Counters(); bc.BadCRC != 0 || bc.Garbage != 0 {
		t.Errorf("rtu line: %+v", bc)
	}
	// 6 refused with a valid token are failed writes too.
	if st, to := srv.Stats(), uint64(timedOut.Load()); st.WritesOK != 2+writers*each-to || st.WritesFailed != 6+to || st.AuthFailures != 2 {
		t.Errorf("web stats (%d writes timed out): %+v", to, st)
	}
}
