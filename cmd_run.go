package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"reflect"
	"runtime"
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
	watch := fs.Duration("watch", 0, "also reload when the config file changes, checked this often (0: only on SIGHUP)")
	pprofAddr := fs.String("pprof", "", "serve CPU and heap profiles of this process on this loopback host:port (off by default)")
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
	errs, warns := preflight(c)
	if !printPreflight(os.Stderr, errs, nil) {
		return errInvalidConfig
	}
	for _, w := range warns {
		log.Warn(w)
	}
	var prof []piece
	if *pprofAddr != "" {
		l, err := profileListener(*pprofAddr)
		if err != nil {
			return err
		}
		runtime.MemProfileRate = 4 << 10 // a heap profile that sees a small gateway's parts (the default samples every 512 KiB)
		prof = append(prof, piece{"pprof", func(ctx context.Context) error { return serveProfiles(ctx, l, log) }})
	}
	g, err := newGateway(c, log, false)
	if err != nil {
		return err
	}
	page, err := g.listen()
	if err != nil {
		g.release()
		return err
	}
	ctx, stop := signalContext()
	defer stop()
	wd := sdnotify.New(sdnotify.Config{Logger: log, Check: func() error { return g.sched.Healthy(30 * time.Second) }})
	pieces := append(g.pieces(),
		piece{"watchdog", wd.Run},
		piece{"reload", func(ctx context.Context) error { return reloadOnSignal(ctx, g, *path, *watch, log, wd) }},
	)
	pieces = append(pieces, prof...)
	log.Info("edgegw running", "version", version, "config", *path, "gateway", c.Gateway.ID, "devices", len(c.Devices), "page", page)
	wd.Notify(sdnotify.Ready)
	err = runStages(ctx, log, 10*time.Second, pieces)
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
func reloadOnSignal(ctx context.Context, g *gateway, path string, watch time.Duration, log *slog.Logger, wd *sdnotify.Watchdog) error {
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
		reload(ctx, g, path, log)
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

// reload applies the config at path to the running gateway.
func reload(ctx context.Context, g *gateway, path string, log *slog.Logger) {
	c, err := conf.Load(path)
	if err != nil {
		log.Error("reload: config invalid; the running one stays", "config", path, "err", err)
		return
	}
	ec, err := edgeConfig(c)
	if err != nil {
		log.Error("reload: config invalid; the running one stays", "config", path, "err", err)
		return
	}
	if running := len(g.sched.Devices()); len(ec.Devices) == 0 && running > 0 && !c.AllowEmpty {
		log.Error("reload: config refused: it has no devices and would stop all polling (set allow_empty = true to allow it); the running one stays",
			"config", path, "running_devices", running)
		return
	}
	errs, warns := preflight(c)
	for _, w := range warns {
		log.Warn("reload: "+w, "config", path)
	}
	for _, e := range errs {
		log.Warn("reload: the next restart would fail with this config", "config", path, "err", e)
	}
	res, err := g.sched.Reload(ctx, ec.Devices)
	if err != nil {
		log.Error("reload: devices not applied; the running ones stay", "config", path, "err", err)
		return
	}
	if n, err := g.markRemoved(ec.Devices, time.Now()); err != nil {
		log.Error("reload: marking the removed tags stale", "err", err)
	} else if n > 0 {
		log.Info("reload: removed tags marked stale", "tags", n)
	}
	log.Info("reload: devices applied", "config", path, "result", res.String())
	if diff := restartSections(g.cfg, c); len(diff) > 0 {
		log.Warn("reload: these sections changed and take effect at the next restart", "sections", diff)
	}
}

// restartSections names the config sections other than the devices and
// profiles that differ between the running config and a new one.
func restartSections(old, new *conf.Config) []string {
	var out []string
	for _, p := range []struct {
		name string
		a, b any
	}{
		{"gateway", old.Gateway, new.Gateway}, {"http", old.HTTP, new.HTTP}, {"ring", old.Ring, new.Ring},
		{"poll", old.Poll, new.Poll}, {"upstream", old.Upstream, new.Upstream}, {"buffer", old.Buffer, new.Buffer},
		{"history", old.History, new.History}, {"modbus_server", old.ModbusServers, new.ModbusServers},
	} {
		if !reflect.DeepEqual(p.a, p.b) {
			out = append(out, p.name)
		}
	}
	return out
}
