package receiver

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"

	"edgegw/internal/pgtest"
	"edgegw/internal/testenv"
	"edgegw/ringstore"
	"edgegw/wire"

	"github.com/gorilla/websocket"
)

// pgReceiver serves a receiver storing into db for the rest of the test
// and returns it with its /ingest URL.
func pgReceiver(t *testing.T, db *pgtest.Server, id string) (*Receiver, string) {
	t.Helper()
	r := New(Config{Logger: logger(t), Postgres: db.URL(), ID: id})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := r.Open(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Close) // after Serve has returned (cleanups run last-in first-out)
	return r, serve(t, r)
}

// gwConn is a gateway's WebSocket connection to a receiver in a test.
type gwConn struct {
	t *testing.T
	c *websocket.Conn
}

func dialGW(t *testing.T, url, gateway string) *gwConn {
	t.Helper()
	c, _, err := websocket.DefaultDialer.Dial(url, http.Header{wire.GatewayHeader: {gateway}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &gwConn{t: t, c: c}
}

// send writes frame and returns the ack's seq, or the close error when
// the receiver closed the connection instead.
func (g *gwConn) send(frame []byte) (uint64, error) {
	g.t.Helper()
	if err := g.c.WriteMessage(websocket.TextMessage, frame); err != nil {
		return 0, err
	}
	_ = g.c.SetReadDeadline(time.Now().Add(20 * time.Second))
	_, msg, err := g.c.ReadMessage()
	if err != nil {
		return 0, err
	}
	m, err := wire.ParseUplink(msg)
	if err != nil || m.Type != "ack" {
		g.t.Fatalf("ack %q: %+v %v", msg, m, err)
	}
	return m.Last, nil
}

func (g *gwConn) ack(frame []byte, want uint64) {
	g.t.Helper()
	got, err := g.send(frame)
	if err != nil || got != want {
		g.t.Fatalf("ack %d %v, want %d", got, err, want)
	}
}

// frame is a batch of gateway gw, epoch e, seqs from..to, with skips and
// losses; every third sample a string tag, every fifth a timeout.
func frame(gw string, e, from, to uint64, skips []wire.Range, loss []wire.Loss) []byte {
	var s []ringstore.Sample
	text := "on"
	for i := from; i <= to; i++ {
		smp := ringstore.Sample{Seq: i, Epoch: e, Device: "d", Tag: "t", Value: float64(i) / 2, TS: 1764450000000000 + int64(i)*1000}
		switch {
		case i%3 == 0:
			smp.Tag, smp.Kind, smp.Text = "state", ringstore.KindString, &text
		case i%5 == 0:
			smp.Quality = ringstore.Timeout
		}
		s = append(s, smp)
	}
	return wire.AppendBatchLoss(nil, []byte(`"`+gw+`"`), s, false, skips, loss)
}

// Batches land in edgegw_samples exactly once across two receivers
// sharing the database: resends and overlaps are acked and counted as
// duplicates, the values keep their kind, the schema is at its version,
// and gaps finds exactly the hole the test left (not the announced
// skip and loss ranges).
func TestPGExactlyOnceAcrossReceivers(t *testing.T) {
	db := pgtest.Start(t)
	r1, u1 := pgReceiver(t, db, "r1")
	r2, u2 := pgReceiver(t, db, "r2")
	if v := db.Psql("SELECT version FROM edgegw_schema_version"); v != "1" {
		t.Fatalf("schema version %q", v)
	}
	a, b := dialGW(t, u1, "gw-a"), dialGW(t, u2, "gw-a")
	a.ack(frame("gw-a", 7, 1, 100, nil, nil), 100)
	b.ack(frame("gw-a", 7, 50, 150, nil, nil), 150) // a resend of 50..100 through another receiver
	a.ack(frame("gw-a", 7, 1, 150, nil, nil), 150)  // all again
	// 151..160 skipped (a restart), 161..170 lost (queue full), 171..180 never sent: a hole.
	b.ack(frame("gw-a", 7, 181, 200, []wire.Range{{First: 151, Last: 160}},
		[]wire.Loss{{Epoch: ringstore.FormatEpoch(7), First: 161, Last: 170, Reason: wire.LossFull}}), 200)
	if got := db.Psql("SELECT count(*), count(DISTINCT seq), min(seq), max(seq) FROM edgegw_samples WHERE gateway = 'gw-a'"); got != "170|170|1|200" {
		t.Fatalf("count, distinct, min, max = %s", got)
	}
	st1, st2 := r1.Stats(), r2.Stats()
	if st1.Samples+st2.Samples != 170 || st1.Duplicates+st2.Duplicates != 51+150 || st1.Batches+st2.Batches != 4 {
		t.Fatalf("stats r1 %+v r2 %+v", st1, st2)
	}
	if st2.LostSamples != 10 || st2.Losses != 1 {
		t.Fatalf("losses: %+v", st2)
	}
	if got := db.Psql("SELECT tag, value, value_text, quality FROM edgegw_samples WHERE gateway = 'gw-a' AND seq IN (4, 6, 10) ORDER BY seq"); got != "t|2||good\nstate||on|good\nt|||timeout" {
		t.Fatalf("values:\n%s", got)
	}
	if got := db.Psql("SELECT first_seq FROM edgegw_epochs WHERE gateway = 'gw-a'"); got != "1" {
		t.Fatalf("epoch first seq %q", got)
	}
	rep, err := Gaps(t.Context(), db.URL(), "", time.Unix(0, 0))
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Holes) != 1 || rep.Holes[0] != (Hole{Gateway: "gw-a", Epoch: ringstore.FormatEpoch(7), First: 171, Last: 180}) || rep.Samples != 170 || rep.Announce != 2 {
		t.Fatalf("gaps: %+v", rep)
	}
	// The same through the command: exit with ErrHoles, the hole on stdout.
	var out bytes.Buffer
	if err := mainGaps(t.Context(), "gaps", []string{"-postgres", db.URL(), "-gateway", "gw-a"}, &out); !errors.Is(err, ErrHoles) || !strings.Contains(out.String(), "seq 171..180 (10 missing)") {
		t.Fatalf("gaps command: %v\n%s", err, out.String())
	}
	a.ack(frame("gw-a", 7, 171, 180, nil, nil), 180)
	out.Reset()
	if err := mainGaps(t.Context(), "gaps", []string{"-postgres", db.URL(), "-since", "2025-01-01T00:00:00Z"}, &out); err != nil || !strings.Contains(out.String(), "gaps: 0 holes") {
		t.Fatalf("gaps command after the fill: %v\n%s", err, out.String())
	}
	// -since after the samples: nothing looked at, nothing found.
	out.Reset()
	if err := mainGaps(t.Context(), "gaps", []string{"-postgres", db.URL(), "-since", "2030-01-01T00:00:00Z"}, &out); err != nil || !strings.Contains(out.String(), "looked at 0 samples") {
		t.Fatalf("gaps -since later: %v\n%s", err, out.String())
	}
}

// A write for a gateway connected to another receiver names that receiver.
func TestPGWriteNamesTheOtherReceiver(t *testing.T) {
	db := pgtest.Start(t)
	r1, _ := pgReceiver(t, db, "r1")
	_, u2 := pgReceiver(t, db, "r2")
	dialGW(t, u2, "gw-w").ack(frame("gw-w", 1, 1, 2, nil, nil), 2)
	testenv.WaitFor(t, 10*time.Second, "the connection recorded", func() bool {
		return db.Psql("SELECT receiver FROM edgegw_connections WHERE gateway = 'gw-w'") == "r2"
	})
	_, err := r1.Write(t.Context(), "gw-w", "d", "t", 1)
	if !errors.Is(err, ErrConnectedElsewhere) || !strings.Contains(err.Error(), `connected to receiver "r2"`) {
		t.Fatalf("write through r1: %v", err)
	}
	_, err = r1.Write(t.Context(), "gw-none", "d", "t", 1)
	if !errors.Is(err, ErrNotConnected) {
		t.Fatalf("write to an unknown gateway: %v", err)
	}
}

// While the database is down the receiver acks nothing (it closes the
// connection with 1013), /healthz answers 503 with the reason and
// /metrics says database_up 0; after it is back the resend is stored and
// acked, and the exposition passes promtool.
func TestPGDatabaseDownNoAck(t *testing.T) {
	db := pgtest.Start(t)
	r, u := pgReceiver(t, db, "r1")
	base := strings.TrimSuffix(strings.Replace(u, "ws://", "http://", 1), "/ingest")
	dialGW(t, u, "gw-d").ack(frame("gw-d", 1, 1, 10, nil, nil), 10)
	if code, body := get(t, base+"/healthz"); code != 200 || !strings.Contains(body, `"database":"reachable"`) {
		t.Fatalf("healthz %d %s", code, body)
	}
	db.Stop("immediate")
	g := dialGW(t, u, "gw-d")
	_, err := g.send(frame("gw-d", 1, 11, 20, nil, nil))
	var ce *websocket.CloseError
	if !errors.As(err, &ce) || ce.Code != websocket.CloseTryAgainLater {
		t.Fatalf("send with the database down: %v, want a close 1013", err)
	}
	code, body := get(t, base+"/healthz")
	var h Health
	if err := json.Unmarshal([]byte(body), &h); err != nil || code != 503 || h.OK || !strings.Contains(h.Reason, "database") {
		t.Fatalf("healthz with the database down: %d %s", code, body)
	}
	if _, m := get(t, base+"/metrics"); !strings.Contains(m, "edgegw_receiver_database_up 0") {
		t.Fatalf("metrics:\n%s", m)
	}
	db.Restart()
	testenv.WaitFor(t, 30*time.Second, "a resend stored after the restart", func() bool {
		c, _, err := websocket.DefaultDialer.Dial(u, http.Header{wire.GatewayHeader: {"gw-d"}})
		if err != nil {
			return false
		}
		defer c.Close()
		g := &gwConn{t: t, c: c}
		last, err := g.send(frame("gw-d", 1, 11, 20, nil, nil))
		return err == nil && last == 20
	})
	if got := db.Psql("SELECT count(*) FROM edgegw_samples WHERE gateway = 'gw-d'"); got != "20" {
		t.Fatalf("stored %s, want 20", got)
	}
	testenv.WaitFor(t, 10*time.Second, "healthz ok again", func() bool { c, _ := get(t, base+"/healthz"); return c == 200 })
	if st := r.Stats(); st.Samples != 20 {
		t.Fatalf("stats %+v", st)
	}
	_, m := get(t, base+"/metrics")
	for _, want := range []string{"edgegw_receiver_samples_total 20", "edgegw_receiver_database_up 1", "edgegw_receiver_commit_seconds_count 2", "edgegw_receiver_store_failures_total "} {
		if !strings.Contains(m, want) {
			t.Errorf("metrics lack %q", want)
		}
	}
	if strings.Contains(m, "edgegw_receiver_ws_read_bytes_total 0\n") {
		t.Errorf("no WebSocket bytes counted:\n%s", m)
	}
	promtool := testenv.Need(t, "promtool")
	cmd := exec.Command(promtool, "check", "metrics")
	cmd.Stdin = strings.NewReader(m)
	if out, err := cmd.CombinedOutput(); err != nil || len(bytes.TrimSpace(out)) != 0 {
		t.Fatalf("promtool check metrics: %v\n%s", err, out)
	}
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", url, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// Without PostgreSQL, /healthz is 200 and /metrics passes promtool too
// (an empty commit histogram, no last-commit gauge).
func TestFileModeHealthAndMetrics(t *testing.T) {
	promtool := testenv.Need(t, "promtool")
	r := New(Config{Out: newOut(t), Logger: logger(t)})
	u := serve(t, r)
	dialGW(t, u, gwID).ack(batch(1, 1, 5), 5)
	base := strings.TrimSuffix(strings.Replace(u, "ws://", "http://", 1), "/ingest")
	if code, body := get(t, base+"/healthz"); code != 200 || !strings.Contains(body, `"ok":true`) {
		t.Fatalf("healthz %d %s", code, body)
	}
	_, m := get(t, base+"/metrics")
	if !strings.Contains(m, "edgegw_receiver_samples_total 5\n") || !strings.Contains(m, "edgegw_receiver_gateways_connected 1\n") {
		t.Fatalf("metrics:\n%s", m)
	}
	cmd := exec.Command(promtool, "check", "metrics")
	cmd.Stdin = strings.NewReader(m)
	if out, err := cmd.CombinedOutput(); err != nil || len(bytes.TrimSpace(out)) != 0 {
		t.Fatalf("promtool check metrics: %v\n%s", err, out)
	}
}
