package receiver

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"
)

// ErrHoles is returned by Main's gaps command when it found a hole.
var ErrHoles = errors.New("receiver: holes in the stored sequences")

// Main runs the receiver command with args (without the program name):
// the server, or `gaps` (holes per gateway and epoch in the database). It
// is the whole of the edgegw-receiver binary and of the lab's
// `edgegw receive`. Logs and reports go to stderr; ctx ends the server.
func Main(ctx context.Context, name string, args []string, stderr io.Writer) error {
	if len(args) > 0 && args[0] == "gaps" {
		return mainGaps(ctx, name+" gaps", args[1:], os.Stdout)
	}
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	o := Flags(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q (the only subcommand is gaps)", fs.Arg(0))
	}
	log, err := o.Logger(stderr)
	if err != nil {
		return err
	}
	token, err := o.token()
	if err != nil {
		return err
	}
	cfg := Config{Listen: o.Listen, Token: token, Logger: log, Postgres: o.Postgres, ID: o.ID}
	if o.Postgres == "" {
		var w io.Writer = os.Stdout
		if o.Out != "-" {
			f, err := os.OpenFile(o.Out, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o640)
			if err != nil {
				return err
			}
			defer f.Close()
			w = f
		}
		if o.StateDir == "" && o.Out != "-" {
			o.StateDir = o.Out + ".state"
		}
		if o.StateDir != "" {
			if err := os.MkdirAll(o.StateDir, 0o750); err != nil {
				return err
			}
			log.Info("dedup state kept in " + o.StateDir)
		} else {
			log.Info("dedup state kept in memory only (-out -): a restart of the receiver may write duplicates")
		}
		cfg.Out, cfg.StateDir = w, o.StateDir
	}
	r := New(cfg)
	addr, err := r.Listen()
	if err != nil {
		return err
	}
	octx, cancel := context.WithTimeout(ctx, 30*time.Second)
	err = r.Open(octx)
	cancel()
	if err != nil {
		return err
	}
	defer r.Close()
	fmt.Fprintf(stderr, "receiving on ws://%s/ingest\n", addr)
	ctx, stop := context.WithCancel(ctx)
	defer stop()
	mqttDone := make(chan error, 1)
	if len(o.MQTT.Brokers) > 0 {
		mq := *o.MQTT
		mq.Logger = log
		m, err := NewMQTT(r, mq)
		if err != nil {
			return err
		}
		fmt.Fprintf(stderr, "receiving from mqtt %s topic %s\n", strings.Join(mq.Brokers, ","), m.Topic())
		go func() { mqttDone <- m.Run(ctx) }()
	} else {
		mqttDone <- nil
	}
	err = r.Serve(ctx)
	stop() // the MQTT ingest ends with the server
	if merr := <-mqttDone; err == nil {
		err = merr
	}
	st := r.Stats()
	fmt.Fprintf(stderr, "received %d batches, %d new samples, %d duplicates, %d gaps (%d samples), %d losses (%d samples lost at the gateway), %d epochs\n",
		st.Batches, st.Samples, st.Duplicates, st.Gaps, st.GapSamples, st.Losses, st.LostSamples, st.Epochs)
	return err
}

// mainGaps is `gaps -postgres URL [-gateway G] [-since T]`.
func mainGaps(ctx context.Context, name string, args []string, out io.Writer) error {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	url := fs.String("postgres", os.Getenv("DATABASE_URL"), "PostgreSQL URL (default $DATABASE_URL)")
	gateway := fs.String("gateway", "", "only this gateway (default every one)")
	since := fs.String("since", "", "only samples with ts at or after this: RFC 3339 time (2026-12-01T10:00:00Z) or a duration back from now (1h)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *url == "" {
		return errors.New("gaps: -postgres URL (or DATABASE_URL) is required")
	}
	t := time.Unix(0, 0)
	if *since != "" {
		if d, err := time.ParseDuration(*since); err == nil {
			t = time.Now().Add(-d)
		} else if t, err = time.Parse(time.RFC3339, *since); err != nil {
			return fmt.Errorf("gaps: -since %q is neither an RFC 3339 time nor a duration", *since)
		}
	}
	rep, err := Gaps(ctx, *url, *gateway, t)
	if err != nil {
		return err
	}
	for _, h := range rep.Holes {
		epoch := h.Epoch
		if epoch == "" {
			epoch = `""`
		}
		fmt.Fprintf(out, "hole: gateway %s epoch %s seq %d..%d (%d missing)\n", h.Gateway, epoch, h.First, h.Last, h.Last-h.First+1)
	}
	fmt.Fprintf(out, "gaps: %d holes, %d seqs missing; looked at %d samples in %d (gateway, epoch) pairs with %d skip/loss ranges\n",
		len(rep.Holes), rep.Missing, rep.Samples, rep.Epochs, rep.Announce)
	if len(rep.Holes) > 0 {
		return ErrHoles
	}
	return nil
}
