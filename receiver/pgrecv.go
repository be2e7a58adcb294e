package receiver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"edgegw/stats"
	"edgegw/wire"
)

// errStore marks a batch the database did not take (unreachable, a failed
// commit): not acked, the connection closed with 1013 (try again later) so
// that the gateway resends, here or to another receiver.
var errStore = errors.New("receiver: database unavailable")

// ErrConnectedElsewhere is returned by Write for a gateway that the
// database says is connected to another receiver (the error names it).
var ErrConnectedElsewhere = errors.New("receiver: gateway connected to another receiver")

// pgStats are the counters of the database path.
type pgStats struct {
	commit     stats.Histogram // batch transaction, BEGIN to COMMIT
	commits    atomic.Uint64
	failures   atomic.Uint64
	lastCommit atomic.Int64 // Unix ns of the latest commit
	wsBytes    atomic.Uint64
	otherBytes atomic.Uint64 // read on the listener outside WebSocket connections (handshakes, /metrics, /healthz)

	mu      sync.Mutex
	lastErr string // the latest write error, "" once a commit succeeds
}

// storeTimeout bounds one batch's transaction.
const storeTimeout = 15 * time.Second

// storeBatch writes f to the database; it returns the seq to ack once the
// transaction has committed.
func (r *Receiver) storeBatch(f *wire.Batch) (uint64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), storeTimeout)
	defer cancel()
	t0 := time.Now()
	res, err := r.db.write(ctx, f)
	if err != nil {
		var bad *badBatch
		if errors.As(err, &bad) {
			r.bad.Add(1)
			return 0, err
		}
		r.pg.failures.Add(1)
		r.pg.mu.Lock()
		r.pg.lastErr = err.Error()
		r.pg.mu.Unlock()
		return 0, fmt.Errorf("%w: %w", errStore, err)
	}
	now := time.Now()
	r.pg.commit.Observe(now.Sub(t0))
	r.pg.commits.Add(1)
	r.pg.lastCommit.Store(now.UnixNano())
	r.pg.mu.Lock()
	r.pg.lastErr = ""
	r.pg.mu.Unlock()
	if res.newEpoch {
		r.epochs.Add(1)
		r.log.Info("receiver: new epoch", "gateway", f.Gateway, "epoch", f.Epoch, "first", f.First)
	}
	if res.losses > 0 {
		r.log.Warn("receiver: samples lost at the gateway", "gateway", f.Gateway, "ranges", res.losses, "lost", res.lostSamples)
	}
	r.batches.Add(1)
	r.samples.Add(uint64(res.inserted))
	r.dups.Add(uint64(res.duplicates))
	r.losses.Add(res.losses)
	r.lostSamples.Add(res.lostSamples)
	return f.Last, nil
}

// badBatch is a batch the database cannot hold as it is (a seq beyond a
// bigint): a bad frame, not a database failure.
type badBatch struct{ msg string }

func (e *badBatch) Error() string { return "receiver: " + e.msg }

func (r *Receiver) recordConnect(gateway, remote string) {
	if r.db == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := r.db.connect(ctx, gateway, remote); err != nil {
		r.log.Warn("receiver: connection not recorded in the database", "gateway", gateway, "err", err)
	}
}

func (r *Receiver) recordDisconnect(gateway string) {
	if r.db == nil || gateway == "" {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := r.db.disconnect(ctx, gateway); err != nil {
		r.log.Warn("receiver: disconnection not recorded in the database", "gateway", gateway, "err", err)
	}
}

// notHere is Write's error for a gateway with no connection to this
// receiver: where the database says it is connected, when it knows.
func (r *Receiver) notHere(ctx context.Context, gateway string) error {
	if r.db != nil {
		c, ok, err := r.db.where(ctx, gateway)
		switch {
		case err != nil:
			return fmt.Errorf("receiver: write to %q: %w (and the database does not say where: %v)", gateway, ErrNotConnected, err)
		case ok && c.Receiver != r.cfg.ID:
			return fmt.Errorf("receiver: write to %q: %w: connected to receiver %q (from %s, since %s); send the write there",
				gateway, ErrConnectedElsewhere, c.Receiver, c.Remote, c.Since.UTC().Format(time.RFC3339))
		}
	}
	return fmt.Errorf("receiver: write to %q: %w", gateway, ErrNotConnected)
}

// Health is the receiver's /healthz answer.
type Health struct {
	OK       bool   `json:"ok"`
	Receiver string `json:"receiver,omitempty"`
	Database string `json:"database,omitempty"` // "reachable", or why not
	Reason   string `json:"reason,omitempty"`   // why not OK
	// LastCommitAge is the seconds since the latest batch committed (-1: none yet).
	LastCommitAge float64 `json:"last_commit_age_seconds"`
	Gateways      int     `json:"gateways"`
}

// Health checks the database (a ping, 2 s at most) and the latest write.
func (r *Receiver) Health(ctx context.Context) Health {
	h := Health{OK: true, Receiver: r.cfg.ID, LastCommitAge: -1, Gateways: len(r.Connected())}
	if ns := r.pg.lastCommit.Load(); ns != 0 {
		h.LastCommitAge = time.Since(time.Unix(0, ns)).Seconds()
	}
	if r.db == nil {
		return h
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if err := r.db.pool.Ping(ctx); err != nil {
		h.OK, h.Database, h.Reason = false, "unreachable", "database unreachable: "+err.Error()
		return h
	}
	h.Database = "reachable"
	r.pg.mu.Lock()
	last := r.pg.lastErr
	r.pg.mu.Unlock()
	if last != "" {
		h.OK, h.Reason = false, "the latest batch was not stored: "+last
	}
	return h
}

func (r *Receiver) healthz(w http.ResponseWriter, req *http.Request) {
	h := r.Health(req.Context())
	w.Header().Set("Content-Type", "application/json")
	if !h.OK {
		w.WriteHeader(http.StatusServiceUnavailable)
	}
	_ = json.NewEncoder(w).Encode(h)
}

// metrics writes the Prometheus text exposition.
func (r *Receiver) metrics(w http.ResponseWriter, _ *http.Request) {
	st := r.Stats()
	var b []byte
	counter := func(name, help string, v uint64) {
		b = append(b, "# HELP "+name+" "+help+"\n# TYPE "+name+" counter\n"+name+" "...)
		b = strconv.AppendUint(b, v, 10)
		b = append(b, '\n')
	}
	gauge := func(name, help string, v float64) {
		b = append(b, "# HELP "+name+" "+help+"\n# TYPE "+name+" gauge\n"+name+" "...)
		b = strconv.AppendFloat(b, v, 'g', -1, 64)
		b = append(b, '\n')
	}
	counter("edgegw_receiver_connections_total", "WebSocket connections of gateways accepted.", st.Connections)
	counter("edgegw_receiver_refused_total", "Handshakes refused for a wrong or missing token.", st.Refused)
	counter("edgegw_receiver_batches_total", "Batches stored and acked.", st.Batches)
	counter("edgegw_receiver_samples_total", "New samples stored.", st.Samples)
	counter("edgegw_receiver_duplicates_total", "Samples received again and not stored (the primary key, or the dedup state).", st.Duplicates)
	counter("edgegw_receiver_bad_frames_total", "Frames that broke the protocol.", st.BadFrames)
	counter("edgegw_receiver_lost_samples_total", "Samples the gateways announced lost (loss ranges new to this receiver or database).", st.LostSamples)
	counter("edgegw_receiver_store_failures_total", "Batches the database did not take (not acked).", r.pg.failures.Load())
	counter("edgegw_receiver_ws_read_bytes_total", "Bytes read on the gateways' WebSocket connections (frames as on the socket).", r.pg.wsBytes.Load())
	counter("edgegw_receiver_other_read_bytes_total", "Bytes read on the listener outside WebSocket connections (handshakes, scrapes).", r.pg.otherBytes.Load())
	gauge("edgegw_receiver_gateways_connected", "Gateways connected to this receiver now.", float64(len(r.Connected())))
	up := 1.0
	if r.db != nil && !r.Health(context.Background()).OK {
		up = 0
	}
	gauge("edgegw_receiver_database_up", "1 when the database answers and the latest batch was stored (always 1 without -postgres).", up)
	if ns := r.pg.lastCommit.Load(); ns != 0 {
		gauge("edgegw_receiver_last_commit_timestamp_seconds", "Unix time of the latest batch commit.", float64(ns)/1e9)
	}
	const h = "edgegw_receiver_commit_seconds"
	b = append(b, "# HELP "+h+" Time of a batch's database transaction, BEGIN to COMMIT.\n# TYPE "+h+" histogram\n"...)
	snap := r.pg.commit.Snapshot()
	var cum uint64
	for i, c := range snap.Counts {
		cum += c
		le := "+Inf"
		if i < len(stats.BucketBounds) {
			le = strconv.FormatFloat(stats.BucketBounds[i]/1e6, 'g', -1, 64)
		}
		b = append(b, h+`_bucket{le="`+le+`"} `...)
		b = strconv.AppendUint(b, cum, 10)
		b = append(b, '\n')
	}
	b = append(b, h+"_sum "...)
	b = strconv.AppendFloat(b, float64(snap.SumUS)/1e6, 'g', -1, 64)
	b = append(b, "\n"+h+"_count "...)
	b = strconv.AppendUint(b, snap.N, 10)
	b = append(b, '\n')
	w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
	_, _ = w.Write(b)
}

// countListener counts the bytes read on its connections: a gateway's
// WebSocket frames as they came on the socket (compressed or not), so that
// bytes per stored sample can be computed.
type countListener struct {
	net.Listener
	r *Receiver
}

func (l *countListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &countConn{Conn: c, r: l.r}, nil
}

type countConn struct {
	net.Conn
	r  *Receiver
	ws atomic.Bool // upgraded to a gateway's WebSocket connection
}

func (c *countConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if c.ws.Load() {
		c.r.pg.wsBytes.Add(uint64(n))
	} else {
		c.r.pg.otherBytes.Add(uint64(n))
	}
	return n, err
}
