package web

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"
)

func (ts *testServer) getWith(t *testing.T, path string, set func(*http.Request)) *http.Response {
	t.Helper()
	req, _ := http.NewRequest("GET", ts.base+path, nil)
	if set != nil {
		set(req)
	}
	resp, err := ts.client.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	resp.Body.Close()
	return resp
}

func withBearer(tok string) func(*http.Request) {
	return func(r *http.Request) { r.Header.Set("Authorization", "Bearer "+tok) }
}

func withBasic(u, p string) func(*http.Request) {
	return func(r *http.Request) { r.SetBasicAuth(u, p) }
}

// With a read token, the page and API need it (or the write token);
// /healthz and /metrics stay open unless ProtectMetrics.
func TestReadToken(t *testing.T) {
	const read, write = "read-token-0123456789", "write-token-0123456789"
	for _, protect := range []bool{false, true} {
		ts := startServer(t, Config{ReadToken: read, WriteToken: write, ProtectMetrics: protect, Devices: someDevices()})
		for _, path := range []string{"/", "/api/shortPolling", "/api/longPolling?lastSequence=0", "/api/devices", "/api/status", "/metrics", "/healthz"} {
			open := path == "/healthz" || (path == "/metrics" && !protect)
			r := ts.getWith(t, path, nil)
			if open != (r.StatusCode == 200) {
				t.Errorf("protect metrics %v: %s without a token: %d", protect, path, r.StatusCode)
			}
			if !open && (r.StatusCode != 401 || r.Header.Get("WWW-Authenticate") != `Bearer realm="edgegw"`) {
				t.Errorf("%s: %d %q", path, r.StatusCode, r.Header.Values("WWW-Authenticate"))
			}
			if path == "/api/longPolling?lastSequence=0" {
				continue // waits for data
			}
			for _, tok := range []string{read, write} {
				if r := ts.getWith(t, path, withBearer(tok)); r.StatusCode != 200 {
					t.Errorf("%s with a token: %d", path, r.StatusCode)
				}
			}
			if r := ts.getWith(t, path, withBearer(read[:len(read)-1])); !open && r.StatusCode != 401 {
				t.Errorf("%s with a prefix of the token: %d", path, r.StatusCode)
			}
		}
		// WebSocket: refused without, upgraded with.
		d := websocket.Dialer{HandshakeTimeout: 5 * time.Second}
		if c, resp, err := d.Dial(ts.wsURL, nil); err == nil || resp == nil || resp.StatusCode != 401 {
			if c != nil {
				c.Close()
			}
			t.Errorf("ws without token: %v %v", err, resp)
		}
		c := dialWS(t, ts.wsURL, http.Header{"Authorization": {"Bearer " + read}})
		if f := mustFrame(t, c); f.Type != "snapshot" {
			t.Errorf("first frame %+v", f)
		}
		c.Close()
	}
}

// Basic auth (for browsers) guards reads; it never authorizes a write.
func TestBasicAuth(t *testing.T) {
	hash, err := HashPassword("s3cret pass", 2000)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(hash, "pbkdf2-sha256$2000$") {
		t.Fatalf("hash %q", hash)
	}
	w := &scriptWriter{}
	ts := startServer(t, Config{BasicAuthUser: "operator", BasicAuthHash: hash, Writer: w, WriteToken: testToken})
	r := ts.getWith(t, "/", nil)
	if r.StatusCode != 401 || !strings.Contains(strings.Join(r.Header.Values("WWW-Authenticate"), "|"), `Basic realm="edgegw"`) {
		t.Errorf("no credentials: %d %q", r.StatusCode, r.Header.Values("WWW-Authenticate"))
	}
	for _, c := range []struct {
		u, p string
		code int
	}{{"operator", "s3cret pass", 200}, {"operator", "s3cret pass", 200}, {"operator", "wrong", 401}, {"admin", "s3cret pass", 401}, {"operator", "", 401}} {
		if r := ts.getWith(t, "/api/status", withBasic(c.u, c.p)); r.StatusCode != c.code {
			t.Errorf("%s:%s: %d, want %d", c.u, c.p, r.StatusCode, c.code)
		}
	}
	req, _ := http.NewRequest("POST", ts.base+"/api/write", strings.NewReader(`{"device":"d","tag":"t","value":1}`))
	req.SetBasicAuth("operator", "s3cret pass")
	req.Header.Set("Content-Type", "application/json")
	resp, err := ts.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 401 || w.ncalls() != 0 {
		t.Errorf("write with basic credentials: %d, %d calls", resp.StatusCode, w.ncalls())
	}
	for _, bad := range []Config{{BasicAuthUser: "x"}, {BasicAuthUser: "x", BasicAuthHash: "sha1$abc"}, {BasicAuthUser: "x", BasicAuthHash: "pbkdf2-sha256$10$AAAAAAAAAAA$AAAA"}} {
		bad.Ring = newRing(t, 10)
		bad.Listen = "127.0.0.1:0"
		if _, err := New(bad).Listen(); err == nil || !strings.HasPrefix(err.Error(), "web: basic auth") {
			t.Errorf("%+v: %v", bad, err)
		}
	}
}

// selfSigned writes a certificate for 127.0.0.1 and its key; it returns
// the paths and a pool that trusts it.
func selfSigned(t *testing.T) (certFile, keyFile string, pool *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "edgegw test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, BasicConstraintsValid: true, IsCA: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600); err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	pool = x509.NewCertPool()
	pool.AddCert(cert)
	return certFile, keyFile, pool
}

func TestTLS(t *testing.T) {
	certFile, keyFile, pool := selfSigned(t)
	ts := startServer(t, Config{TLSCertFile: certFile, TLSKeyFile: keyFile})
	appendBatch(t, ts.ring, "d", 2, 1)
	host := strings.TrimPrefix(ts.base, "http://")
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}
	defer tr.CloseIdleConnections()
	cl := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	resp, err := cl.Get("https://" + host + "/api/shortPolling")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.TLS == nil || resp.Proto != "HTTP/1.1" {
		t.Fatalf("https: %d %v %s", resp.StatusCode, resp.TLS != nil, resp.Proto)
	}
	// Plain HTTP on the TLS port is refused.
	if resp, err := ts.client.Get(ts.base + "/healthz"); err == nil {
		resp.Body.Close()
		if resp.StatusCode == 200 {
			t.Error("plain http served on the https port")
		}
	}
	// An untrusted certificate is refused by the client.
	if resp, err := http.Get("https://" + host + "/healthz"); err == nil {
		resp.Body.Close()
		t.Error("self-signed certificate accepted without the pool")
	}
	// wss works.
	d := websocket.Dialer{TLSClientConfig: &tls.Config{RootCAs: pool}, HandshakeTimeout: 5 * time.Second}
	c, _, err := d.Dial("wss://"+host+"/api/ws", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if f := mustFrame(t, c); f.Type != "snapshot" || len(f.Samples) != 2 {
		t.Errorf("wss first frame %+v", f)
	}
	// Half a TLS configuration, or a missing file, is an error at Listen.
	for _, cfg := range []Config{{TLSCertFile: certFile}, {TLSCertFile: certFile, TLSKeyFile: certFile + ".missing"}} {
		cfg.Ring, cfg.Listen = ts.ring, "127.0.0.1:0"
		if _, err := New(cfg).Listen(); err == nil || !strings.HasPrefix(err.Error(), "web: tls") {
			t.Errorf("%+v: %v", cfg, err)
		}
	}
}

// The poll and read limits: a burst, then 429 with Retry-After; each class
// has its own bucket (shortPolling is poll, devices is read, /healthz is
// monitor); loopback clients are limited unless exempt.
func TestReadRateLimit(t *testing.T) {
	ts := startServer(t, Config{RateLimit: RateLimits{Poll: Rate{PerSec: 0.2, Burst: 3}, Read: Rate{PerSec: 0.2, Burst: 2}}})
	var codes []int
	for range 5 {
		r := ts.getWith(t, "/api/shortPolling", nil)
		codes = append(codes, r.StatusCode)
		if r.StatusCode == 429 && r.Header.Get("Retry-After") != "5" {
			t.Errorf("Retry-After %q", r.Header.Get("Retry-After"))
		}
	}
	var read []int
	for range 3 {
		read = append(read, ts.getWith(t, "/api/devices", nil).StatusCode)
	}
	if read[0] != 200 || read[1] != 200 || read[2] != 429 {
		t.Errorf("devices has its own read bucket (burst 2): %v", read)
	}
	for range 10 {
		if r := ts.getWith(t, "/healthz", nil); r.StatusCode != 200 {
			t.Fatalf("healthz limited: %d", r.StatusCode)
		}
	}
	if st := ts.Stats(); st.RateLimitedPoll != 2 || st.RateLimitedRead != 1 {
		t.Errorf("counted poll %d, read %d", st.RateLimitedPoll, st.RateLimitedRead)
	}
	if len(codes) != 5 || codes[2] != 200 || codes[3] != 429 {
		t.Errorf("codes %v", codes)
	}
	free := startServer(t, Config{RateLimit: RateLimits{ExemptLoopback: true, Poll: Rate{PerSec: 0.2, Burst: 1}}})
	for range 20 {
		if r := free.getWith(t, "/api/shortPolling", nil); r.StatusCode != 200 {
			t.Fatalf("exempt loopback limited: %d", r.StatusCode)
		}
	}
}

// The limiter itself: refill, per-IP buckets, bounded table.
func TestLimiterBuckets(t *testing.T) {
	l := newLimiter(RateLimits{Read: Rate{PerSec: 10, Burst: 2}, Clients: 3})
	now := time.Now()
	ip := func(i byte) (a [4]byte) { return [4]byte{10, 0, 0, i} }
	a := netip.AddrFrom4(ip(1))
	for i, want := range []bool{true, true, false} {
		if ok, _ := l.allow(a, classRead, now); ok != want {
			t.Fatalf("take %d: %v", i, ok)
		}
	}
	if ok, wait := l.allow(a, classRead, now); ok || wait != 100*time.Millisecond {
		t.Fatalf("empty bucket: %v %v", ok, wait)
	}
	if ok, _ := l.allow(a, classRead, now.Add(100*time.Millisecond)); !ok {
		t.Fatal("no refill")
	}
	if ok, _ := l.allow(netip.AddrFrom4(ip(2)), classRead, now); !ok {
		t.Fatal("another client limited")
	}
	// Fill the table with busy clients: newcomers share the overflow bucket.
	l.allow(netip.AddrFrom4(ip(3)), classRead, now)
	for i := range 5 {
		l.allow(netip.AddrFrom4(ip(byte(10+i))), classRead, now)
	}
	if len(l.clients) > 4 { // 3 clients + the overflow bucket
		t.Fatalf("table grew to %d", len(l.clients))
	}
	// Later every bucket is full again: the sweep frees the table.
	if ok, _ := l.allow(netip.AddrFrom4(ip(99)), classRead, now.Add(time.Minute)); !ok || len(l.clients) != 1 {
		t.Fatalf("after a minute: %v, %d clients", ok, len(l.clients))
	}
}

// The limiter is on the path of every expensive request.
func BenchmarkLimiterAllow(b *testing.B) {
	l := newLimiter(RateLimits{Read: Rate{PerSec: 1e9, Burst: 1e9}})
	ips := make([]netip.Addr, 1000)
	for i := range ips {
		ips[i] = netip.AddrFrom4([4]byte{10, 0, byte(i >> 8), byte(i)})
	}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			l.allow(ips[i%len(ips)], classRead, time.Now())
			i++
		}
	})
}

func BenchmarkParseWriteBody(b *testing.B) {
	body := []byte(`{"device":"boiler-plc","tag":"setpoint","value":21.5}`)
	b.ReportAllocs()
	for b.Loop() {
		if _, status, _ := parseWriteBody(bytes.NewReader(body)); status != 0 {
			b.Fatal(status)
		}
	}
}
