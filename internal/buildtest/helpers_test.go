package buildtest

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"

	"edgegw/internal/testenv"

	"go.uber.org/goleak"
)

// TestMain checks for leaked goroutines and removes the binaries built
// for the whole run.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.Cleanup(func(code int) {
		if binDir != "" {
			os.RemoveAll(binDir)
		}
		os.Exit(code)
	}))
}

// slow reports whether the slow parts run (EDGEGW_BUILD_TESTS=1 or CI).
func slow() bool { return os.Getenv("EDGEGW_BUILD_TESTS") == "1" || testenv.CI() }

func needSlow(t *testing.T, what string) {
	t.Helper()
	if !slow() {
		t.Skipf("%s is slow: set EDGEGW_BUILD_TESTS=1 (CI=true runs it)", what)
	}
}

// root is the repository root (the tests run in internal/buildtest).
func root(t *testing.T) string {
	t.Helper()
	r, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(r, "go.mod")); err != nil {
		t.Fatalf("no go.mod in %s: %v", r, err)
	}
	return r
}

// goTool is the go command on PATH (go test puts the toolchain running
// the tests first on it).
func goTool() string {
	if p, err := exec.LookPath("go"); err == nil {
		return p
	}
	return "go"
}

// result of a child process.
type result struct {
	out  string // stdout and stderr interleaved
	code int
}

// run runs name args in dir with extra env and returns its output and exit
// code; a failure to start fails the test.
func run(t *testing.T, dir string, env []string, name string, args ...string) result {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	var buf bytes.Buffer
	cmd.Stdout = &buf
	cmd.Stderr = &buf
	err := cmd.Run()
	code := 0
	if err != nil {
		ee, ok := err.(*exec.ExitError)
		if !ok {
			t.Fatalf("%s %s: %v", name, strings.Join(args, " "), err)
		}
		code = ee.ExitCode()
	}
	return result{out: buf.String(), code: code}
}

// mustRun is run that fails the test on a non-zero exit.
func mustRun(t *testing.T, dir string, env []string, name string, args ...string) string {
	t.Helper()
	r := run(t, dir, env, name, args...)
	if r.code != 0 {
		t.Fatalf("%s %s: exit %d\n%s", name, strings.Join(args, " "), r.code, r.out)
	}
	return r.out
}

// Stamps used by the test builds (as the Makefile's -X flags).
const (
	testVersion = "v9.8.7-test"
	testCommit  = "0123456789ab"
	testDate    = "2026-01-02T03:04:05Z"
)

// buildFlags mirror the Makefile's BUILD.
func buildFlags(out string) []string {
	return []string{"build", "-trimpath", "-buildvcs=false",
		"-ldflags", fmt.Sprintf("-s -w -X main.version=%s -X main.commit=%s -X main.date=%s", testVersion, testCommit, testDate),
		"-o", out, "."}
}

// gatewayFlags are build/gateway.flags, the flags of the release gateway
// binary (the Makefile's GWFLAGS reads the same file): the lab and HTTP/2
// left out, inlining off only in named cold packages.
var gatewayFlags = readGatewayFlags()

func readGatewayFlags() []string {
	b, err := os.ReadFile(filepath.Join("..", "..", "build", "gateway.flags"))
	if err != nil {
		panic("buildtest: " + err.Error())
	}
	var flags []string
	for _, line := range strings.Split(string(b), "\n") {
		if line = strings.TrimSpace(line); line != "" && !strings.HasPrefix(line, "#") {
			flags = append(flags, strings.Fields(line)...)
		}
	}
	return flags
}

// gatewayBuildFlags are buildFlags with gatewayFlags after "build".
func gatewayBuildFlags(out string) []string {
	f := buildFlags(out)
	return append(append([]string{f[0]}, gatewayFlags...), f[1:]...)
}

// goenv maps a release arch name to its GOOS/GOARCH/GOARM.
func goenv(arch string) []string {
	switch arch {
	case "armv7":
		return []string{"GOOS=linux", "GOARCH=arm", "GOARM=7"}
	case "arm64":
		return []string{"GOOS=linux", "GOARCH=arm64"}
	case "amd64":
		return []string{"GOOS=linux", "GOARCH=amd64"}
	}
	panic("unknown arch " + arch)
}

var (
	binMu    sync.Mutex
	binCache = map[string]string{}
	binDir   string
)

// binary builds the release gateway binary (no lab) for arch once per test
// binary (static, stamped) and returns its path.
func binary(t *testing.T, arch string) string {
	t.Helper()
	if arch == "armv7" {
		return build(t, "edgegw-"+arch, arch, func(out string) []string {
			f := gatewayBuildFlags(out)
			for i := range f {
				if f[i] == "-ldflags" {
					f[i+1] += " " + armv7LinkFlags
				}
			}
			return f
		})
	}
	return build(t, "edgegw-"+arch, arch, gatewayBuildFlags)
}

// armv7LinkFlags mirror the Makefile's LDFLAGS_armv7: the armv7 gateway's
// segments aligned to 4 KiB, ARM Linux's page size (64 KiB by default).
const armv7LinkFlags = "-R 0x1000"

// labBinary builds the lab binary (gateway + demo, sim, receive, bench).
func labBinary(t *testing.T, arch string) string {
	t.Helper()
	return build(t, "edgegw-lab-"+arch, arch, buildFlags)
}

func build(t *testing.T, name, arch string, flags func(out string) []string) string {
	t.Helper()
	binMu.Lock()
	defer binMu.Unlock()
	if p, ok := binCache[name]; ok {
		return p
	}
	if binDir == "" {
		d, err := os.MkdirTemp("", "edgegw-buildtest-")
		if err != nil {
			t.Fatal(err)
		}
		binDir = d
	}
	p := filepath.Join(binDir, name)
	env := append([]string{"CGO_ENABLED=0"}, goenv(arch)...)
	mustRun(t, root(t), env, goTool(), flags(p)...)
	binCache[name] = p
	return p
}

// tree is a canonical listing of dir: one line per entry with its type,
// permission bits and (files) SHA-256 or (links) target, sorted.
func tree(t *testing.T, dir string) []string {
	t.Helper()
	var lines []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		info, err := d.Info()
		if err != nil {
			return err
		}
		line := fmt.Sprintf("%s %v", rel, info.Mode())
		switch {
		case info.Mode().IsRegular():
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			sum := sha256.Sum256(b)
			line += " " + hex.EncodeToString(sum[:])
		case info.Mode()&fs.ModeSymlink != 0:
			target, _ := os.Readlink(p)
			line += " -> " + target
		}
		lines = append(lines, line)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(lines)
	return lines
}

func diffTrees(a, b []string) string {
	in := func(xs []string) map[string]bool {
		m := map[string]bool{}
		for _, x := range xs {
			m[x] = true
		}
		return m
	}
	ma, mb := in(a), in(b)
	var d []string
	for _, x := range a {
		if !mb[x] {
			d = append(d, "- "+x)
		}
	}
	for _, x := range b {
		if !ma[x] {
			d = append(d, "+ "+x)
		}
	}
	return strings.Join(d, "\n")
}

func readFile(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func writeFile(t *testing.T, p, body string, mode os.FileMode) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(body), mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, mode); err != nil {
		t.Fatal(err)
	}
}

func exists(p string) bool {
	_, err := os.Lstat(p)
	return err == nil
}
