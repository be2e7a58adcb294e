//go:build !nolab

package main

import (
	"flag"
	"fmt"
	"io"
	"os"

	"edgegw/push"
)

// cmdReceive runs the reference upstream receiver: it accepts gateways over
// WebSocket at /ingest, acknowledges every batch, drops duplicates by
// (gateway, seq) and writes each new sample as one JSON line.
func cmdReceive(args []string) error {
	fs := flag.NewFlagSet("receive", flag.ContinueOnError)
	listen := fs.String("listen", "127.0.0.1:9090", "address to accept gateways on (path /ingest)")
	out := fs.String("out", "-", "JSON lines file to append samples to (- = stdout)")
	tokenFile := fs.String("token-file", "", "file holding the bearer token gateways must present (empty: no check)")
	newLog := logFlags(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	log, err := newLog(os.Stderr)
	if err != nil {
		return err
	}
	token, err := secret("-token-file", *tokenFile)
	if err != nil {
		return err
	}
	var w io.Writer = os.Stdout
	if *out != "-" {
		f, err := os.OpenFile(*out, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o640)
		if err != nil {
			return err
		}
		defer f.Close()
		w = f
	}
	r := push.NewReceiver(push.ReceiverConfig{Listen: *listen, Token: token, Out: w, Logger: log})
	addr, err := r.Listen()
	if err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "receiving on ws://%s/ingest\n", addr)
	ctx, stop := signalContext()
	defer stop()
	err = r.Serve(ctx)
	st := r.Stats()
	fmt.Fprintf(os.Stderr, "received %d batches, %d new samples, %d duplicates\n", st.Batches, st.Samples, st.Duplicates)
	return err
}
