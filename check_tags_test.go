package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// `edgegw check` accepts a 100 ms device without timeout (and prints the
// timeout it chose), overlapping tags and strings, and plans one read for them.
func TestCheckDerivedTimeoutOverlapsStrings(t *testing.T) {
	path := filepath.Join(t.TempDir(), "c.toml")
	body := `[[device]]
name = "fast"
transport = "tcp"
address = "127.0.0.1:1502"
interval = "100ms"
tags = [
  { name = "status", address = 0 },
  { name = "alarm", address = 0, type = "bool", bit = 3 },
  { name = "serial", address = 1, type = "string", length = 8 },
]
`
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(bin, "check", "-config", path).CombinedOutput()
	if err != nil {
		t.Fatalf("check: %v\n%s", err, out)
	}
	for _, want := range []string{"100ms     50ms (auto)", "serial  holding   1..8     string", "holding 0+9 (3 tags)", "ok (1 devices)"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("check output lacks %q:\n%s", want, out)
		}
	}
}
