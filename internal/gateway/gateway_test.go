package gateway

import (
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"edgegw/conf"
	"edgegw/internal/testenv"
)

// baseConfig is a valid config with every component on: a device, a data
// directory, a WebSocket and MQTT upstream and a Sparkplug node. Each case
// of TestStartupRefusalsNeverPanic breaks one of them.
func baseConfig(t *testing.T) *conf.Config {
	t.Helper()
	body := `[gateway]
id = "gw"
data_dir = ` + "%q" + `
[http]
listen = "127.0.0.1:0"
[poll]
udp_listen = "127.0.0.1:0"
[upstream.websocket]
url = "ws://REFUSED/ingest"
[upstream.mqtt]
broker = "tcp://REFUSED"
[upstream.sparkplug]
group_id = "plant"
[[device]]
name = "d1"
transport = "udp"
address = "SILENT"
tags = [ { name = "t", address = 0 } ]
`
	body = strings.NewReplacer("REFUSED", testenv.RefusedAddr(t), "SILENT", testenv.SilentUDPAddr(t)).Replace(body)
	c, err := conf.Parse("base.toml", []byte(strings.Replace(body, "%q", `"`+filepath.Join(t.TempDir(), "data")+`"`, 1)))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// Start-up never panics on a refused component, and every refusal is
// returned as itself: each component refuses in turn, the ones built before
// it are released (goleak in TestMain; the data_dir's queues closed, so the
// next case's open of the same kind succeeds). The config is built in code,
// past conf's checks, so that each package's own refusal is what is met.
func TestStartupRefusalsNeverPanic(t *testing.T) {
	for _, c := range []struct {
		name   string
		break_ func(c *conf.Config)
		want   string
	}{
		{"queue", func(c *conf.Config) { c.Buffer.Fsync = "sometimes" }, `spool: unknown fsync policy "sometimes"`},
		{"history", func(c *conf.Config) { c.History.FineKeep = time.Second }, "history: keep"},
		{"edge", func(c *conf.Config) { c.Devices[0].Tags[0].Type = "int12" }, `device "d1": tag "t"`},
		{"write token", func(c *conf.Config) { c.HTTP.WriteTokenFile = "/nonexistent/write.token" }, "http.write_token_file"},
		{"push", func(c *conf.Config) { c.Upstream.MQTT.PasswordFile = "/nonexistent/pw" }, "upstream.mqtt.password_file"},
		{"sparkplug id", func(c *conf.Config) { c.Upstream.Sparkplug.GroupID = "a/b" }, "sparkplug: group_id"},
		{"web", func(c *conf.Config) { c.HTTP.TLSCertFile = "/nonexistent/tls.crt" }, "web: tls needs both"},
	} {
		t.Run(c.name, func(t *testing.T) {
			for _, dry := range []bool{false, true} {
				cfg := baseConfig(t)
				c.break_(cfg)
				g, err := newGateway(cfg, slog.New(slog.DiscardHandler), dry)
				if g != nil || err == nil || !strings.Contains(err.Error(), c.want) {
					t.Fatalf("dry %v: gateway %v, err %v; want an error containing %q", dry, g != nil, err, c.want)
				}
			}
		})
	}
}
