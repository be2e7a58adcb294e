package web

import (
	"bytes"
	"compress/gzip"
	"io"
	"net/http"
	"os"
	"strconv"
	"testing"
)

// TestEmbeddedGzipIsTheSource: each embedded member inflates (CRC and size
// checked) to the file it was made from, and has the 10-byte header
// without a name that writeGzipped skips (go generate ./web remakes them).
func TestEmbeddedGzipIsTheSource(t *testing.T) {
	for src, gz := range map[string][]byte{"page.html": pageGz, "uplot/uPlot.iife.min.js": uplotJSGz} {
		want, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		zr, err := gzip.NewReader(bytes.NewReader(gz))
		if err != nil {
			t.Fatalf("%s.gz: %v", src, err)
		}
		zr.Multistream(false)
		got, err := io.ReadAll(zr)
		if err != nil {
			t.Fatalf("%s.gz: %v", src, err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s.gz inflates to %d bytes that are not %s's %d: run go generate ./web", src, len(got), src, len(want))
		}
		if gz[3] != 0 || zr.Name != "" || zr.Extra != nil || zr.Comment != "" {
			t.Errorf("%s.gz: header flags %#x (name %q): want gzip -n's 10-byte header", src, gz[3], zr.Name)
		}
		if len(gz)*2 > len(want) {
			t.Errorf("%s.gz is %d bytes for %d: not worth the flash", src, len(gz), len(want))
		}
	}
}

// TestPageAndScriptGzipOrNot: the page and uPlot's script go out as the
// embedded gzip member to a client that accepts gzip, inflated (the
// source's bytes) to any other, with a Content-Length and Vary either way.
func TestPageAndScriptGzipOrNot(t *testing.T) {
	ts := startServer(t, Config{})
	page, err := os.ReadFile("page.html")
	if err != nil {
		t.Fatal(err)
	}
	script, err := os.ReadFile("uplot/uPlot.iife.min.js")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		path, accept string
		gz           bool
	}{
		{"/", "", false},
		{"/", "gzip, deflate, br", true},
		{"/", "br;q=1.0, gzip;q=0.8, *;q=0.1", true},
		{"/", "gzip;q=0", false},
		{"/", "gzip;q=0, *", false},
		{"/", "*", true},
		{"/", "identity", false},
		{"/assets/uplot-1.6.32.min.js", "", false},
		{"/assets/uplot-1.6.32.min.js", "gzip", true},
		{"/assets/uplot-1.6.32.min.js", "x-gzip;q=0.5", true},
	} {
		req, err := http.NewRequest("GET", ts.base+c.path, nil)
		if err != nil {
			t.Fatal(err)
		}
		if c.accept != "" {
			req.Header.Set("Accept-Encoding", c.accept)
		}
		resp, err := ts.client.Do(req) // DisableCompression: the body as sent
		if err != nil {
			t.Fatalf("GET %s: %v", c.path, err)
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			t.Fatalf("GET %s: read: %v", c.path, err)
		}
		want, plain := pageGz, page
		if c.path != "/" {
			want, plain = uplotJSGz, script
		}
		if !c.gz {
			want = plain
		}
		enc := resp.Header.Get("Content-Encoding")
		if resp.StatusCode != 200 || !bytes.Equal(body, want) || (enc == "gzip") != c.gz {
			t.Errorf("GET %s, Accept-Encoding %q: %d, Content-Encoding %q, %d bytes; want gzip %v, %d bytes", c.path, c.accept, resp.StatusCode, enc, len(body), c.gz, len(want))
		}
		if cl := resp.Header.Get("Content-Length"); cl != strconv.Itoa(len(want)) {
			t.Errorf("GET %s, Accept-Encoding %q: Content-Length %q, want %d", c.path, c.accept, cl, len(want))
		}
		if v := resp.Header.Get("Vary"); v != "Accept-Encoding" {
			t.Errorf("GET %s: Vary %q", c.path, v)
		}
	}
}
