package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"edgegw/conf"
)

// ErrInvalidConfig is returned by a command that has already printed why
// the config is refused: main exits 1 without printing it.
var ErrInvalidConfig = errors.New("invalid config")

// LogFlags adds -log-format and -log-level to fs; the returned function
// builds the logger after parsing.
func LogFlags(fs *flag.FlagSet) func(w io.Writer) (*slog.Logger, error) {
	format := fs.String("log-format", "text", "log format on stderr: text (journald-friendly) or json")
	level := fs.String("log-level", "info", "debug, info, warn or error")
	return func(w io.Writer) (*slog.Logger, error) {
		var lv slog.Level
		if err := lv.UnmarshalText([]byte(*level)); err != nil {
			return nil, fmt.Errorf("-log-level: %w", err)
		}
		opts := &slog.HandlerOptions{Level: lv}
		switch *format {
		case "text":
			return slog.New(slog.NewTextHandler(w, opts)), nil
		case "json":
			return slog.New(slog.NewJSONHandler(w, opts)), nil
		}
		return nil, fmt.Errorf("-log-format %q is not text or json", *format)
	}
}

// SignalContext is cancelled by SIGINT or SIGTERM.
func SignalContext() (context.Context, context.CancelFunc) {
	return signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
}

// PrintConfErrors prints one problem a line.
func PrintConfErrors(w io.Writer, err error) {
	var es conf.Errors
	if errors.As(err, &es) {
		for _, e := range es {
			fmt.Fprintln(w, e)
		}
		fmt.Fprintf(w, "%d problem(s)\n", len(es))
		return
	}
	fmt.Fprintln(w, err)
}
