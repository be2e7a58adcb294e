package web

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"edgegw/ringstore"
	"edgegw/wire"

	"github.com/gorilla/websocket"
)

// WebSocket (GET /api/ws, text frames, one JSON object each): the messages
// are wire's (AppendWSSnapshot, AppendWSSamples, ParseResume; layouts in
// package wire's comment): a snapshot first, then one "samples" message per
// ring batch (several when the hub lags); a client sends {"lastSequence":N}
// to resume after a reconnect and gets the samples > N still in the ring
// in "samples" messages of at most WSChunk samples (none if nothing is
// missing), each encoded once the one before is written, or, when N fell
// out of the ring or is ahead of the gateway, a snapshot with "reset":true.
//
// After the first frame, the samples a client receives are in seq order with
// no gap and no duplicate (a reset snapshot is the only declared gap).
// A malformed client message closes the connection with 1007 and a reason,
// one over WSReadLimit with 1009 (both counted);
// a client whose queue fills is closed with 1008 "too slow", one that
// answers no ping within 2 pings + WSWriteTimeout with 1008 "no pong", one
// whose next message of its own (a snapshot, a resume chunk) would take the
// bytes queued to all clients past WSQueueBudget with 1013 "server busy:
// queue budget"; those, and a write that times out, are counted as dropped
// by reason and logged with the client's address; shutdown closes with 1001.
//
// Memory: the hub's frames are encoded once and shared (PreparedMessage);
// a client's queue holds only frames of the last WSQueue broadcasts. What a
// writer encodes for its client alone lives in a pooled buffer for as long
// as its write lasts, counted against WSQueueBudget: an idle client holds
// no buffer, a slow one at most one message. Gorilla's write buffer comes
// from a pool for the length of a write; the read buffer is wsReadBuffer
// (a client sends a resume now and then, pongs and a close). A connection
// is served by its writer and its reader goroutine only (gorilla needs a
// reader besides the writer); the HTTP handler returns after the handshake
// with its request, response and bufio buffers.

// wsReadBuffer is gorilla's read buffer per connection: a client message
// longer than it (at most WSReadLimit) is read in several pieces.
const wsReadBuffer = 256

// frame is one hub batch, encoded once for every client. Immutable.
// A gap frame (no samples) says the hub skipped ahead to last.
type frame struct {
	gap         bool
	first, last uint64
	samples     []ringstore.Sample // for the rare client that needs only a part of it
	pm          *websocket.PreparedMessage
}

// wsClient is one WebSocket connection as the hub sees it.
type wsClient struct {
	conn      *websocket.Conn
	queue     chan *frame
	resume    chan uint64   // latest {"lastSequence":N}, capacity 1
	gone      chan struct{} // closed by the hub when it drops the client
	closeSent atomic.Bool   // a close frame went out (only one may)
	readErr   error         // why the reader ended (set before it exits)
}

// hub fans each frame out to every client's bounded queue.
type hub struct {
	mu       sync.Mutex
	clients  map[*wsClient]struct{}
	joined   chan struct{}          // closed (and replaced) when a client joins an empty hub
	joinedAt uint64                 // the ring's sequence before that client's snapshot
	woken    atomic.Pointer[func()] // tests: run when the hub wakes for a joined client
}

// add adds c, whose snapshot is not taken yet; seq is the ring's last
// sequence now. A client joining an empty hub sets where the hub goes on
// from: every sample after seq comes in the hub's frames (the ones the
// snapshot already holds are skipped by the writer), however late the hub
// goroutine wakes.
func (h *hub) add(c *wsClient, seq uint64) {
	h.mu.Lock()
	if len(h.clients) == 0 {
		h.joinedAt = seq
		if h.joined != nil {
			close(h.joined)
			h.joined = make(chan struct{})
		}
	}
	h.clients[c] = struct{}{}
	h.mu.Unlock()
}

// start returns where the hub goes on from after waking for a joined client.
func (h *hub) start() uint64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.joinedAt
}

// idle returns a channel closed when the first client joins, or nil when
// there are clients.
func (h *hub) idle() <-chan struct{} {
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.clients) > 0 {
		return nil
	}
	if h.joined == nil {
		h.joined = make(chan struct{})
	}
	return h.joined
}

func (h *hub) remove(c *wsClient) {
	h.mu.Lock()
	delete(h.clients, c)
	h.mu.Unlock()
}

func (h *hub) count() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.clients)
}

// broadcast offers f to every client without blocking; a client whose queue
// is full is dropped (removed, its gone channel closed, its pending write cut
// short); its handler counts and logs it. It returns the number dropped.
func (h *hub) broadcast(f *frame) (dropped int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for c := range h.clients {
		select {
		case c.queue <- f:
		default:
			delete(h.clients, c)
			close(c.gone)
			// Cut a write stuck on a full socket buffer now rather than
			// after WSWriteTimeout. net.Conn deadlines are goroutine-safe.
			_ = c.conn.NetConn().SetWriteDeadline(time.Now())
			dropped++
		}
	}
	return dropped
}

// runHub is the one goroutine that waits on the ring: each new batch is
// encoded once into a PreparedMessage and offered to every client.
func (s *Server) runHub(ctx context.Context) {
	last := s.cfg.Ring.Snapshot().Seq
	for {
		if joined := s.hub.idle(); joined != nil {
			// No client: do not wake on every poll. The first client to
			// join says where to go on from (add): the ring's sequence
			// before its snapshot, not after the hub wakes, which may be
			// after the next batch.
			select {
			case <-joined:
				if f := s.hub.woken.Load(); f != nil {
					(*f)()
				}
				last = s.hub.start()
			case <-ctx.Done():
				return
			}
		}
		res := s.cfg.Ring.Since(last, nil) // a fresh slice: frames are immutable once sent
		switch {
		case res.Reset:
			// The hub fell more than a ring behind (or the ring went back):
			// skip ahead and tell every client's writer, which catches up
			// from the ring on its own (or sends a reset snapshot).
			last = res.Seq
			s.hub.broadcast(&frame{gap: true, last: last}) // drops are counted by each handler
			continue
		case len(res.Samples) > 0:
			last = res.Samples[len(res.Samples)-1].Seq
			if s.hub.count() > 0 {
				f, err := newFrame(res.Samples)
				if err != nil {
					s.log.Error("web: encode frame", "err", err)
					continue
				}
				s.hub.broadcast(f) // drops are counted by each handler
			}
			continue
		}
		select {
		case <-res.Wait:
		case <-ctx.Done():
			return
		}
	}
}

func newFrame(samples []ringstore.Sample) (*frame, error) {
	last := samples[len(samples)-1].Seq
	pm, err := websocket.NewPreparedMessage(websocket.TextMessage,
		wire.AppendWSSamples(make([]byte, 0, 64+len(samples)*112), last, samples))
	if err != nil {
		return nil, err
	}
	return &frame{first: samples[0].Seq, last: last, samples: samples, pm: pm}, nil
}

// handleWS upgrades the connection and returns: the connection is served by
// two goroutines of its own, its writer (serveWS) and its reader (wsRead),
// as gorilla needs (a reader for the control frames, one writer). The HTTP
// server's goroutine, with its request, response and buffered reader and
// writer, is gone once the handshake is done (a connection that stays would
// hold them, 8 KiB and more, for its lifetime). The client's method count,
// its connection slot and wsWG are released by serveWS.
func (s *Server) handleWS(w http.ResponseWriter, r *http.Request) {
	if !s.acquire(w, mWS) {
		return
	}
	handedOff := false
	defer func() {
		if !handedOff {
			s.release(mWS)
		}
	}()
	s.mu.Lock()
	if s.closing {
		s.mu.Unlock()
		w.Header().Set("Retry-After", "1")
		writeError(w, http.StatusServiceUnavailable, "shutting down")
		return
	}
	s.wsWG.Add(1)
	s.mu.Unlock()

	conn, err := s.up.Upgrade(w, r, nil)
	if err != nil {
		s.wsWG.Done()
		s.log.Debug("web: websocket upgrade refused", "remote", r.RemoteAddr, "err", err)
		return // Upgrade wrote the error reply (403 for a refused origin)
	}
	c := &wsClient{
		conn:   conn,
		queue:  make(chan *frame, s.cfg.WSQueue),
		resume: make(chan uint64, 1),
		gone:   make(chan struct{}),
	}
	handedOff = true
	go s.serveWS(c, r.RemoteAddr, s.keepSlot(r))
}

// serveWS is a WebSocket connection's writer goroutine, owned by the server
// (wsWG): it starts the reader, writes until the connection ends, closes it,
// waits for the reader and gives back what handleWS took.
func (s *Server) serveWS(c *wsClient, remote string, releaseSlot func()) {
	defer s.wsWG.Done()
	defer s.release(mWS)
	defer releaseSlot()
	conn := c.conn
	s.hub.add(c, s.cfg.Ring.Snapshot().Seq)
	readerDone := make(chan struct{})
	go func() {
		defer close(readerDone)
		s.wsRead(c)
	}()
	code, reason, werr := s.wsWrite(c, readerDone)
	s.hub.remove(c)
	if code != 0 && c.closeSent.CompareAndSwap(false, true) {
		_ = conn.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(code, reason),
			time.Now().Add(time.Second))
	}
	_ = conn.Close()
	<-readerDone
	if why, ok := slowReason(c, werr); ok {
		s.wsDrops[why].Add(1)
		s.dropLog.Log(s.log, "ws slow", "web: dropped a slow websocket client", "remote", remote, "reason", dropNames[why])
	}
}

// dropReason is why a WebSocket client that did not keep up was dropped.
type dropReason int

const (
	dropQueueFull    dropReason = iota // the hub found its queue full (1008 "too slow")
	dropWriteTimeout                   // a write blocked past WSWriteTimeout (no close frame)
	dropNoPong                         // no pong within the read deadline (1008 "no pong")
	dropBudget                         // a message for it would pass WSQueueBudget (1013)
	nDrops
)

// dropNames label edgegw_web_ws_dropped_total and /api/status.
var dropNames = [nDrops]string{dropQueueFull: "queue_full", dropWriteTimeout: "write_timeout",
	dropNoPong: "no_pong", dropBudget: "queue_budget"}

// slowReason says why a client that did not keep up was dropped, or false
// when it ended otherwise (it closed, it sent garbage, the server shut down).
// A client that stops reading fills its socket buffers and then its queue
// (the hub drops it), or blocks a write past WSWriteTimeout; one that reads
// nothing at all never answers a ping either, and its read deadline ends it
// first when the frames are small and the socket buffers large (the case
// that used to go uncounted). One that needs a message of its own (a
// snapshot, a resume's chunk) while the clients' queued bytes are at the
// budget is closed with 1013 "try again later".
func slowReason(c *wsClient, werr error) (dropReason, bool) {
	select {
	case <-c.gone:
		return dropQueueFull, true
	default:
	}
	if errors.Is(werr, errOverBudget) {
		return dropBudget, true
	}
	var ne net.Error
	if errors.As(werr, &ne) && ne.Timeout() {
		return dropWriteTimeout, true
	}
	if errors.As(c.readErr, &ne) && ne.Timeout() {
		return dropNoPong, true
	}
	return 0, false
}

var (
	// errOverBudget: a message encoded for one client would take the bytes
	// queued to all clients past WSQueueBudget.
	errOverBudget = errors.New("web: websocket queue budget exceeded")
	// errStopped: the client was dropped or the server is shutting down
	// between two chunks of a catch-up; wsWrite's loop says which.
	errStopped = errors.New("web: websocket writer stopped")
)

// wsWrite is the connection's only data writer. It keeps the client's
// cursor (the last seq it was sent) so that, whatever the hub and resumes
// do, the client receives every sample once, in order. It returns the close
// code to send (0: none, the connection failed, with the write error).
func (s *Server) wsWrite(c *wsClient, readerDone <-chan struct{}) (code int, reason string, err error) {
	ping := time.NewTicker(s.cfg.WSPingInterval)
	defer ping.Stop()
	w := &wsWriter{s: s, c: c, ping: ping.C}
	if tc := tcpOf(c.conn.NetConn()); tc != nil && s.cfg.WSSendBuffer > 0 {
		_ = tc.SetWriteBuffer(s.cfg.WSSendBuffer) // best effort: the OS's autotuning otherwise
	}
	if err := w.snapshot(false); err != nil {
		if errors.Is(err, errOverBudget) {
			return websocket.CloseTryAgainLater, "server busy: queue budget", err
		}
		return 0, "", err
	}
	for {
		// A dropped client or a shutdown wins over a full queue: without this
		// check the select could pick queued frames (each up to
		// WSWriteTimeout on a stuck socket) before noticing.
		select {
		case <-c.gone:
			return websocket.ClosePolicyViolation, "too slow", nil
		case <-s.shutdown:
			return websocket.CloseGoingAway, "server shutting down", nil
		default:
		}
		var err error
		select {
		case <-readerDone:
			var ne net.Error
			if errors.As(c.readErr, &ne) && ne.Timeout() {
				return websocket.ClosePolicyViolation, "no pong", nil
			}
			return websocket.CloseNormalClosure, "", nil
		case <-c.gone:
			return websocket.ClosePolicyViolation, "too slow", nil
		case <-s.shutdown:
			return websocket.CloseGoingAway, "server shutting down", nil
		case n := <-c.resume:
			err = w.catchUp(n, 0)
		case f := <-c.queue:
			err = w.deliver(f)
		case <-ping.C:
			err = w.pingNow()
		}
		switch {
		case err == nil:
		case errors.Is(err, errStopped):
			// the checks at the top of the loop say why
		case errors.Is(err, errOverBudget):
			return websocket.CloseTryAgainLater, "server busy: queue budget", err
		default:
			return 0, "", err // the stream may end mid-frame: no close frame after a failed write
		}
	}
}

// tcpOf is the TCP connection under c (TLS and the connection counter
// unwrapped), or nil.
func tcpOf(c net.Conn) *net.TCPConn {
	for {
		switch x := c.(type) {
		case *net.TCPConn:
			return x
		case *tls.Conn:
			c = x.NetConn()
		case *countedConn:
			c = x.Conn
		default:
			return nil
		}
	}
}

// wsWriter is the per-connection writer state (owned by one goroutine).
// It holds no buffer between messages: a message encoded for this client
// alone takes a pooled buffer for as long as its write lasts.
type wsWriter struct {
	s      *Server
	c      *wsClient
	ping   <-chan time.Time
	cursor uint64 // last seq sent to this client
}

// Pools of the buffers a writer takes for one message: the encoded bytes
// and the samples a catch-up copies out of the ring (long polls have their
// own, poll.go, whose buffers grow to a whole reply). A buffer grown past
// maxPooled (a big snapshot) is left to the collector, so what a writer
// takes, and counts against the budget, is about one message.
var (
	wsBufPool     = sync.Pool{New: func() any { b := make([]byte, 0, 16<<10); return &b }}
	wsSamplesPool = sync.Pool{New: func() any { return new([]ringstore.Sample) }}
)

const maxPooled = 64 << 10

func getBuf() *[]byte { return wsBufPool.Get().(*[]byte) }

func putBuf(p *[]byte) {
	if cap(*p) <= maxPooled {
		*p = (*p)[:0]
		wsBufPool.Put(p)
	}
}

func getSamples() *[]ringstore.Sample { return wsSamplesPool.Get().(*[]ringstore.Sample) }

func putSamples(p *[]ringstore.Sample, s []ringstore.Sample) {
	clear(s) // no strings kept alive by the pool
	*p = s[:0]
	wsSamplesPool.Put(p)
}

// send writes the message in *p (a pooled buffer, returned to the pool
// here). Its length counts as queued to clients, against WSQueueBudget,
// from before the write until it returns (the buffer it takes is at most
// maxPooled larger). A message alone in the budget is
// always sent, so one larger than the budget does not lock every client out.
func (w *wsWriter) send(p *[]byte) error {
	defer putBuf(p)
	n := int64(len(*p))
	q := &w.s.wsQueued
	defer q.Add(-n)
	if total := q.Add(n); total > w.s.cfg.WSQueueBudget && total != n {
		return errOverBudget
	}
	if err := w.c.conn.SetWriteDeadline(time.Now().Add(w.s.cfg.WSWriteTimeout)); err != nil {
		return err
	}
	if err := w.c.conn.WriteMessage(websocket.TextMessage, *p); err != nil {
		return err
	}
	w.s.wsFrames.Add(1)
	return nil
}

func (w *wsWriter) pingNow() error {
	return w.c.conn.WriteControl(websocket.PingMessage, nil, time.Now().Add(w.s.cfg.WSWriteTimeout))
}

// snapshot sends the ring's latest values (reset: in answer to a resume the
// ring could not serve) and moves the cursor to its seq.
func (w *wsWriter) snapshot(reset bool) error {
	snap := w.s.cfg.Ring.Snapshot()
	p := getBuf()
	*p = wire.AppendWSSnapshot((*p)[:0], snap.Seq, snap.Epoch, reset, snap.Latest)
	if err := w.send(p); err != nil {
		return err
	}
	w.cursor = snap.Seq
	return nil
}

// deliver sends the part of f the client has not had, catching up from the
// ring first when f starts after a gap.
func (w *wsWriter) deliver(f *frame) error {
	if f.last <= w.cursor {
		return nil // already sent (a catch-up got ahead of the hub)
	}
	if f.gap {
		return w.catchUp(w.cursor, 0)
	}
	if f.first > w.cursor+1 {
		if err := w.catchUp(w.cursor, f.first); err != nil {
			return err
		}
		if f.last <= w.cursor {
			return nil
		}
	}
	if f.first > w.cursor {
		if err := w.c.conn.SetWriteDeadline(time.Now().Add(w.s.cfg.WSWriteTimeout)); err != nil {
			return err
		}
		if err := w.c.conn.WritePreparedMessage(f.pm); err != nil {
			return err
		}
		w.s.wsFrames.Add(1)
		w.cursor = f.last
		return nil
	}
	// Partly sent already: encode the rest for this client alone.
	i := 0
	for i < len(f.samples) && f.samples[i].Seq <= w.cursor {
		i++
	}
	p := getBuf()
	*p = wire.AppendWSSamples((*p)[:0], f.last, f.samples[i:])
	if err := w.send(p); err != nil {
		return err
	}
	w.cursor = f.last
	return nil
}

// catchUp sends the samples after `after` from the ring (below `before` when
// before > 0, else up to the ring's newest, which it chases while it
// grows) or, when after is no longer in the ring or is ahead of it, a reset
// snapshot. It sends them in messages of at most WSChunk samples, each
// copied out of the ring and encoded only once the previous one is written,
// so a slow reader holds one chunk, never the whole tail. Between chunks
// it answers the ping ticker and stops (errStopped) when the client was
// dropped or the server shuts down. It sets the cursor to what was sent.
func (w *wsWriter) catchUp(after, before uint64) error {
	chunk := w.s.cfg.WSChunk
	for {
		select {
		case <-w.c.gone:
			return errStopped
		case <-w.s.shutdown:
			return errStopped
		case <-w.ping:
			if err := w.pingNow(); err != nil {
				return err
			}
		default:
		}
		sp := getSamples()
		res := w.s.cfg.Ring.SinceN(after, chunk, (*sp)[:0])
		if res.Reset {
			putSamples(sp, res.Samples)
			return w.snapshot(true)
		}
		samples := res.Samples
		more := len(samples) == chunk // the ring may hold more after these
		if before > 0 {
			n := len(samples)
			for n > 0 && samples[n-1].Seq >= before {
				n--
			}
			if n < len(samples) {
				more = false
			}
			samples = samples[:n]
		}
		if len(samples) == 0 {
			putSamples(sp, res.Samples)
			w.cursor = res.Seq // nothing newer than after
			if before > 0 {
				w.cursor = max(after, before-1) // nothing in the ring between after and before
			}
			return nil
		}
		last := samples[len(samples)-1].Seq
		p := getBuf()
		*p = wire.AppendWSSamples((*p)[:0], last, samples)
		putSamples(sp, res.Samples) // before the write, which may block
		if err := w.send(p); err != nil {
			return err
		}
		w.cursor, after = last, last
		if !more {
			return nil
		}
	}
}

// wsRead is the connection's reader: control frames, deadlines, resumes.
func (s *Server) wsRead(c *wsClient) {
	conn := c.conn
	conn.SetReadLimit(s.cfg.WSReadLimit)
	wait := 2*s.cfg.WSPingInterval + s.cfg.WSWriteTimeout
	_ = conn.SetReadDeadline(time.Now().Add(wait))
	conn.SetPongHandler(func(string) error { return conn.SetReadDeadline(time.Now().Add(wait)) })
	for {
		_, data, err := conn.ReadMessage()
		if err != nil {
			c.readErr = err
			var ce *websocket.CloseError
			switch {
			case errors.As(err, &ce):
				c.closeSent.Store(true) // gorilla's close handler answered it
			case errors.Is(err, websocket.ErrReadLimit):
				// gorilla sent 1009 "message too big" itself
				c.closeSent.Store(true)
				s.wsBad.Add(1)
				s.rlog.Log(s.log, "ws bad", "web: websocket client closed: message over the read limit",
					"remote", conn.RemoteAddr().String(), "limit", s.cfg.WSReadLimit)
			}
			return
		}
		_ = conn.SetReadDeadline(time.Now().Add(wait))
		n, msg := wire.ParseResume(data)
		if msg != "" {
			s.wsBad.Add(1)
			s.rlog.Log(s.log, "ws bad", "web: websocket client closed: "+msg, "remote", conn.RemoteAddr().String())
			if c.closeSent.CompareAndSwap(false, true) {
				_ = conn.WriteControl(websocket.CloseMessage,
					websocket.FormatCloseMessage(websocket.CloseInvalidFramePayloadData, msg),
					time.Now().Add(time.Second))
			}
			return
		}
		for { // latest resume wins
			select {
			case c.resume <- n:
			default:
				select {
				case <-c.resume:
				default:
				}
				continue
			}
			break
		}
	}
}
