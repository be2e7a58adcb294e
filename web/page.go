package web

import (
	"bytes"
	"compress/flate"
	_ "embed"
	"encoding/binary"
	"io"
	"net/http"
	"strconv"
	"strings"
)

// page is the live page: one HTML file (inline CSS and JS) fed by /api/ws,
// /api/devices, /api/status and /api/history. Its one library, uPlot 1.6.32
// (MIT, https://github.com/leeoniya/uPlot; npm package "uplot", dist files
// and LICENSE copied as they are into uplot/), is embedded too and served under
// /assets/: the page loads nothing from any other host and works offline.
//
// The page and uPlot's script are embedded gzip-compressed (page.html.gz,
// uplot/uPlot.iife.min.js.gz, made from the files beside them by go
// generate; TestEmbeddedGzipIsTheSource checks they are): 35 KB of flash
// instead of 91 KB. A client that accepts gzip gets them as they are
// (Content-Encoding: gzip), any other one the inflated bytes.
//
//go:generate sh -c "gzip -9nc page.html >page.html.gz && gzip -9nc uplot/uPlot.iife.min.js >uplot/uPlot.iife.min.js.gz"
//go:embed page.html.gz
var pageGz []byte

var (
	//go:embed uplot/uPlot.iife.min.js.gz
	uplotJSGz []byte
	//go:embed uplot/uPlot.min.css
	uplotCSS []byte
	//go:embed uplot/LICENSE
	uplotLicense []byte
)

// assets are the embedded files under /assets/, with their content type
// and whether body is gzip-compressed.
var assets = map[string]struct {
	body  []byte
	ctype string
	gz    bool
}{
	"uplot-1.6.32.min.js":  {uplotJSGz, "text/javascript; charset=utf-8", true},
	"uplot-1.6.32.min.css": {uplotCSS, "text/css; charset=utf-8", false},
	"uplot.LICENSE.txt":    {uplotLicense, "text/plain; charset=utf-8", false},
}

func (s *Server) handlePage(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Content-Type", "text/html; charset=utf-8")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Content-Security-Policy", "default-src 'self'; style-src 'self' 'unsafe-inline'; script-src 'self' 'unsafe-inline'; connect-src 'self' ws: wss:; img-src 'self' data:")
	writeGzipped(w, r, pageGz)
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
	h.Set("Cache-Control", "private, max-age=604800") // private: it may sit behind read auth
	h.Set("X-Content-Type-Options", "nosniff")
	if a.gz {
		writeGzipped(w, r, a.body)
		return
	}
	h.Set("Content-Length", strconv.Itoa(len(a.body)))
	_, _ = w.Write(a.body)
}

// writeGzipped writes gz, a gzip member, as it is when the request accepts
// gzip, inflated otherwise; Content-Length either way (the inflated size is
// the member's ISIZE trailer: the files are far below 4 GiB).
func writeGzipped(w http.ResponseWriter, r *http.Request, gz []byte) {
	h := w.Header()
	h.Add("Vary", "Accept-Encoding")
	if acceptsGzip(r.Header.Values("Accept-Encoding")) {
		h.Set("Content-Encoding", "gzip")
		h.Set("Content-Length", strconv.Itoa(len(gz)))
		_, _ = w.Write(gz)
		return
	}
	h.Set("Content-Length", strconv.FormatUint(uint64(binary.LittleEndian.Uint32(gz[len(gz)-4:])), 10))
	// The members are gzip -n's: a 10-byte header without a name, the
	// deflate stream, CRC-32 and ISIZE (TestEmbeddedGzipIsTheSource checks
	// each inflates to its source); a short copy is a client gone.
	_, _ = io.Copy(w, flate.NewReader(bytes.NewReader(gz[10:len(gz)-8])))
}

// acceptsGzip reports whether the Accept-Encoding values take gzip: gzip
// (or x-gzip) with a non-zero q, else * with a non-zero q.
func acceptsGzip(values []string) bool {
	gzipQ, starQ := -1.0, -1.0
	for _, v := range values {
		for _, part := range strings.Split(v, ",") {
			coding, params, _ := strings.Cut(part, ";")
			q := 1.0
			for _, p := range strings.Split(params, ";") {
				if k, val, ok := strings.Cut(p, "="); ok && strings.EqualFold(strings.TrimSpace(k), "q") {
					if q, _ = strconv.ParseFloat(strings.TrimSpace(val), 64); q != q {
						q = 0 // NaN
					}
				}
			}
			switch coding = strings.TrimSpace(coding); {
			case strings.EqualFold(coding, "gzip"), strings.EqualFold(coding, "x-gzip"):
				gzipQ = max(gzipQ, q)
			case coding == "*":
				starQ = max(starQ, q)
			}
		}
	}
	if gzipQ >= 0 {
		return gzipQ > 0
	}
	return starQ > 0
}
