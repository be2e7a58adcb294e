package demo

import (
	"os"

	"edgegw/internal/cli"
	"edgegw/receiver"
)

// Receive runs the upstream receiver (package receiver's Main, the same
// code as the edgegw-receiver binary): it accepts gateways over WebSocket
// at /ingest, acknowledges every batch once stored, drops duplicates by
// (gateway, epoch, seq) and stores each new sample in PostgreSQL
// (-postgres) or as one JSON line, with its dedup state in -state (by
// default <out>.state/ beside the output file; memory only when writing to
// stdout). `edgegw receive gaps` reports the holes in the database.
func Receive(args []string) error {
	ctx, stop := cli.SignalContext()
	defer stop()
	return receiver.Main(ctx, "receive", args, os.Stderr)
}
