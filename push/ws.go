package push

import (
	"compress/flate"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"edgegw/internal/backoff"
	"edgegw/internal/wsread"
	"edgegw/wire"

	"github.com/gorilla/websocket"
)

const (
	wsReadLimit    = 64 << 10 // acks and write commands are tiny; anything big is a broken peer
	wsWriteTimeout = 10 * time.Second
)

// UnauthorizedError is the receiver refusing the gateway's token (HTTP 401
// or 403 on the WebSocket handshake). The pusher stops dialling.
type UnauthorizedError struct {
	URL    string
	Status int
}

func (e *UnauthorizedError) Error() string {
	return fmt.Sprintf("push: websocket %s: receiver refused the token (HTTP %d)", e.URL, e.Status)
}

// wsEvent tells the dispatcher about the WebSocket link.
type wsEvent struct {
	kind    int           // wsUp, wsConnected, wsDown, wsUnauthorized
	granted chan struct{} // wsUp: closed by the dispatcher once MQTT has stopped sending
}

const (
	wsUp           = iota // handshake done: the session asks for the batch stream
	wsConnected           // the session's first batch was acknowledged
	wsDown                // the session ended
	wsUnauthorized        // 401/403: no more dials
)

// wsLoop dials with backoff, asks the dispatcher for the batch stream and
// runs one session per connection. It returns when ctx ends or the token
// is refused. A session tells the dispatcher when its first batch is
// acknowledged (wsConnected): only then is the WebSocket up. After a
// session the loop waits the next backoff delay, whether or not the
// handshake had succeeded.
//
// Receivers (URLs) are tried in order: a failed dial or a session that
// ends moves to the next one (after the backoff delay, with jitter; from
// the last back to the first). Once the uplink has been away from the
// first URL for PrimaryRetry, it goes back to it: a session on another
// URL then stops taking new batches, waits (at most AckTimeout) for the
// acks of those in flight and ends, and the first URL is dialled at once;
// if it fails, the order goes on from the second. Every session starts
// from the oldest unacknowledged sample.
func (p *Pusher) wsLoop(ctx context.Context, events chan<- wsEvent) {
	w := p.cfg.WS
	// gorilla watches ctx only while connecting, not during the HTTP
	// handshake (only HandshakeTimeout bounds it): keep the socket at hand
	// so that cancelling Run interrupts a handshake at once.
	var dialMu sync.Mutex
	var dialing net.Conn
	var nd net.Dialer
	dialer := &websocket.Dialer{
		Proxy:             http.ProxyFromEnvironment,
		HandshakeTimeout:  w.HandshakeTimeout,
		TLSClientConfig:   p.tlsWS,
		ReadBufferSize:    4 << 10,
		WriteBufferSize:   64 << 10,
		EnableCompression: !w.NoCompression,
		NetDialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := nd.DialContext(ctx, network, addr)
			dialMu.Lock()
			dialing = c
			dialMu.Unlock()
			return c, err
		},
	}
	interrupt := func() {
		dialMu.Lock()
		if dialing != nil {
			_ = dialing.SetDeadline(time.Unix(1, 0))
		}
		dialMu.Unlock()
	}
	bo := backoff.Delay{Min: w.ReconnectMin, Max: w.ReconnectMax}
	connects := 0
	cur := 0                  // index into URLs of the receiver to dial
	var leftPrimary time.Time // when the uplink moved away from URLs[0]
	next := func() {
		if cur == 0 {
			leftPrimary = time.Now()
		}
		cur = (cur + 1) % len(w.URLs)
	}
	for {
		if cur != 0 && time.Since(leftPrimary) >= w.PrimaryRetry {
			cur = 0
		}
		u := w.URLs[cur]
		p.st.WSURL.Store(redact(u))
		log := p.log.With("url", redact(u))
		state := &p.wsStates[cur]
		stopWatch := context.AfterFunc(ctx, interrupt)
		conn, resp, err := dialer.DialContext(ctx, u, p.header)
		stopWatch()
		dialMu.Lock()
		dialing = nil
		dialMu.Unlock()
		if err == nil && ctx.Err() != nil {
			conn.Close()
			return
		}
		if resp != nil && resp.Body != nil {
			resp.Body.Close()
		}
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			if resp != nil && (resp.StatusCode == http.StatusUnauthorized || resp.StatusCode == http.StatusForbidden) {
				uerr := &UnauthorizedError{URL: redact(u), Status: resp.StatusCode}
				state.Set(log, slog.LevelError, "unauthorized",
					"push: websocket: receiver refused the token; not retrying (check the token file, then restart)", "err", uerr)
				send(ctx, events, wsEvent{kind: wsUnauthorized})
				return
			}
			d := bo.Next()
			p.wsFailures.Add(1)
			state.Set(log, slog.LevelWarn, failState("failed", err), "push: websocket: cannot connect",
				append(errArgs(err), "retry_in", d.Round(time.Millisecond))...)
			next()
			if !sleepCtx(ctx, d) {
				return
			}
			continue
		}
		connects++
		if connects > 1 {
			p.st.Reconnects.Add(1)
		}
		granted := make(chan struct{})
		if !send(ctx, events, wsEvent{kind: wsUp, granted: granted}) {
			conn.Close()
			return
		}
		select {
		case <-granted:
		case <-ctx.Done():
			conn.Close()
			return
		}
		// Away from the first URL: hand the stream back to it once the
		// uplink has been away PrimaryRetry.
		var handover <-chan time.Time
		var primaryDue *time.Timer
		if cur != 0 {
			primaryDue = time.NewTimer(max(0, time.Until(leftPrimary.Add(w.PrimaryRetry))))
			handover = primaryDue.C
		}
		deflate := negotiated(resp)
		if deflate {
			// Each message is deflated alone (see negotiated): the best
			// level costs little CPU at a gateway's rates and takes ~20%
			// off the bytes of a batch.
			_ = conn.SetCompressionLevel(flate.BestCompression)
		}
		// Connected is the first batch acknowledged, not the handshake: a
		// receiver that answers the handshake and stores nothing is down.
		var connectedAt time.Time
		err = p.session(ctx, conn, p.wsOrigins[cur], handover, func() {
			connectedAt = time.Now()
			state.Set(log, slog.LevelInfo, "connected", "push: websocket: connected", "compressed", deflate)
			if len(w.URLs) > 1 {
				p.wsURLState.Set(p.log, slog.LevelInfo, redact(u), "push: websocket: receiver", "url", redact(u), "of", len(w.URLs))
			}
			send(ctx, events, wsEvent{kind: wsConnected})
		})
		if primaryDue != nil {
			primaryDue.Stop()
		}
		if ctx.Err() != nil {
			return
		}
		if errors.Is(err, errHandover) {
			// Back to the first URL at once; not a failure.
			log.Info("push: websocket: back to the first receiver url", "after", w.PrimaryRetry, "first", redact(w.URLs[0]))
			cur = 0
			if !send(ctx, events, wsEvent{kind: wsDown}) {
				return
			}
			continue
		}
		// The delay starts over only after a session that stayed connected
		// for ReconnectMax: a receiver that fails every session, before or
		// after its first ack, is retried ever more slowly, like a dial.
		if !connectedAt.IsZero() && time.Since(connectedAt) >= w.ReconnectMax {
			bo.Reset()
		}
		d := bo.Next()
		why := sessionReason(err)
		if connectedAt.IsZero() {
			p.st.WSSessionsFailed.Add(1)
			state.Set(log, slog.LevelWarn, "not storing: "+why, "push: websocket: receiver answered the handshake but acknowledged no batch; counted as down",
				"reason", why, "err", err, "retry_in", d.Round(time.Millisecond))
		} else {
			state.Set(log, slog.LevelWarn, "lost: "+why, "push: websocket: connection lost",
				"reason", why, "err", err, "retry_in", d.Round(time.Millisecond))
		}
		next()
		if !send(ctx, events, wsEvent{kind: wsDown}) {
			return
		}
		if !sleepCtx(ctx, d) {
			return
		}
	}
}

// errHandover ends a session on a later URL when the first is due again.
var errHandover = errors.New("push: websocket: handing the stream back to the first receiver url")

// negotiated reports whether the receiver accepted permessage-deflate in
// its handshake answer (gorilla does not say otherwise). gorilla v1.5.3
// offers and accepts it only without context takeover (RFC 7692
// server_no_context_takeover and client_no_context_takeover): every message
// is deflated alone, with no dictionary kept from the one before. A
// receiver that does not accept it gets plain frames.
func negotiated(resp *http.Response) bool {
	return resp != nil && strings.Contains(resp.Header.Get("Sec-WebSocket-Extensions"), "permessage-deflate")
}

// noAckError is a batch not acknowledged within AckTimeout.
type noAckError struct {
	last    uint64
	timeout time.Duration
}

func (e *noAckError) Error() string {
	return fmt.Sprintf("push: websocket: no ack for batch up to %d within %v", e.last, e.timeout)
}

// sessionReason names why a session ended, the same words for the same
// cause (no seq, no address), so that the log says each change of reason
// once and not each session.
func sessionReason(err error) string {
	var na *noAckError
	var pe *wire.ProtocolError
	var ce *websocket.CloseError
	switch {
	case err == nil:
		return "closed"
	case errors.As(err, &na):
		return "no ack within " + na.timeout.String()
	case errors.As(err, &pe):
		return "bad " + pe.Frame + " frame from the receiver"
	case errors.As(err, &ce):
		return fmt.Sprintf("receiver closed the connection (code %d)", ce.Code)
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, syscall.ECONNRESET),
		errors.Is(err, syscall.EPIPE), errors.Is(err, net.ErrClosed):
		return "receiver dropped the connection"
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return "receiver silent (read or write timeout)"
	}
	return err.Error()
}

func send(ctx context.Context, ch chan<- wsEvent, ev wsEvent) bool {
	if ch == nil {
		return false
	}
	select {
	case ch <- ev:
		return true
	case <-ctx.Done():
		return false
	}
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

type flight struct {
	last uint64
	n    int
	sent time.Time
}

// session runs one connection: this goroutine writes batches, pings and
// write answers (the one writer), a reader goroutine takes acks (and
// pongs) and write commands. It starts from the oldest unacknowledged
// sample, keeps up to Window batches in flight and returns after the
// reader and every write it started have exited.
//
// Write commands: at most MaxWrites in flight per connection, each in its
// own goroutine bounded by WriteTimeout; one more is answered "busy" at
// once. Answers reach the writer through a channel; when the session ends
// the writes are cancelled and their answers dropped (the receiver sees
// the connection close).
//
// connected is called once, from this goroutine, when the first batch is
// acknowledged. Until then one batch is in flight (a receiver that does
// not ack holds no more than one batch of the stream).
//
// When handover fires, the session sends no new batch, waits for the acks
// of those in flight (AckTimeout bounds it as always) and returns
// errHandover.
func (p *Pusher) session(ctx context.Context, conn *websocket.Conn, origin string, handover <-chan time.Time, connected func()) error {
	w := p.cfg.WS
	var sentLast, ackedLast atomic.Uint64
	ackNote := make(chan struct{}, 1)
	readErr := make(chan error, 1)
	answers := make(chan []byte, p.cfg.MaxWrites+4)
	quit := make(chan struct{}) // closed when the writer has stopped
	wctx, wcancel := context.WithCancel(ctx)
	defer wcancel()
	var writes sync.WaitGroup
	sem := make(chan struct{}, p.cfg.MaxWrites)
	answer := func(a *wire.WriteAnswer) {
		select {
		case answers <- wire.AppendWriteResult(nil, a):
		case <-quit:
		}
	}
	deadline := w.PingInterval + w.AckTimeout
	conn.SetReadLimit(wsReadLimit)
	_ = conn.SetReadDeadline(time.Now().Add(deadline))
	conn.SetPongHandler(func(string) error { return conn.SetReadDeadline(time.Now().Add(deadline)) })
	go func() {
		for {
			_, msg, err := wsread.Message(conn, wsReadLimit)
			if err != nil {
				readErr <- err
				return
			}
			_ = conn.SetReadDeadline(time.Now().Add(deadline))
			m, err := wire.ParseUplink(msg)
			if err == nil && m.Type == "write" {
				p.wc.received.Add(1)
				switch {
				case m.Bad != "":
					a := p.refuse(m.Cmd.ID, wire.KindBadRequest, m.Bad, origin)
					answer(&a)
				case p.cfg.Writer == nil:
					a := p.refuse(m.Cmd.ID, wire.KindRefused, errNoWriter, origin)
					answer(&a)
				default:
					select {
					case sem <- struct{}{}:
						writes.Add(1)
						go func(c wire.WriteCommand) {
							defer writes.Done()
							a := p.doWrite(wctx, c, origin)
							<-sem
							answer(&a)
						}(m.Cmd)
					default:
						a := p.refuse(m.Cmd.ID, wire.KindBusy, fmt.Sprintf("%d write commands in flight", p.cfg.MaxWrites), origin)
						answer(&a)
					}
				}
				continue
			}
			last := m.Last
			if err == nil && last > sentLast.Load() {
				err = &wire.ProtocolError{Frame: "ack", Msg: fmt.Sprintf("last %d beyond what was sent (%d)", last, sentLast.Load())}
			}
			if err != nil {
				readErr <- err
				return
			}
			p.q.Ack(last)
			if last > ackedLast.Load() {
				ackedLast.Store(last)
			}
			select {
			case ackNote <- struct{}{}:
			default:
			}
		}
	}()

	err := p.sessionWrite(ctx, conn, &sentLast, &ackedLast, ackNote, readErr, answers, handover, connected)
	close(quit)
	wcancel()
	// Close: a close frame, then the socket; the reader then ends.
	_ = conn.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(websocket.CloseNormalClosure, ""), time.Now().Add(time.Second))
	conn.Close()
	if rerr := <-readErr; err == nil {
		err = rerr
	}
	writes.Wait() // the reader has exited: no Add after this
	return err
}

func (p *Pusher) sessionWrite(ctx context.Context, conn *websocket.Conn, sentLast, ackedLast *atomic.Uint64,
	ackNote <-chan struct{}, readErr chan error, answers <-chan []byte, handover <-chan time.Time, connected func()) error {
	w := p.cfg.WS
	after := p.q.Acked() // resend from the oldest unacknowledged sample
	var inflight []flight
	var frame []byte
	bt := batcher{max: w.BatchMax, wait: w.BatchWait}
	draining := false
	ping := time.NewTicker(w.PingInterval)
	defer ping.Stop()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		// Settle acknowledged batches.
		acked := ackedLast.Load()
		for len(inflight) > 0 && inflight[0].last <= acked {
			p.st.SentWS.Add(uint64(inflight[0].n))
			inflight = inflight[1:]
			if connected != nil {
				connected()
				connected = nil
			}
		}
		window := w.Window
		if connected != nil {
			window = 1 // not connected yet: one batch proves the receiver stores
		}
		if draining && len(inflight) == 0 {
			return errHandover // drained
		}
		var wake <-chan struct{}
		if len(inflight) < window && !draining {
			wake = p.q.Wait()
			now := time.Now()
			if batch := bt.next(p.q, after, now); batch != nil {
				last := batch[len(batch)-1].Seq
				frame = wire.AppendBatchLoss(frame[:0], p.gwJSON, batch, p.cfg.TSMillis, skipRanges(bt.skips), bt.loss)
				sentLast.Store(last)
				_ = conn.SetWriteDeadline(now.Add(wsWriteTimeout))
				if err := conn.WriteMessage(websocket.TextMessage, frame); err != nil {
					return fmt.Errorf("push: websocket: write batch %d-%d: %w", batch[0].Seq, last, err)
				}
				if p.mirror != nil {
					p.mirror(frame)
				}
				inflight = append(inflight, flight{last: last, n: len(batch), sent: now})
				after = last
				continue
			}
		}
		// Wait for: more samples, an ack, the linger or ack deadline, a ping.
		next := time.Duration(-1)
		if d := bt.linger(); d >= 0 && wake != nil {
			next = d
		}
		if len(inflight) > 0 {
			d := time.Until(inflight[0].sent.Add(w.AckTimeout))
			if d <= 0 {
				return &noAckError{last: inflight[0].last, timeout: w.AckTimeout}
			}
			if next < 0 || d < next {
				next = d
			}
		}
		if next < 0 {
			next = time.Hour
		}
		timer.Reset(max(next, time.Millisecond))
		select {
		case <-ctx.Done():
			return nil
		case err := <-readErr:
			readErr <- err // for session's final receive
			return err
		case <-ackNote:
		case <-handover:
			draining, handover = true, nil
		case a := <-answers:
			_ = conn.SetWriteDeadline(time.Now().Add(wsWriteTimeout))
			if err := conn.WriteMessage(websocket.TextMessage, a); err != nil {
				return fmt.Errorf("push: websocket: write answer: %w", err)
			}
		case <-wake:
		case <-timer.C:
		case <-ping.C:
			if err := conn.WriteControl(websocket.PingMessage, nil, time.Now().Add(wsWriteTimeout)); err != nil {
				return fmt.Errorf("push: websocket: ping: %w", err)
			}
		}
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
	}
}
