package receiver

import (
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
)

// Options are the receiver's command-line flags, the same in the lab's
// `edgegw receive` and in the edgegw-receiver binary (both register them
// with Flags).
type Options struct {
	Listen    string
	Out       string
	TokenFile string
	StateDir  string
	Postgres  string
	ID        string
	LogFormat string
	LogLevel  string
	MQTT      *MQTTConfig // -mqtt, -mqtt-group, -mqtt-prefix (MQTTFlags)
}

// Flags registers every flag of the receiver on fs; the returned Options
// hold their values once fs is parsed. -postgres defaults to $DATABASE_URL.
func Flags(fs *flag.FlagSet) *Options {
	o := &Options{}
	fs.StringVar(&o.Listen, "listen", "127.0.0.1:9090", "address to accept gateways on (path /ingest; /healthz and /metrics beside it)")
	fs.StringVar(&o.Out, "out", "-", "JSON lines file to append samples to (- = stdout); unused with -postgres")
	fs.StringVar(&o.TokenFile, "token-file", "", "file holding the bearer token gateways must present (empty: no check)")
	fs.StringVar(&o.StateDir, "state", "", "directory for the dedup state, one <gateway>.json each, kept across restarts (default <out>.state; none with -out -); unused with -postgres")
	fs.StringVar(&o.Postgres, "postgres", os.Getenv("DATABASE_URL"), "PostgreSQL URL to store the samples in, exactly once, the dedup state in the database (default $DATABASE_URL)")
	fs.StringVar(&o.ID, "id", "", "this receiver's name in the database's connection records (default hostname:port)")
	fs.StringVar(&o.LogFormat, "log-format", "text", "log format on stderr: text (journald-friendly) or json")
	fs.StringVar(&o.LogLevel, "log-level", "info", "debug, info, warn or error")
	o.MQTT = MQTTFlags(fs)
	return o
}

// Logger builds the logger the log flags ask for, writing to w.
func (o *Options) Logger(w io.Writer) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(o.LogLevel)); err != nil {
		return nil, fmt.Errorf("-log-level: %w", err)
	}
	opts := &slog.HandlerOptions{Level: lv}
	switch o.LogFormat {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("-log-format %q is not text or json", o.LogFormat)
}

// token reads -token-file ("" = no check), trimming the final newline.
func (o *Options) token() (string, error) {
	if o.TokenFile == "" {
		return "", nil
	}
	b, err := os.ReadFile(o.TokenFile)
	if err != nil {
		return "", fmt.Errorf("-token-file: %w", err)
	}
	return strings.TrimRight(string(b), "\r\n"), nil
}
