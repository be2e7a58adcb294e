package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestPkgOf(t *testing.T) {
	for name, want := range map[string]string{
		"runtime.mallocgc": "runtime",
		"github.com/gorilla/websocket.(*Conn).WriteMessage":      "github.com/gorilla/websocket",
		"edgegw/edge/modbus.(*UDP).Send.func1":                   "edgegw/edge/modbus",
		"sync/atomic.(*Pointer[go.shape.struct { a/b.c }]).Load": "sync/atomic",
		"slices.SortFunc[go.shape.[]uint8]":                      "slices",
		"go:string.*":                                            "go:",
		"type:*edgegw/ringstore.Sample":                          "type:",
		"gopkg.in/yaml.v3.unmarshal":                             "gopkg.in/yaml", // dotted last element: a known limit
		"main.main":                                              "main",
	} {
		if got := pkgOf(name); got != want {
			t.Errorf("pkgOf(%q) = %q, want %q", name, got, want)
		}
	}
}

// TestMeasureItself builds a small program with symbols and checks that
// its own package and the runtime are counted and bss is kept apart.
func TestMeasureItself(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "main.go")
	if err := os.WriteFile(src, []byte(`package main

var big [1 << 20]byte // bss: 1 MiB, not in the file

var table = [4096]uint64{1, 2, 3} // data: 32 KiB in the file

func main() { big[len(table)%7]++; println(table[1], big[1]) }
`), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "go.mod"), []byte("module symtest\n\ngo 1.26\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "prog")
	cmd := exec.Command("go", "build", "-trimpath", "-o", bin, ".")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOFLAGS=")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	s, err := measure(bin)
	if err != nil {
		t.Fatal(err)
	}
	if s.pkg["main"] < 4096*8 {
		t.Errorf("main counts %d bytes, want ≥ 32 KiB of data", s.pkg["main"])
	}
	if s.bss < 1<<20 {
		t.Errorf("bss %d bytes, want ≥ 1 MiB", s.bss)
	}
	if s.pkg["runtime"] == 0 || s.total < s.pkg["runtime"]+s.pkg["main"] {
		t.Errorf("runtime %d, total %d", s.pkg["runtime"], s.total)
	}
	var out bytes.Buffer
	if err := run(&out, bin, 3); err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(out.String(), "\n"); n != 5 {
		t.Errorf("-n 3 printed %d lines:\n%s", n, out.String())
	}

	// A stripped binary has no symbols: a clear error.
	stripped := filepath.Join(dir, "stripped")
	cmd = exec.Command("go", "build", "-trimpath", "-ldflags", "-s -w", "-o", stripped, ".")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOFLAGS=")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	if _, err := measure(stripped); err == nil || !strings.Contains(err.Error(), "without -ldflags -s") {
		t.Errorf("stripped binary: %v", err)
	}
}
