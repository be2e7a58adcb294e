package main

import (
	"context"
	"flag"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"edgegw/conf"
	"edgegw/internal/sdnotify"
)

// cmdRun is the gateway proper: one config file, runs until SIGINT/SIGTERM.
// Under systemd (Type=notify) it reports READY once listening and polling,
// pings the watchdog while no bus is stuck, and STOPPING on shutdown.
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
	wd := sdnotify.New(sdnotify.Config{Logger: log, Check: func() error { return g.sched.Healthy(30 * time.Second) }})
	pieces := append(g.pieces(),
		piece{"watchdog", wd.Run},
		piece{"sighup", func(ctx context.Context) error { return onSIGHUP(ctx, *path, log, wd) }},
	)
	log.Info("edgegw running", "version", version, "config", *path, "gateway", c.Gateway.ID, "devices", len(c.Devices), "page", page)
	wd.Notify(sdnotify.Ready)
	err = runStages(ctx, log, 10*time.Second, pieces)
	wd.Notify(sdnotify.Stopping)
	log.Info("edgegw stopped")
	return err
}

// onSIGHUP re-reads the config on every SIGHUP and says whether it is valid.
// Applying a changed config without a restart is not done yet: the running
// one stays (Go's default on SIGHUP would be to exit).
func onSIGHUP(ctx context.Context, path string, log *slog.Logger, wd *sdnotify.Watchdog) error {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-hup:
		}
		wd.Notify(sdnotify.Reloading())
		if _, err := conf.Load(path); err != nil {
			log.Error("SIGHUP: config invalid; the running one stays", "config", path, "err", err)
		} else {
			log.Warn("SIGHUP: config valid, but applying it needs a restart (systemctl restart edgegw)", "config", path)
		}
		wd.Notify(sdnotify.Ready)
	}
}
