package testenv

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"
)

// Browser is a headless Chromium showing one page, driven over the DevTools
// protocol (one WebSocket to the page target; calls are synchronous). Unlike
// --dump-dom it runs in real time, so a test can stop the gateway under the
// page and watch what the page makes of it.
type Browser struct {
	t    testing.TB
	conn *websocket.Conn
	id   int
}

var devtoolsRE = regexp.MustCompile(`DevTools listening on (ws://127\.0\.0\.1:(\d+)/\S+)`)

// StartBrowser starts Chromium (the flags of the other page tests plus a
// DevTools port picked by Chromium) on url at width × height; it is killed
// at cleanup.
func StartBrowser(t testing.TB, url string, width, height int) *Browser {
	t.Helper()
	bin := Need(t, "chromium")
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, bin, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
		"--disable-background-networking", "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage",
		"--hide-scrollbars", "--user-data-dir="+t.TempDir(), "--remote-debugging-address=127.0.0.1", "--remote-debugging-port=0",
		fmt.Sprintf("--window-size=%d,%d", width, height), url)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	port := make(chan string, 1)
	go func() { // reads stderr until chromium exits
		defer close(done)
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			if m := devtoolsRE.FindStringSubmatch(sc.Text()); m != nil {
				select {
				case port <- m[2]:
				default:
				}
			}
		}
		_, _ = io.Copy(io.Discard, stderr)
	}()
	b := &Browser{t: t}
	t.Cleanup(func() {
		if b.conn != nil {
			b.conn.Close()
		}
		cancel()
		<-done
		_ = cmd.Wait()
	})
	var p string
	select {
	case p = <-port:
	case <-done:
		t.Fatal("testenv: chromium exited before opening its DevTools port")
	case <-time.After(30 * time.Second):
		t.Fatal("testenv: chromium did not open its DevTools port within 30s")
	}
	// The page target of the url given on the command line.
	var targets []struct {
		Type, URL, WebSocketDebuggerURL string
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		resp, err := http.Get("http://127.0.0.1:" + p + "/json/list")
		if err == nil {
			err = json.NewDecoder(resp.Body).Decode(&targets)
			resp.Body.Close()
		}
		var ws string
		for _, tg := range targets {
			if tg.Type == "page" && tg.WebSocketDebuggerURL != "" {
				ws = tg.WebSocketDebuggerURL
			}
		}
		if ws != "" {
			if b.conn, _, err = websocket.DefaultDialer.Dial(ws, nil); err != nil {
				t.Fatalf("testenv: devtools: %v", err)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("testenv: no page target in chromium: %v %+v", err, targets)
		}
		time.Sleep(50 * time.Millisecond) // the poll interval of the target list
	}
	return b
}

// Call sends one DevTools command and returns its result.
func (b *Browser) Call(method string, params any) (json.RawMessage, error) {
	b.id++
	id := b.id
	if err := b.conn.WriteJSON(map[string]any{"id": id, "method": method, "params": params}); err != nil {
		return nil, err
	}
	_ = b.conn.SetReadDeadline(time.Now().Add(60 * time.Second))
	for {
		var m struct {
			ID     int             `json:"id"`
			Result json.RawMessage `json:"result"`
			Error  *struct {
				Message string `json:"message"`
			} `json:"error"`
		}
		if err := b.conn.ReadJSON(&m); err != nil {
			return nil, fmt.Errorf("testenv: devtools %s: %w", method, err)
		}
		if m.ID != id {
			continue // an event
		}
		if m.Error != nil {
			return nil, fmt.Errorf("testenv: devtools %s: %s", method, m.Error.Message)
		}
		return m.Result, nil
	}
}

// Eval evaluates a JavaScript expression in the page (promises awaited)
// and decodes its value into out (nil: ignore it).
func (b *Browser) Eval(expr string, out any) error {
	res, err := b.Call("Runtime.evaluate", map[string]any{"expression": expr, "returnByValue": true, "awaitPromise": true})
	if err != nil {
		return err
	}
	var r struct {
		Result struct {
			Value json.RawMessage `json:"value"`
		} `json:"result"`
		ExceptionDetails *struct {
			Text      string `json:"text"`
			Exception struct {
				Description string `json:"description"`
			} `json:"exception"`
		} `json:"exceptionDetails"`
	}
	if err := json.Unmarshal(res, &r); err != nil {
		return err
	}
	if r.ExceptionDetails != nil {
		return fmt.Errorf("testenv: %s: %s %s", expr, r.ExceptionDetails.Text, r.ExceptionDetails.Exception.Description)
	}
	if out == nil || len(r.Result.Value) == 0 {
		return nil
	}
	return json.Unmarshal(r.Result.Value, out)
}

// WaitJS waits until the expression is true, at most limit, checking
// every 100 ms; the last value of report (an expression) goes in the failure.
func (b *Browser) WaitJS(limit time.Duration, what, expr, report string) time.Duration {
	b.t.Helper()
	start := time.Now()
	for {
		var ok bool
		err := b.Eval("!!("+expr+")", &ok)
		if err == nil && ok {
			return time.Since(start)
		}
		if time.Since(start) > limit {
			var rep any
			if report != "" {
				_ = b.Eval(report, &rep)
			}
			b.t.Fatalf("timed out after %v waiting for %s (%v): %v", limit, what, err, rep)
		}
		time.Sleep(100 * time.Millisecond) // the poll interval of the condition check
	}
}

// Viewport sets the page's size; mobile emulates a phone (touch, no scrollbars).
func (b *Browser) Viewport(width, height int, mobile bool) {
	b.t.Helper()
	if _, err := b.Call("Emulation.setDeviceMetricsOverride", map[string]any{
		"width": width, "height": height, "deviceScaleFactor": 1, "mobile": mobile}); err != nil {
		b.t.Fatal(err)
	}
}

// Screenshot writes a PNG of the viewport to path.
func (b *Browser) Screenshot(path string) {
	b.t.Helper()
	res, err := b.Call("Page.captureScreenshot", map[string]any{"format": "png"})
	if err != nil {
		b.t.Fatal(err)
	}
	var r struct {
		Data string `json:"data"`
	}
	if err := json.Unmarshal(res, &r); err != nil {
		b.t.Fatal(err)
	}
	png, err := base64.StdEncoding.DecodeString(r.Data)
	if err != nil || len(png) < 1000 || !strings.HasPrefix(string(png), "\x89PNG") {
		b.t.Fatalf("screenshot: %d bytes, %v", len(png), err)
	}
	if err := os.WriteFile(path, png, 0o644); err != nil {
		b.t.Fatal(err)
	}
}
