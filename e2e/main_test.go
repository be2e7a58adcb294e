package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"edgegw/internal/testenv"
	"edgegw/lab/sim"
)

// bin is the edgegw binary built once for the tests that run it as a
// process (the commands, the demo in a browser, the upstream outage).
var bin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "edgegw-test")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	bin = filepath.Join(dir, "edgegw")
	// The tests name the repository's files (build/, conf/, README.md)
	// from its root, and the binary is the root package.
	if err := os.Chdir(".."); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "build: %v\n%s", err, out)
		os.Exit(1)
	}
	code := m.Run()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.RemoveAll(dir)
	os.Exit(code)
}

// proc is one edgegw process started by a test.
type proc = testenv.Proc

// startProc runs edgegw with args until the test ends (SIGKILL at cleanup).
func startProc(t *testing.T, args ...string) *proc {
	t.Helper()
	return startProcBin(t, bin, args...)
}

// startProcBin is startProc with another edgegw binary (an installed copy).
func startProcBin(t *testing.T, binary string, args ...string) *proc {
	t.Helper()
	return testenv.StartProc(t, "edgegw "+strings.Join(args, " "), binary, args...)
}

// getJSON decodes the JSON body of a GET of url into v: an error unless
// it answers 200 within 10 s.
func getJSON(t *testing.T, url string, v any) error {
	t.Helper()
	return getJSONWith(http.DefaultClient, url, "", "", v)
}

// getJSONWith is getJSON through c, with basic auth when user is set.
func getJSONWith(c *http.Client, url, user, pass string, v any) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", url, nil)
	if user != "" {
		req.SetBasicAuth(user, pass)
	}
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		return fmt.Errorf("%s: %s", url, resp.Status)
	}
	return json.NewDecoder(resp.Body).Decode(v)
}

// waitFor is testenv.WaitFor: poll a condition with a deadline.
var waitFor = testenv.WaitFor

func TestVersion(t *testing.T) {
	out, err := exec.Command(bin, "version").Output()
	if err != nil || !strings.HasPrefix(string(out), "edgegw ") || !strings.Contains(string(out), "go1.") {
		t.Fatalf("version: %q %v", out, err)
	}
}

func TestCheckExampleConfig(t *testing.T) {
	out, err := exec.Command(bin, "check", "-config", "build/edgegw.example.toml").CombinedOutput()
	if err != nil {
		t.Fatalf("check: %v\n%s", err, out)
	}
	for _, want := range []string{"logger-48", "temperature", "read plan", "holding 0+2 (2 tags)", "ok (49 devices)"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("check output lacks %q", want)
		}
	}
}

func TestCheckBadConfigExitsOne(t *testing.T) {
	path := filepath.Join(t.TempDir(), "bad.toml")
	body := "[[device]]\nname = \"d1\"\ntransport = \"udp\"\naddress = \"127.0.0.1\"\ntags = [ { name = \"t\", address = 70000 } ]\nbogus = 1\n"
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "check", "-config", path)
	out, _ := cmd.CombinedOutput()
	if cmd.ProcessState.ExitCode() != 1 {
		t.Fatalf("exit %d, want 1\n%s", cmd.ProcessState.ExitCode(), out)
	}
	for _, want := range []string{path + ":5:", `device "d1"`, "70000", path + ":6:", "bogus"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("errors lack %q:\n%s", want, out)
		}
	}
}

// runGateway runs `edgegw run -config cfg` and returns it with its page URL
// (read from the "edgegw running … page=URL" log line).
func runGateway(t *testing.T, cfg string) (*proc, string) {
	t.Helper()
	p := startProc(t, "run", "-config", cfg)
	line := p.WaitLine("edgegw running", 20*time.Second)
	return p, line[strings.Index(line, "page=")+len("page="):]
}

// runFleet runs simulated loggers in the test process until the test ends.
func runFleet(t *testing.T, cfg sim.Config) *sim.Fleet {
	t.Helper()
	fleet, err := sim.NewFleet(cfg)
	return testenv.Running(t, 10*time.Second, "the simulated fleet", fleet, err)
}

// refusedAddr and silentUDPAddr: a TCP address that refuses, a UDP one
// that never answers (testenv's).
var refusedAddr, silentUDPAddr = testenv.RefusedAddr, testenv.SilentUDPAddr

// startDemo runs `edgegw demo` and returns its page URL.
func startDemo(t *testing.T, args ...string) (*proc, string) {
	t.Helper()
	p := startProc(t, append([]string{"demo", "-http", "127.0.0.1:0", "-stats", "0"}, args...)...)
	line := p.WaitLine("page: ", 20*time.Second)
	return p, strings.TrimSpace(strings.TrimPrefix(line[strings.Index(line, "page: "):], "page: "))
}

type shortPoll struct {
	Seq  uint64 `json:"seq"`
	Tags []struct {
		Device, Tag, Quality string
		Value                *float64
	} `json:"tags"`
}

// The demo answers on its page and API, and stops cleanly on SIGINT.
func TestDemoServesAndStopsCleanly(t *testing.T) {
	p, page := startDemo(t, "-devices", "8", "-interval", "200ms")
	var sp shortPoll
	waitFor(t, 10*time.Second, "all 8 loggers in /api/shortPolling", func() bool {
		return getJSON(t, page+"api/shortPolling", &sp) == nil && len(sp.Tags) == 16
	})
	for _, tg := range sp.Tags {
		if tg.Quality != "good" || tg.Value == nil {
			t.Errorf("%s/%s: %s %v", tg.Device, tg.Tag, tg.Quality, tg.Value)
		}
	}
	if code := p.Stop(os.Interrupt, 15*time.Second); code != 0 {
		t.Fatalf("demo exited %d on SIGINT", code)
	}
}

// The page, loaded in headless Chromium against `edgegw demo`, shows the
// simulated devices' values. The screenshot is kept in $EDGEGW_ARTIFACTS.
func TestDemoPageInChromium(t *testing.T) {
	chromium := testenv.Need(t, "chromium")
	_, page := startDemo(t, "-devices", "6", "-interval", "200ms")
	var sp shortPoll
	waitFor(t, 10*time.Second, "values of every logger", func() bool {
		return getJSON(t, page+"api/shortPolling", &sp) == nil && len(sp.Tags) == 12
	})
	flags := []string{"--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
		"--disable-background-networking", "--disable-component-update", "--disable-sync",
		"--user-data-dir=" + t.TempDir(), "--virtual-time-budget=5000"}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	dom, err := exec.CommandContext(ctx, chromium, append(flags, "--dump-dom", page)...).Output()
	if err != nil {
		t.Fatalf("chromium --dump-dom: %v", err)
	}
	html := string(dom)
	for i := 1; i <= 6; i++ {
		if !strings.Contains(html, fmt.Sprintf(`data-device="logger-%02d"`, i)) {
			t.Errorf("page lacks logger-%02d", i)
		}
	}
	for _, want := range []string{`data-tag="temperature"`, `data-tag="humidity"`, `data-quality="good"`, "°C", "%RH"} {
		if !strings.Contains(html, want) {
			t.Errorf("page lacks %s", want)
		}
	}
	dir := os.Getenv("EDGEGW_ARTIFACTS")
	if dir == "" {
		dir = t.TempDir()
	}
	shot := filepath.Join(dir, "demo-page.png")
	if out, err := exec.CommandContext(ctx, chromium, append(flags, "--window-size=1200,900", "--screenshot="+shot, page)...).CombinedOutput(); err != nil {
		t.Fatalf("chromium --screenshot: %v\n%s", err, out)
	}
	if b, err := os.ReadFile(shot); err != nil || len(b) < 1000 || string(b[1:4]) != "PNG" {
		t.Fatalf("screenshot %s: %d bytes, %v", shot, len(b), err)
	}
	t.Logf("screenshot: %s", shot)
}

// hashPasswordFile writes dir/ui.hash: `edgegw hash-password`'s hash of
// password (for basic_auth_hash_file), and returns its path.
func hashPasswordFile(t *testing.T, dir, password string) string {
	t.Helper()
	cmd := exec.Command(bin, "hash-password")
	cmd.Stdin = strings.NewReader(password + "\n")
	hash, err := cmd.Output()
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "ui.hash")
	if err := os.WriteFile(path, hash, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// Read access control from the config file: basic auth for the page and
// API (hash made by `edgegw hash-password`), /metrics protected too,
// /healthz open.
func TestBasicAuthFromConfig(t *testing.T) {
	dir := t.TempDir()
	hashFile := hashPasswordFile(t, dir, "s3cret")
	cfg := filepath.Join(dir, "edgegw.toml")
	body := fmt.Sprintf("[http]\nlisten = \"127.0.0.1:0\"\nbasic_auth_user = \"operator\"\nbasic_auth_hash_file = %q\nprotect_metrics = true\n"+
		"[[device]]\nname = \"d\"\ntransport = \"tcp\"\naddress = %q\ntags = [ { name = \"t\", address = 0 } ]\n", hashFile, refusedAddr(t))
	if err := os.WriteFile(cfg, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	gw, page := runGateway(t, cfg)
	get := func(path, user, pass string) int {
		req, _ := http.NewRequest("GET", page+path, nil)
		if user != "" {
			req.SetBasicAuth(user, pass)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	for _, c := range []struct {
		path, user, pass string
		want             int
	}{
		{"api/shortPolling", "", "", 401},
		{"api/shortPolling", "operator", "wrong", 401},
		{"api/shortPolling", "operator", "s3cret", 200},
		{"", "", "", 401},
		{"metrics", "", "", 401},
		{"metrics", "operator", "s3cret", 200},
		{"healthz", "", "", 200}, // open; 503 once the unreachable device counts as down
	} {
		if got := get(c.path, c.user, c.pass); got != c.want && !(c.path == "healthz" && got == 503) {
			t.Errorf("GET /%s as %q/%q: %d, want %d", c.path, c.user, c.pass, got, c.want)
		}
	}
	gw.Stop(os.Interrupt, 10*time.Second)
}
