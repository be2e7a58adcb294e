package gateway

import (
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"

	"edgegw/conf"
	"edgegw/push"
	"edgegw/ringstore"
	"edgegw/spool"
	"edgegw/stats"
)

// hasUpstream reports whether the config names any upstream path.
func hasUpstream(c *conf.Config) bool {
	return len(c.Upstream.WebSocket.URLs) > 0 || (len(c.Upstream.MQTT.Brokers) > 0 && c.Upstream.MQTT.Mode != conf.MQTTOff)
}

// The queue's cursors when both push and Sparkplug read it.
const (
	cursorPush      = "push"
	cursorSparkplug = "sparkplug"
)

// openQueue opens the durable queue under data_dir ("" = memory only):
// the one queue push and Sparkplug read, each sample written once. With
// both, each reads through its own cursor; with one, through the queue's
// only cursor (no cursors file).
func openQueue(c *conf.Config, log *slog.Logger) (*spool.Queue, error) {
	dir := ""
	if c.Gateway.DataDir != "" {
		dir = filepath.Join(c.Gateway.DataDir, "queue")
		old := filepath.Join(c.Gateway.DataDir, "sparkplug", "queue")
		if segs, _ := filepath.Glob(filepath.Join(old, "*.seg")); len(segs) > 0 {
			log.Warn("a Sparkplug queue of an older version is left in data_dir and not read: Sparkplug reads the shared queue now",
				"dir", old, "segments", len(segs))
		}
	}
	var cursors []string
	if hasUpstream(c) && c.Upstream.Sparkplug != nil {
		cursors = []string{cursorPush, cursorSparkplug}
	}
	return spool.Open(spool.Config{
		Dir: dir, MaxBytes: c.Buffer.MaxBytes, Fsync: c.Buffer.Fsync, FsyncInterval: c.Buffer.FsyncInterval,
		Cursors: cursors, Logger: log,
	})
}

// queueReader is what the consumer name reads of q: its cursor when q has
// several, else q itself.
func queueReader(q *spool.Queue, name string) spool.Reader {
	if r := q.Cursor(name); r != nil {
		return r
	}
	return q
}

// secret reads a token or password file ("" = none), trimming the final newline.
func secret(what, path string) (string, error) {
	if path == "" {
		return "", nil
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("%s: %w", what, err)
	}
	return strings.TrimRight(string(b), "\r\n"), nil
}

// newPusher maps [upstream] onto push.Config, reading the secrets from their files.
// Write commands from the uplink are taken only over wss:// (a plain ws://
// uplink could carry commands injected on the way); from MQTT only when
// write_commands is on.
// devices gives the tag units of the per-tag payloads.
func newPusher(c *conf.Config, q spool.Reader, latest func() *ringstore.Snapshot, devices func() []stats.Entry,
	st *stats.Upstream, w push.Writer, log *slog.Logger) (*push.Pusher, error) {
	ws, m := c.Upstream.WebSocket, c.Upstream.MQTT
	token, err := secret("upstream.websocket.token_file", ws.TokenFile)
	if err != nil {
		return nil, err
	}
	user, err := secret("upstream.mqtt.username_file", m.UsernameFile)
	if err != nil {
		return nil, err
	}
	pass, err := secret("upstream.mqtt.password_file", m.PasswordFile)
	if err != nil {
		return nil, err
	}
	qos := byte(m.QoS)
	if qos == 0 && len(m.Brokers) > 0 {
		// conf's defaults say so: a batch leaves the queue only on its PUBACK.
		log.Warn("upstream.mqtt.qos = 0 cannot acknowledge batches; batches use qos 1 (per-tag topics stay at qos 0)")
		qos = 1
	}
	return push.New(push.Config{
		GatewayID: c.Gateway.ID,
		WS: push.WSConfig{
			URLs: ws.URLs, PrimaryRetry: ws.PrimaryRetry, NoCompression: !ws.Compression, Token: token, CAFile: ws.CAFile, CertFile: ws.CertFile, KeyFile: ws.KeyFile,
			ServerName: ws.ServerName, BatchMax: ws.BatchMax, BatchWait: ws.BatchWait,
		},
		MQTT: push.MQTTConfig{
			Brokers: m.Brokers, Mode: m.Mode, FallbackAfter: ws.FallbackAfter, TopicPrefix: m.TopicPrefix, QoS: qos,
			ClientID: m.ClientID, Username: user, Password: pass, CAFile: m.CAFile, CertFile: m.CertFile,
			KeyFile: m.KeyFile, ServerName: m.ServerName, NoPerTagTopics: !m.PerTagTopics, WriteCommands: m.WriteCommands,
		},
		Queue: q, Latest: latest, State: st, Logger: log, Writer: uplinkWriter(ws.URLs, m.WriteCommands, w),
		Devices: devices, TSMillis: c.Upstream.TSUnit == conf.TSUnitMillis,
	})
}

// uplinkWriter is w when some upstream path may carry write commands: a
// wss:// uplink (every URL in the list wss://), or MQTT with
// write_commands on. Otherwise nil (refused).
func uplinkWriter(wsURLs []string, mqttWrites bool, w push.Writer) push.Writer {
	tls := len(wsURLs) > 0
	for _, u := range wsURLs {
		tls = tls && strings.HasPrefix(u, "wss://")
	}
	if tls || mqttWrites {
		return w
	}
	return nil
}
