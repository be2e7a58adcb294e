package bench

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strconv"
	"time"

	"edgegw/wire"

	"github.com/gorilla/websocket"
)

// newHTTPClient is one keep-alive pool for a step's n clients; every
// connection it dials is counted.
func newHTTPClient(run *stepRun, n int) *http.Client {
	d := &net.Dialer{Timeout: 10 * time.Second}
	tr := &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := d.DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			return run.wire.wrap(c), nil
		},
		MaxIdleConns:        n + 16,
		MaxIdleConnsPerHost: n + 16,
		IdleConnTimeout:     time.Minute,
		DisableCompression:  true,
		ForceAttemptHTTP2:   false,
	}
	return &http.Client{Transport: tr}
}

// get fetches url into buf (reset first).
func get(ctx context.Context, hc *http.Client, url string, buf *bytes.Buffer) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	buf.Reset()
	if _, err := buf.ReadFrom(resp.Body); err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("bench: GET %s: %s", url, resp.Status)
	}
	return nil
}

// backoff waits a little after a failed request (bounded by ctx).
func backoff(ctx context.Context) bool { return sleepCtx(ctx, 100*time.Millisecond) == nil }

type seqTS struct {
	seq  uint64
	ts   int64
	size int
}

// shortClient polls /api/shortPolling every period (open loop: the next
// request is due one period after the previous was due; a request that
// overruns its period is counted and the next one is sent at once). Each
// body is the latest sample of every tag: samples newer than the previous
// body's seq are received (latency measured), the rest of the seqs in
// between were overwritten before this client looked: missed.
func shortClient(ctx context.Context, run *stepRun, hc *http.Client, r *clientResult) {
	url := "http://" + run.addr + "/api/shortPolling"
	var buf bytes.Buffer
	var fresh []seqTS
	p := run.cfg.ShortPeriod
	due := time.Now()
	for ctx.Err() == nil {
		err := get(ctx, hc, url, &buf)
		now := time.Now()
		r.requests++
		if err != nil {
			if ctx.Err() == nil {
				r.errors++
				backoff(ctx)
			}
			continue
		}
		r.payload += uint64(buf.Len())
		h, rest, err := wire.ReadHead(buf.Bytes())
		if err != nil {
			r.errors++
			continue
		}
		if !r.started {
			r.begin(h.Seq)
		} else if h.Seq > r.last {
			fresh = fresh[:0]
			err = wire.EachSample(rest, func(seq uint64, ts int64, size int) {
				if seq > r.last {
					fresh = append(fresh, seqTS{seq, ts, size})
				} else {
					r.repeated++
				}
			})
			if err != nil {
				r.errors++
			}
			slices.SortFunc(fresh, func(a, b seqTS) int { return int(a.seq - b.seq) })
			rec := run.recording.Load()
			for _, s := range fresh {
				r.observe(s.seq, s.ts, s.size, now.UnixMicro(), rec)
			}
			r.skipTo(h.Seq) // samples overwritten between two looks
			r.lastAtom.Store(r.last)
		} else {
			_ = wire.EachSample(rest, func(uint64, int64, int) { r.repeated++ })
		}
		due = due.Add(p)
		if wait := time.Until(due); wait > 0 {
			if sleepCtx(ctx, wait) != nil {
				return
			}
		} else {
			r.overruns++
			due = time.Now()
		}
	}
}

// longClient polls /api/longPolling back to back, passing the last reply's
// seq as lastSequence.
func longClient(ctx context.Context, run *stepRun, hc *http.Client, r *clientResult) {
	base := "http://" + run.addr + "/api/longPolling?lastSequence="
	var buf bytes.Buffer
	var after uint64
	for ctx.Err() == nil {
		err := get(ctx, hc, base+strconv.FormatUint(after, 10), &buf)
		now := time.Now().UnixMicro()
		r.requests++
		if err != nil {
			if ctx.Err() == nil {
				r.errors++
				backoff(ctx)
			}
			continue
		}
		r.payload += uint64(buf.Len())
		h, rest, err := wire.ReadHead(buf.Bytes())
		if err != nil {
			r.errors++
			continue
		}
		r.take(h, rest, h.Reset, now, run.recording.Load())
		after = max(r.last, h.Seq)
	}
}

// wsClient reads /api/ws: the first frame (a snapshot) sets the start, then
// every sample must arrive once, in order.
func wsClient(ctx context.Context, run *stepRun, r *clientResult) {
	d := websocket.Dialer{
		HandshakeTimeout: 10 * time.Second,
		NetDialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			var nd net.Dialer
			c, err := nd.DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			return run.wire.wrap(c), nil
		},
	}
	for ctx.Err() == nil {
		conn, resp, err := d.DialContext(ctx, "ws://"+run.addr+"/api/ws", nil)
		if resp != nil && resp.Body != nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		if err != nil {
			if ctx.Err() == nil {
				r.errors++
				backoff(ctx)
			}
			continue
		}
		wsRead(ctx, run, conn, r)
		return // a dropped client stays dropped: its tail counts as missed
	}
}

func wsRead(ctx context.Context, run *stepRun, conn *websocket.Conn, r *clientResult) {
	stop := context.AfterFunc(ctx, func() {
		_ = conn.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(websocket.CloseNormalClosure, ""), time.Now().Add(time.Second))
		_ = conn.Close()
	})
	defer func() {
		if stop() {
			_ = conn.Close()
		}
	}()
	conn.SetReadLimit(64 << 20)
	for {
		_, msg, err := conn.ReadMessage()
		if err != nil {
			if ctx.Err() == nil {
				r.errors++
			}
			return
		}
		now := time.Now().UnixMicro()
		r.requests++
		r.payload += uint64(len(msg))
		h, rest, err := wire.ReadHead(msg)
		if err != nil {
			r.errors++
			continue
		}
		r.take(h, rest, h.Snapshot, now, run.recording.Load())
	}
}
