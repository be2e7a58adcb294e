package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
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

// `edgegw check` warns (and still exits 0) about retries that cannot fit
// the interval, writable tags with no write path, and empty token files;
// a config without those problems gets none of the warnings.
func TestCheckWarnings(t *testing.T) {
	dir := t.TempDir()
	empty, tok := filepath.Join(dir, "empty.token"), filepath.Join(dir, "write.token")
	if err := os.WriteFile(empty, []byte("\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(tok, []byte("s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	dev := func(timing string) string {
		return "[[device]]\nname = \"plc\"\ntransport = \"tcp\"\naddress = \"127.0.0.1:1502\"\n" + timing +
			"tags = [ { name = \"setpoint\", address = 0, writable = true }, { name = \"t\", address = 1 } ]\n"
	}
	for _, c := range []struct {
		name, body string
		want, not  []string
	}{
		{"warned", "[http]\nwrite_token_file = " + strconv.Quote(empty) + "\nread_token_file = " + strconv.Quote(empty) + "\n" +
			dev("interval = \"1s\"\ntimeout = \"400ms\"\nretries = 2\n"), []string{
			`warning: device "plc": retries 2 at timeout 400ms: 3 attempts take up to 1.2s, longer than interval 1s`,
			"(timeout at most 333.333333ms",
			"warning: 1 writable tag(s) but no write path is on, nothing can write them: plc/setpoint",
			"warning: http.write_token_file: " + empty + " is empty: writes by POST /api/write are off",
			"warning: http.read_token_file: " + empty + " is empty: reads need no token",
			"ok (1 devices)",
		}, nil},
		{"clean", "[http]\nwrite_token_file = " + strconv.Quote(tok) + "\n" + dev("interval = \"1s\"\ntimeout = \"400ms\"\nretries = 1\n"), []string{"ok (1 devices)"},
			[]string{"retries", "writable tag", "is empty"}},
		{"derived timeout", dev("interval = \"100ms\"\nretries = 3\n") + "[upstream.mqtt]\nbroker = \"tcp://127.0.0.1:1502\"\nwrite_commands = true\n",
			[]string{"ok (1 devices)"}, []string{"retries", "writable tag"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			path := filepath.Join(dir, c.name+".toml")
			if err := os.WriteFile(path, []byte(c.body), 0o600); err != nil {
				t.Fatal(err)
			}
			out, err := exec.Command(bin, "check", "-config", path).CombinedOutput()
			if err != nil {
				t.Fatalf("check: %v (warnings must not fail it)\n%s", err, out)
			}
			for _, w := range c.want {
				if !strings.Contains(string(out), w) {
					t.Errorf("check output lacks %q:\n%s", w, out)
				}
			}
			for _, line := range strings.Split(string(out), "\n") {
				for _, w := range c.not {
					if strings.HasPrefix(line, "warning: ") && strings.Contains(line, w) {
						t.Errorf("check warns %q", line)
					}
				}
			}
		})
	}
}
