package receiver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"edgegw/internal/testenv"
	"edgegw/ringstore"
	"edgegw/wire"

	"github.com/gorilla/websocket"
)

const gwID = "gw-test"

// out is the receiver's output file in the test's directory, as with
// `edgegw receive -out FILE`.
type out struct{ *os.File }

func newOut(t *testing.T) out {
	f, err := os.Create(filepath.Join(t.TempDir(), "samples.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return out{f}
}

func (o out) String() string {
	b, _ := os.ReadFile(o.Name())
	return string(b)
}

// seqs reads the lines written so far (each a sample of gateway with the
// gateway in front) and returns their seqs in order.
func (o out) seqs(t *testing.T, gateway string) []uint64 {
	t.Helper()
	var seqs []uint64
	for _, l := range strings.SplitAfter(o.String(), "\n") {
		if l == "" {
			continue
		}
		var line struct{ Gateway string }
		var smp ringstore.Sample
		if json.Unmarshal([]byte(l), &line) != nil || json.Unmarshal([]byte(l), &smp) != nil || line.Gateway != gateway || !strings.HasSuffix(l, "}\n") {
			t.Fatalf("line %q: want a sample of %q", l, gateway)
		}
		seqs = append(seqs, smp.Seq)
	}
	return seqs
}

// logger logs into the test's output (shown with -v or on failure).
func logger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// serve runs r on 127.0.0.1:0 for the rest of the test and returns its
// /ingest URL.
func serve(t *testing.T, r *Receiver) string {
	t.Helper()
	addr, err := r.Listen()
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- r.Serve(t.Context()) }() // cancelled before the cleanups run
	t.Cleanup(func() {
		if err := testenv.Recv(t, done, 10*time.Second, "Serve to return after the test's context ended"); err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	return "ws://" + addr.String() + "/ingest"
}

// batch is a frame of the seqs from..to of epoch e (v2; "" = v1 layout is
// not made here), gateway gwID.
func batch(e uint64, from, to uint64, skips ...wire.Range) []byte {
	var s []ringstore.Sample
	for i := from; i <= to; i++ {
		s = append(s, ringstore.Sample{Seq: i, Epoch: e, Device: "d", Tag: "t", Value: float64(i), TS: int64(i)})
	}
	return wire.AppendBatch(nil, []byte(`"`+gwID+`"`), s, false, skips)
}

// Duplicate and overlapping batches are acked but not written twice; a
// malformed frame closes the connection and is counted.
func TestReceiverDuplicates(t *testing.T) {
	o := newOut(t)
	r := New(Config{Out: o, Logger: logger(t)})
	c, _, err := websocket.DefaultDialer.Dial(serve(t, r), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	send := func(frame []byte, wantAck uint64) {
		t.Helper()
		if err := c.WriteMessage(websocket.TextMessage, frame); err != nil {
			t.Fatal(err)
		}
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		_, msg, err := c.ReadMessage()
		if err != nil {
			t.Fatal(err)
		}
		if m, err := wire.ParseUplink(msg); err != nil || m.Type != "ack" || m.Last != wantAck {
			t.Fatalf("ack %q: %+v %v, want %d", msg, m, err, wantAck)
		}
	}
	send(batch(1, 10, 19), 19)
	send(batch(1, 10, 19), 19) // the same batch again (a resend after a lost ack)
	send(batch(1, 15, 24), 24) // overlapping
	send(batch(1, 30, 31), 31) // a gap 25..29
	send(batch(1, 25, 29), 29) // filled late (the other path)
	send(batch(1, 10, 31), 31) // all of it again
	var want []uint64
	for i := uint64(10); i <= 24; i++ {
		want = append(want, i)
	}
	want = append(want, 30, 31, 25, 26, 27, 28, 29)
	if got := o.seqs(t, gwID); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("written %v, want %v", got, want)
	}
	rs := r.Stats()
	if rs.Samples != 22 || rs.Duplicates != 10+5+22 || rs.Batches != 6 || rs.Gaps != 1 || rs.GapSamples != 5 || rs.Epochs != 1 || rs.Connections != 1 {
		t.Fatalf("stats: %+v", rs)
	}
	_ = c.WriteMessage(websocket.TextMessage, []byte(`{"type":"batch","gateway":"x","first":2,"last":1,"samples":[]}`))
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, _, err = c.ReadMessage()
	if !websocket.IsCloseError(err, websocket.CloseInvalidFramePayloadData) {
		t.Fatalf("bad frame: %v, want close 1007", err)
	}
	if r.Stats().BadFrames != 1 {
		t.Fatalf("bad frames: %+v", r.Stats())
	}
}

// A token is checked on the handshake: none or a wrong one is a 401, counted.
func TestReceiverToken(t *testing.T) {
	r := New(Config{Token: "right", Logger: logger(t)})
	url := serve(t, r)
	for _, h := range []http.Header{nil, {"Authorization": {"Bearer wrong"}}} {
		_, resp, err := websocket.DefaultDialer.Dial(url, h)
		if err == nil || resp == nil || resp.StatusCode != http.StatusUnauthorized {
			t.Fatalf("%v: err %v resp %v", h, err, resp)
		}
		resp.Body.Close()
	}
	c, _, err := websocket.DefaultDialer.Dial(url, http.Header{"Authorization": {"Bearer right"}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// The handshake's answer may reach the client before the handler counts it.
	testenv.WaitFor(t, 5*time.Second, "the connection counted", func() bool { return r.Stats().Connections == 1 })
	if st := r.Stats(); st.Refused != 2 {
		t.Fatalf("stats %+v", st)
	}
}

func TestDedupCompaction(t *testing.T) {
	d := &dedup{max: 3}
	type rg = wire.Range
	steps := []struct {
		seq      uint64
		skipFrom uint64 // > 0: skip(skipFrom, seq) instead of add(seq)
		new      bool
		gap      rg
		hwm      uint64
		held     int
	}{
		{seq: 100, new: true, hwm: 100},
		{seq: 101, new: true, hwm: 101},
		{seq: 101, hwm: 101},
		{seq: 105, new: true, gap: rg{First: 102, Last: 104}, hwm: 101, held: 1},
		{seq: 107, new: true, gap: rg{First: 106, Last: 106}, hwm: 101, held: 2},
		{seq: 103, new: true, hwm: 101, held: 3},
		{seq: 108, new: true, hwm: 101, held: 3}, // joins 107's range
		{seq: 109, new: true, hwm: 101, held: 3},
		{seq: 111, new: true, gap: rg{First: 110, Last: 110}, hwm: 103, held: 3}, // over max: the hole 102 is given up, 103 absorbed
		{seq: 102, hwm: 103, held: 3},
		{seq: 104, new: true, hwm: 105, held: 2}, // fills a hole: 105 absorbed
		{seq: 106, new: true, hwm: 109, held: 1},
		{seq: 108, hwm: 109, held: 1},
		{skipFrom: 112, seq: 200, hwm: 109, held: 1},                                 // a restart's skip right after the top: no gap
		{seq: 201, new: true, hwm: 109, held: 1},                                     // the next run's first sample: no gap
		{seq: 150, hwm: 109, held: 1},                                                // inside the skip: seen
		{skipFrom: 300, seq: 400, gap: rg{First: 202, Last: 299}, hwm: 109, held: 2}, // samples before a skip missing: a gap
		{seq: 110, new: true, hwm: 201, held: 1},
	}
	for i, s := range steps {
		var isNew bool
		var gap wire.Range
		if s.skipFrom > 0 {
			gap = d.skip(s.skipFrom, s.seq)
		} else {
			isNew, gap = d.add(s.seq)
		}
		if isNew != s.new || gap != s.gap {
			t.Fatalf("step %d (seq %d): new %v gap %v, want %v %v", i, s.seq, isNew, gap, s.new, s.gap)
		}
		if d.HWM != s.hwm || len(d.Above) != s.held {
			t.Fatalf("step %d: hwm %d held %v, want %d %d", i, d.HWM, d.Above, s.hwm, s.held)
		}
	}
}

// The state file carries the dedup across a restart of the receiver: the
// same batches again write nothing, a skip is no gap, a new epoch is no
// gap, and a late batch of the older epoch is still known. An unreadable
// state file is logged and the receiver starts afresh.
func TestReceiverStateFile(t *testing.T) {
	const e1, e2 = 0x1111222233334444, 0x5555666677778888
	f1 := batch(e1, 1, 3)
	f2 := batch(e1, 1000, 1002, wire.Range{First: 4, Last: 999}) // a gateway restart skipped 4..999
	f3 := batch(e2, 1003, 1004)                                  // a new epoch
	dir := t.TempDir()
	o := newOut(t)
	r := New(Config{Out: o, StateDir: dir, Logger: logger(t)})
	for _, f := range [][]byte{f1, f2, f2, f3} {
		if _, err := r.Ingest(f); err != nil {
			t.Fatal(err)
		}
	}
	if st := r.Stats(); st.Samples != 8 || st.Duplicates != 3 || st.Gaps != 0 || st.Epochs != 2 {
		t.Fatalf("stats %+v", st)
	}
	if !strings.Contains(o.String(), `{"gateway":"`+gwID+`","epoch":"5555666677778888","seq":1003,`) || len(o.seqs(t, gwID)) != 8 {
		t.Fatalf("output %s", o.String())
	}
	file := filepath.Join(dir, gwID+".json")
	var saved gwState
	if b, err := os.ReadFile(file); err != nil || json.Unmarshal(b, &saved) != nil || saved.Current != "5555666677778888" || len(saved.Epochs) != 2 {
		t.Fatalf("state file: %+v %v", saved, err)
	}
	r2 := New(Config{Out: o, StateDir: dir, Logger: logger(t)})
	for _, f := range [][]byte{f3, f1, f2} {
		if _, err := r2.Ingest(f); err != nil {
			t.Fatal(err)
		}
	}
	if st := r2.Stats(); st.Samples != 0 || st.Duplicates != 8 || st.Gaps != 0 {
		t.Fatalf("after restart: stats %+v", st)
	}
	if err := os.WriteFile(file, []byte("{not json"), 0o600); err != nil {
		t.Fatal(err)
	}
	r3 := New(Config{Out: o, StateDir: dir, Logger: logger(t)})
	if _, err := r3.Ingest(f1); err != nil {
		t.Fatal(err)
	}
	if st := r3.Stats(); st.Samples != 3 {
		t.Fatalf("after a corrupt state file: %+v, want a fresh start", st)
	}
}

// A receiver whose output fails acks nothing and marks nothing seen: the
// gateway resends and the batch is written then.
func TestReceiverOutputFails(t *testing.T) {
	w := &failing{fail: true}
	r := New(Config{Out: w, Logger: logger(t)})
	if _, err := r.Ingest(batch(1, 1, 3)); err == nil {
		t.Fatal("a failed write was acked")
	}
	w.fail = false
	if last, err := r.Ingest(batch(1, 1, 3)); err != nil || last != 3 || r.Stats().Samples != 3 {
		t.Fatalf("resend: %d %v %+v", last, err, r.Stats())
	}
}

type failing struct{ fail bool }

func (f *failing) Write(p []byte) (int, error) {
	if f.fail {
		return 0, errors.New("disk full")
	}
	return len(p), nil
}

// The receiver refuses a batch above MaxBatch before decoding it, and a
// WebSocket message above MaxFrame; a frame of a million tiny elements
// costs about its own size in memory, not a million samples.
func TestReceiverLimits(t *testing.T) {
	r := New(Config{MaxBatch: 100, MaxFrame: 64 << 10, Logger: logger(t)})
	if _, err := r.Ingest(batch(1, 1, 100)); err != nil {
		t.Fatal(err)
	}
	var pe *wire.ProtocolError
	if _, err := r.Ingest(batch(1, 101, 201)); !errors.As(err, &pe) || !strings.Contains(err.Error(), "101 samples") {
		t.Fatalf("101 samples: %v", err)
	}
	huge := []byte(`{"type":"batch","gateway":"g","first":1,"last":1,"samples":[` + strings.Repeat("null,", 1<<20) + `null]}`)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	_, err := r.Ingest(huge)
	runtime.ReadMemStats(&after)
	if !errors.As(err, &pe) {
		t.Fatalf("huge: %v", err)
	}
	if d := after.TotalAlloc - before.TotalAlloc; d > 4*uint64(len(huge)) {
		t.Fatalf("a refused frame of %d bytes allocated %d bytes", len(huge), d)
	}
	if rs := r.Stats(); rs.BadFrames != 2 || rs.Samples != 100 {
		t.Fatalf("stats %+v", rs)
	}
	c, _, err := websocket.DefaultDialer.Dial(serve(t, r), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.WriteMessage(websocket.TextMessage, make([]byte, 65<<10))
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, _, err = c.ReadMessage()
	if !websocket.IsCloseError(err, websocket.CloseMessageTooBig) {
		t.Fatalf("oversize message: %v", err)
	}
}

// Write reaches the gateway that said its id on the handshake and returns
// its answer; an answer nobody waits for is counted; a gateway not
// connected, or gone before answering, is an error.
func TestReceiverWrite(t *testing.T) {
	r := New(Config{Logger: logger(t)})
	url := serve(t, r)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := r.Write(ctx, gwID, "d", "t", 1); !errors.Is(err, ErrNotConnected) {
		t.Fatalf("not connected: %v", err)
	}
	c, _, err := websocket.DefaultDialer.Dial(url, http.Header{wire.GatewayHeader: {gwID}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	testenv.WaitFor(t, 5*time.Second, "the gateway known", func() bool { return fmt.Sprint(r.Connected()) == "["+gwID+"]" })
	gateway := make(chan error, 1)
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	go func() { // the gateway's side: one command, answered after a stray answer
		_, msg, err := c.ReadMessage()
		if err == nil {
			var m wire.Uplink
			if m, err = wire.ParseUplink(msg); err == nil && (m.Type != "write" || m.Bad != "" || m.Cmd.Device != "boiler" || m.Cmd.Value != 42.5) {
				err = fmt.Errorf("command %+v", m)
			}
			if err == nil {
				err = c.WriteMessage(websocket.TextMessage, wire.AppendWriteResult(nil, &wire.WriteAnswer{ID: "stray", OK: true}))
			}
			if err == nil {
				err = c.WriteMessage(websocket.TextMessage, wire.AppendWriteResult(nil, &wire.WriteAnswer{ID: m.Cmd.ID, OK: true, Written: 42.5, ReadBack: 42.4}))
			}
		}
		gateway <- err
	}()
	a, err := r.Write(ctx, gwID, "boiler", "setpoint", 42.5)
	if err != nil || !a.OK || a.Written != 42.5 || a.ReadBack != 42.4 {
		t.Fatalf("answer %+v %v", a, err)
	}
	if err := testenv.Recv(t, gateway, 10*time.Second, "the gateway's side to answer"); err != nil {
		t.Fatal(err)
	}
	if st := r.Stats(); st.WriteAnswers != 1 || st.UnknownAnswers != 1 {
		t.Fatalf("stats %+v", st)
	}
	go func() { // the gateway reads the next command and goes away
		_, _, _ = c.ReadMessage()
		c.Close()
	}()
	if _, err := r.Write(ctx, gwID, "boiler", "setpoint", 1); err == nil || !strings.Contains(err.Error(), "closed before the answer") {
		t.Fatalf("gone: %v", err)
	}
}

// Loss ranges are counted and logged apart from gaps, once, only for the
// seqs not seen; a loss of an older epoch goes to that epoch; the state
// keeps them.
func TestReceiverLossRanges(t *testing.T) {
	o := newOut(t)
	dir := t.TempDir()
	r := New(Config{Out: o, Logger: logger(t), StateDir: dir})
	mk := func(e uint64, from, to uint64, loss ...wire.Loss) []byte {
		var s []ringstore.Sample
		for i := from; i <= to; i++ {
			s = append(s, ringstore.Sample{Seq: i, Epoch: e, Device: "d", Tag: "t", Value: float64(i), TS: int64(i)})
		}
		return wire.AppendBatchLoss(nil, []byte(`"`+gwID+`"`), s, false, nil, loss)
	}
	e1, e2 := ringstore.FormatEpoch(1), ringstore.FormatEpoch(2)
	for _, f := range [][]byte{
		mk(1, 1, 10),
		mk(1, 21, 30, wire.Loss{Epoch: e1, First: 11, Last: 20, Reason: wire.LossCrash}), // 10 lost, no gap
		mk(1, 21, 30, wire.Loss{Epoch: e1, First: 11, Last: 20, Reason: wire.LossCrash}), // resent: counted once
		mk(1, 41, 45, wire.Loss{Epoch: e1, First: 5, Last: 35, Reason: wire.LossFull}),   // 31..35 new: 5 lost, gap 36..40
		mk(2, 61, 62, wire.Loss{Epoch: e1, First: 46, Last: 50, Reason: wire.LossCrash}, // an older epoch's tail
			wire.Loss{Epoch: e2, First: 51, Last: 60, Reason: wire.LossFull}), // the new epoch's start: no silent drop
	} {
		if _, err := r.Ingest(f); err != nil {
			t.Fatal(err)
		}
	}
	st := r.Stats()
	if st.Losses != 4 || st.LostSamples != 10+5+5+10 || st.Gaps != 1 || st.GapSamples != 5 || st.Samples != 27 {
		t.Fatalf("stats %+v", st)
	}
	b, err := os.ReadFile(filepath.Join(dir, gwID+".json"))
	if err != nil {
		t.Fatal(err)
	}
	var g gwState
	if err := json.Unmarshal(b, &g); err != nil {
		t.Fatal(err)
	}
	lost := map[string]uint64{}
	for _, d := range g.Epochs {
		lost[d.Epoch] = d.Lost
	}
	if lost[e1] != 20 || lost[e2] != 10 {
		t.Fatalf("state lost %v", lost)
	}
}
