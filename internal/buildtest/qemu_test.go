package buildtest

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"edgegw/internal/testenv"
)

var qemuTargets = []struct {
	arch, qemu, goarch string
}{
	{"arm64", "qemu-aarch64", "linux/arm64"},
	{"armv7", "qemu-arm", "linux/arm"},
}

// TestQemuVersion runs the cross-compiled arm64 and armv7 binaries under
// qemu-user, called explicitly (binfmt is not registered).
func TestQemuVersion(t *testing.T) {
	for _, tg := range qemuTargets {
		t.Run(tg.arch, func(t *testing.T) {
			qemu := testenv.Need(t, tg.qemu)
			bin := binary(t, tg.arch)
			out := mustRun(t, filepath.Dir(bin), nil, qemu, bin, "version")
			for _, want := range []string{"edgegw " + testVersion, testCommit, testDate, tg.goarch} {
				if !strings.Contains(out, want) {
					t.Errorf("%s %s version = %q, lacks %q", tg.qemu, tg.arch, out, want)
				}
			}
		})
	}
}

// TestQemuSmoke runs build/qemu-smoke.sh (the script behind make
// qemu-smoke) on both ARM targets: version and check on the example config
// with the gateway binary, and a demo with 48 loggers (the lab binary: the
// gateway has no demo) whose page and /api/shortPolling answer on loopback,
// then SIGINT. It logs the peak RSS under qemu.
func TestQemuSmoke(t *testing.T) {
	needSlow(t, "the demo under qemu")
	testenv.Need(t, "curl")
	config := filepath.Join(root(t), "build", "edgegw.example.toml")
	if _, err := os.Stat(config); err != nil {
		testenv.Missing(t, "build/edgegw.example.toml not written yet")
	}
	for _, tg := range qemuTargets {
		t.Run(tg.arch, func(t *testing.T) {
			qemu := testenv.Need(t, tg.qemu)
			bin, lab := binary(t, tg.arch), labBinary(t, tg.arch)
			out := mustRun(t, root(t), nil, "sh", filepath.Join(root(t), "build", "qemu-smoke.sh"), qemu, bin, config, "48", lab)
			t.Log(strings.TrimSpace(out))
		})
	}
}

// fakeDemo is a stand-in edgegw for the smoke script itself: version,
// check, and a demo (python http.server) that prints the agreed line
// "page: http://127.0.0.1:PORT/" and exits 0 on SIGINT. mode "silent"
// never prints the line; "nosamples" serves a shortPolling without "seq".
const fakeDemo = `#!/bin/sh
case $1 in
version) echo "edgegw v0-fake (commit c, built d, go1.26 linux/arm64)" ;;
check) [ "$2" = -config ] && [ -f "$3" ] || { echo "no config" >&2; exit 1; }; echo "$3: ok" ;;
demo) exec /usr/bin/python3 -u -c '
import http.server, json, signal, sys
mode = sys.argv[1]
class H(http.server.BaseHTTPRequestHandler):
    def log_message(self, *a): pass
    def do_GET(self):
        if self.path == "/":
            body, ct = b"<!doctype html><html><body>edgegw</body></html>", "text/html"
        elif self.path == "/api/shortPolling":
            doc = {"tags": []} if mode == "nosamples" else {"seq": 7, "tags": [{"seq": 7, "device": "logger-01", "tag": "t", "value": 1}]}
            body, ct = json.dumps(doc).encode(), "application/json"
        else:
            self.send_error(404); return
        self.send_response(200); self.send_header("Content-Type", ct); self.end_headers(); self.wfile.write(body)
srv = http.server.HTTPServer(("127.0.0.1", 0), H)
def stop(*a): sys.exit(0)
signal.signal(signal.SIGINT, stop)
if mode != "silent":
    print("edgegw demo: fake", flush=True)
    print("page: http://127.0.0.1:%d/" % srv.server_address[1], flush=True)
srv.serve_forever()
' "$FAKE_MODE" ;;
*) echo "usage: edgegw run|demo|check|version" >&2; exit 2 ;;
esac
`

// TestSmokeScript checks build/qemu-smoke.sh against the fake binary (run
// by "env" in place of qemu): it passes a good demo and fails, with the
// reason, a demo that never prints its page line or serves no samples.
func TestSmokeScript(t *testing.T) {
	testenv.Need(t, "curl")
	testenv.Need(t, "/usr/bin/python3")
	dir := t.TempDir()
	fake := filepath.Join(dir, "edgegw-fake")
	writeFile(t, fake, fakeDemo, 0o755)
	config := filepath.Join(dir, "edgegw.toml")
	writeFile(t, config, "# fake\n", 0o644)
	script := filepath.Join(root(t), "build", "qemu-smoke.sh")
	smoke := func(mode string) result {
		return run(t, dir, []string{"FAKE_MODE=" + mode, "SMOKE_START_TIMEOUT=3", "SMOKE_STOP_TIMEOUT=10"},
			"sh", script, "env", fake, config, "3")
	}
	r := smoke("good")
	if r.code != 0 {
		t.Fatalf("smoke on a good demo: exit %d\n%s", r.code, r.out)
	}
	for _, want := range []string{"check " + config + " ok", "demo serves http://127.0.0.1:", "answer", "peak RSS", "stopped cleanly"} {
		if !strings.Contains(r.out, want) {
			t.Errorf("smoke output lacks %q:\n%s", want, r.out)
		}
	}
	if r := smoke("silent"); r.code == 0 || !strings.Contains(r.out, "no 'page:' line") {
		t.Errorf("smoke on a silent demo: exit %d\n%s", r.code, r.out)
	}
	if r := smoke("nosamples"); r.code == 0 || !strings.Contains(r.out, `without "seq"`) {
		t.Errorf("smoke on a demo without samples: exit %d\n%s", r.code, r.out)
	}
	if r := run(t, dir, nil, "sh", script, "env", fake, filepath.Join(dir, "absent.toml"), "3"); r.code == 0 || !strings.Contains(r.out, "check") {
		t.Errorf("smoke with a missing config: exit %d\n%s", r.code, r.out)
	}
}
