package gateway

import (
	"context"
	"log/slog"
	"reflect"
	"time"

	"edgegw/conf"
)

// reload applies the config at path to the running gateway.
func (g *gateway) reload(ctx context.Context, path string, log *slog.Logger) {
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
	errs, warns := Preflight(c)
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
