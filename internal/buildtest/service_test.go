package buildtest

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"edgegw/internal/testenv"
)

// unitDirectives parses a systemd unit into section.Key → values (a key
// may repeat); comments and blank lines are dropped.
func unitDirectives(t *testing.T, body string) map[string][]string {
	t.Helper()
	m := map[string][]string{}
	section := ""
	sc := bufio.NewScanner(strings.NewReader(body))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "" || line[0] == '#' || line[0] == ';':
		case line[0] == '[':
			section = strings.Trim(line, "[]")
		default:
			k, v, ok := strings.Cut(line, "=")
			if !ok {
				t.Fatalf("unit line without '=': %q", line)
			}
			m[section+"."+k] = append(m[section+"."+k], v)
		}
	}
	return m
}

func TestServiceUnitDirectives(t *testing.T) {
	body := readFile(t, filepath.Join(root(t), "build", "edgegw.service"))
	d := unitDirectives(t, body)
	want := map[string]string{
		"Service.Type":                    "notify",
		"Service.NotifyAccess":            "main",
		"Service.WatchdogSec":             "30",
		"Service.User":                    "edgegw",
		"Service.Group":                   "edgegw",
		"Service.DynamicUser":             "no",
		"Service.ExecStartPre":            "/usr/local/bin/edgegw check -config /etc/edgegw/edgegw.toml",
		"Service.ExecStart":               "/usr/local/bin/edgegw run -config /etc/edgegw/edgegw.toml",
		"Service.ExecReload":              "/bin/kill -HUP $MAINPID",
		"Service.Restart":                 "on-failure",
		"Service.RestartSec":              "2",
		"Service.StateDirectory":          "edgegw",
		"Service.NoNewPrivileges":         "yes",
		"Service.ProtectSystem":           "strict",
		"Service.ProtectHome":             "yes",
		"Service.PrivateTmp":              "yes",
		"Service.ProtectKernelTunables":   "yes",
		"Service.ProtectKernelModules":    "yes",
		"Service.ProtectControlGroups":    "yes",
		"Service.RestrictAddressFamilies": "AF_INET AF_INET6 AF_UNIX",
		"Service.RestrictNamespaces":      "yes",
		"Service.LockPersonality":         "yes",
		"Service.MemoryDenyWriteExecute":  "yes",
		"Service.SystemCallArchitectures": "native",
		"Service.CapabilityBoundingSet":   "",
		"Service.MemoryMax":               "128M",
		"Install.WantedBy":                "multi-user.target",
	}
	for k, v := range want {
		got, ok := d[k]
		if !ok || len(got) != 1 || got[0] != v {
			t.Errorf("%s = %q, want exactly %q", k, got, v)
		}
	}
	// Writable paths come from StateDirectory only.
	if rw := d["Service.ReadWritePaths"]; len(rw) != 0 {
		t.Errorf("ReadWritePaths = %q: the state directory is the only writable path", rw)
	}
	// The opt-ins are documented, commented out.
	for _, c := range []string{"#CapabilityBoundingSet=CAP_NET_BIND_SERVICE", "#AmbientCapabilities=CAP_NET_BIND_SERVICE", "#SupplementaryGroups=dialout"} {
		if !strings.Contains(body, "\n"+c+"\n") {
			t.Errorf("unit lacks the commented opt-in %q", c)
		}
	}
}

// verifyUnit runs systemd-analyze verify on body with the binary path
// pointed at an existing executable, and returns its complaints (it exits
// 0 on parse warnings, so any output counts).
func verifyUnit(t *testing.T, analyze, body string) string {
	t.Helper()
	dir := t.TempDir()
	bin := filepath.Join(dir, "edgegw")
	writeFile(t, bin, "#!/bin/sh\nexit 0\n", 0o755)
	body = strings.ReplaceAll(body, "/usr/local/bin/edgegw", bin)
	unit := filepath.Join(dir, "edgegw.service")
	writeFile(t, unit, body, 0o644)
	r := run(t, dir, []string{"SYSTEMD_LOG_LEVEL=notice"}, analyze, "verify", "--man=no", unit)
	out := strings.TrimSpace(r.out)
	if r.code != 0 && out == "" {
		out = fmt.Sprintf("exit status %d", r.code)
	}
	return out
}

func TestServiceUnitVerifies(t *testing.T) {
	// Optional even under CI: gateways' build machines need not run systemd.
	analyze, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Skip("systemd-analyze not found (Debian package systemd): unit not verified")
	}
	body := readFile(t, filepath.Join(root(t), "build", "edgegw.service"))
	if out := verifyUnit(t, analyze, body); out != "" {
		t.Fatalf("systemd-analyze verify edgegw.service:\n%s", out)
	}
	// The check can fail: a misspelt key and a bad value are reported.
	bad := strings.Replace(body, "MemoryMax=128M", "MemoryMax=12x8M", 1)
	bad = strings.Replace(bad, "Restart=on-failure", "Restrat=on-failure", 1)
	out := verifyUnit(t, analyze, bad)
	if !strings.Contains(out, "Restrat") || !strings.Contains(out, "12x8M") {
		t.Fatalf("systemd-analyze did not report the broken unit: %q", out)
	}
}

// TestInitScript runs the procd init script's start_service and
// reload_service under a stand-in for /etc/rc.common that records every
// procd_* call, with a fake edgegw whose "check" passes or fails.
func TestInitScript(t *testing.T) {
	testenv.Need(t, "sh")
	initScript := filepath.Join(root(t), "build", "edgegw.init")
	if r := run(t, ".", nil, "sh", "-n", initScript); r.code != 0 {
		t.Fatalf("sh -n edgegw.init:\n%s", r.out)
	}
	dir := t.TempDir()
	fake := filepath.Join(dir, "edgegw")
	writeFile(t, fake, `#!/bin/sh
if [ "$1" = check ]; then
	grep -q '^good' "$3" && exit 0
	echo "conf: $3:1: bad config" >&2
	exit 1
fi
exit 0
`, 0o755)
	harness := filepath.Join(dir, "harness.sh")
	writeFile(t, harness, `
procd_open_instance() { echo "open $*"; }
procd_set_param() { echo "param $*"; }
procd_close_instance() { echo "close"; }
procd_send_signal() { echo "signal $*"; }
logger() { cat >/dev/null; }
. "$INIT"
PROG=$T_PROG CONF=$T_CONF DATA=$T_DATA
"$1"
echo "rc=$?"
`, 0o644)
	conf := filepath.Join(dir, "edgegw.toml")
	data := filepath.Join(dir, "var", "lib", "edgegw")
	env := []string{"INIT=" + initScript, "T_PROG=" + fake, "T_CONF=" + conf, "T_DATA=" + data}
	call := func(fn string) string {
		t.Helper()
		return run(t, dir, env, "sh", harness, fn).out
	}

	writeFile(t, conf, "good\n", 0o644)
	out := call("start_service")
	for _, want := range []string{
		"open edgegw",
		"param command " + fake + " run -config " + conf,
		"param respawn 3600 5 5",
		"param stdout 1",
		"param stderr 1",
		"close",
		"rc=0",
	} {
		if !strings.Contains(out, want+"\n") {
			t.Errorf("start_service with a good config: no %q in\n%s", want, out)
		}
	}
	if fi, err := os.Stat(data); err != nil || fi.Mode().Perm() != 0o750 {
		t.Errorf("data dir: %v %v", fi, err)
	}
	if out := call("reload_service"); !strings.Contains(out, "signal edgegw * HUP\n") || !strings.Contains(out, "rc=0") {
		t.Errorf("reload_service with a good config:\n%s", out)
	}

	writeFile(t, conf, "bad\n", 0o644)
	out = call("start_service")
	if strings.Contains(out, "open") || !strings.Contains(out, "rc=1") || !strings.Contains(out, "bad config") {
		t.Errorf("start_service with a bad config must refuse and say why:\n%s", out)
	}
	out = call("reload_service")
	if strings.Contains(out, "signal") || !strings.Contains(out, "rc=1") {
		t.Errorf("reload_service with a bad config must not signal:\n%s", out)
	}
}
