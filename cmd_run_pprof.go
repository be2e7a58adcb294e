//go:build !nolab || pprof

package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"runtime"
	"runtime/pprof"
	"strconv"
	"time"
)

// profileListener is `edgegw run -pprof ADDR`: off unless given, loopback
// only (a profile shows the config's names and addresses, and a CPU profile
// costs the poll loop a few percent while it runs). It serves runtime/pprof
// directly, without net/http/pprof (whose index, symbol and trace handlers
// the shipped binary does not need):
//
//	GET /debug/pprof/profile?seconds=N   CPU profile over N s (default 30, at most 600)
//	GET /debug/pprof/heap[?gc=1]         heap profile (gc=1: after a collection)
//	GET /debug/pprof/allocs | goroutine  the other runtime profiles
func profileListener(addr string) (net.Listener, error) {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, fmt.Errorf("-pprof %q: %w", addr, err)
	}
	if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
		return nil, fmt.Errorf("-pprof %q: not a loopback address (127.0.0.1:PORT, [::1]:PORT or localhost:PORT)", addr)
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("-pprof: %w", err)
	}
	return l, nil
}

// profileMux answers the profiles listed on profileListener.
func profileMux() *http.ServeMux {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /debug/pprof/profile", func(w http.ResponseWriter, r *http.Request) {
		secs := 30
		if s := r.URL.Query().Get("seconds"); s != "" {
			n, err := strconv.Atoi(s)
			if err != nil || n <= 0 || n > 600 {
				http.Error(w, "pprof: seconds must be 1..600", http.StatusBadRequest)
				return
			}
			secs = n
		}
		w.Header().Set("Content-Type", "application/octet-stream")
		if err := pprof.StartCPUProfile(w); err != nil {
			http.Error(w, "pprof: "+err.Error(), http.StatusConflict) // another one is running
			return
		}
		t := time.NewTimer(time.Duration(secs) * time.Second)
		select {
		case <-t.C:
		case <-r.Context().Done():
			t.Stop()
		}
		pprof.StopCPUProfile()
	})
	mux.HandleFunc("GET /debug/pprof/{name}", func(w http.ResponseWriter, r *http.Request) {
		p := pprof.Lookup(r.PathValue("name"))
		if p == nil || r.PathValue("name") == "profile" {
			http.Error(w, "pprof: no such profile (profile, heap, allocs, goroutine)", http.StatusNotFound)
			return
		}
		if r.URL.Query().Get("gc") == "1" {
			runtime.GC()
		}
		w.Header().Set("Content-Type", "application/octet-stream")
		_ = p.WriteTo(w, 0)
	})
	return mux
}

// serveProfiles serves profileMux on l until ctx is done.
func serveProfiles(ctx context.Context, l net.Listener, log *slog.Logger) error {
	srv := &http.Server{Handler: profileMux(), ReadHeaderTimeout: 5 * time.Second}
	log.Warn("pprof listening (profiles of this process, loopback only)", "addr", l.Addr().String())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(l) }()
	select {
	case err := <-done:
		return fmt.Errorf("pprof: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_ = srv.Shutdown(sctx)
	if err := <-done; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("pprof: %w", err)
	}
	return nil
}
