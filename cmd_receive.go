//go:build !nolab

package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"edgegw/receiver"
)

// cmdReceive runs the reference upstream receiver: it accepts gateways over
// WebSocket at /ingest, acknowledges every batch, drops duplicates by
// (gateway, epoch, seq) and writes each new sample as one JSON line. Its
// dedup state is kept in -state (by default <out>.state/ beside the output
// file; memory only when writing to stdout), one <gateway>.json per gateway.
func cmdReceive(args []string) error {
	fs := flag.NewFlagSet("receive", flag.ContinueOnError)
	listen := fs.String("listen", "127.0.0.1:9090", "address to accept gateways on (path /ingest)")
	out := fs.String("out", "-", "JSON lines file to append samples to (- = stdout)")
	tokenFile := fs.String("token-file", "", "file holding the bearer token gateways must present (empty: no check)")
	stateDir := fs.String("state", "", "directory for the dedup state, one <gateway>.json each, kept across restarts (default <out>.state; none with -out -)")
	newLog := logFlags(fs)
	mq := receiver.MQTTFlags(fs)
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
	if *stateDir == "" && *out != "-" {
		*stateDir = *out + ".state"
	}
	if *stateDir != "" {
		if err := os.MkdirAll(*stateDir, 0o750); err != nil {
			return err
		}
		log.Info("dedup state kept in " + *stateDir)
	} else {
		log.Info("dedup state kept in memory only (-out -): a restart of the receiver may write duplicates")
	}
	r := receiver.New(receiver.Config{Listen: *listen, Token: token, Out: w, Logger: log, StateDir: *stateDir})
	addr, err := r.Listen()
	if err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "receiving on ws://%s/ingest\n", addr)
	ctx, stop := signalContext()
	defer stop()
	mqttDone := make(chan error, 1)
	if len(mq.Brokers) > 0 {
		mq.Logger = log
		m, err := receiver.NewMQTT(r, *mq)
		if err != nil {
			return err
		}
		fmt.Fprintf(os.Stderr, "receiving from mqtt %s topic %s\n", strings.Join(mq.Brokers, ","), m.Topic())
		go func() { mqttDone <- m.Run(ctx) }()
	} else {
		mqttDone <- nil
	}
	err = r.Serve(ctx)
	stop()
	if merr := <-mqttDone; err == nil {
		err = merr
	}
	st := r.Stats()
	fmt.Fprintf(os.Stderr, "received %d batches, %d new samples, %d duplicates, %d gaps (%d samples), %d losses (%d samples lost at the gateway), %d epochs\n",
		st.Batches, st.Samples, st.Duplicates, st.Gaps, st.GapSamples, st.Losses, st.LostSamples, st.Epochs)
	return err
}
