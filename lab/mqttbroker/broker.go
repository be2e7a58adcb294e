package mqttbroker

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"sync"

	mochi "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/hooks/auth"
	"github.com/mochi-mqtt/server/v2/listeners"
)

// Config configures the embedded broker of `edgegw demo`.
type Config struct {
	Listen string // "127.0.0.1:0" by default
	Logger *slog.Logger
}

// Broker is an embedded MQTT broker (mochi-mqtt) that allows every client:
// for the demo and tests on loopback only, never for a real deployment.
type Broker struct {
	cfg Config
	mu  sync.Mutex
	ln  net.Listener
}

// New returns a broker; it listens on Listen or Run.
func New(cfg Config) *Broker {
	if cfg.Listen == "" {
		cfg.Listen = "127.0.0.1:0"
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Broker{cfg: cfg}
}

// Listen binds the socket and returns the real address (127.0.0.1:PORT).
func (b *Broker) Listen() (net.Addr, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.ln == nil {
		ln, err := net.Listen("tcp", b.cfg.Listen)
		if err != nil {
			return nil, fmt.Errorf("mqttbroker: %w", err)
		}
		b.ln = ln
	}
	return b.ln.Addr(), nil
}

// Run serves MQTT until ctx ends, then closes the broker.
func (b *Broker) Run(ctx context.Context) error {
	if _, err := b.Listen(); err != nil {
		return err
	}
	b.mu.Lock()
	ln := b.ln
	b.mu.Unlock()
	s := mochi.New(&mochi.Options{Logger: slog.New(listenerLog{b.cfg.Logger.Handler()}), InlineClient: false})
	if err := s.AddHook(new(auth.AllowHook), nil); err != nil { // without it every CONNECT is refused
		ln.Close()
		return fmt.Errorf("mqttbroker: %w", err)
	}
	if err := s.AddListener(listeners.NewNet("tcp", ln)); err != nil {
		ln.Close()
		return fmt.Errorf("mqttbroker: %w", err)
	}
	if err := s.Serve(); err != nil {
		s.Close()
		return fmt.Errorf("mqttbroker: %w", err)
	}
	<-ctx.Done()
	err := s.Close()
	b.mu.Lock()
	b.ln = nil
	b.mu.Unlock()
	return err
}
