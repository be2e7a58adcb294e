package e2e

import (
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"edgegw/internal/testenv"
)

// check -poll on a config with one live device (pymodbus) and two dead
// ones (a refused TCP address, a silent UDP socket): it prints the live
// tags' values with unit and quality, the live device's round trip, the
// reason of each failure, and exits 1 naming the dead devices and not the
// live one. -device limits it to one device: the live one alone exits 0.
func TestCheckPollLiveAndDead(t *testing.T) {
	f := math.Float32bits(21.5)
	port := testenv.PymodbusRegisters(t, []uint16{215, uint16(f >> 16), uint16(f), 0x4142})
	cfg := `
[[device]]
name = "live-meter"
transport = "tcp"
address = "127.0.0.1:` + strconv.Itoa(port) + `"
timeout = "2s"
interval = "5s"
tags = [
  { name = "temperature", address = 0, type = "int16", scale = 0.1, unit = "°C" },
  { name = "power", address = 1, type = "float32", unit = "kW" },
  { name = "alarm", register = "coil", address = 0 },
]

[[device]]
name = "dead-plc"
transport = "tcp"
address = "` + refusedAddr(t) + `"
tags = [ { name = "setpoint", address = 0, unit = "bar" } ]

[[device]]
name = "dead-logger"
transport = "udp"
address = "` + silentUDPAddr(t) + `"
timeout = "200ms"
retries = 0
tags = [ { name = "level", address = 0 } ]
`
	path := filepath.Join(t.TempDir(), "poll.toml")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd := exec.Command(bin, "check", "-config", path, "-poll")
	cmd.Stderr = &stderr
	out, err := cmd.Output() // the poll's log lines go to stderr, the report to stdout
	t.Logf("%s\nstderr:\n%s", out, stderr.String())
	text := string(out)
	if i := strings.Index(text, "poll (each device once"); i >= 0 {
		text = text[i:] // the poll's lines, not the device table's
	}
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 {
		t.Fatalf("exit: %v, want 1", err)
	}
	for _, want := range [][]string{
		{"temperature", "21.5", "°C", "good"},
		{"power", "21.5", "kW", "good"},
		{"alarm", "false", "good"},
		{"setpoint", "-", "bar", "error"},
		{"level", "-", "timeout"},
	} {
		if !containsFields(text, want...) {
			t.Errorf("no line %v", want)
		}
	}
	if !containsFields(text, "live-meter", "rtt") || strings.Contains(testenv.LineWith(text, "live-meter"), "FAILED") {
		t.Errorf("live device line: %q", testenv.LineWith(text, "live-meter"))
	}
	if l := testenv.LineWith(text, "dead-plc "); !strings.Contains(l, "FAILED") || !strings.Contains(l, "connection refused") {
		t.Errorf("dead tcp device line: %q", l)
	}
	if l := testenv.LineWith(text, "dead-logger "); !strings.Contains(l, "FAILED") || !strings.Contains(l, "timeout") {
		t.Errorf("dead udp device line: %q", l)
	}
	last := testenv.LineWith(stderr.String(), "edgegw check:")
	if !strings.Contains(last, "poll failed: ") || !strings.Contains(last, "dead-plc") || !strings.Contains(last, "dead-logger") || strings.Contains(last, "live-meter") {
		t.Errorf("verdict %q: want the dead devices named, not the live one", last)
	}

	out, err = exec.Command(bin, "check", "-config", path, "-poll", "-device", "live-meter").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "poll: ok (1 devices)") || strings.Contains(string(out), "rtt -") {
		t.Errorf("-device live-meter: %v\n%s", err, out)
	}
	out, err = exec.Command(bin, "check", "-config", path, "-poll", "-device", "nope").CombinedOutput()
	if err == nil || !strings.Contains(string(out), `-device "nope": no such device`) {
		t.Errorf("-device nope: %v\n%s", err, out)
	}
}
