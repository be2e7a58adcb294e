package main

import (
	"flag"
	"fmt"
	"os"

	"edgegw/conf"
)

// cmdRun is the gateway proper: one config file, runs until SIGINT/SIGTERM.
func cmdRun(args []string) error {
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	path := fs.String("config", "/etc/edgegw/edgegw.toml", "config file")
	newLog := logFlags(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	log, err := newLog(os.Stderr)
	if err != nil {
		return err
	}
	c, err := conf.Load(*path)
	if err != nil {
		printConfErrors(os.Stderr, err)
		return errInvalidConfig
	}
	g, err := newGateway(c, log)
	if err != nil {
		return err
	}
	page, err := g.listen()
	if err != nil {
		return err
	}
	ctx, stop := signalContext()
	defer stop()
	log.Info("edgegw running", "version", version, "config", *path, "gateway", c.Gateway.ID, "devices", len(c.Devices), "page", page)
	if err := g.run(ctx); err != nil {
		return fmt.Errorf("%w", err)
	}
	log.Info("edgegw stopped")
	return nil
}
