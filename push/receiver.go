package push

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
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorilla/websocket"
)

// ReceiverConfig configures the reference receiver.
type ReceiverConfig struct {
	Listen string    // "127.0.0.1:0" by default
	Token  string    // bearer token gateways must send; "" = no check
	Out    io.Writer // one JSON line per new sample; nil = discard
	Logger *slog.Logger
	// MaxPending bounds the out-of-order seqs remembered per gateway before
	// the oldest hole is declared a gap (4096).
	MaxPending int
	// MaxBatch is the most samples one batch may hold (DefaultMaxBatch); a
	// bigger one is a bad frame, counted before anything is decoded.
	MaxBatch int
	// MaxFrame is the most bytes of one WebSocket message (4 MiB).
	MaxFrame int64
}

// ReceiverStats are the receiver's counters.
type ReceiverStats struct {
	Connections, Refused uint64 // WebSocket connections accepted; handshakes refused (401)
	Batches, Samples     uint64 // batches acked; new samples written
	Duplicates           uint64 // samples received again and not written
	Gaps, GapSamples     uint64 // holes seen in a gateway's seq, and their size
	BadFrames            uint64
	Gateways             int
	WriteAnswers         uint64 // answers to Receiver.Write received
	UnknownAnswers       uint64 // answers nobody waited for (late, or an unknown id)
}

// Receiver is the reference upstream receiver: it accepts gateways over
// WebSocket at /ingest, acks every batch after writing it, dedups by
// (gateway, seq) and writes each new sample as a JSON line:
//
//	{"gateway":"gw-01","seq":42,"device":"logger-01","tag":"temperature","value":21.5,"quality":"good","ts":1764450000123456}
//
// Ingest takes a batch frame from elsewhere (an MQTT subscriber of
// <prefix>/batch) with the same dedup and output.
type Receiver struct {
	cfg ReceiverConfig
	log *slog.Logger
	up  websocket.Upgrader

	mu    sync.Mutex // dedup state, Out, listener
	gws   map[string]*dedup
	ln    net.Listener
	conns map[*websocket.Conn]struct{}
	line  []byte

	smu      sync.Mutex        // sessions, and every rconn's gateway and pending
	sessions map[string]*rconn // gateway id -> its latest connection
	nextID   atomic.Uint64

	connections, refused, batches, samples, dups, gaps, gapSamples, bad atomic.Uint64
	answers, unknownAnswers                                             atomic.Uint64
}

// rconn is one gateway connection of the receiver.
type rconn struct {
	c       *websocket.Conn
	wmu     sync.Mutex // one writer at a time: acks (the handler) and write commands (Write)
	done    chan struct{}
	gateway string                      // under Receiver.smu
	pending map[string]chan WriteAnswer // under Receiver.smu
}

// NewReceiver returns a receiver; it listens on Listen or Serve.
// A receiver serves one Serve at a time.
func NewReceiver(cfg ReceiverConfig) *Receiver {
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
		cfg.MaxBatch = DefaultMaxBatch
	}
	if cfg.MaxFrame <= 0 {
		cfg.MaxFrame = 4 << 20
	}
	return &Receiver{cfg: cfg, log: cfg.Logger, gws: make(map[string]*dedup), conns: make(map[*websocket.Conn]struct{}),
		sessions: make(map[string]*rconn),
		up:       websocket.Upgrader{ReadBufferSize: 64 << 10, WriteBufferSize: 4 << 10}}
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
		return nil, fmt.Errorf("push: receiver: %w", err)
	}
	r.ln = ln
	r.cfg.Listen = ln.Addr().String() // a later Listen binds the same port
	return ln.Addr(), nil
}

// Serve serves /ingest until ctx ends, then closes every connection and
// returns after their handlers have exited.
func (r *Receiver) Serve(ctx context.Context) error {
	if _, err := r.Listen(); err != nil {
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
		r.log.Warn("push: receiver: refused a gateway: wrong or missing token", "remote", req.RemoteAddr)
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
	r.connections.Add(1)
	rc := &rconn{c: conn, done: make(chan struct{}), pending: make(map[string]chan WriteAnswer)}
	if gw := req.Header.Get(gatewayHeader); validName(gw) {
		r.attach(rc, gw)
	}
	defer func() {
		close(rc.done)
		r.smu.Lock()
		if r.sessions[rc.gateway] == rc {
			delete(r.sessions, rc.gateway)
		}
		r.smu.Unlock()
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
		_, msg, err := conn.ReadMessage()
		if err != nil {
			if !websocket.IsCloseError(err, websocket.CloseNormalClosure, websocket.CloseGoingAway) && ctx.Err() == nil {
				log.Info("push: receiver: connection ended", "err", err)
			}
			return
		}
		_ = conn.SetReadDeadline(time.Now().Add(idle))
		var in inFrame
		var last uint64
		if err = json.Unmarshal(msg, &in); err != nil {
			r.bad.Add(1)
			err = &ProtocolError{"batch", err.Error()}
		} else if in.Type == "write_result" {
			r.answer(rc, in.WriteAnswer)
			continue
		} else {
			var f *batchFrame
			if f, err = in.batch(r.cfg.MaxBatch); err != nil {
				r.bad.Add(1)
			} else if last, err = r.ingestBatch(f); err == nil && rc.gateway == "" {
				r.attach(rc, f.Gateway) // a gateway that sent no header
			}
		}
		if err != nil {
			log.Warn("push: receiver: bad frame; closing", "err", err)
			rc.wmu.Lock()
			_ = conn.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(websocket.CloseInvalidFramePayloadData, "bad frame"), time.Now().Add(time.Second))
			rc.wmu.Unlock()
			return
		}
		ack = appendAck(ack[:0], last)
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
}

// answer hands a write answer to the Write waiting for its id.
func (r *Receiver) answer(rc *rconn, a WriteAnswer) {
	r.smu.Lock()
	ch := rc.pending[a.ID]
	delete(rc.pending, a.ID)
	r.smu.Unlock()
	if ch == nil {
		r.unknownAnswers.Add(1)
		r.log.Warn("push: receiver: write answer nobody waits for", "id", a.ID, "gateway", rc.gateway)
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
var ErrNotConnected = errors.New("push: receiver: gateway not connected")

// Write sends a write command to a connected gateway over its uplink and
// waits for the answer, until ctx ends:
//
//	{"type":"write","id":"7","device":"boiler-plc","tag":"setpoint","value":42.5}
//
// The error is non-nil only when no answer came (not connected, the
// connection closed, ctx); a write the gateway refused or that failed is an
// answer with OK false, Kind and Error. The gateway is known by the
// Edgegw-Gateway header of its handshake, or else by its first batch.
func (r *Receiver) Write(ctx context.Context, gateway, device, tag string, value float64) (WriteAnswer, error) {
	if math.IsInf(value, 0) || math.IsNaN(value) {
		return WriteAnswer{}, fmt.Errorf("push: receiver: write %s/%s: value %v is not finite", device, tag, value)
	}
	r.smu.Lock()
	rc := r.sessions[gateway]
	if rc == nil {
		r.smu.Unlock()
		return WriteAnswer{}, fmt.Errorf("push: receiver: write to %q: %w", gateway, ErrNotConnected)
	}
	id := strconv.FormatUint(r.nextID.Add(1), 10)
	ch := make(chan WriteAnswer, 1)
	rc.pending[id] = ch
	r.smu.Unlock()
	defer func() {
		r.smu.Lock()
		delete(rc.pending, id)
		r.smu.Unlock()
	}()
	frame := appendWriteCommand(nil, id, device, tag, value)
	rc.wmu.Lock()
	_ = rc.c.SetWriteDeadline(time.Now().Add(10 * time.Second))
	err := rc.c.WriteMessage(websocket.TextMessage, frame)
	rc.wmu.Unlock()
	if err != nil {
		return WriteAnswer{}, fmt.Errorf("push: receiver: write to %q: %w", gateway, err)
	}
	select {
	case a := <-ch:
		return a, nil
	case <-rc.done:
		return WriteAnswer{}, fmt.Errorf("push: receiver: write to %q: connection closed before the answer", gateway)
	case <-ctx.Done():
		return WriteAnswer{}, fmt.Errorf("push: receiver: write to %q: %w", gateway, ctx.Err())
	}
}

// Ingest takes one batch frame: new samples are written to Out (one Write
// per batch, before the caller acks), duplicates are counted and skipped.
// It returns the seq to acknowledge.
func (r *Receiver) Ingest(frame []byte) (last uint64, err error) {
	f, err := parseBatchMax(frame, r.cfg.MaxBatch)
	if err != nil {
		r.bad.Add(1)
		return 0, err
	}
	return r.ingestBatch(f)
}

func (r *Receiver) ingestBatch(f *batchFrame) (last uint64, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	d := r.gws[f.Gateway]
	if d == nil {
		d = &dedup{above: make(map[uint64]struct{}), max: r.cfg.MaxPending}
		r.gws[f.Gateway] = d
	}
	gw, _ := json.Marshal(f.Gateway)
	r.line = r.line[:0]
	var fresh, dup uint64
	for i := range f.Samples {
		s := &f.Samples[i]
		isNew, gap := d.add(s.Seq)
		if gap.Last != 0 {
			r.gaps.Add(1)
			r.gapSamples.Add(gap.Last - gap.First + 1)
			r.log.Warn("push: receiver: gap in sequence", "gateway", f.Gateway, "first", gap.First, "last", gap.Last, "missing", gap.Last-gap.First+1)
		}
		if !isNew {
			dup++
			continue
		}
		fresh++
		r.line = append(r.line, `{"gateway":`...)
		r.line = append(r.line, gw...)
		r.line = append(r.line, ',')
		j := len(r.line)
		r.line = s.AppendJSON(r.line)
		r.line = append(r.line[:j], r.line[j+1:]...) // drop the sample's own '{'
		r.line = append(r.line, '\n')
	}
	if len(r.line) > 0 {
		if _, err := r.cfg.Out.Write(r.line); err != nil {
			return 0, fmt.Errorf("push: receiver: write: %w", err) // not acked: the gateway resends
		}
	}
	r.batches.Add(1)
	r.samples.Add(fresh)
	r.dups.Add(dup)
	return f.Last, nil
}

// Stats returns the receiver's counters.
func (r *Receiver) Stats() ReceiverStats {
	r.mu.Lock()
	n := len(r.gws)
	r.mu.Unlock()
	return ReceiverStats{
		Connections: r.connections.Load(), Refused: r.refused.Load(),
		Batches: r.batches.Load(), Samples: r.samples.Load(), Duplicates: r.dups.Load(),
		Gaps: r.gaps.Load(), GapSamples: r.gapSamples.Load(), BadFrames: r.bad.Load(), Gateways: n,
		WriteAnswers: r.answers.Load(), UnknownAnswers: r.unknownAnswers.Load(),
	}
}

type seqRange struct{ First, Last uint64 }

// dedup is one gateway's record of seqs seen: everything <= hwm, plus the
// set of seqs above it (out of order, or after a hole). When the set grows
// beyond max, the oldest hole is given up: hwm jumps over it.
type dedup struct {
	started bool
	hwm     uint64 // every seq <= hwm has been seen (or given up)
	top     uint64 // highest seq seen
	above   map[uint64]struct{}
	max     int
}

// add records seq and reports whether it is new, and the hole it opens
// above the highest seq seen so far (zero range if none).
func (d *dedup) add(seq uint64) (isNew bool, gap seqRange) {
	if !d.started { // the first seq (0 included: no seq-1 underflow)
		d.started, d.hwm, d.top = true, seq, seq
		return true, gap
	}
	if seq <= d.hwm {
		return false, gap
	}
	if _, ok := d.above[seq]; ok {
		return false, gap
	}
	if seq > d.top+1 {
		gap = seqRange{d.top + 1, seq - 1}
	}
	d.top = max(d.top, seq)
	if seq != d.hwm+1 {
		d.above[seq] = struct{}{}
		if len(d.above) <= d.max {
			return true, gap
		}
		low := seq
		for s := range d.above {
			low = min(low, s)
		}
		d.hwm = low - 1 // give up the hole below the lowest pending seq
	}
	for {
		if _, ok := d.above[d.hwm+1]; ok {
			delete(d.above, d.hwm+1)
			d.hwm++
			continue
		}
		if d.hwm+1 == seq {
			d.hwm = seq
			continue
		}
		break
	}
	return true, gap
}
