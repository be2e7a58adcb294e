package receiver

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"edgegw/internal/wsread"
	"edgegw/wire"

	"github.com/gorilla/websocket"
)

// Config configures the reference receiver.
type Config struct {
	Listen string    // "127.0.0.1:0" by default
	Token  string    // bearer token gateways must send; "" = no check
	Out    io.Writer // one JSON line per new sample; nil = discard
	Logger *slog.Logger
	// MaxPending bounds the seq ranges remembered above the high-water
	// mark of a (gateway, epoch) before the oldest hole is given up (4096).
	MaxPending int
	// StateDir keeps each gateway's dedup state (file <gateway>.json:
	// epochs, high-water mark, ranges above it), saved after every batch
	// that wrote samples, before its ack, so a restart of the receiver
	// neither writes duplicates nor loses anything. "" = memory only.
	StateDir string
	// MaxBatch is the most samples one batch may hold (wire.DefaultMaxBatch); a
	// bigger one is a bad frame, counted before anything is decoded.
	MaxBatch int
	// MaxFrame is the most bytes of one WebSocket message (4 MiB).
	MaxFrame int64
	// Postgres, when set, is the URL of the PostgreSQL database the
	// samples go to (table edgegw_samples, schema created by Open): every
	// batch in one transaction, acked after its commit, deduplicated by the
	// primary key (gateway, epoch, seq). Out and StateDir are then unused:
	// the dedup state is the database's, and receivers sharing it are
	// interchangeable.
	Postgres string
	// ID names this receiver in edgegw_connections (default host:port).
	ID string
}

// Stats are the receiver's counters.
type Stats struct {
	Connections, Refused uint64 // WebSocket connections accepted; handshakes refused (401)
	Batches, Samples     uint64 // batches acked; new samples written
	Duplicates           uint64 // samples received again and not written
	Gaps, GapSamples     uint64 // holes seen in a gateway's seq (within one epoch), and their size
	Losses, LostSamples  uint64 // loss ranges the gateways reported (with seqs not seen), and the samples they lost
	Epochs               uint64 // (gateway, epoch) pairs seen for the first time
	BadFrames            uint64
	Gateways             int
	WriteAnswers         uint64 // answers to Receiver.Write received
	UnknownAnswers       uint64 // answers nobody waited for (late, or an unknown id)
}

// Receiver is the reference upstream receiver: it accepts gateways over
// WebSocket at /ingest, acks every batch after writing it, dedups by
// (gateway, epoch, seq) and writes each new sample as a JSON line:
//
//	{"gateway":"gw-01","epoch":"9f3c04e1a2b3c4d5","seq":42,"device":"logger-01","tag":"temperature","value":21.5,"quality":"good","ts":1764450000123456}
//
// A gap (a hole in the seqs) is reported only inside one epoch, and not
// where the frame says the numbers were skipped; a new epoch is logged at
// INFO with the old and the new id. Version 1 frames (no epoch) are the
// epoch "" (no epoch in the line).
//
// Ingest takes a batch frame from elsewhere (an MQTT subscriber of
// <prefix>/batch) with the same dedup and output.
type Receiver struct {
	cfg Config
	log *slog.Logger
	up  websocket.Upgrader

	mu    sync.Mutex // dedup state, Out, listener
	gws   map[string]*gwState
	ln    net.Listener
	conns map[*websocket.Conn]struct{}
	line  []byte

	smu      sync.Mutex        // sessions, and every rconn's gateway and pending
	sessions map[string]*rconn // gateway id -> its latest connection
	nextID   atomic.Uint64

	connections, refused, batches, samples, dups, gaps, gapSamples, bad, epochs atomic.Uint64
	losses, lostSamples                                                         atomic.Uint64
	answers, unknownAnswers                                                     atomic.Uint64

	db *store // nil without Config.Postgres
	pg pgStats
}

// rconn is one gateway connection of the receiver.
type rconn struct {
	c       *websocket.Conn
	wmu     sync.Mutex // one writer at a time: acks (the handler) and write commands (Write)
	done    chan struct{}
	remote  string
	gateway string                           // under Receiver.smu
	pending map[string]chan wire.WriteAnswer // under Receiver.smu
}

// New returns a receiver; it listens on Listen or Serve.
// A receiver serves one Serve at a time.
func New(cfg Config) *Receiver {
	if cfg.Listen == "" {
		cfg.Listen = "127.0.0.1:0"
	}
	if cfg.Out == nil {
		cfg.Out = io.Discard
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.MaxPending <= 0 {
		cfg.MaxPending = 4096
	}
	if cfg.MaxBatch <= 0 {
		cfg.MaxBatch = wire.DefaultMaxBatch
	}
	if cfg.MaxFrame <= 0 {
		cfg.MaxFrame = 4 << 20
	}
	return &Receiver{cfg: cfg, log: cfg.Logger, gws: make(map[string]*gwState), conns: make(map[*websocket.Conn]struct{}),
		sessions: make(map[string]*rconn),
		up:       websocket.Upgrader{ReadBufferSize: 64 << 10, WriteBufferSize: 4 << 10, EnableCompression: true}}
}

// Open connects to the database of Config.Postgres and brings its schema
// to SchemaVersion (nothing without Postgres); Serve calls it if not done.
func (r *Receiver) Open(ctx context.Context) error {
	if r.cfg.Postgres == "" || r.db != nil {
		return nil
	}
	if r.cfg.ID == "" {
		host, _ := os.Hostname()
		_, port, _ := net.SplitHostPort(r.cfg.Listen)
		r.cfg.ID = host + ":" + port
	}
	db, err := openStore(ctx, r.cfg.Postgres, r.cfg.ID)
	if err != nil {
		return err
	}
	if err := db.forget(ctx); err != nil {
		r.log.Warn("receiver: connections of an earlier run not cleared", "err", err)
	}
	r.db = db
	r.log.Info("receiver: storing in postgres", "receiver", r.cfg.ID, "schema_version", SchemaVersion)
	return nil
}

// Close closes the database connections (after Serve has returned).
func (r *Receiver) Close() {
	if r.db != nil {
		r.db.close()
		r.db = nil
	}
}

// Listen binds the listening socket (so the address is known before Serve).
// After Serve returns, Listen may be called again (same address) and Serve
// run again: the dedup state is kept.
func (r *Receiver) Listen() (net.Addr, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.ln != nil {
		return r.ln.Addr(), nil
	}
	ln, err := net.Listen("tcp", r.cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("receiver: %w", err)
	}
	r.ln = &countListener{Listener: ln, r: r}
	r.cfg.Listen = ln.Addr().String() // a later Listen binds the same port
	return ln.Addr(), nil
}

// Serve serves /ingest until ctx ends, then closes every connection and
// returns after their handlers have exited.
func (r *Receiver) Serve(ctx context.Context) error {
	if _, err := r.Listen(); err != nil {
		return err
	}
	if err := r.Open(ctx); err != nil {
		return err
	}
	r.mu.Lock()
	ln := r.ln
	r.mu.Unlock()
	// Handlers register under hmu; once closing is set none starts, so
	// wg.Wait below cannot race with an Add.
	var wg sync.WaitGroup
	var hmu sync.Mutex
	closing := false
	mux := http.NewServeMux()
	mux.HandleFunc("/ingest", func(w http.ResponseWriter, req *http.Request) {
		hmu.Lock()
		if closing {
			hmu.Unlock()
			http.Error(w, "shutting down", http.StatusServiceUnavailable)
			return
		}
		wg.Add(1)
		hmu.Unlock()
		defer wg.Done()
		r.ingest(ctx, w, req)
	})
	mux.HandleFunc("/healthz", r.healthz)
	mux.HandleFunc("/metrics", r.metrics)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	var err error
	select {
	case <-ctx.Done():
	case err = <-errc:
	}
	sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	_ = srv.Shutdown(sctx) // closes the listener and idle connections
	cancel()
	hmu.Lock()
	closing = true
	hmu.Unlock()
	r.mu.Lock()
	for c := range r.conns {
		c.Close() // hijacked: Shutdown does not close them
	}
	r.ln = nil
	r.mu.Unlock()
	wg.Wait()
	if err == nil {
		err = <-errc
	}
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	return err
}

func (r *Receiver) authorized(req *http.Request) bool {
	if r.cfg.Token == "" {
		return true
	}
	want := "Bearer " + r.cfg.Token
	got := req.Header.Get("Authorization")
	return subtle.ConstantTimeCompare([]byte(got), []byte(want)) == 1
}

func (r *Receiver) ingest(ctx context.Context, w http.ResponseWriter, req *http.Request) {
	if !r.authorized(req) {
		r.refused.Add(1)
		r.log.Warn("receiver: refused a gateway: wrong or missing token", "remote", req.RemoteAddr)
		http.Error(w, "unauthorized", http.StatusUnauthorized)
		return
	}
	conn, err := r.up.Upgrade(w, req, nil)
	if err != nil {
		return // the upgrader has answered
	}
	r.mu.Lock()
	if ctx.Err() != nil {
		r.mu.Unlock()
		conn.Close()
		return
	}
	r.conns[conn] = struct{}{}
	r.mu.Unlock()
	if cc, ok := conn.NetConn().(*countConn); ok {
		cc.ws.Store(true) // from here on its bytes are a gateway's frames
	}
	r.connections.Add(1)
	rc := &rconn{c: conn, done: make(chan struct{}), pending: make(map[string]chan wire.WriteAnswer)}
	rc.remote = req.RemoteAddr
	if gw := req.Header.Get(wire.GatewayHeader); wire.ValidName(gw) {
		r.attach(rc, gw)
	}
	defer func() {
		close(rc.done)
		r.smu.Lock()
		gone := r.sessions[rc.gateway] == rc
		if gone {
			delete(r.sessions, rc.gateway)
		}
		r.smu.Unlock()
		if gone {
			r.recordDisconnect(rc.gateway)
		}
		r.mu.Lock()
		delete(r.conns, conn)
		r.mu.Unlock()
		conn.Close()
	}()
	log := r.log.With("remote", req.RemoteAddr)
	const idle = 90 * time.Second // gateways ping every 20 s by default
	conn.SetReadLimit(r.cfg.MaxFrame)
	_ = conn.SetReadDeadline(time.Now().Add(idle))
	conn.SetPingHandler(func(data string) error {
		_ = conn.SetReadDeadline(time.Now().Add(idle))
		rc.wmu.Lock()
		defer rc.wmu.Unlock()
		return conn.WriteControl(websocket.PongMessage, []byte(data), time.Now().Add(5*time.Second))
	})
	var ack []byte
	for {
		_, msg, err := wsread.Message(conn, r.cfg.MaxFrame)
		if err != nil {
			if !websocket.IsCloseError(err, websocket.CloseNormalClosure, websocket.CloseGoingAway) && ctx.Err() == nil {
				log.Info("receiver: connection ended", "err", err)
			}
			return
		}
		_ = conn.SetReadDeadline(time.Now().Add(idle))
		var last uint64
		f, a, err := wire.ParseFromGateway(msg, r.cfg.MaxBatch)
		switch {
		case err != nil:
			r.bad.Add(1)
		case a != nil:
			r.answer(rc, *a)
			continue
		default:
			if last, err = r.ingestBatch(f); err == nil && rc.gateway == "" {
				r.attach(rc, f.Gateway) // a gateway that sent no header
			}
		}
		if errors.Is(err, errStore) {
			log.Warn("receiver: batch not stored, not acked; closing (the gateway resends)", "err", err)
			rc.wmu.Lock()
			_ = conn.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(websocket.CloseTryAgainLater, "database unavailable"), time.Now().Add(time.Second))
			rc.wmu.Unlock()
			return
		}
		if err != nil {
			log.Warn("receiver: bad frame; closing", "err", err)
			rc.wmu.Lock()
			_ = conn.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(websocket.CloseInvalidFramePayloadData, "bad frame"), time.Now().Add(time.Second))
			rc.wmu.Unlock()
			return
		}
		ack = wire.AppendAck(ack[:0], last)
		rc.wmu.Lock()
		_ = conn.SetWriteDeadline(time.Now().Add(10 * time.Second))
		err = conn.WriteMessage(websocket.TextMessage, ack)
		rc.wmu.Unlock()
		if err != nil {
			return
		}
	}
}

// attach makes rc the connection of gateway for Write (the latest wins).
func (r *Receiver) attach(rc *rconn, gateway string) {
	r.smu.Lock()
	rc.gateway = gateway
	r.sessions[gateway] = rc
	r.smu.Unlock()
	r.recordConnect(gateway, rc.remote)
}

// answer hands a write answer to the Write waiting for its id.
func (r *Receiver) answer(rc *rconn, a wire.WriteAnswer) {
	r.smu.Lock()
	ch := rc.pending[a.ID]
	delete(rc.pending, a.ID)
	r.smu.Unlock()
	if ch == nil {
		r.unknownAnswers.Add(1)
		r.log.Warn("receiver: write answer nobody waits for", "id", a.ID, "gateway", rc.gateway)
		return
	}
	r.answers.Add(1)
	ch <- a // buffered, one answer per id
}

// Connected returns the ids of the gateways connected now (sorted), the
// ones Write can reach.
func (r *Receiver) Connected() []string {
	r.smu.Lock()
	ids := make([]string, 0, len(r.sessions))
	for id := range r.sessions {
		ids = append(ids, id)
	}
	r.smu.Unlock()
	slices.Sort(ids)
	return ids
}

// ErrNotConnected is returned by Write for a gateway with no connection.
var ErrNotConnected = errors.New("receiver: gateway not connected")

// Write sends a write command to a connected gateway over its uplink and
// waits for the answer, until ctx ends:
//
//	{"type":"write","id":"7","device":"boiler-plc","tag":"setpoint","value":42.5}
//
// The error is non-nil only when no answer came (not connected, the
// connection closed, ctx); a write the gateway refused or that failed is an
// answer with OK false, Kind and Error. The gateway is known by the
// Edgegw-Gateway header of its handshake, or else by its first batch.
func (r *Receiver) Write(ctx context.Context, gateway, device, tag string, value float64) (wire.WriteAnswer, error) {
	if math.IsInf(value, 0) || math.IsNaN(value) {
		return wire.WriteAnswer{}, fmt.Errorf("receiver: write %s/%s: value %v is not finite", device, tag, value)
	}
	r.smu.Lock()
	rc := r.sessions[gateway]
	if rc == nil {
		r.smu.Unlock()
		return wire.WriteAnswer{}, r.notHere(ctx, gateway)
	}
	id := strconv.FormatUint(r.nextID.Add(1), 10)
	ch := make(chan wire.WriteAnswer, 1)
	rc.pending[id] = ch
	r.smu.Unlock()
	defer func() {
		r.smu.Lock()
		delete(rc.pending, id)
		r.smu.Unlock()
	}()
	frame := wire.AppendWriteCommand(nil, id, device, tag, value)
	rc.wmu.Lock()
	_ = rc.c.SetWriteDeadline(time.Now().Add(10 * time.Second))
	err := rc.c.WriteMessage(websocket.TextMessage, frame)
	rc.wmu.Unlock()
	if err != nil {
		return wire.WriteAnswer{}, fmt.Errorf("receiver: write to %q: %w", gateway, err)
	}
	select {
	case a := <-ch:
		return a, nil
	case <-rc.done:
		return wire.WriteAnswer{}, fmt.Errorf("receiver: write to %q: connection closed before the answer", gateway)
	case <-ctx.Done():
		return wire.WriteAnswer{}, fmt.Errorf("receiver: write to %q: %w", gateway, ctx.Err())
	}
}

// Ingest takes one batch frame: new samples are written to Out (one Write
// per batch, before the caller acks), duplicates are counted and skipped.
// It returns the seq to acknowledge.
func (r *Receiver) Ingest(frame []byte) (last uint64, err error) {
	f, err := wire.ParseBatch(frame, r.cfg.MaxBatch)
	if err != nil {
		r.bad.Add(1)
		return 0, err
	}
	return r.ingestBatch(f)
}

func (r *Receiver) ingestBatch(f *wire.Batch) (last uint64, err error) {
	if r.db != nil {
		return r.storeBatch(f)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	g := r.state(f.Gateway)
	saved := g.clone() // restored if the samples cannot be written: nothing acked, nothing marked seen
	d, isNew := g.epochOrNew(f.Epoch, r.cfg.MaxPending)
	if isNew {
		r.epochs.Add(1)
		if g.Current != f.Epoch {
			r.log.Info("receiver: new epoch", "gateway", f.Gateway, "old_epoch", g.Current, "new_epoch", f.Epoch, "first", f.First)
		}
		g.Current = f.Epoch
	}
	gw, _ := json.Marshal(f.Gateway)
	r.line = r.line[:0]
	var fresh, dup, gaps, gapSamples uint64
	gapped := func(gap wire.Range) {
		if gap.Last == 0 {
			return
		}
		gaps++
		gapSamples += gap.Last - gap.First + 1
		r.log.Warn("receiver: gap in sequence", "gateway", f.Gateway, "epoch", f.Epoch, "first", gap.First, "last", gap.Last, "missing", gap.Last-gap.First+1)
	}
	var losses, lostSamples uint64
	cur := d
	lose := func(d *dedup, epoch string, l wire.Loss) {
		n, gap := d.lose(l.First, l.Last, l.Reason)
		if d == cur {
			gapped(gap) // a hole below the loss, in an older epoch, is not this batch's to tell
		}
		if n > 0 {
			losses++
			lostSamples += n
			r.log.Warn("receiver: samples lost at the gateway", "gateway", f.Gateway, "epoch", epoch, "first", l.First, "last", l.Last,
				"lost", n, "reason", l.Reason)
		}
	}
	// Losses of another (older) epoch first: their seqs lie below the batch's.
	for _, l := range f.Loss {
		if l.Epoch != f.Epoch {
			od, _ := g.epochOrNew(l.Epoch, r.cfg.MaxPending)
			lose(od, l.Epoch, l)
		}
	}
	if g.epoch(f.Epoch) == nil { // the batch's epoch stays the most recently used
		g.Epochs = append(g.Epochs, d)
	}
	si, li := 0, 0
	for i := range f.Samples {
		s := &f.Samples[i]
		for { // skips and losses are applied where they lie, in seq order
			skipDue := si < len(f.Skip) && f.Skip[si].Last < s.Seq
			lossDue := li < len(f.Loss) && f.Loss[li].Last < s.Seq
			if skipDue && (!lossDue || f.Skip[si].First <= f.Loss[li].First) {
				k := f.Skip[si]
				gapped(d.skip(k.First, k.Last))
				r.log.Info("receiver: restart skip (numbers never given to a sample)", "gateway", f.Gateway, "epoch", f.Epoch, "first", k.First, "last", k.Last)
				si++
			} else if lossDue {
				if f.Loss[li].Epoch == f.Epoch {
					lose(d, f.Epoch, f.Loss[li])
				}
				li++
			} else {
				break
			}
		}
		isNew, gap := d.add(s.Seq)
		gapped(gap)
		if !isNew {
			dup++
			continue
		}
		fresh++
		r.line = wire.AppendStored(r.line, gw, f.Epoch, s)
	}
	if len(r.line) > 0 {
		if _, err := r.cfg.Out.Write(r.line); err != nil {
			r.gws[f.Gateway] = saved
			return 0, fmt.Errorf("receiver: write: %w", err) // not acked: the gateway resends
		}
	}
	if r.cfg.StateDir != "" && fresh > 0 {
		if err := r.saveState(g); err != nil {
			// The samples are written; not acking would write them again.
			r.log.Error("receiver: dedup state not saved (a restart may write duplicates)", "gateway", f.Gateway, "err", err)
		}
	}
	r.batches.Add(1)
	r.samples.Add(fresh)
	r.dups.Add(dup)
	r.gaps.Add(gaps)
	r.gapSamples.Add(gapSamples)
	r.losses.Add(losses)
	r.lostSamples.Add(lostSamples)
	return f.Last, nil
}

// Stats returns the receiver's counters.
func (r *Receiver) Stats() Stats {
	r.mu.Lock()
	n := len(r.gws)
	r.mu.Unlock()
	return Stats{
		Connections: r.connections.Load(), Refused: r.refused.Load(),
		Batches: r.batches.Load(), Samples: r.samples.Load(), Duplicates: r.dups.Load(),
		Gaps: r.gaps.Load(), GapSamples: r.gapSamples.Load(), BadFrames: r.bad.Load(), Gateways: n,
		Losses: r.losses.Load(), LostSamples: r.lostSamples.Load(),
		Epochs:       r.epochs.Load(),
		WriteAnswers: r.answers.Load(), UnknownAnswers: r.unknownAnswers.Load(),
	}
}
