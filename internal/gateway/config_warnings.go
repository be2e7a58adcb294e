package gateway

import (
	"fmt"
	"strings"
	"time"

	"edgegw/conf"
)

// configWarnings are what a valid config asks for that the gateway cannot
// do as written; it starts regardless (check prints them, run logs them):
//   - a device whose retries can never fit its interval: (retries + 1)
//     attempts of timeout each take longer than the interval, so a poll
//     that needs them overruns and its next tick is skipped (a tag's own
//     interval is a multiple of its device's, so the device's is the
//     binding one);
//   - writable tags while no write path is on: nothing can write them;
//   - a token file that is empty: for http.write_token_file writes are
//     off, for http.read_token_file reads are open, for
//     upstream.websocket.token_file the uplink sends no token.
//
// Files that cannot be read are preflight's errors, not warnings here.
func configWarnings(c *conf.Config) []string {
	var out []string
	for _, d := range c.Devices {
		attempts := time.Duration(d.Retries + 1)
		if d.TimeoutDerived || attempts*d.Timeout <= d.Interval {
			continue
		}
		out = append(out, fmt.Sprintf("device %q: retries %d at timeout %v: %d attempts take up to %v, longer than interval %v: "+
			"a poll that needs its retries overruns and skips the next tick (timeout at most %v, fewer retries, or no timeout: then interval / (retries + 1))",
			d.Name, d.Retries, d.Timeout, d.Retries+1, attempts*d.Timeout, d.Interval, d.Interval/attempts))
	}
	var writable []string
	for _, d := range c.Devices {
		for _, t := range d.Tags {
			if t.Writable {
				writable = append(writable, d.Name+"/"+t.Name)
			}
		}
	}
	if len(writable) > 0 && !writePathOn(c) {
		list := writable
		if len(list) > 5 {
			list = append(list[:5:5], fmt.Sprintf("and %d more", len(writable)-5))
		}
		out = append(out, fmt.Sprintf("%d writable tag(s) but no write path is on, nothing can write them: %s "+
			"(writes come by POST /api/write with [http] write_token_file, a wss:// [upstream.websocket] url, "+
			"[upstream.mqtt] write_commands = true, or [upstream.sparkplug] writes = true)", len(writable), strings.Join(list, ", ")))
	}
	for _, f := range []struct{ key, path, means string }{
		{"http.write_token_file", c.HTTP.WriteTokenFile, "writes by POST /api/write are off"},
		{"http.read_token_file", c.HTTP.ReadTokenFile, "reads need no token"},
		{"upstream.websocket.token_file", c.Upstream.WebSocket.TokenFile, "the uplink sends no token"},
	} {
		if f.path == "" {
			continue
		}
		if tok, err := secret(f.key, f.path); err == nil && tok == "" {
			out = append(out, fmt.Sprintf("%s: %s is empty: %s", f.key, f.path, f.means))
		}
	}
	return out
}

// writePathOn says whether any path can carry a write to a tag: the local
// API with a write token, write commands on a wss:// uplink (upstream.go's
// uplinkWriter), MQTT write commands, Sparkplug DCMD.
func writePathOn(c *conf.Config) bool {
	if c.HTTP.WriteTokenFile != "" {
		if tok, err := secret("http.write_token_file", c.HTTP.WriteTokenFile); err == nil && tok != "" {
			return true
		}
	}
	u := c.Upstream
	return strings.HasPrefix(u.WebSocket.URL, "wss://") ||
		u.MQTT.Broker != "" && u.MQTT.WriteCommands ||
		u.Sparkplug != nil && u.Sparkplug.Writes && u.MQTT.Broker != ""
}
