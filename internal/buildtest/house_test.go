package buildtest

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
)

const module = "edgegw"

// The packages the README's rules name (besides those its table tags).
var (
	houseRoles    = []string{"edge", "web", "push", "mbserver"}                      // never depend on each other
	houseMainOnly = []string{"conf", "internal/sdnotify"}                            // imported by houseEntrance alone
	houseEntrance = []string{"main", "internal/gateway", "internal/cli", "lab/demo"} // the commands and the assembly
	houseLabMods  = []string{"github.com/mochi-mqtt/server"}                         // never in the gateway build
	houseLeaves   = []string{"tagtype"}                                              // import only the standard library
)

// TestHouse holds the code to the README's Architecture section: every
// package of the module has a row in its "may import" table, imports only
// what its row allows, and the rules under it hold through each package's
// dependencies; the gateway build (-tags nolab) links no lab package; every
// module the go.mod requires directly is named in the dependency table. A
// row for a package that does not exist yet (being added) is allowed; a
// package the rules name must exist or have a row.
func TestHouse(t *testing.T) {
	dir := root(t)
	h, err := parseHouse(readFile(t, filepath.Join(dir, "README.md")))
	if err != nil {
		t.Fatal(err)
	}
	pkgs := goListPackages(t, dir)
	nolab := strings.Fields(goOutput(t, dir, "list", "-deps", "-tags", "nolab", "."))
	for _, p := range checkHouse(h, pkgs, nolab) {
		t.Error(p)
	}
	leafDeps := map[string][]string{}
	for _, l := range houseLeaves {
		leafDeps[l] = strings.Fields(goOutput(t, dir, "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", "./"+l))
	}
	for _, p := range checkLeaves(leafDeps) {
		t.Error(p)
	}
	for _, m := range directRequires(t, readFile(t, filepath.Join(dir, "go.mod"))) {
		if !strings.Contains(h.section, "`"+m+"`") {
			t.Errorf("README, Architecture: go.mod requires %s, which the dependency table does not name", m)
		}
	}
	t.Logf("%d packages, %d rows, gateway build: %d packages", len(pkgs), len(h.rows), len(nolab))
}

// TestHouseCatches: the checker finds each kind of breach (so TestHouse can
// fail): an import the table does not allow, a package with no row, a role
// depending on another through a third package, a gateway package reaching
// the lab, the lab in the gateway build, a main-only package imported
// elsewhere, a package the rules name that neither exists nor has a row.
func TestHouseCatches(t *testing.T) {
	h, err := parseHouse("## Architecture\n\n```text\npackage            may import\n" +
		"main               any\nconf               none\nringstore          none\nstats              none\n" +
		"edge               ringstore, stats\nweb                ringstore\nhelper             ringstore\n" +
		"internal/sdnotify  none\nsim                none (lab)\ninternal/testenv   none (tests only)\n```\n\n## Tests\n")
	if err != nil {
		t.Fatal(err)
	}
	pkgs := map[string]pkgInfo{
		"main":      {imports: []string{"conf", "edge", "web", "sim"}, deps: []string{"conf", "edge", "web", "sim", "ringstore", "stats", "helper"}},
		"conf":      {},
		"ringstore": {},
		"stats":     {},
		"edge":      {imports: []string{"ringstore", "helper"}, deps: []string{"ringstore", "helper", "web"}},
		"web":       {imports: []string{"ringstore", "conf"}, deps: []string{"ringstore", "conf", "sim"}},
		"helper":    {imports: []string{"web"}, deps: []string{"web", "ringstore"}},
		"sim":       {},
		"stray":     {},
	}
	got := strings.Join(checkHouse(h, pkgs, []string{"edgegw", "edgegw/web", "edgegw/sim", "github.com/mochi-mqtt/server/v2"}), "\n")
	for _, want := range []string{
		"edge imports helper, which its row does not allow",
		"web imports conf, which its row does not allow",
		"helper imports web, which its row does not allow",
		"stray has no row",
		"edge depends on web",
		"web depends on the lab package sim",
		"the gateway build (-tags nolab) links sim",
		"the gateway build (-tags nolab) links github.com/mochi-mqtt/server/v2",
		"conf is imported by web",
		"push is named by the rules but neither exists nor has a row",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("checker missed %q; it said:\n%s", want, got)
		}
	}
}

// checkLeaves returns a breach for every package a leaf (houseLeaves)
// depends on outside the standard library (deps: what go list -deps names
// that is not standard, the leaf itself included).
func checkLeaves(deps map[string][]string) []string {
	var out []string
	for leaf, ds := range deps {
		for _, d := range ds {
			if d != module+"/"+leaf {
				out = append(out, fmt.Sprintf("%s depends on %s: it imports only the standard library (README, Architecture)", leaf, d))
			}
		}
	}
	sort.Strings(out)
	return out
}

// TestLeavesCatches: checkLeaves finds a leaf that reaches past the standard library.
func TestLeavesCatches(t *testing.T) {
	got := checkLeaves(map[string][]string{"tagtype": {"edgegw/tagtype", "edgegw/ringstore"}, "clean": {"edgegw/clean"}})
	if len(got) != 1 || !strings.Contains(got[0], "tagtype depends on edgegw/ringstore") {
		t.Errorf("checkLeaves said %q", got)
	}
}

// house is the README's Architecture section, parsed.
type house struct {
	section   string
	rows      map[string][]string // package → what it may import; nil: any
	lab       map[string]bool
	testsOnly map[string]bool
}

// parseHouse reads the "package  may import" block of the Architecture
// section: one package a line, then "any", "none" or a comma-separated
// list, then an optional "(lab)", "(tests only)" or other remark.
func parseHouse(readme string) (house, error) {
	h := house{rows: map[string][]string{}, lab: map[string]bool{}, testsOnly: map[string]bool{}}
	i := strings.Index(readme, "\n## Architecture\n")
	if i < 0 && strings.HasPrefix(readme, "## Architecture\n") {
		i = -1
	} else if i < 0 {
		return h, errors.New("README: no Architecture section")
	}
	sec := readme[i+1:]
	if j := strings.Index(sec[3:], "\n## "); j >= 0 {
		sec = sec[:j+3]
	}
	h.section = sec
	const head = "```text\npackage            may import\n"
	k := strings.Index(sec, head)
	if k < 0 {
		return h, fmt.Errorf("README, Architecture: no block starting %q", head)
	}
	body := sec[k+len(head):]
	end := strings.Index(body, "```")
	if end < 0 {
		return h, errors.New("README, Architecture: the may-import block does not end")
	}
	for _, line := range strings.Split(strings.TrimSpace(body[:end]), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			return h, fmt.Errorf("README, Architecture: row %q: want a package and what it may import", line)
		}
		pkg, rest := f[0], strings.Join(f[1:], " ")
		note := ""
		if p := strings.Index(rest, "("); p >= 0 {
			rest, note = strings.TrimSpace(rest[:p]), strings.Trim(rest[p:], "()")
		}
		if _, dup := h.rows[pkg]; dup {
			return h, fmt.Errorf("README, Architecture: %s has two rows", pkg)
		}
		switch rest {
		case "any":
			h.rows[pkg] = nil
		case "none":
			h.rows[pkg] = []string{}
		default:
			for _, d := range strings.Split(rest, ",") {
				h.rows[pkg] = append(h.rows[pkg], strings.TrimSpace(d))
			}
		}
		h.lab[pkg] = note == "lab"
		h.testsOnly[pkg] = note == "tests only"
	}
	if len(h.rows) < 5 {
		return h, fmt.Errorf("README, Architecture: only %d rows in the may-import block", len(h.rows))
	}
	return h, nil
}

// pkgInfo is one package's project imports and dependencies, named as in
// the README ("main" for the module's root, else the path below it).
type pkgInfo struct{ imports, deps []string }

// checkHouse returns every breach of the README's table and rules by pkgs
// and the gateway build's dependency list (import paths as go list gives).
func checkHouse(h house, pkgs map[string]pkgInfo, gatewayDeps []string) []string {
	var out []string
	bad := func(format string, args ...any) { out = append(out, fmt.Sprintf(format, args...)) }
	names := make([]string, 0, len(pkgs))
	for n := range pkgs {
		names = append(names, n)
	}
	sort.Strings(names)
	known := func(p string) bool { _, ok := pkgs[p]; _, row := h.rows[p]; return ok || row }
	within := func(p, root string) bool { return p == root || strings.HasPrefix(p, root+"/") }

	for _, n := range names {
		allowed, ok := h.rows[n]
		if !ok {
			bad("README, Architecture: %s has no row in the may-import table", n)
			continue
		}
		if allowed == nil {
			continue
		}
		for _, imp := range pkgs[n].imports {
			if !slices.Contains(allowed, imp) {
				bad("%s imports %s, which its row does not allow (README, Architecture)", n, imp)
			}
		}
	}
	for _, p := range slices.Concat(houseRoles, houseMainOnly, houseEntrance[1:]) {
		if !known(p) {
			bad("%s is named by the rules but neither exists nor has a row (README, Architecture)", p)
		}
	}
	// The roles never depend on each other.
	for _, a := range houseRoles {
		for _, d := range pkgs[a].deps {
			for _, b := range houseRoles {
				if b != a && within(d, b) {
					bad("%s depends on %s (through its imports): the roles never depend on each other", a, d)
				}
			}
		}
	}
	// No gateway package depends on the lab.
	isLab := func(p string) bool {
		for l, yes := range h.lab {
			if yes && within(p, l) {
				return true
			}
		}
		return false
	}
	for _, n := range names {
		if n == "main" || isLab(n) || h.testsOnly[n] {
			continue
		}
		for _, d := range pkgs[n].deps {
			if isLab(d) {
				bad("%s depends on the lab package %s", n, d)
			}
		}
	}
	for _, d := range gatewayDeps {
		name, own := projectName(d)
		if own && isLab(name) {
			bad("the gateway build (-tags nolab) links %s", name)
		}
		for _, m := range houseLabMods {
			if strings.HasPrefix(d, m) {
				bad("the gateway build (-tags nolab) links %s", d)
			}
		}
	}
	// Main-only and tests-only packages.
	for _, n := range names {
		for _, imp := range pkgs[n].imports {
			if !slices.Contains(houseEntrance, n) && slices.Contains(houseMainOnly, imp) {
				bad("%s is imported by %s: only the commands and the assembly may (%s)", imp, n, strings.Join(houseEntrance, ", "))
			}
			if h.testsOnly[imp] {
				bad("%s is imported by %s: it is for tests only", imp, n)
			}
		}
	}
	return out
}

// projectName names an import path as the README does; own is false
// outside the module.
func projectName(path string) (name string, own bool) {
	switch {
	case path == module:
		return "main", true
	case strings.HasPrefix(path, module+"/"):
		return strings.TrimPrefix(path, module+"/"), true
	}
	return path, false
}

// goListPackages runs go list -json ./... in dir: every package of the
// module with its project imports and dependencies (tests' not included).
func goListPackages(t *testing.T, dir string) map[string]pkgInfo {
	t.Helper()
	out := goOutput(t, dir, "list", "-json", "./...")
	pkgs := map[string]pkgInfo{}
	dec := json.NewDecoder(strings.NewReader(out))
	for {
		var p struct {
			ImportPath    string
			Imports, Deps []string
		}
		if err := dec.Decode(&p); err == io.EOF {
			break
		} else if err != nil {
			t.Fatalf("go list -json: %v", err)
		}
		name, _ := projectName(p.ImportPath)
		var info pkgInfo
		for _, l := range []struct {
			from []string
			to   *[]string
		}{{p.Imports, &info.imports}, {p.Deps, &info.deps}} {
			for _, d := range l.from {
				if n, own := projectName(d); own {
					*l.to = append(*l.to, n)
				}
			}
		}
		pkgs[name] = info
	}
	if len(pkgs) < 5 {
		t.Fatalf("go list found %d packages", len(pkgs))
	}
	return pkgs
}

// directRequires lists the modules go.mod requires directly (the lines of
// its require blocks not marked "// indirect"), read from the file so that
// no module has to be fetched.
func directRequires(t *testing.T, gomod string) []string {
	t.Helper()
	var out []string
	block := false
	for _, l := range strings.Split(gomod, "\n") {
		l = strings.TrimSpace(l)
		switch {
		case l == "require (":
			block = true
			continue
		case block && l == ")":
			block = false
			continue
		case strings.HasPrefix(l, "require "):
			l = strings.TrimPrefix(l, "require ")
		case !block:
			continue
		}
		if f := strings.Fields(l); len(f) >= 2 && !strings.Contains(l, "// indirect") {
			out = append(out, f[0])
		}
	}
	if len(out) == 0 {
		t.Fatal("go.mod: no direct requirement found")
	}
	return out
}

// goOutput runs the go tool in dir and returns its standard output.
func goOutput(t *testing.T, dir string, args ...string) string {
	t.Helper()
	cmd := exec.Command(goTool(), args...)
	cmd.Dir = dir
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, stderr.Bytes())
	}
	return string(out)
}
