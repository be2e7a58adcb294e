// Command edgegw-receiver is the receiving side of the gateways' WebSocket
// uplink: it stores their samples in PostgreSQL exactly once (-postgres),
// or as JSON lines; `edgegw-receiver gaps` reports holes in the database.
// The code is package receiver's, the same as the lab's `edgegw receive`.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"edgegw/receiver"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := receiver.Main(ctx, "edgegw-receiver", os.Args[1:], os.Stderr)
	stop()
	if err != nil {
		fmt.Fprintf(os.Stderr, "edgegw-receiver: %v\n", err)
		os.Exit(1)
	}
}
