package tlsfile

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// writeCert writes a self-signed certificate and its key as PEM files.
func writeCert(t *testing.T, dir string) (certFile, keyFile string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "gw"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(dir, "c.pem"), filepath.Join(dir, "k.pem")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600); err != nil {
		t.Fatal(err)
	}
	return certFile, keyFile
}

func TestClient(t *testing.T) {
	dir := t.TempDir()
	cert, key := writeCert(t, dir)
	if c, err := Client("", "", "", ""); c != nil || err != nil {
		t.Fatalf("no files: %v %v, want nil, nil (system roots)", c, err)
	}
	c, err := Client(cert, cert, key, "broker.local")
	if err != nil {
		t.Fatal(err)
	}
	if c.ServerName != "broker.local" || c.MinVersion != tls.VersionTLS12 || c.RootCAs == nil || len(c.Certificates) != 1 {
		t.Fatalf("config %+v", c)
	}
	junk := filepath.Join(dir, "junk.pem")
	if err := os.WriteFile(junk, []byte("not a certificate"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []struct {
		ca, cert, key, want string
	}{
		{filepath.Join(dir, "missing.pem"), "", "", "ca file"},
		{junk, "", "", "no certificate"},
		{"", cert, "", "client certificate"},
		{"", junk, key, "client certificate"},
	} {
		if _, err := Client(bad.ca, bad.cert, bad.key, ""); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("%+v: err %v, want %q", bad, err, bad.want)
		}
	}
}
