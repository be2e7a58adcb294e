package web

import (
	_ "embed"
	"net/http"
	"strconv"
)

// page is the live page: one self-contained HTML file (inline CSS and JS, no
// external URL) fed by /api/ws, /api/devices and /api/status.
//
//go:embed page.html
var page []byte

func (s *Server) handlePage(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Content-Type", "text/html; charset=utf-8")
	h.Set("Content-Length", strconv.Itoa(len(page)))
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Content-Security-Policy", "default-src 'self'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; connect-src 'self' ws: wss:; img-src 'self' data:")
	_, _ = w.Write(page)
}
