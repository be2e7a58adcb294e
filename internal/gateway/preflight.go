package gateway

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"edgegw/conf"
)

// Preflight checks what `run` needs beyond a valid file, the same way for
// `check` and `run` so the two never disagree about whether the gateway
// starts: every file the config names exists and is readable by this user
// (certificates and keys also parse). Problems that do not stop the gateway
// are warnings: a data_dir that is not a writable directory (a card mounted
// read-only after errors, a full disk: the gateway starts, keeps its queue
// and sequence in memory and says so in /api/status and /healthz), a
// missing serial port (its devices are down until it appears), a config
// without devices, and what configWarnings finds (retries that cannot fit,
// writable tags with no write path, empty token files).
func Preflight(c *conf.Config) (errs []error, warns []string) {
	files := []struct{ key, path string }{
		{"http.write_token_file", c.HTTP.WriteTokenFile},
		{"http.read_token_file", c.HTTP.ReadTokenFile},
		{"http.basic_auth_hash_file", c.HTTP.BasicAuthHashFile},
		{"http.tls_cert_file", c.HTTP.TLSCertFile},
		{"http.tls_key_file", c.HTTP.TLSKeyFile},
		{"upstream.websocket.token_file", c.Upstream.WebSocket.TokenFile},
		{"upstream.websocket.ca_file", c.Upstream.WebSocket.CAFile},
		{"upstream.websocket.cert_file", c.Upstream.WebSocket.CertFile},
		{"upstream.websocket.key_file", c.Upstream.WebSocket.KeyFile},
		{"upstream.mqtt.username_file", c.Upstream.MQTT.UsernameFile},
		{"upstream.mqtt.password_file", c.Upstream.MQTT.PasswordFile},
		{"upstream.mqtt.ca_file", c.Upstream.MQTT.CAFile},
		{"upstream.mqtt.cert_file", c.Upstream.MQTT.CertFile},
		{"upstream.mqtt.key_file", c.Upstream.MQTT.KeyFile},
	}
	bad := map[string]bool{}
	for _, f := range files {
		if f.path == "" {
			continue
		}
		if err := readable(f.path); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", f.key, err))
			bad[f.path] = true
		}
	}
	for _, p := range []struct{ what, cert, key string }{
		{"http.tls_cert_file/tls_key_file", c.HTTP.TLSCertFile, c.HTTP.TLSKeyFile},
		{"upstream.websocket.cert_file/key_file", c.Upstream.WebSocket.CertFile, c.Upstream.WebSocket.KeyFile},
		{"upstream.mqtt.cert_file/key_file", c.Upstream.MQTT.CertFile, c.Upstream.MQTT.KeyFile},
	} {
		if p.cert == "" || p.key == "" || bad[p.cert] || bad[p.key] {
			continue
		}
		if _, err := tls.LoadX509KeyPair(p.cert, p.key); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", p.what, err))
		}
	}
	for _, ca := range []struct{ key, path string }{
		{"upstream.websocket.ca_file", c.Upstream.WebSocket.CAFile}, {"upstream.mqtt.ca_file", c.Upstream.MQTT.CAFile},
	} {
		if ca.path == "" || bad[ca.path] {
			continue
		}
		if b, err := os.ReadFile(ca.path); err == nil && !x509.NewCertPool().AppendCertsFromPEM(b) {
			errs = append(errs, fmt.Errorf("%s: %s: no PEM certificate in it", ca.key, ca.path))
		}
	}
	if dir := c.Gateway.DataDir; dir != "" {
		if err := writableDir(dir); err != nil {
			warns = append(warns, fmt.Sprintf("gateway.data_dir: %v: the gateway starts, keeps the queue and the sequence in memory and goes back to disk when it can", err))
		}
	}
	ports := map[string][]string{}
	for _, d := range c.Devices {
		if conf.SerialLine(d.Transport) {
			if _, err := os.Stat(d.Address); err != nil {
				ports[d.Address] = append(ports[d.Address], d.Name)
			}
		}
	}
	paths := make([]string, 0, len(ports))
	for p := range ports {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	for _, p := range paths {
		warns = append(warns, fmt.Sprintf("serial port %s is missing: the gateway starts, %s stay down until it appears", p, strings.Join(ports[p], ", ")))
	}
	if len(c.Devices) == 0 {
		warns = append(warns, "no devices: nothing will be polled")
	}
	warns = append(warns, configWarnings(c)...)
	return errs, warns
}

// readable opens path and reads a byte: it exists, is a file and this user may read it.
func readable(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	if fi, err := f.Stat(); err == nil && fi.IsDir() {
		return fmt.Errorf("%s is a directory", path)
	}
	if _, err := f.Read(make([]byte, 1)); err != nil && !errors.Is(err, io.EOF) {
		return err
	}
	return nil
}

// writableDir: dir is a directory this user can create files in, or does not
// exist yet and its nearest existing parent is (run creates it).
func writableDir(dir string) error {
	fi, err := os.Stat(dir)
	switch {
	case errors.Is(err, os.ErrNotExist):
		parent := filepath.Dir(filepath.Clean(dir))
		if parent == dir {
			return err
		}
		if perr := writableDir(parent); perr != nil {
			return fmt.Errorf("%s does not exist and cannot be created: %w", dir, perr)
		}
		return nil
	case err != nil:
		return err
	case !fi.IsDir():
		return fmt.Errorf("%s is not a directory", dir)
	}
	f, err := os.CreateTemp(dir, ".edgegw-check-*")
	if err != nil {
		return fmt.Errorf("%s is not writable: %w", dir, err)
	}
	name := f.Name()
	f.Close()
	return os.Remove(name)
}

// PrintPreflight prints the problems and warnings; it returns whether the
// gateway can start.
func PrintPreflight(w io.Writer, errs []error, warns []string) bool {
	for _, e := range errs {
		fmt.Fprintln(w, "error:", e)
	}
	for _, s := range warns {
		fmt.Fprintln(w, "warning:", s)
	}
	if len(errs) > 0 {
		fmt.Fprintf(w, "%d problem(s)\n", len(errs))
	}
	return len(errs) == 0
}
