package push

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"io"
	"log"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"edgegw/internal/testenv"
	"edgegw/stats"
)

// logLines is a slog text handler's output with a line count per substring.
type logLines struct{ syncBuffer }

func (l *logLines) logger() *slog.Logger {
	return slog.New(slog.NewTextHandler(&l.syncBuffer, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

func (l *logLines) with(substrs ...string) []string {
	var out []string
	for _, line := range strings.Split(l.String(), "\n") {
		ok := line != ""
		for _, s := range substrs {
			ok = ok && strings.Contains(line, s)
		}
		if ok {
			out = append(out, line)
		}
	}
	return out
}

// closedPort is a loopback address where nothing listens.
func closedPort(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// An MQTT broker that is down: paho retries every 20 ms; the log says it
// once, with the reason, however many attempts fail; the path is logged
// once as buffering.
func TestMQTTBrokerDownLoggedOnce(t *testing.T) {
	g := newGateway(t, t.TempDir())
	var logs logLines
	st := new(stats.Upstream)
	p, err := New(Config{GatewayID: "gw", Queue: g.q, State: st, Logger: logs.logger(),
		MQTT: MQTTConfig{Broker: "tcp://" + closedPort(t), NoPerTagTopics: true,
			ReconnectMin: 20 * time.Millisecond, ReconnectMax: 20 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	runPusher(t, p)
	waitFor(t, 20*time.Second, "10 failed connection attempts", func() bool { return p.mqttFailures.Load() >= 10 })
	got := logs.with("push: mqtt: cannot connect")
	if len(got) != 1 || !strings.Contains(got[0], "connection refused") || !strings.Contains(got[0], "level=WARN") {
		t.Fatalf("after %d attempts, want one WARN line with the reason, got %d:\n%s", p.mqttFailures.Load(), len(got), strings.Join(got, "\n"))
	}
	if n := len(logs.with("push: upstream path")); n != 0 {
		t.Errorf("path lines while it stayed buffering: %d", n)
	}
}

// A TLS broker whose certificate our CA did not sign: one line with the
// x509 complaint and the certificate's subject and issuer; with the right
// CA it connects (and says so once).
func TestMQTTWrongCALoggedOnce(t *testing.T) {
	dir := t.TempDir()
	brokerCA := newCA(t, "broker CA")
	otherCA := newCA(t, "some other CA")
	certFile, keyFile := brokerCA.issue(t, dir, "broker")
	otherFile := filepath.Join(dir, "other-ca.pem")
	writePEM(t, otherFile, "CERTIFICATE", otherCA.der)
	rightFile := filepath.Join(dir, "broker-ca.pem")
	writePEM(t, rightFile, "CERTIFICATE", brokerCA.der)
	mosq := testenv.StartMosquittoTLS(t, certFile, keyFile)

	run := func(caFile string) (*Pusher, *logLines) {
		g := newGateway(t, t.TempDir())
		logs := new(logLines)
		p, err := New(Config{GatewayID: "gw", Queue: g.q, State: new(stats.Upstream), Logger: logs.logger(),
			MQTT: MQTTConfig{Broker: "ssl://" + mosq.Addr, CAFile: caFile, ServerName: "broker", NoPerTagTopics: true,
				ReconnectMin: 20 * time.Millisecond, ReconnectMax: 20 * time.Millisecond}})
		if err != nil {
			t.Fatal(err)
		}
		runPusher(t, p)
		return p, logs
	}
	p, logs := run(otherFile)
	waitFor(t, 20*time.Second, "5 failed TLS handshakes", func() bool { return p.mqttFailures.Load() >= 5 })
	got := logs.with("push: mqtt: cannot connect")
	if len(got) != 1 || !strings.Contains(got[0], "certificate signed by unknown authority") ||
		!strings.Contains(got[0], `cert_issuer="CN=broker CA"`) || !strings.Contains(got[0], `cert_subject="CN=broker"`) {
		t.Fatalf("after %d attempts, want one line with the certificate complaint, got %d:\n%s",
			p.mqttFailures.Load(), len(got), strings.Join(got, "\n"))
	}

	_, good := run(rightFile)
	waitFor(t, 20*time.Second, "connected with the right CA", func() bool { return len(good.with("push: mqtt: connected")) == 1 })
	if n := len(good.with("cannot connect")); n != 0 {
		t.Errorf("right CA: %d failure lines", n)
	}
}

// The WebSocket uplink down: one line however many dials fail; when the
// MQTT fallback takes over, one path line.
func TestWebSocketDownLoggedOnce(t *testing.T) {
	mosq := testenv.StartMosquitto(t)
	g := newGateway(t, t.TempDir())
	var logs logLines
	st := new(stats.Upstream)
	w := wsConfig(closedPort(t), "")
	w.ReconnectMin, w.ReconnectMax = 10*time.Millisecond, 20*time.Millisecond
	p, err := New(Config{GatewayID: "gw", Queue: g.q, State: st, Logger: logs.logger(), WS: w,
		MQTT: MQTTConfig{Broker: "tcp://" + mosq.Addr, FallbackAfter: 100 * time.Millisecond, NoPerTagTopics: true}})
	if err != nil {
		t.Fatal(err)
	}
	runPusher(t, p)
	waitFor(t, 20*time.Second, "fallback to mqtt and 20 failed dials", func() bool {
		return path(st) == stats.PathMQTT && p.wsFailures.Load() >= 20
	})
	if got := logs.with("push: websocket: cannot connect", "connection refused"); len(got) != 1 {
		t.Fatalf("after %d dials, %d lines:\n%s", p.wsFailures.Load(), len(got), strings.Join(got, "\n"))
	}
	if got := logs.with("push: upstream path", "path=mqtt", "was=buffering"); len(got) != 1 {
		t.Fatalf("path change: %q", got)
	}
	if st.Snapshot().PathSinceUS == 0 {
		t.Error("PathSinceUS not set")
	}
}

type testCA struct {
	cert *x509.Certificate
	der  []byte
	key  *ecdsa.PrivateKey
}

func newCA(t *testing.T, name string) *testCA {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	return &testCA{cert: cert, der: der, key: key}
}

// issue writes a server certificate for name (and 127.0.0.1) and its key.
func (ca *testCA) issue(t *testing.T, dir, name string) (certFile, keyFile string) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: name},
		DNSNames: []string{name}, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	kb, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(dir, name+".pem"), filepath.Join(dir, name+"-key.pem")
	writePEM(t, certFile, "CERTIFICATE", der)
	writePEM(t, keyFile, "EC PRIVATE KEY", kb)
	return certFile, keyFile
}

func writePEM(t *testing.T, file, typ string, der []byte) {
	if err := os.WriteFile(file, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o644); err != nil {
		t.Fatal(err)
	}
}

// A wss:// receiver whose certificate another CA signed: one line, with
// the complaint and the certificate's subject and issuer, however many
// dials fail.
func TestWebSocketWrongCALoggedOnce(t *testing.T) {
	dir := t.TempDir()
	serverCA, otherCA := newCA(t, "receiver CA"), newCA(t, "some other CA")
	certFile, keyFile := serverCA.issue(t, dir, "receiver")
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{cert}})
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.NotFoundHandler(), ErrorLog: log.New(io.Discard, "", 0)}
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(ln) }()
	t.Cleanup(func() { srv.Close(); testenv.Closed(t, done, 10*time.Second, "the TLS server's Serve to return") })
	otherFile := filepath.Join(dir, "other-ca.pem")
	writePEM(t, otherFile, "CERTIFICATE", otherCA.der)

	g := newGateway(t, t.TempDir())
	var logs logLines
	w := wsConfig(ln.Addr().String(), "")
	w.URL = "wss://" + ln.Addr().String() + "/ingest"
	w.CAFile, w.ServerName = otherFile, "receiver"
	w.ReconnectMin, w.ReconnectMax = 10*time.Millisecond, 20*time.Millisecond
	p, err := New(Config{GatewayID: "gw", Queue: g.q, State: new(stats.Upstream), Logger: logs.logger(), WS: w,
		MQTT: MQTTConfig{Mode: ModeOff}})
	if err != nil {
		t.Fatal(err)
	}
	runPusher(t, p)
	waitFor(t, 20*time.Second, "10 failed dials", func() bool { return p.wsFailures.Load() >= 10 })
	got := logs.with("push: websocket: cannot connect")
	if len(got) != 1 || !strings.Contains(got[0], "certificate signed by unknown authority") ||
		!strings.Contains(got[0], `cert_issuer="CN=receiver CA"`) || !strings.Contains(got[0], `cert_subject="CN=receiver"`) {
		t.Fatalf("after %d dials, want one line with the certificate complaint, got %d:\n%s",
			p.wsFailures.Load(), len(got), strings.Join(got, "\n"))
	}
}
