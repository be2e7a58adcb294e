package mqttbroker

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"edgegw/internal/testenv"
)

// A client that connects and then drops its socket without a DISCONNECT
// (a crashed or unplugged client) makes mochi's listener log a warning with
// an empty message and error=EOF. It reaches the log as a debug line that
// says what happened, and never as an empty warning.
func TestDroppedClientLogsNoEmptyWarning(t *testing.T) {
	var out testenv.Buffer
	b := New(Config{Logger: slog.New(slog.NewTextHandler(&out, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	addr, err := b.Listen()
	if err != nil {
		t.Fatal(err)
	}
	testenv.RunUntilEnd(t, 10*time.Second, "the broker", b.Run)

	c, err := net.Dial("tcp", addr.String())
	if err != nil {
		t.Fatal(err)
	}
	// CONNECT, MQTT 3.1.1, clean session, keep-alive 60 s, client id "t".
	connect := []byte{0x10, 13, 0, 4, 'M', 'Q', 'T', 'T', 4, 0x02, 0, 60, 0, 1, 't'}
	if _, err := c.Write(connect); err != nil {
		t.Fatal(err)
	}
	ack := make([]byte, 4)
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.ReadFull(c, ack); err != nil {
		t.Fatalf("CONNACK: %v", err)
	}
	if ack[0] != 0x20 || ack[3] != 0 {
		t.Fatalf("CONNACK % x: not accepted", ack)
	}
	c.Close()

	testenv.WaitFor(t, 10*time.Second, "the broker to log the dropped connection", func() bool {
		s := out.String()
		return strings.Contains(s, `msg="mqttbroker: client connection closed"`) || strings.Contains(s, "level=WARN")
	})
	if line := testenv.LineWith(out.String(), "level=WARN"); line != "" {
		t.Errorf("a warning for a dropped client: %s", line)
	}
	if line := testenv.LineWith(out.String(), `level=DEBUG msg="mqttbroker: client connection closed"`); !strings.Contains(line, "error=EOF") || !strings.Contains(line, "listener=tcp") {
		t.Errorf("the closed connection's line lost its attributes: %s", line)
	}
}

func TestListenerLogLevels(t *testing.T) {
	closed := fmt.Errorf("read tcp: %w", net.ErrClosed)
	for _, c := range []struct {
		name  string
		level slog.Level // the handler's
		log   func(*slog.Logger)
		want  string // "" for nothing
	}{
		{"closed, at debug", slog.LevelDebug, func(l *slog.Logger) { l.Warn("", "error", closed) },
			`level=DEBUG msg="mqttbroker: client connection closed" listener=tcp error="read tcp: use of closed network connection"`},
		{"closed, at info", slog.LevelInfo, func(l *slog.Logger) { l.Warn("", "error", closed) }, ""},
		{"EOF, at info", slog.LevelInfo, func(l *slog.Logger) { l.Warn("", "error", io.EOF) }, ""},
		{"another error", slog.LevelInfo, func(l *slog.Logger) { l.Warn("", "error", errors.New("malformed packet")) },
			`level=WARN msg="mqttbroker: a client connection ended with an error" listener=tcp error="malformed packet"`},
		{"a warning with a message", slog.LevelInfo, func(l *slog.Logger) { l.Warn("hook refused", "error", closed) },
			`level=WARN msg="hook refused" listener=tcp error="read tcp: use of closed network connection"`},
		{"info", slog.LevelInfo, func(l *slog.Logger) { l.Info("mochi mqtt started") },
			`level=INFO msg="mochi mqtt started" listener=tcp`},
	} {
		t.Run(c.name, func(t *testing.T) {
			var out strings.Builder
			h := slog.NewTextHandler(&out, &slog.HandlerOptions{Level: c.level, ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
				if a.Key == slog.TimeKey {
					return slog.Attr{}
				}
				return a
			}})
			c.log(slog.New(listenerLog{h}).With("listener", "tcp"))
			if got := strings.TrimSuffix(out.String(), "\n"); got != c.want {
				t.Errorf("logged %q, want %q", got, c.want)
			}
		})
	}
}
