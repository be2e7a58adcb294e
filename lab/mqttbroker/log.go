package mqttbroker

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
)

// listenerLog is the handler mochi logs through. Its listeners report the
// end of every client connection that returned an error as a warning with
// an empty message. When that error is only the connection being closed (a
// client's DISCONNECT racing the broker's own close, or the broker stopping),
// it is logged at debug level as "client connection closed"; any other error
// stays a warning, with a message that says what ended.
type listenerLog struct{ slog.Handler }

func (h listenerLog) Handle(ctx context.Context, r slog.Record) error {
	if r.Message != "" || r.Level != slog.LevelWarn {
		return h.Handler.Handle(ctx, r)
	}
	var err error
	r.Attrs(func(a slog.Attr) bool {
		if e, ok := a.Value.Any().(error); ok && a.Key == "error" {
			err = e
			return false
		}
		return true
	})
	level, msg := slog.LevelWarn, "mqttbroker: a client connection ended with an error"
	if errors.Is(err, net.ErrClosed) || errors.Is(err, io.EOF) {
		level, msg = slog.LevelDebug, "mqttbroker: client connection closed"
	}
	if !h.Handler.Enabled(ctx, level) {
		return nil
	}
	out := slog.NewRecord(r.Time, level, msg, r.PC)
	r.Attrs(func(a slog.Attr) bool { out.AddAttrs(a); return true })
	return h.Handler.Handle(ctx, out)
}

func (h listenerLog) WithAttrs(as []slog.Attr) slog.Handler {
	return listenerLog{h.Handler.WithAttrs(as)}
}

func (h listenerLog) WithGroup(name string) slog.Handler {
	return listenerLog{h.Handler.WithGroup(name)}
}
