package buildtest

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"edgegw/internal/testenv"
)

// TestReproducibleBuild builds the host gateway binary twice with the Makefile's
// flags into two directories and compares the bytes. The fast form shares
// the build cache (it catches link-time nondeterminism: time stamps, paths,
// map order in the linker); with EDGEGW_BUILD_TESTS=1 or CI the second
// build uses an empty cache, so every package is compiled again.
func TestReproducibleBuild(t *testing.T) {
	dir := t.TempDir()
	a, b := filepath.Join(dir, "a", "edgegw"), filepath.Join(dir, "b", "edgegw")
	env := []string{"CGO_ENABLED=0"}
	mustRun(t, root(t), env, goTool(), gatewayBuildFlags(a)...)
	envB := env
	if slow() {
		envB = append(envB, "GOCACHE="+filepath.Join(dir, "gocache"))
		t.Log("second build with an empty GOCACHE")
	} else {
		t.Log("second build shares the cache (EDGEGW_BUILD_TESTS=1 for a cold one)")
	}
	mustRun(t, root(t), envB, goTool(), gatewayBuildFlags(b)...)
	ba, bb := readFile(t, a), readFile(t, b)
	if ba != bb {
		t.Fatalf("two builds differ (%d vs %d bytes)", len(ba), len(bb))
	}
	if slow() {
		// The module cache is read-only; the build cache is not, but be sure.
		_ = run(t, dir, nil, "chmod", "-R", "u+w", filepath.Join(dir, "gocache"))
	}

	// The stamps land where "edgegw version" prints them.
	out := mustRun(t, dir, nil, a, "version")
	for _, want := range []string{testVersion, testCommit, testDate, "go1."} {
		if !strings.Contains(out, want) {
			t.Errorf("version output %q lacks %q", out, want)
		}
	}
}

// TestNotices: THIRD_PARTY_NOTICES names every module the binary links and
// holds a licence text for each, plus Go's own.
func TestNotices(t *testing.T) {
	testenv.Need(t, "sh")
	r := root(t)
	notices := mustRun(t, r, []string{"GO=" + goTool()}, "sh", filepath.Join(r, "build", "notices.sh"), ".")
	mods := mustRun(t, r, []string{"GOFLAGS=-mod=readonly"}, goTool(), "list", "-deps", "-f",
		"{{with .Module}}{{if not .Main}}{{.Path}} {{.Version}}{{end}}{{end}}", ".")
	seen := map[string]bool{}
	for _, m := range strings.Fields(strings.ReplaceAll(mods, " ", "@")) {
		if seen[m] {
			continue
		}
		seen[m] = true
		pv := strings.Replace(m, "@", " ", 1)
		if !strings.Contains(notices, "\n  "+pv+"\n") {
			t.Errorf("notices do not list %s", pv)
		}
		if !strings.Contains(notices, "\n"+pv+" (") {
			t.Errorf("notices hold no licence text for %s", pv)
		}
	}
	goroot := strings.TrimSpace(mustRun(t, r, nil, goTool(), "env", "GOROOT"))
	if !strings.Contains(notices, readFile(t, filepath.Join(goroot, "LICENSE"))) {
		t.Error("notices lack the Go licence text")
	}
	if len(seen) > 0 {
		t.Logf("%d modules linked", len(seen))
	}

	// A linked module without a licence file fails the script: a release
	// never ships with a gap.
	dir := t.TempDir()
	mod := filepath.Join(dir, "mod")
	writeFile(t, filepath.Join(mod, "x.go"), "package x\n", 0o644)
	fakeGo := filepath.Join(dir, "go")
	writeFile(t, fakeGo, fmt.Sprintf("#!/bin/sh\nif [ \"$1\" = list ]; then echo 'example.com/nolicence v1.0.0 %s'; exit 0; fi\nexec %s \"$@\"\n", mod, goTool()), 0o755)
	res := run(t, r, []string{"GO=" + fakeGo}, "sh", filepath.Join(r, "build", "notices.sh"), ".")
	if res.code == 0 || !strings.Contains(res.out, "example.com/nolicence v1.0.0: no LICENSE") {
		t.Errorf("module without a licence: exit %d\n%s", res.code, lastLines(res.out, 5))
	}
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// TestReleaseTarballReproducible packages one binary twice, under
// different umasks and binary mtimes, and compares the tarballs byte for
// byte; then checks what is inside (names, modes, owners, times) and
// SHA256SUMS.
func TestReleaseTarballReproducible(t *testing.T) {
	testenv.Need(t, "tar")
	testenv.Need(t, "gzip")
	testenv.Need(t, "sha256sum")
	r := root(t)
	if !exists(filepath.Join(r, "build", "edgegw.example.toml")) {
		testenv.Missing(t, "build/edgegw.example.toml not written yet")
	}
	bin := binary(t, "amd64")
	const epoch = 1767225600 // 2026-01-01T00:00:00Z
	const version = "v0.0.0-test"
	pack := func(name, umask string, mtime time.Time) string {
		t.Helper()
		dir := filepath.Join(t.TempDir(), name)
		bindir := filepath.Join(dir, "bin")
		writeFile(t, filepath.Join(bindir, "edgegw-amd64"), readFile(t, bin), 0o755)
		if err := os.Chtimes(filepath.Join(bindir, "edgegw-amd64"), mtime, mtime); err != nil {
			t.Fatal(err)
		}
		out := filepath.Join(dir, "out")
		mustRun(t, r, []string{"SOURCE_DATE_EPOCH=" + fmt.Sprint(epoch), "GO=" + goTool()}, "sh", "-c",
			"umask "+umask+" && exec build/package.sh \"$0\" \"$1\" "+version+" amd64", bindir, out)
		return out
	}
	a := pack("a", "022", time.Now())
	b := pack("b", "077", time.Unix(epoch+12345, 0))
	tgz := "edgegw-" + version + "-linux-amd64.tar.gz"
	ta, tb := readFile(t, filepath.Join(a, tgz)), readFile(t, filepath.Join(b, tgz))
	if ta != tb {
		t.Fatalf("two packagings of one binary differ (%d vs %d bytes)", len(ta), len(tb))
	}
	if readFile(t, filepath.Join(a, "SHA256SUMS")) != readFile(t, filepath.Join(b, "SHA256SUMS")) {
		t.Fatal("SHA256SUMS differ")
	}
	sum := sha256.Sum256([]byte(ta))
	if want := hex.EncodeToString(sum[:]) + "  " + tgz + "\n"; readFile(t, filepath.Join(a, "SHA256SUMS")) != want {
		t.Errorf("SHA256SUMS = %q, want %q", readFile(t, filepath.Join(a, "SHA256SUMS")), want)
	}

	zr, err := gzip.NewReader(strings.NewReader(ta))
	if err != nil {
		t.Fatal(err)
	}
	if zr.Name != "" || !zr.ModTime.IsZero() {
		t.Errorf("gzip header carries name %q / time %v (gzip -n)", zr.Name, zr.ModTime)
	}
	top := "edgegw-" + version + "-linux-amd64/"
	want := map[string]int64{
		top:                         0o755,
		top + "LICENSE":             0o644,
		top + "THIRD_PARTY_NOTICES": 0o644,
		top + "edgegw":              0o755,
		top + "edgegw.example.toml": 0o644,
		top + "edgegw.init":         0o755,
		top + "edgegw.service":      0o644,
		top + "install.sh":          0o755,
	}
	tr := tar.NewReader(zr)
	var names []string
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, h.Name)
		mode, ok := want[h.Name]
		if !ok {
			t.Errorf("unexpected entry %s", h.Name)
			continue
		}
		if h.Mode&0o7777 != mode || h.Uid != 0 || h.Gid != 0 || h.Uname != "" || h.Gname != "" || h.ModTime.Unix() != epoch {
			t.Errorf("%s: mode %o uid %d gid %d %q/%q mtime %d; want %o 0 0 \"\" %d",
				h.Name, h.Mode, h.Uid, h.Gid, h.Uname, h.Gname, h.ModTime.Unix(), mode, epoch)
		}
		if h.Name == top+"edgegw" {
			var buf bytes.Buffer
			if _, err := io.Copy(&buf, tr); err != nil {
				t.Fatal(err)
			}
			if buf.String() != readFile(t, bin) {
				t.Error("packaged binary differs from the input")
			}
		}
	}
	if len(names) != len(want) {
		t.Errorf("entries %q, want the %d of %v", names, len(want), want)
	}
	for i := 1; i < len(names); i++ {
		if names[i-1] >= names[i] {
			t.Errorf("entries not sorted by name: %q", names)
		}
	}
}

// sizeBudgetARMv7 and sizeGoalARMv7 mirror SIZE_BUDGET_ARMV7 and
// SIZE_GOAL_ARMV7 in build/build.mk: the armv7 gateway binary (everything a
// gateway runs; the lab is in edgegw-lab) must not be above the budget
// (small flash); the goal (the house issue's) is logged with the distance.
const (
	sizeBudgetARMv7 = 8_100_000
	sizeGoalARMv7   = 7_900_000
)

func TestSizeBudgetARMv7(t *testing.T) {
	fi, err := os.Stat(binary(t, "armv7"))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("armv7 gateway binary: %d bytes (%.2f MiB), budget ≤ %d", fi.Size(), float64(fi.Size())/(1<<20), sizeBudgetARMv7)
	if fi.Size() > sizeBudgetARMv7 {
		t.Fatalf("armv7 gateway binary is %d bytes, budget is ≤ %d: see make size for the largest packages", fi.Size(), sizeBudgetARMv7)
	}
	mk := readFile(t, filepath.Join(root(t), "build", "build.mk"))
	if !strings.Contains(mk, fmt.Sprintf("SIZE_BUDGET_ARMV7 ?= %d\n", sizeBudgetARMv7)) ||
		!strings.Contains(mk, fmt.Sprintf("SIZE_GOAL_ARMV7   ?= %d\n", sizeGoalARMv7)) {
		t.Error("build.mk and this test disagree on the armv7 budget or goal")
	}
	if fi.Size() > sizeGoalARMv7 {
		t.Logf("armv7 goal ≤ %d: %d bytes to go", sizeGoalARMv7, fi.Size()-sizeGoalARMv7)
	}
	mf := readFile(t, filepath.Join(root(t), "Makefile"))
	if want := "LDFLAGS_armv7 := " + armv7LinkFlags + "\n"; !strings.Contains(mf, want) {
		t.Errorf("Makefile lacks %q: this test's armv7 binary is not the release one", want)
	}
}

// TestGatewayLeavesOutTheLab: the release gateway build links none of the
// lab (simulator, bench, demo broker, the reference receiver), says so
// when asked for a lab command, and its flags are the Makefile's.
func TestGatewayLeavesOutTheLab(t *testing.T) {
	deps := mustRun(t, root(t), nil, goTool(), "list", "-deps", "-tags", "nolab", ".")
	for _, lab := range []string{"edgegw/lab/sim", "edgegw/lab/bench", "edgegw/lab/", "edgegw/receiver", "github.com/mochi-mqtt/"} {
		for _, d := range strings.Fields(deps) {
			if strings.HasPrefix(d, lab) {
				t.Errorf("the gateway build links %s", d)
			}
		}
	}
	r := run(t, t.TempDir(), nil, binary(t, "amd64"), "demo")
	if r.code != 2 || !strings.Contains(r.out, "not in this build") {
		t.Errorf("gateway binary, demo: exit %d, output %q; want 2 and a word on edgegw-lab", r.code, r.out)
	}
	mk := readFile(t, filepath.Join(root(t), "Makefile"))
	if want := "GWFLAGS   := $(shell grep -v '^\\#' build/gateway.flags)\n"; !strings.Contains(mk, want) {
		t.Errorf("Makefile lacks %q: its gateway flags are not build/gateway.flags", want)
	}
}

// TestGatewayFlagsInlineHotPaths: the release flags turn inlining off only
// in named cold packages, never everywhere (-gcflags=all=-l) and never in a
// package a poll, a frame or a request goes through; and the compiler does
// inline there (edge/modbus's encode and decode, ringstore's append, the
// spool's record framing, encoding/binary and math calls included).
func TestGatewayFlagsInlineHotPaths(t *testing.T) {
	hot := []string{"edgegw/edge", "edgegw/edge/modbus", "edgegw/ringstore", "edgegw/spool", "edgegw/web",
		"edgegw/push", "edgegw/wire", "edgegw/stats", "edgegw/history", "encoding/binary", "math", "net/netip",
		"net", "net/http", "github.com/gorilla/websocket", "github.com/goburrow/modbus", "runtime", "sync", "time"}
	for _, f := range gatewayFlags {
		if !strings.HasPrefix(f, "-gcflags=") {
			continue
		}
		pattern, args, _ := strings.Cut(strings.TrimPrefix(f, "-gcflags="), "=")
		if !strings.Contains(args, "-l") {
			continue
		}
		if pattern == "all" || pattern == "std" || !strings.Contains(f, "=-l") {
			t.Errorf("%s turns inlining off beyond named packages", f)
		}
		for _, h := range hot {
			if pattern == h || (strings.HasSuffix(pattern, "/...") && (h == strings.TrimSuffix(pattern, "/...") || strings.HasPrefix(h, strings.TrimSuffix(pattern, "...")))) {
				t.Errorf("%s turns inlining off in the hot package %s", f, h)
			}
		}
	}
	// The compiler's word (-m): with the release flags, calls into
	// encoding/binary and math are inlined in the hot packages, as in a
	// plain build (the old flags, -gcflags=all=-l with a list turning it
	// back on, left these out).
	args := append([]string{"build"}, gatewayFlags...)
	args = append(args, "-gcflags=edgegw/edge/modbus=-m", "-gcflags=edgegw/edge=-m", "-gcflags=edgegw/ringstore=-m", "-gcflags=edgegw/spool=-m",
		"-o", os.DevNull, ".")
	r := run(t, root(t), []string{"CGO_ENABLED=0"}, goTool(), args...)
	if r.code != 0 {
		t.Fatalf("go build -m: exit %d\n%s", r.code, lastLines(r.out, 20))
	}
	// The count of inlined calls per hot package, for the log (-v).
	for _, pkg := range []string{"edge/modbus/", "edge/", "ringstore/", "spool/"} {
		n := 0
		for _, line := range strings.Split(r.out, "\n") {
			if strings.HasPrefix(line, pkg) && !strings.HasPrefix(strings.TrimPrefix(line, pkg), "modbus/") && strings.Contains(line, "inlining call to") {
				n++
			}
		}
		t.Logf("-m, release flags: %d inlined calls in %s*", n, pkg)
	}
	for pkg, want := range map[string]string{
		"edge/modbus/": "inlining call to binary.bigEndian.Uint16",
		"edge/":        "inlining call to math.Float64frombits",
		"ringstore/":   "inlining call to math.Float64bits",
		"spool/":       "inlining call to binary.littleEndian.Uint32",
	} {
		found := false
		for _, line := range strings.Split(r.out, "\n") {
			if strings.HasPrefix(line, pkg) && strings.Contains(line, want) {
				found = true
				break
			}
		}
		if !found {
			t.Errorf("with the release flags, %s* has no %q: the hot path is not inlined as in a plain build", pkg, want)
		}
	}
}

// TestGatewayLeavesOutPostgres: the gateway binary (build/gateway.flags'
// tags) never links the PostgreSQL driver, which only the receiver needs;
// the receiver's command does.
func TestGatewayLeavesOutPostgres(t *testing.T) {
	tags := ""
	for i, f := range gatewayFlags {
		if f == "-tags" && i+1 < len(gatewayFlags) {
			tags = gatewayFlags[i+1]
		}
	}
	if !strings.Contains(tags, "nolab") {
		t.Fatalf("build/gateway.flags has no -tags with nolab: %q", gatewayFlags)
	}
	for _, d := range strings.Fields(mustRun(t, root(t), nil, goTool(), "list", "-deps", "-tags", tags, ".")) {
		if strings.HasPrefix(d, "github.com/jackc/") {
			t.Errorf("the gateway build links %s", d)
		}
	}
	if deps := mustRun(t, root(t), nil, goTool(), "list", "-deps", "./cmd/edgegw-receiver"); !strings.Contains(deps, "github.com/jackc/pgx/v5\n") {
		t.Errorf("cmd/edgegw-receiver does not link pgx: the check above proves nothing")
	}
}
