package web

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// kindErr is an error a Writer returns, classified like edge.WriteError.
type kindErr struct{ kind, msg string }

func (e *kindErr) Error() string          { return "edge: " + e.msg }
func (e *kindErr) WriteErrorKind() string { return e.kind }

// scriptWriter answers writes from a table keyed by tag and records calls.
type scriptWriter struct {
	mu    sync.Mutex
	calls []string
	errs  map[string]error
}

var _ Writer = (*scriptWriter)(nil)

func (w *scriptWriter) Write(ctx context.Context, device, tag string, value float64, origin string) (float64, float64, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.calls = append(w.calls, fmt.Sprintf("%s/%s=%v from %s", device, tag, value, origin))
	if err := w.errs[tag]; err != nil {
		return value, 0, err
	}
	return value, value, nil
}

func (w *scriptWriter) ncalls() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.calls)
}

type reply struct {
	code int
	hdr  http.Header
	body map[string]any
	raw  string
}

func (ts *testServer) post(t *testing.T, path, token, ctype, body string) reply {
	t.Helper()
	req, err := http.NewRequest("POST", ts.base+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if ctype != "" {
		req.Header.Set("Content-Type", ctype)
	}
	resp, err := ts.client.Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	r := reply{code: resp.StatusCode, hdr: resp.Header, raw: string(b)}
	if err := json.Unmarshal(b, &r.body); err != nil {
		t.Fatalf("POST %s: %d %q: %v", path, resp.StatusCode, b, err)
	}
	return r
}

const testToken = "0123456789abcdef0123456789abcdef"

func TestWriteEndpoint(t *testing.T) {
	w := &scriptWriter{errs: map[string]error{
		"nodev":  &kindErr{"unknown device", `write "x"/"nodev" = 1: unknown device: no such device`},
		"notag":  &kindErr{"unknown tag", "no such tag"},
		"busy":   &kindErr{"busy", "8 writes already wait"},
		"ro":     &kindErr{"not writable", "the tag is not marked writable"},
		"range":  &kindErr{"out of range", "above max 90"},
		"dead":   &kindErr{"device", "timeout"},
		"differ": &kindErr{"mismatch", "wrote 1, read back 2"},
		"stop":   &kindErr{"stopped", "the scheduler is not running"},
		"late":   fmt.Errorf("edge: write not started: %w", context.DeadlineExceeded),
		"odd":    fmt.Errorf("something else"),
	}}
	ts := startServer(t, Config{Writer: w, WriteToken: testToken})
	const js = "application/json"
	ok := ts.post(t, "/api/write", testToken, js, `{"device":"boiler","tag":"setpoint","value":21.5}`)
	if ok.code != 200 || ok.body["device"] != "boiler" || ok.body["tag"] != "setpoint" || ok.body["written"] != 21.5 ||
		ok.body["read_back"] != 21.5 || ok.body["duration_ms"] == nil {
		t.Fatalf("good write: %d %s", ok.code, ok.raw)
	}
	if r := ts.post(t, "/api/write", testToken, "application/json; charset=utf-8", `{"device":"d","tag":"pump","value":true}`); r.code != 200 || r.body["written"] != 1.0 {
		t.Errorf("bool true: %d %s", r.code, r.raw)
	}
	if r := ts.post(t, "/api/write", testToken, "", `{"device":"d","tag":"pump","value":false}`); r.code != 200 || r.body["written"] != 0.0 {
		t.Errorf("bool false: %d %s", r.code, r.raw)
	}
	calls := w.ncalls()
	if calls != 3 || !strings.HasSuffix(w.calls[0], "boiler/setpoint=21.5 from http 127.0.0.1") {
		t.Fatalf("calls: %q", w.calls)
	}
	refused := []struct {
		name, token, ctype, body string
		code                     int
		msg                      string
	}{
		{"no token", "", js, `{"device":"d","tag":"t","value":1}`, 401, "Bearer"},
		{"wrong token", "x" + testToken[1:], js, `{"device":"d","tag":"t","value":1}`, 401, "Bearer"},
		{"text/plain", testToken, "text/plain", `{"device":"d","tag":"t","value":1}`, 415, "application/json"},
		{"bad json", testToken, js, `{"device":"d",`, 400, "bad write body"},
		{"empty", testToken, js, ``, 400, "empty write body"},
		{"unknown field", testToken, js, `{"device":"d","tag":"t","value":1,"force":true}`, 400, "unknown field"},
		{"trailing", testToken, js, `{"device":"d","tag":"t","value":1}{}`, 400, "data after"},
		{"trailing garbage", testToken, js, `{"device":"d","tag":"t","value":1} x`, 400, "bad write body"},
		{"nested", testToken, js, `{"device":"d","tag":"t","value":[[[[[1]]]]]}`, 400, "nested deeper"},
		{"string value", testToken, js, `{"device":"d","tag":"t","value":"1"}`, 400, "number or true/false"},
		{"null value", testToken, js, `{"device":"d","tag":"t","value":null}`, 400, `missing "value"`},
		{"huge number", testToken, js, `{"device":"d","tag":"t","value":1e400}`, 400, "number or true/false"},
		{"no value", testToken, js, `{"device":"d","tag":"t"}`, 400, `missing "value"`},
		{"no device", testToken, js, `{"tag":"t","value":1}`, 400, `missing "device"`},
		{"array", testToken, js, `[1]`, 400, "bad write body"},
	}
	for _, c := range refused {
		r := ts.post(t, "/api/write", c.token, c.ctype, c.body)
		if e, _ := r.body["error"].(string); r.code != c.code || !strings.Contains(e, c.msg) {
			t.Errorf("%s: %d %s, want %d with %q", c.name, r.code, r.raw, c.code, c.msg)
		}
		if c.code == 401 && !strings.HasPrefix(r.hdr.Get("WWW-Authenticate"), "Bearer") {
			t.Errorf("%s: WWW-Authenticate %q", c.name, r.hdr.Get("WWW-Authenticate"))
		}
	}
	if n := w.ncalls(); n != calls {
		t.Errorf("refused requests reached the writer: %q", w.calls[calls:])
	}
	failed := map[string]int{"nodev": 404, "notag": 404, "busy": 409, "ro": 422, "range": 422, "dead": 502, "differ": 502, "stop": 503, "late": 504, "odd": 500}
	for tag, code := range failed {
		r := ts.post(t, "/api/write", testToken, js, `{"device":"d","tag":"`+tag+`","value":1}`)
		if r.code != code || r.body["error"] != w.errs[tag].Error() {
			t.Errorf("%s: %d %s, want %d", tag, r.code, r.raw, code)
		}
		if k, ok := w.errs[tag].(*kindErr); ok && r.body["kind"] != k.kind {
			t.Errorf("%s: kind %v", tag, r.body["kind"])
		}
		if tag == "busy" && r.hdr.Get("Retry-After") != "1" {
			t.Errorf("busy: Retry-After %q", r.hdr.Get("Retry-After"))
		}
	}
	st := ts.Stats()
	if st.WritesOK != 3 || st.WritesFailed != uint64(len(failed)) || st.WritesRefused != uint64(len(refused)-2) || st.AuthFailures != 2 {
		t.Errorf("stats %+v", st)
	}
	_, _, m := ts.get(t, "/metrics")
	for _, line := range []string{`edgegw_web_writes_total{result="ok"} 3`, `edgegw_web_auth_failures_total 2`} {
		if !strings.Contains(string(m), line+"\n") {
			t.Errorf("metrics lack %q", line)
		}
	}
}

func TestWritesDisabled(t *testing.T) {
	w := &scriptWriter{}
	for _, cfg := range []Config{{Writer: w}, {WriteToken: testToken}} {
		ts := startServer(t, cfg)
		r := ts.post(t, "/api/write", testToken, "application/json", `{"device":"d","tag":"t","value":1}`)
		if e, _ := r.body["error"].(string); r.code != 403 || !strings.Contains(e, "no write token is configured") {
			t.Errorf("%d %s", r.code, r.raw)
		}
	}
	if w.ncalls() != 0 {
		t.Error("writer called")
	}
}

// rawRequest sends head (and body) on a fresh connection and returns the
// status line and how long the answer took.
func rawRequest(t *testing.T, addr, head string, body io.Reader) (string, time.Duration) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	t0 := time.Now()
	if _, err := io.WriteString(c, head); err != nil {
		t.Fatal(err)
	}
	if body != nil {
		go func() { _, _ = io.Copy(c, body) }() // stops when the server closes
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		t.Fatalf("reading the status: %v", err)
	}
	return strings.TrimSpace(line), time.Since(t0)
}

// bodyCounter counts what the server let the client send.
type bodyCounter struct {
	r  io.Reader
	n  int64
	mu sync.Mutex
}

func (b *bodyCounter) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	b.mu.Lock()
	b.n += int64(n)
	b.mu.Unlock()
	return n, err
}

// A 10 MB body is refused with 413 before it is read, announced or chunked.
func TestWriteHugeBody(t *testing.T) {
	ts := startServer(t, Config{Writer: &scriptWriter{}, WriteToken: testToken})
	addr := strings.TrimPrefix(ts.base, "http://")
	head := "POST /api/write HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + testToken + "\r\nContent-Type: application/json\r\n"
	const size = 10 << 20
	// Announced: refused on the header, without a byte of body.
	line, d := rawRequest(t, addr, head+fmt.Sprintf("Content-Length: %d\r\n\r\n", size), nil)
	if !strings.Contains(line, " 413 ") {
		t.Fatalf("announced 10 MB: %s", line)
	}
	t.Logf("announced: %s in %v", line, d)
	// Chunked: cut at MaxWriteBody.
	bc := &bodyCounter{r: chunked(`{"device":"` + strings.Repeat("a", size))}
	line, d = rawRequest(t, addr, head+"Transfer-Encoding: chunked\r\n\r\n", bc)
	if !strings.Contains(line, " 413 ") {
		t.Fatalf("chunked 10 MB: %s", line)
	}
	bc.mu.Lock()
	sent := bc.n
	bc.mu.Unlock()
	t.Logf("chunked: %s in %v after %d bytes sent", line, d, sent)
	if sent >= size/2 {
		t.Errorf("the server let %d bytes in before answering", sent)
	}
	if st := ts.Stats(); st.TooLarge != 2 {
		t.Errorf("too large counted %d", st.TooLarge)
	}
}

// chunked encodes s as one HTTP chunk (test bodies only).
func chunked(s string) io.Reader {
	return strings.NewReader(fmt.Sprintf("%x\r\n%s\r\n0\r\n\r\n", len(s), s))
}

// 100k '[' is refused with 400 after a few bytes.
func TestWriteDeeplyNested(t *testing.T) {
	ts := startServer(t, Config{Writer: &scriptWriter{}, WriteToken: testToken})
	addr := strings.TrimPrefix(ts.base, "http://")
	head := "POST /api/write HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + testToken + "\r\nContent-Type: application/json\r\n"
	deep := strings.Repeat("[", 100_000)
	line, d := rawRequest(t, addr, head+"Transfer-Encoding: chunked\r\n\r\n", chunked(deep))
	if !strings.Contains(line, " 400 ") || d > 2*time.Second {
		t.Fatalf("100k '[' chunked: %s in %v", line, d)
	}
	deep = strings.Repeat("[", 60_000) // under MaxRequestBytes, announced
	r := ts.post(t, "/api/write", testToken, "application/json", `{"device":`+deep)
	if r.code != 400 || !strings.Contains(r.raw, "nested deeper") {
		t.Fatalf("60k '[': %d %s", r.code, r.raw)
	}
}

func TestWriteRateLimit(t *testing.T) {
	w := &scriptWriter{}
	ts := startServer(t, Config{Writer: w, WriteToken: testToken, RateLimit: RateLimits{Hold: -1, Write: Rate{PerSec: 0.5, Burst: 3}}})
	body := `{"device":"d","tag":"t","value":1}`
	var codes []int
	for range 5 {
		r := ts.post(t, "/api/write", testToken, "application/json", body)
		codes = append(codes, r.code)
		if r.code == 429 && r.hdr.Get("Retry-After") != "2" {
			t.Errorf("Retry-After %q", r.hdr.Get("Retry-After"))
		}
	}
	if fmt.Sprint(codes) != "[200 200 200 429 429]" || w.ncalls() != 3 {
		t.Errorf("codes %v, %d writes", codes, w.ncalls())
	}
	_, _, m := ts.get(t, "/metrics")
	if !strings.Contains(string(m), `edgegw_web_rate_limited_total{class="write"} 2`+"\n") {
		t.Error("rate limited writes not in /metrics")
	}
}

// Wrong tokens cost the client's auth bucket: guessing runs into 429.
func TestAuthFailuresAreRateLimited(t *testing.T) {
	ts := startServer(t, Config{ReadToken: testToken, RateLimit: RateLimits{Hold: -1, Auth: Rate{PerSec: 0.1, Burst: 4}}})
	var codes []int
	for range 6 {
		req, _ := http.NewRequest("GET", ts.base+"/api/status", nil)
		req.Header.Set("Authorization", "Bearer guess")
		resp, err := ts.client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		codes = append(codes, resp.StatusCode)
	}
	if fmt.Sprint(codes) != "[401 401 401 401 429 429]" {
		t.Errorf("codes %v", codes)
	}
}

func TestCORSPreflight(t *testing.T) {
	ts := startServer(t, Config{Writer: &scriptWriter{}, WriteToken: testToken, AllowedOrigins: []string{"http://scada.example:8000"}})
	preflight := func(origin, path string) *http.Response {
		req, _ := http.NewRequest("OPTIONS", ts.base+path, nil)
		req.Header.Set("Origin", origin)
		req.Header.Set("Access-Control-Request-Method", "POST")
		req.Header.Set("Access-Control-Request-Headers", "authorization, content-type")
		resp, err := ts.client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp
	}
	r := preflight("http://scada.example:8000", "/api/write")
	if r.StatusCode != 204 || r.Header.Get("Access-Control-Allow-Origin") != "http://scada.example:8000" ||
		r.Header.Get("Access-Control-Allow-Methods") != "POST" || !strings.Contains(r.Header.Get("Access-Control-Allow-Headers"), "Authorization") {
		t.Errorf("allowed origin: %d %v", r.StatusCode, r.Header)
	}
	r = preflight("http://evil.example", "/api/write")
	if r.StatusCode != 403 || r.Header.Get("Access-Control-Allow-Origin") != "" {
		t.Errorf("foreign origin: %d %v", r.StatusCode, r.Header)
	}
	// The actual cross-origin write carries the allow header for the allowed origin only.
	for origin, want := range map[string]string{"http://scada.example:8000": "http://scada.example:8000", "http://evil.example": ""} {
		req, _ := http.NewRequest("POST", ts.base+"/api/write", strings.NewReader(`{"device":"d","tag":"t","value":1}`))
		req.Header.Set("Origin", origin)
		req.Header.Set("Authorization", "Bearer "+testToken)
		req.Header.Set("Content-Type", "application/json")
		resp, err := ts.client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if got := resp.Header.Get("Access-Control-Allow-Origin"); got != want {
			t.Errorf("%s: ACAO %q", origin, got)
		}
	}
}
