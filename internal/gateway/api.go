package gateway

import (
	"context"
	"log/slog"
	"time"

	"edgegw/conf"
	"edgegw/edge"
)

// Gateway is one gateway assembled from a config: the queue, the sequence,
// the history, the scheduler, the pusher, the Sparkplug node, the Modbus
// servers and the web server, each from the Config mapped from the file.
type Gateway struct{ g *gateway }

// New builds every piece from c without opening a listener, a device or
// (dry: what check does) anything under data_dir. On an error every piece
// built before it is released.
func New(c *conf.Config, log *slog.Logger, dry bool) (*Gateway, error) {
	g, err := newGateway(c, log, dry)
	if err != nil {
		return nil, err
	}
	return &Gateway{g}, nil
}

// Listen binds the web server and the Modbus servers; it returns the
// page's URL.
func (g *Gateway) Listen() (string, error) { return g.g.listen() }

// Release closes what New opened, for a gateway that will not run.
func (g *Gateway) Release() { g.g.release() }

// Scheduler is the gateway's edge scheduler (check polls through it).
func (g *Gateway) Scheduler() *edge.Scheduler { return g.g.sched }

// Reload applies the config at path to the running gateway: see
// reload.go for what is refused, applied and only logged.
func (g *Gateway) Reload(ctx context.Context, path string, log *slog.Logger) {
	g.g.reload(ctx, path, log)
}

// Piece is one running part: RunStages runs Run until its context ends.
type Piece struct {
	Name string
	Run  func(context.Context) error
}

// Pieces lists the gateway's running parts in their start order (see
// pieces). Listen must have been called.
func (g *Gateway) Pieces() []Piece {
	var out []Piece
	for _, p := range g.g.pieces() {
		out = append(out, Piece{p.name, p.run})
	}
	return out
}

// RunStages starts the pieces in order and, when ctx is done or a piece
// ends by itself, stops them in the reverse order, each within limit.
func RunStages(ctx context.Context, log *slog.Logger, limit time.Duration, pieces []Piece) error {
	ps := make([]piece, len(pieces))
	for i, p := range pieces {
		ps[i] = piece{p.Name, p.Run}
	}
	return runStages(ctx, log, limit, ps)
}

// version is the binary's version, named in /api/status and in the
// Sparkplug births; main sets it before New.
var version = "dev"

// SetVersion sets the version the gateway names (main's, stamped by the
// Makefile). Call it before New.
func SetVersion(v string) { version = v }
