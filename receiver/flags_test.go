package receiver

import (
	"context"
	"flag"
	"io"
	"net"
	"slices"
	"strings"
	"testing"
	"time"
)

// Flags registers the flags of `edgegw receive` before PostgreSQL, the
// PostgreSQL ones and the MQTT ingest's; -postgres defaults to DATABASE_URL.
func TestFlagsEveryFlag(t *testing.T) {
	t.Setenv("DATABASE_URL", "postgres://u@h/db")
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	o := Flags(fs)
	var names []string
	fs.VisitAll(func(f *flag.Flag) { names = append(names, f.Name) })
	want := []string{"id", "listen", "log-format", "log-level", "mqtt", "mqtt-client-id", "mqtt-group", "mqtt-prefix", "mqtt-session", "out", "postgres", "state", "token-file"}
	if !slices.Equal(names, want) {
		t.Fatalf("flags %v, want %v", names, want)
	}
	if err := fs.Parse(nil); err != nil || o.Postgres != "postgres://u@h/db" || o.Listen != fs.Lookup("listen").DefValue || o.LogFormat != "text" {
		t.Fatalf("defaults: %+v %v", o, err)
	}
}

// A database that is not there fails the start with a message naming
// PostgreSQL, within the connect timeout; a bad subcommand is refused.
func TestMainRefusesUnreachableDatabase(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := ln.Addr().String()
	ln.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()
	err = Main(ctx, "receive", []string{"-listen", "127.0.0.1:0", "-postgres", "postgres://u@" + dead + "/db?sslmode=disable&connect_timeout=2"}, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "postgres") {
		t.Fatalf("start with no database: %v", err)
	}
	if err := Main(ctx, "receive", []string{"bogus"}, io.Discard); err == nil || !strings.Contains(err.Error(), `"bogus"`) {
		t.Fatalf("bad argument: %v", err)
	}
}
