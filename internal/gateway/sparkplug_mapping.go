package gateway

import (
	"fmt"
	"log/slog"
	"path/filepath"

	"edgegw/conf"
	"edgegw/sparkplug"
	"edgegw/spool"
	"edgegw/stats"
	"edgegw/tagtype"
)

// sparkplugParts is the Sparkplug B edge node and its own durable queue
// (data_dir/sparkplug/queue, bounded by [buffer]): it gets every appended
// batch like the push queue, and only the node takes samples out of it.
type sparkplugParts struct {
	queue *spool.Queue
	node  *sparkplug.Node
}

// addSparkplug builds the node of [upstream.sparkplug] (none when the
// section is absent) and makes the ring feed its queue besides the push
// queue.
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
	dir, qdir := "", ""
	if c.Gateway.DataDir != "" {
		dir = filepath.Join(c.Gateway.DataDir, "sparkplug")
		qdir = filepath.Join(dir, "queue")
	}
	q, err := spool.Open(spool.Config{
		Dir: qdir, MaxBytes: c.Buffer.MaxBytes, Fsync: c.Buffer.Fsync, FsyncInterval: c.Buffer.FsyncInterval,
		Logger: log.With("queue", "sparkplug"),
	})
	if err != nil {
		return err
	}
	var devs []sparkplug.Device
	for _, d := range c.Devices {
		sd := sparkplug.Device{Name: d.Name, Interval: d.Interval}
		for _, t := range d.Tags {
			typ, err := tagtype.Parse(t.Type)
			if err != nil {
				q.Close()
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
		DataDir: dir, Devices: devs, Queue: q, Latest: g.ring.Snapshot, Stats: g.sched.Devices,
		Upstream: up, Version: version, Writer: w, Logger: log,
	})
	if err != nil {
		q.Close()
		return err
	}
	g.spb = &sparkplugParts{queue: q, node: node}
	// Its queue reads the ring like the push queue: gateway.consume.
	return nil
}

var _ sparkplug.Writer = edgeWriter{}
