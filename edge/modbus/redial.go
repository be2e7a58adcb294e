package modbus

import (
	"context"
	"log/slog"
	"net"
	"time"

	"edgegw/internal/backoff"
)

// newGate is the reconnect backoff of a stream or port: the n-th
// consecutive failure waits a random time in [d/2, d], d = min(max, min·2^(n-1)).
func newGate(min, max time.Duration) backoff.Gate {
	return backoff.Gate{Delay: backoff.Delay{Min: min, Max: max}}
}

// redialer owns one TCP stream to addr: dial on first use, close on any
// error. A stream that had answered before and then failed (a timeout, a
// device restart, a stale connection) may be redialled at once: one lost
// reply is not a dead device. A failed dial, or a fresh stream that fails
// before its first good reply, starts the backoff: no redial before it
// has passed. Not safe for concurrent
// use; its owner serialises calls.
type redialer struct {
	addr        string
	dialTimeout time.Duration
	log         *slog.Logger
	cnt         *counters

	conn   net.Conn
	bo     backoff.Gate
	dialed bool  // a dial has succeeded before: the next one is a reconnect
	good   bool  // the current stream has carried a good reply
	free   bool  // closed after good replies: the next dial needs no backoff
	down   bool  // logged as down, log again when back
	cause  error // the failure that started the backoff (BackoffError.Cause)
	extra  int   // bytes read after the last reply frame: the stream is out of step
}

func (r *redialer) get() (net.Conn, error) {
	if r.conn != nil {
		return r.conn, nil
	}
	now := time.Now()
	if w := r.bo.Wait(now); w > 0 {
		return nil, &BackoffError{Cause: r.cause, Wait: w}
	}
	d := net.Dialer{
		Timeout:         r.dialTimeout,
		KeepAliveConfig: net.KeepAliveConfig{Enable: true, Idle: 15 * time.Second, Interval: 5 * time.Second, Count: 3},
	}
	r.free = false // a failed dial starts the backoff even right after good replies
	c, err := d.DialContext(context.Background(), "tcp", r.addr)
	if err != nil {
		r.failed(err)
		return nil, classify(err, r.dialTimeout)
	}
	if r.dialed {
		r.cnt.reconnects.Add(1)
	}
	r.dialed = true
	r.conn, r.extra = c, 0
	r.good, r.free = false, false
	return c, nil
}

// succeeded resets the backoff after a good reply.
func (r *redialer) succeeded() {
	if r.down {
		r.log.Info("modbus: connection back", "addr", r.addr, "failures", r.bo.Failures)
		r.down = false
	}
	r.bo.OK()
	r.good = true
}

// failed closes the stream (so a late reply can never be read as the next
// answer) and starts the backoff. Idempotent while the stream is closed
// after a failure that already started a backoff.
func (r *redialer) failed(err error) {
	if r.conn != nil {
		_ = r.conn.Close()
		r.conn = nil
		if r.good {
			r.good, r.free = false, true
			r.log.Debug("modbus: stream failed after good replies; redialling at once", "addr", r.addr, "err", err)
			return
		}
	} else if r.free || r.bo.Until.After(time.Now()) {
		return // this failure was already handled
	}
	d := r.bo.Failed(time.Now())
	r.cause = err
	if !r.down {
		r.log.Warn("modbus: connection down", "addr", r.addr, "err", err, "retry_in", d)
		r.down = true
	} else {
		r.log.Debug("modbus: still down", "addr", r.addr, "err", err, "retry_in", d)
	}
}

func (r *redialer) close() error {
	if r.conn == nil {
		return nil
	}
	err := r.conn.Close()
	r.conn = nil
	return err
}

func discard(l *slog.Logger) *slog.Logger {
	if l == nil {
		return slog.New(slog.DiscardHandler)
	}
	return l
}
