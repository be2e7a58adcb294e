package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// check prints the reads of each rate's polls: the slow tags join the fast
// read they are next to.
func TestCheckPrintsThePlanPerRate(t *testing.T) {
	path := filepath.Join(t.TempDir(), "rates.toml")
	body := `[gateway]
id = "gw"
[[device]]
name = "meter"
transport = "tcp"
address = "127.0.0.1:1"
interval = "1s"
tags = [
  { name = "power", address = 0 },
  { name = "energy", address = 1, type = "uint32", interval = "1m" },
  { name = "temp", address = 3, interval = "10s" },
]
`
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(bin, "check", "-config", path).CombinedOutput()
	if err != nil {
		t.Fatalf("check: %v\n%s", err, out)
	}
	for _, want := range []string{
		"meter                    every 1s     holding 0+1 (1 tags)\n",
		"meter                    every 10s    holding 0+4 (2 tags)\n",
		"meter                    every 1m0s   holding 0+4 (3 tags)\n",
	} {
		if !strings.Contains(string(out), want) {
			t.Errorf("check output lacks %q:\n%s", want, out)
		}
	}
	bad := strings.Replace(body, `interval = "10s"`, `interval = "2500ms"`, 1)
	if err := os.WriteFile(path, []byte(bad), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "check", "-config", path)
	out, _ = cmd.CombinedOutput()
	if code := cmd.ProcessState.ExitCode(); code != 1 || !strings.Contains(string(out), `tag "temp": interval 2.5s is not a multiple of the device's interval 1s`) {
		t.Errorf("check of a 2.5 s tag on a 1 s device: exit %d\n%s", code, out)
	}
}
