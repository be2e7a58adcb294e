package gateway

import (
	"fmt"
	"log/slog"
	"path/filepath"

	"edgegw/conf"
	"edgegw/sparkplug"
	"edgegw/stats"
	"edgegw/tagtype"
)

// sparkplugParts is the Sparkplug B edge node. It reads the gateway's one
// queue (data_dir/queue, bounded by [buffer]) through its own cursor when
// push reads it too, so a sample is written to flash once.
type sparkplugParts struct {
	node *sparkplug.Node
}

// addSparkplug builds the node of [upstream.sparkplug] (none when the
// section is absent), reading g.queue (build opened it).
func (g *gateway) addSparkplug(c *conf.Config, w sparkplug.Writer, log *slog.Logger) error {
	s := c.Upstream.Sparkplug
	if s == nil {
		return nil
	}
	m := c.Upstream.MQTT
	user, err := secret("upstream.mqtt.username_file", m.UsernameFile)
	if err != nil {
		return err
	}
	pass, err := secret("upstream.mqtt.password_file", m.PasswordFile)
	if err != nil {
		return err
	}
	dir := ""
	if c.Gateway.DataDir != "" {
		dir = filepath.Join(c.Gateway.DataDir, "sparkplug")
	}
	var devs []sparkplug.Device
	for _, d := range c.Devices {
		sd := sparkplug.Device{Name: d.Name, Interval: d.Interval}
		for _, t := range d.Tags {
			typ, err := tagtype.Parse(t.Type)
			if err != nil {
				return fmt.Errorf("device %q: tag %q: %w", d.Name, t.Name, err)
			}
			sd.Tags = append(sd.Tags, sparkplug.Tag{Name: t.Name, Type: typ, Scaled: t.Scale != 1 || t.Offset != 0,
				Unit: t.Unit, Min: t.Min, Max: t.Max, Writable: t.Writable})
		}
		devs = append(devs, sd)
	}
	var up *stats.Upstream
	if g.up != nil {
		up = g.up
	}
	node, err := sparkplug.New(sparkplug.Config{
		GroupID: s.GroupID, NodeID: s.NodeID, PrimaryHostID: s.PrimaryHostID, Writes: s.Writes,
		Broker: m.Broker, ClientID: s.ClientID, Username: user, Password: pass,
		CAFile: m.CAFile, CertFile: m.CertFile, KeyFile: m.KeyFile, ServerName: m.ServerName,
		DataDir: dir, Devices: devs, Queue: queueReader(g.queue, cursorSparkplug), Latest: g.ring.Snapshot, Stats: g.sched.Devices,
		Upstream: up, Version: version, Writer: w, Logger: log,
	})
	if err != nil {
		return err
	}
	g.spb = &sparkplugParts{node: node}
	return nil
}

var _ sparkplug.Writer = edgeWriter{}
