package push

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"edgegw/wire"
)

// Writer carries out one write command: the value goes to the tag of the
// device, is read back once, and both are returned. Declared here, the
// consumer; main adapts edge's scheduler to it (push never imports edge).
// Origin says who asked ("websocket uplink collector.example:443",
// "mqtt 127.0.0.1:1883"); the writer logs it with the result.
//
// An error may carry a kind for the answer by having a method
// WriteErrorKind() string (edge's *WriteError: "unknown device", "not
// writable", "out of range", "busy", "device", "mismatch", "stopped", …);
// other errors are answered with kind "failed", a context deadline with
// "timeout".
type Writer interface {
	Write(ctx context.Context, device, tag string, value float64, origin string) (written, readBack float64, err error)
}

// A write command and its answer are wire.WriteCommand and
// wire.WriteAnswer; the kinds push decides itself are wire's Kind*
// constants (the writer adds its own).

// WriteStats counts write commands by outcome, over both paths.
type WriteStats struct {
	Received uint64 // commands seen (WebSocket and MQTT)
	OK       uint64 // written and read back
	Failed   uint64 // answered with an error by the writer (or its timeout)
	Busy     uint64 // refused: in-flight bound or rate limit
	Refused  uint64 // refused: no writer
	Bad      uint64 // refused: malformed command
}

type writeCounters struct {
	received, ok, failed, busy, refused, bad atomic.Uint64
}

// WriteStats returns the write command counters.
func (p *Pusher) WriteStats() WriteStats {
	c := &p.wc
	return WriteStats{Received: c.received.Load(), OK: c.ok.Load(), Failed: c.failed.Load(),
		Busy: c.busy.Load(), Refused: c.refused.Load(), Bad: c.bad.Load()}
}

// refuse builds the answer to a command push does not pass to the writer,
// counts it and logs it at a limited rate.
func (p *Pusher) refuse(id, kind, msg, origin string) wire.WriteAnswer {
	switch kind {
	case wire.KindBusy:
		p.wc.busy.Add(1)
	case wire.KindRefused:
		p.wc.refused.Add(1)
	default:
		p.wc.bad.Add(1)
	}
	p.refuseLog.Log(p.log, "refused", "push: write command refused", "origin", origin, "kind", kind, "err", msg)
	return wire.WriteAnswer{ID: id, Kind: kind, Error: "push: write: " + msg}
}

// errNoWriter is the answer when no Writer is configured.
const errNoWriter = "write commands are off on this gateway"

// doWrite carries out a checked command with the writer, bounded by
// WriteTimeout, and builds the answer.
func (p *Pusher) doWrite(ctx context.Context, c wire.WriteCommand, origin string) wire.WriteAnswer {
	if p.cfg.Writer == nil {
		return p.refuse(c.ID, wire.KindRefused, errNoWriter, origin)
	}
	ctx, cancel := context.WithTimeout(ctx, p.cfg.WriteTimeout)
	defer cancel()
	start := time.Now()
	written, readBack, err := p.cfg.Writer.Write(ctx, c.Device, c.Tag, c.Value, origin)
	if err == nil {
		p.wc.ok.Add(1)
		p.log.Debug("push: write command done", "origin", origin, "id", c.ID, "device", c.Device, "tag", c.Tag,
			"value", c.Value, "read_back", readBack, "took", time.Since(start))
		return wire.WriteAnswer{ID: c.ID, OK: true, Written: written, ReadBack: readBack}
	}
	p.wc.failed.Add(1)
	kind := wire.KindFailed
	var k interface{ WriteErrorKind() string }
	switch {
	case errors.As(err, &k):
		kind = k.WriteErrorKind()
	case errors.Is(err, context.DeadlineExceeded):
		kind = wire.KindTimeout
	}
	p.log.Debug("push: write command failed", "origin", origin, "id", c.ID, "device", c.Device, "tag", c.Tag,
		"value", c.Value, "kind", kind, "err", err, "took", time.Since(start))
	return wire.WriteAnswer{ID: c.ID, Kind: kind, Error: err.Error()}
}
