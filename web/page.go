package web

import (
	_ "embed"
	"net/http"
	"strconv"
)

// page is the live page: one HTML file (inline CSS and JS) fed by /api/ws,
// /api/devices, /api/status and /api/history. Its one library, uPlot 1.6.32
// (MIT, https://github.com/leeoniya/uPlot; npm package "uplot", dist files
// and LICENSE copied as they are into uplot/), is embedded too and served under
// /assets/: the page loads nothing from any other host and works offline.
//
//go:embed page.html
var page []byte

var (
	//go:embed uplot/uPlot.iife.min.js
	uplotJS []byte
	//go:embed uplot/uPlot.min.css
	uplotCSS []byte
	//go:embed uplot/LICENSE
	uplotLicense []byte
)

// assets are the embedded files under /assets/, with their content type.
var assets = map[string]struct {
	body  []byte
	ctype string
}{
	"uplot-1.6.32.min.js":  {uplotJS, "text/javascript; charset=utf-8"},
	"uplot-1.6.32.min.css": {uplotCSS, "text/css; charset=utf-8"},
	"uplot.LICENSE.txt":    {uplotLicense, "text/plain; charset=utf-8"},
}

func (s *Server) handlePage(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Content-Type", "text/html; charset=utf-8")
	h.Set("Content-Length", strconv.Itoa(len(page)))
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Content-Security-Policy", "default-src 'self'; style-src 'self' 'unsafe-inline'; script-src 'self' 'unsafe-inline'; connect-src 'self' ws: wss:; img-src 'self' data:")
	_, _ = w.Write(page)
}

// handleAsset serves an embedded library file; the version is in the name,
// so browsers may keep it for a week (never a shared cache: it may need auth).
func (s *Server) handleAsset(w http.ResponseWriter, r *http.Request) {
	a, ok := assets[r.PathValue("file")]
	if !ok {
		http.NotFound(w, r)
		return
	}
	h := w.Header()
	h.Set("Content-Type", a.ctype)
	h.Set("Content-Length", strconv.Itoa(len(a.body)))
	h.Set("Cache-Control", "private, max-age=604800") // private: it may sit behind read auth
	h.Set("X-Content-Type-Options", "nosniff")
	_, _ = w.Write(a.body)
}
