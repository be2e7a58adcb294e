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
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"sort"
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
	// MaxPending bounds the seq ranges remembered above the high-water
	// mark of a (gateway, epoch) before the oldest hole is given up (4096).
	MaxPending int
	// StateDir keeps each gateway's dedup state (file <gateway>.json:
	// epochs, high-water mark, ranges above it), saved after every batch
	// that wrote samples, before its ack, so a restart of the receiver
	// neither writes duplicates nor loses anything. "" = memory only.
	StateDir string
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
	Gaps, GapSamples     uint64 // holes seen in a gateway's seq (within one epoch), and their size
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
	cfg ReceiverConfig
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
	answers, unknownAnswers                                                     atomic.Uint64
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
	return &Receiver{cfg: cfg, log: cfg.Logger, gws: make(map[string]*gwState), conns: make(map[*websocket.Conn]struct{}),
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

// maxEpochs is how many epochs of one gateway the receiver remembers: the
// current one and a few before it, for late copies (MQTT redeliveries).
const maxEpochs = 4

// gwState is the dedup state of one gateway: a record per recent epoch.
// It is what the state file holds (JSON).
type gwState struct {
	Gateway string   `json:"gateway"`
	Current string   `json:"current"` // the newest epoch seen
	Epochs  []*dedup `json:"epochs"`  // most recently used last
}

func (g *gwState) epoch(e string) *dedup {
	for i, d := range g.Epochs {
		if d.Epoch == e {
			copy(g.Epochs[i:], g.Epochs[i+1:])
			g.Epochs[len(g.Epochs)-1] = d
			return d
		}
	}
	return nil
}

func (g *gwState) clone() *gwState {
	c := &gwState{Gateway: g.Gateway, Current: g.Current, Epochs: make([]*dedup, len(g.Epochs))}
	for i, d := range g.Epochs {
		dd := *d
		dd.Above = slices.Clone(d.Above)
		c.Epochs[i] = &dd
	}
	return c
}

// state returns the gateway's dedup state, loaded from its file the first
// time when StateDir is set. r.mu held.
func (r *Receiver) state(gateway string) *gwState {
	if g := r.gws[gateway]; g != nil {
		return g
	}
	g := &gwState{Gateway: gateway}
	if r.cfg.StateDir != "" {
		path := r.statePath(gateway)
		b, err := os.ReadFile(path)
		switch {
		case err == nil:
			var l gwState
			if err := json.Unmarshal(b, &l); err != nil || l.Gateway != gateway {
				r.log.Error("push: receiver: dedup state unreadable; starting afresh (duplicates possible)", "file", path, "err", err)
			} else {
				g = &l
				r.log.Info("push: receiver: dedup state loaded", "gateway", gateway, "epoch", g.Current, "file", path)
			}
		case !os.IsNotExist(err):
			r.log.Error("push: receiver: dedup state unreadable; starting afresh (duplicates possible)", "file", path, "err", err)
		}
	}
	for _, d := range g.Epochs {
		d.max = r.cfg.MaxPending
	}
	r.gws[gateway] = g
	return g
}

// statePath is <StateDir>/<gateway, path-escaped>.json.
func (r *Receiver) statePath(gateway string) string {
	return filepath.Join(r.cfg.StateDir, url.PathEscape(gateway)+".json")
}

// saveState replaces the gateway's state file (temporary file, rename).
func (r *Receiver) saveState(g *gwState) error {
	b, err := json.Marshal(g)
	if err != nil {
		return err
	}
	path := r.statePath(g.Gateway)
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, append(b, '\n'), 0o640); err != nil {
		_ = os.Remove(tmp)
		return err
	}
	return os.Rename(tmp, path)
}

func (r *Receiver) ingestBatch(f *batchFrame) (last uint64, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	g := r.state(f.Gateway)
	saved := g.clone() // restored if the samples cannot be written: nothing acked, nothing marked seen
	d := g.epoch(f.Epoch)
	if d == nil {
		d = &dedup{Epoch: f.Epoch, max: r.cfg.MaxPending}
		g.Epochs = append(g.Epochs, d)
		if len(g.Epochs) > maxEpochs {
			g.Epochs = slices.Delete(g.Epochs, 0, len(g.Epochs)-maxEpochs)
		}
		r.epochs.Add(1)
		if g.Current != f.Epoch {
			r.log.Info("push: receiver: new epoch", "gateway", f.Gateway, "old_epoch", g.Current, "new_epoch", f.Epoch, "first", f.First)
		}
		g.Current = f.Epoch
	}
	gw, _ := json.Marshal(f.Gateway)
	var epoch []byte
	if f.Epoch != "" {
		epoch = append(append([]byte(`,"epoch":"`), f.Epoch...), '"')
	}
	r.line = r.line[:0]
	var fresh, dup, gaps, gapSamples uint64
	gapped := func(gap seqRange) {
		if gap.Last == 0 {
			return
		}
		gaps++
		gapSamples += gap.Last - gap.First + 1
		r.log.Warn("push: receiver: gap in sequence", "gateway", f.Gateway, "epoch", f.Epoch, "first", gap.First, "last", gap.Last, "missing", gap.Last-gap.First+1)
	}
	si := 0
	for i := range f.Samples {
		s := &f.Samples[i]
		for si < len(f.Skip) && f.Skip[si][1] < s.Seq { // a skip is applied where it lies
			gapped(d.skip(f.Skip[si][0], f.Skip[si][1]))
			si++
		}
		isNew, gap := d.add(s.Seq)
		gapped(gap)
		if !isNew {
			dup++
			continue
		}
		fresh++
		r.line = append(r.line, `{"gateway":`...)
		r.line = append(r.line, gw...)
		r.line = append(r.line, epoch...)
		r.line = append(r.line, ',')
		j := len(r.line)
		r.line = s.AppendJSON(r.line)
		r.line = append(r.line[:j], r.line[j+1:]...) // drop the sample's own '{'
		r.line = append(r.line, '\n')
	}
	if len(r.line) > 0 {
		if _, err := r.cfg.Out.Write(r.line); err != nil {
			r.gws[f.Gateway] = saved
			return 0, fmt.Errorf("push: receiver: write: %w", err) // not acked: the gateway resends
		}
	}
	if r.cfg.StateDir != "" && fresh > 0 {
		if err := r.saveState(g); err != nil {
			// The samples are written; not acking would write them again.
			r.log.Error("push: receiver: dedup state not saved (a restart may write duplicates)", "gateway", f.Gateway, "err", err)
		}
	}
	r.batches.Add(1)
	r.samples.Add(fresh)
	r.dups.Add(dup)
	r.gaps.Add(gaps)
	r.gapSamples.Add(gapSamples)
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
		Epochs:       r.epochs.Load(),
		WriteAnswers: r.answers.Load(), UnknownAnswers: r.unknownAnswers.Load(),
	}
}

type seqRange struct{ First, Last uint64 }

// MarshalJSON writes [first,last].
func (s seqRange) MarshalJSON() ([]byte, error) {
	return fmt.Appendf(nil, "[%d,%d]", s.First, s.Last), nil
}

// UnmarshalJSON reads [first,last].
func (s *seqRange) UnmarshalJSON(b []byte) error {
	var a [2]uint64
	if err := json.Unmarshal(b, &a); err != nil {
		return err
	}
	s.First, s.Last = a[0], a[1]
	return nil
}

// dedup is the record of the seqs of one (gateway, epoch) seen: everything
// <= HWM, plus ranges above it (out of order, or after a hole). When the
// ranges grow beyond max, the oldest hole is given up: HWM jumps over it.
// Skipped ranges (never given to a sample) count as seen.
type dedup struct {
	Epoch   string     `json:"epoch"`
	Started bool       `json:"started"`
	HWM     uint64     `json:"hwm"`   // every seq <= HWM has been seen (or given up)
	Top     uint64     `json:"top"`   // highest seq seen
	Above   []seqRange `json:"above"` // sorted, disjoint, not adjacent, all above HWM+1
	max     int
}

// add records seq and reports whether it is new, and the hole it opens
// above the highest seq seen so far (zero range if none).
func (d *dedup) add(seq uint64) (isNew bool, gap seqRange) {
	if !d.Started { // the first seq (0 included: no seq-1 underflow)
		d.Started, d.HWM, d.Top = true, seq, seq
		return true, gap
	}
	if d.seen(seq) {
		return false, gap
	}
	return true, d.insert(seq, seq)
}

// skip records [a,b] as numbers never given to a sample, and reports the
// hole it opens above the highest seq seen so far (a real gap: samples
// before the skip that never came).
func (d *dedup) skip(a, b uint64) (gap seqRange) {
	if !d.Started {
		d.Started, d.HWM, d.Top = true, b, b
		return gap
	}
	a = max(a, d.HWM+1)
	if a > b {
		return gap
	}
	return d.insert(a, b)
}

func (d *dedup) seen(seq uint64) bool {
	if seq <= d.HWM {
		return true
	}
	i, _ := slices.BinarySearchFunc(d.Above, seq, func(r seqRange, s uint64) int {
		switch {
		case r.Last < s:
			return -1
		case r.First > s:
			return 1
		}
		return 0
	})
	return i < len(d.Above) && d.Above[i].First <= seq && seq <= d.Above[i].Last
}

// insert adds [a,b] (a > HWM) to the seen ranges.
func (d *dedup) insert(a, b uint64) (gap seqRange) {
	if a > d.Top+1 {
		gap = seqRange{d.Top + 1, a - 1}
	}
	d.Top = max(d.Top, b)
	// the first range that ends at or after a-1 (touching or overlapping)
	i := sort.Search(len(d.Above), func(i int) bool { return d.Above[i].Last+1 >= a })
	j := i
	for j < len(d.Above) && d.Above[j].First <= b+1 {
		a, b = min(a, d.Above[j].First), max(b, d.Above[j].Last)
		j++
	}
	d.Above = slices.Replace(d.Above, i, j, seqRange{a, b})
	d.absorb()
	for d.max > 0 && len(d.Above) > d.max {
		d.HWM = d.Above[0].Last // give up the hole below the lowest range
		d.Above = slices.Delete(d.Above, 0, 1)
		d.absorb()
	}
	return gap
}

// absorb moves the ranges that touch HWM into it.
func (d *dedup) absorb() {
	for len(d.Above) > 0 && d.Above[0].First <= d.HWM+1 {
		d.HWM = max(d.HWM, d.Above[0].Last)
		d.Above = slices.Delete(d.Above, 0, 1)
	}
}
