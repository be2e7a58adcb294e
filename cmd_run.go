package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"runtime"
	"syscall"
	"time"

	"edgegw/conf"
	"edgegw/internal/cli"
	"edgegw/internal/gateway"
	"edgegw/internal/sdnotify"
)

// cmdRun is the gateway proper: one config file, runs until SIGINT/SIGTERM.
// Under systemd (Type=notify) it reports READY once listening and polling,
// pings the watchdog while no bus is stuck, and STOPPING on shutdown.
func cmdRun(args []string) error {
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	path := fs.String("config", "/etc/edgegw/edgegw.toml", "config file")
	watch := fs.Duration("watch", 0, "also reload when the config file changes, checked this often (0: only on SIGHUP)")
	pprofAddr := fs.String("pprof", "", "serve CPU and heap profiles of this process on this loopback host:port (off by default)")
	newLog := cli.LogFlags(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	log, err := newLog(os.Stderr)
	if err != nil {
		return err
	}
	c, err := conf.Load(*path)
	if err != nil {
		cli.PrintConfErrors(os.Stderr, err)
		return cli.ErrInvalidConfig
	}
	errs, warns := gateway.Preflight(c)
	if !gateway.PrintPreflight(os.Stderr, errs, nil) {
		return cli.ErrInvalidConfig
	}
	for _, w := range warns {
		log.Warn(w)
	}
	var prof []gateway.Piece
	if *pprofAddr != "" {
		l, err := profileListener(*pprofAddr)
		if err != nil {
			return err
		}
		runtime.MemProfileRate = 4 << 10 // a heap profile that sees a small gateway's parts (the default samples every 512 KiB)
		prof = append(prof, gateway.Piece{Name: "pprof", Run: func(ctx context.Context) error { return serveProfiles(ctx, l, log) }})
	}
	g, err := gateway.New(c, log, false)
	if err != nil {
		return err
	}
	page, err := g.Listen()
	if err != nil {
		g.Release()
		return err
	}
	ctx, stop := cli.SignalContext()
	defer stop()
	wd := sdnotify.New(sdnotify.Config{Logger: log, Check: func() error { return g.Scheduler().Healthy(30 * time.Second) }})
	pieces := append(g.Pieces(),
		gateway.Piece{Name: "watchdog", Run: wd.Run},
		gateway.Piece{Name: "reload", Run: func(ctx context.Context) error { return reloadOnSignal(ctx, g, *path, *watch, log, wd) }},
	)
	pieces = append(pieces, prof...)
	log.Info("edgegw running", "version", version, "config", *path, "gateway", c.Gateway.ID, "devices", len(c.Devices), "page", page)
	wd.Notify(sdnotify.Ready)
	err = gateway.RunStages(ctx, log, 10*time.Second, pieces)
	wd.Notify(sdnotify.Stopping)
	log.Info("edgegw stopped")
	return err
}

// reloadOnSignal re-reads the config on SIGHUP (and, with watch > 0, when
// the file's size or modification time changes) and applies it: an invalid
// file is refused and the running config stays, and so is one without
// devices (an empty or truncated file) unless it says allow_empty = true;
// a device whose transport does not open is added down and retried; the device set is applied
// at once (unchanged devices keep polling without a gap, clients stay
// connected, the sequence continues); changes to other sections are named
// in the log as needing a restart.
func reloadOnSignal(ctx context.Context, g *gateway.Gateway, path string, watch time.Duration, log *slog.Logger, wd *sdnotify.Watchdog) error {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	var tick <-chan time.Time
	stamp := fileStamp(path)
	if watch > 0 {
		t := time.NewTicker(watch)
		defer t.Stop()
		tick = t.C
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-hup:
		case <-tick:
			if st := fileStamp(path); st == stamp {
				continue
			} else {
				stamp = st
			}
		}
		wd.Notify(sdnotify.Reloading())
		g.Reload(ctx, path, log)
		wd.Notify(sdnotify.Ready)
	}
}

func fileStamp(path string) string {
	fi, err := os.Stat(path)
	if err != nil {
		return ""
	}
	return fmt.Sprint(fi.Size(), fi.ModTime().UnixNano())
}
