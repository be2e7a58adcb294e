//go:build !nolab || pprof

package main

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"edgegw/internal/testenv"
)

// The -pprof listener binds loopback only and serves the runtime's profiles.
func TestProfileListener(t *testing.T) {
	for _, addr := range []string{"0.0.0.0:0", ":0", "192.0.2.1:0", "example.com:0", "127.0.0.1"} {
		if l, err := profileListener(addr); err == nil {
			l.Close()
			t.Errorf("%q: listening, want refused (not loopback or not host:port)", addr)
		} else if !strings.HasPrefix(err.Error(), "-pprof") {
			t.Errorf("%q: error %q does not name the flag", addr, err)
		}
	}
	l, err := profileListener("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- serveProfiles(ctx, l, slog.New(slog.DiscardHandler)) }()
	base := "http://" + l.Addr().String() + "/debug/pprof/"
	c := &http.Client{Timeout: 20 * time.Second}
	for path, want := range map[string]int{
		"heap?gc=1": http.StatusOK, "goroutine": http.StatusOK, "profile?seconds=1": http.StatusOK,
		"profile?seconds=0": http.StatusBadRequest, "nothing": http.StatusNotFound,
	} {
		resp, err := c.Get(base + path)
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("%s: %s, want %d: %s", path, resp.Status, want, b)
		}
		if want == http.StatusOK && len(b) < 16 {
			t.Errorf("%s: %d bytes, want a profile", path, len(b))
		}
	}
	c.CloseIdleConnections()
	cancel()
	if err := testenv.Recv(t, done, 10*time.Second, "pprof server stopped"); err != nil {
		t.Errorf("serveProfiles: %v", err)
	}
}
