package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"edgegw/internal/testenv"
	"edgegw/lab/sim"
)

// install.sh into a scratch DESTDIR, then the installed binary checks the
// installed example and runs it — with only its addresses pointed at the
// simulator (48 UDP loggers, one TCP PLC), its upstream at a closed
// loopback port and data_dir inside DESTDIR — and every device polls.
// (Before: the example named /etc/edgegw/upstream.token, which install.sh
// does not create: check passed, run exited 1.)
func TestFaultFreshInstallStarts(t *testing.T) {
	testenv.Need(t, "sh")
	dest := filepath.Join(t.TempDir(), "root")
	cmd := exec.Command("sh", "build/install.sh", "--binary", bin, "--systemd")
	cmd.Env = append(os.Environ(), "DESTDIR="+dest)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("install.sh: %v\n%s", err, out)
	}
	installed := filepath.Join(dest, "usr/local/bin/edgegw")
	confPath := filepath.Join(dest, "etc/edgegw/edgegw.toml")
	raw, err := os.ReadFile(confPath)
	if err != nil {
		t.Fatal(err)
	}
	// The installed example as it is: check passes (it names no file that is missing).
	if out, err := exec.Command(installed, "check", "-config", confPath).CombinedOutput(); err != nil {
		t.Fatalf("check of the installed example: %v\n%s", err, out)
	}

	udp := runFleet(t, sim.Config{Devices: 48, Transport: "udp"})
	plc := runFleet(t, sim.Config{Devices: 1, Transport: "tcp"})
	body := string(raw)
	body = regexp.MustCompile(`address = "192\.168\.1\.1(\d\d):502"`).ReplaceAllStringFunc(body, func(m string) string {
		n, _ := strconv.Atoi(m[len(`address = "192.168.1.1`) : len(`address = "192.168.1.1`)+2])
		return fmt.Sprintf("address = %q", udp.Addr(n-1))
	})
	for _, r := range []struct{ old, new string }{
		{`address = "192.168.1.20"`, fmt.Sprintf("address = %q", plc.Addr(0))},
		{`data_dir = "/var/lib/edgegw"`, fmt.Sprintf("data_dir = %q", filepath.Join(dest, "var/lib/edgegw"))},
		{`listen = "0.0.0.0:8080"`, `listen = "127.0.0.1:0"`},
		{`url = "wss://collector.example/ingest"`, fmt.Sprintf(`url = "ws://%s/ingest"`, refusedAddr(t))},
		{`broker = "tcp://127.0.0.1:1883"`, fmt.Sprintf(`broker = "tcp://%s"`, refusedAddr(t))},
	} {
		if !strings.Contains(body, r.old) {
			t.Fatalf("the example no longer has %s", r.old)
		}
		body = strings.ReplaceAll(body, r.old, r.new)
	}
	for _, l := range strings.Split(body, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(l), "#") && strings.Contains(l, "192.168.") {
			t.Fatalf("an address of the example was not pointed at the simulator: %s", l)
		}
	}
	if err := os.WriteFile(confPath, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(installed, "check", "-config", confPath).CombinedOutput(); err != nil {
		t.Fatalf("check: %v\n%s", err, out)
	}
	p := startProcBin(t, installed, "run", "-config", confPath)
	line := p.WaitLine("edgegw running", 20*time.Second)
	page := line[strings.Index(line, "page=")+len("page="):]
	waitFor(t, 30*time.Second, "every device of the example polled", func() bool {
		devs := apiDevices(t, p, page)
		if len(devs) != 49 {
			return false
		}
		for _, d := range devs {
			if d.GoodPolls < 2 {
				return false
			}
		}
		return true
	})
	if code := p.Stop(os.Interrupt, 15*time.Second); code != 0 {
		t.Errorf("installed gateway exited %d", code)
	}
}
