package e2e

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"edgegw/internal/testenv"
)

// verdict is what one command made of a config: started (run) or ok
// (check), else the lines it refused with, its own name replaced by CMD
// (log lines and warnings left out: run logs what check prints).
type verdict struct {
	ok    bool
	lines []string
}

func (v verdict) String() string {
	if v.ok {
		return "ok"
	}
	return "refused: " + strings.Join(v.lines, " | ")
}

// refusal keeps the lines of out that say why a command refused.
func refusal(cmd, out string) []string {
	var keep []string
	for _, l := range strings.Split(out, "\n") {
		l = strings.TrimSpace(l)
		if l == "" || strings.HasPrefix(l, "time=") || strings.HasPrefix(l, "warning:") {
			continue
		}
		keep = append(keep, strings.Replace(l, "edgegw "+cmd+":", "edgegw CMD:", 1))
	}
	return keep
}

// checkVerdict runs `edgegw check`.
func checkVerdict(t *testing.T, cfg string) verdict {
	t.Helper()
	cmd := exec.Command(bin, "check", "-config", cfg)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err == nil {
		if !strings.Contains(string(out), ": ok (") {
			t.Fatalf("check exited 0 without saying ok:\n%s", out)
		}
		return verdict{ok: true}
	}
	if cmd.ProcessState == nil || cmd.ProcessState.ExitCode() != 1 {
		t.Fatalf("check: %v (want exit 0 or 1)\n%s", err, stderr.String())
	}
	return verdict{lines: refusal("check", stderr.String())}
}

// runVerdict runs `edgegw run` until it says it is running (then stops it
// with SIGINT: it must exit 0) or exits by itself.
func runVerdict(t *testing.T, cfg string) verdict {
	t.Helper()
	cmd := exec.Command(bin, "run", "-config", cfg)
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = pw, pw
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait(); pw.Close() }()
	running := make(chan struct{})
	var out strings.Builder
	read := make(chan struct{})
	go func() {
		defer close(read)
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			out.WriteString(sc.Text() + "\n")
			if strings.Contains(sc.Text(), "edgegw running") {
				close(running)
			}
		}
	}()
	select {
	case <-running:
		_ = cmd.Process.Signal(os.Interrupt)
		if err := testenv.Recv(t, exited, 20*time.Second, "run to stop after SIGINT"); err != nil {
			testenv.Closed(t, read, 5*time.Second, "run's output")
			t.Fatalf("run stopped with %v:\n%s", err, out.String())
		}
		testenv.Closed(t, read, 5*time.Second, "run's output")
		return verdict{ok: true}
	case err := <-exited:
		testenv.Closed(t, read, 5*time.Second, "run's output")
		if cmd.ProcessState.ExitCode() != 1 {
			t.Fatalf("run exited with %v (want 1 or running):\n%s", err, out.String())
		}
		return verdict{lines: refusal("run", out.String())}
	case <-time.After(30 * time.Second):
		_ = cmd.Process.Kill()
		testenv.Recv(t, exited, 10*time.Second, "run to die")
		t.Fatalf("run neither started nor exited within 30 s:\n%s", out.String())
	}
	return verdict{}
}

// adapt makes a config safe to run here: data_dir in dir, the HTTP server
// and the UDP socket on 127.0.0.1:0, the MQTT broker on a closed port, the
// upstream token in a file of dir.
func adapt(t *testing.T, body, dir, closed string) string {
	t.Helper()
	set := func(key, value string) {
		re := regexp.MustCompile(`(?m)^` + key + ` = .*$`)
		body = re.ReplaceAllString(body, key+" = "+value)
	}
	set("data_dir", strconv.Quote(filepath.Join(dir, "data")))
	set("listen", `"127.0.0.1:0"`)
	set("udp_listen", `"127.0.0.1:0"`)
	set("broker", strconv.Quote("tcp://"+closed))
	token := filepath.Join(dir, "upstream.token")
	if err := os.WriteFile(token, []byte("secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	set("token_file", strconv.Quote(token))
	if !regexp.MustCompile(`(?m)^listen = `).MatchString(body) {
		body += "\n[http]\nlisten = \"127.0.0.1:0\"\n" // the default is a fixed port
	}
	return body
}

// readmeConfigs are the ```toml blocks of README.md.
func readmeConfigs(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, part := range strings.Split(string(b), "```toml\n")[1:] {
		out = append(out, part[:strings.Index(part, "```")])
	}
	if len(out) == 0 {
		t.Fatal("README.md has no toml block")
	}
	return out
}

// Every example config of the repository, the demo's and configs that
// each piece refuses: check and run reach the same verdict, and a refusal
// reads the same. The string tag with [upstream.sparkplug] was check "ok"
// and a SIGSEGV of run that hid the message; it then was a refusal of
// both; now Sparkplug carries every tag type and both start.
func TestCheckRunSameVerdict(t *testing.T) {
	example, err := os.ReadFile("build/edgegw.example.toml")
	if err != nil {
		t.Fatal(err)
	}
	demo, err := exec.Command(bin, "demo", "-print-config", "-devices", "3").Output()
	if err != nil {
		t.Fatalf("demo -print-config: %v", err)
	}
	dev := fmt.Sprintf("[[device]]\nname = \"d1\"\ntransport = \"udp\"\naddress = %q\n", silentUDPAddr(t))
	const spb = "[upstream.mqtt]\nbroker = \"x\"\n[upstream.sparkplug]\ngroup_id = \"plant\"\n"
	hash := filepath.Join(t.TempDir(), "hash")
	if err := os.WriteFile(hash, []byte("not a hash\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name, body string
		want       string // "" = starts; else in the refusal
	}{
		{"build/edgegw.example.toml", string(example), ""},
		{"demo -print-config", string(demo), ""},
		{"every tag type with sparkplug", spb + dev + "tags = [ { name = \"serial\", address = 0, type = \"string\", length = 4 },\n" +
			"  { name = \"hi\", address = 4, type = \"int8_high\" }, { name = \"lo\", address = 4, type = \"uint8_low\" },\n" +
			"  { name = \"half\", address = 5, type = \"float16\" }, { name = \"big\", address = 6, type = \"int64\" },\n" +
			"  { name = \"up\", address = 10, type = \"string\", length = 2, string_register_location = \"upper\" } ]\n", ""},
		{"string tag without sparkplug", dev + "tags = [ { name = \"serial\", address = 0, type = \"string\", length = 4 } ]\n", ""},
		{"basic auth hash unreadable", "[http]\nlisten = \"x\"\nbasic_auth_user = \"op\"\nbasic_auth_hash_file = " + strconv.Quote(hash) + "\n" +
			dev + "tags = [ { name = \"t\", address = 0 } ]\n", "edgegw CMD: web:"},
		{"write token missing", "[http]\nlisten = \"x\"\nwrite_token_file = \"/nonexistent/write.token\"\n" + dev + "tags = [ { name = \"t\", address = 0 } ]\n",
			"http.write_token_file"},
		{"bad tag address", dev + "tags = [ { name = \"t\", address = 70000 } ]\n", "70000"},
	}
	for i, body := range readmeConfigs(t) {
		cases = append(cases, struct{ name, body, want string }{fmt.Sprintf("README.md toml block %d", i+1), body, ""})
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			cfg := filepath.Join(dir, "edgegw.toml")
			if err := os.WriteFile(cfg, []byte(adapt(t, c.body, dir, refusedAddr(t))), 0o600); err != nil {
				t.Fatal(err)
			}
			check, run := checkVerdict(t, cfg), runVerdict(t, cfg)
			if check.String() != run.String() {
				t.Fatalf("check %s\nrun   %s", check, run)
			}
			if c.want == "" && !run.ok || c.want != "" && (run.ok || !strings.Contains(run.String(), c.want)) {
				t.Fatalf("both %s; want %q", run, c.want)
			}
			t.Logf("both %s", run)
		})
	}
}
