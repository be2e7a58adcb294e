package e2e

import (
	"os/exec"
	"strings"
	"testing"

	"edgegw/lab/sim"
)

// edgegw scan behind a TCP address (the simulator, which has neither
// function 43 nor 17): the units that answer are listed, and the
// identification functions are reported as not supported, in words.
func TestScanTCPIdentificationUnsupported(t *testing.T) {
	fleet := runFleet(t, sim.Config{Devices: 1, Transport: "tcp", Seed: 1})
	out, err := exec.Command(bin, "scan", "-transport", "tcp", "-address", fleet.Addr(0), "-units", "1-2", "-timeout", "2s").CombinedOutput()
	t.Logf("%s", out)
	if err != nil {
		t.Fatalf("scan: %v", err)
	}
	text := string(out)
	if !strings.Contains(text, "2 units × 1 settings") || !containsFields(text, "unit", "1", "tcp", fleet.Addr(0), "answers:") {
		t.Errorf("unit 1 not found")
	}
	if !strings.Contains(text, "device identification: not supported (exception 1 (illegal function") ||
		!strings.Contains(text, "server id: not supported (exception 1 (illegal function") {
		t.Errorf("identification not reported unsupported")
	}
	if !strings.Contains(text, `transport = "tcp"`) || !strings.Contains(text, `address = "`+fleet.Addr(0)+`"`) {
		t.Errorf("no tcp snippet")
	}
}
