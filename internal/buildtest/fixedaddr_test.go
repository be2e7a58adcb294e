package buildtest

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// fixedAddr matches a host:port literal with a port other than 0: an IPv4
// address, localhost or a bracketed IPv6 address followed by :PORT, or a
// bare ":PORT" in quotes (a listen address). Port 0 (the kernel picks one)
// is what tests listen on.
var fixedAddr = regexp.MustCompile(`(?:\b(?:\d{1,3}\.){3}\d{1,3}|\blocalhost|\[[0-9A-Fa-f:.]*\]):0*[1-9]\d{0,4}\b|":0*[1-9]\d{0,4}"`)

// addrUse is a fixed address a test may name because nothing dials or
// listens on it. file is a path from the repository root, or a directory
// ending in "/"; addr is the literal ("" for any in file).
type addrUse struct{ file, addr, why string }

// fixedAddrAllowed is the whole allow-list: keep it short, give a reason
// for each. An entry that no longer matches anything fails the test, so the
// list shrinks with the tests.
var fixedAddrAllowed = []addrUse{
	{"internal/buildtest/fixedaddr_test.go", "", "this allow-list"},
	{"conf/", "", "conf parses and validates addresses into its tables and messages; it never dials or listens"},
	{"edge/rates_test.go", "127.0.0.1:1", "a device built to test its read plan: newDevice never dials"},
	{"e2e/rates_e2e_test.go", "127.0.0.1:1", "check prints the plan per rate without -poll: nothing dials it"},
	{"e2e/install_e2e_test.go", "0.0.0.0:8080", "text of the installed example that the test looks for and replaces"},
	{"e2e/install_e2e_test.go", "127.0.0.1:1883", "text of the installed example that the test looks for and replaces"},
	{"e2e/check_tags_test.go", "127.0.0.1:1502", "only `edgegw check` reads this config, and check never dials a device"},
	{"e2e/faults_e2e_test.go", "127.0.0.1:5020", "TestCheckPrintsBuses: `edgegw check` prints the buses of these addresses and never dials them"},
	{"e2e/faults_e2e_test.go", "127.0.0.1:5021", "TestCheckPrintsBuses, as above"},
	{"e2e/faults_e2e_test.go", "127.0.0.1:5022", "TestCheckPrintsBuses, as above"},
	{"web/helpers_test.go", "127.0.0.1:1502", "a stats.Info address that the API and the page show; web never dials a device"},
	{"web/helpers_test.go", "127.0.0.1:1503", "a stats.Info address that the API and the page show; web never dials a device"},
	{"web/api_test.go", "127.0.0.1:1503", "the address /api/devices reports for helpers_test.go's logger-01"},
	{"web/page_write_test.go", "127.0.0.1:1502", "a stats.Info address the page shows; web never dials a device"},
	{"web/metrics_tags_test.go", "127.0.0.1:502", "a stats.Info address in /metrics' labels; web never dials a device"},
	{"web/limits_test.go", "192.0.2.7:4711", "an X-Forwarded-For value parsed by the client-address table; nothing dials it"},
	{"web/limits_test.go", "[2001:db8::5]:80", "an X-Forwarded-For value parsed by the client-address table; nothing dials it"},
	{"web/page_test.go", "127.0.1.27:502", "a reason string the page shows; web never dials a device"},
	{"web/state_test.go", "127.0.0.1:502", "a stats.Info address /api/devices shows; web never dials a device"},
	{"edge/modbus/fuzz_test.go", "127.0.1.7:502", "a reply's source address given to the UDP matcher; no socket sends to it"},
	{"edge/modbus/fuzz_test.go", "127.0.1.8:502", "a reply's source address given to the UDP matcher; no socket sends to it"},
}

// addrFinding is one fixed address found in a test file.
type addrFinding struct {
	file string // from the root, slash-separated
	line int
	addr string
}

// scanFixedAddrs returns the fixed host:port literals of every *_test.go
// below dir (node_modules and dot directories left out) that the allow-list
// does not cover, and the allow-list entries that covered nothing. Comment
// lines (and comments after code) are documentation, not addresses in use.
func scanFixedAddrs(t *testing.T, dir string, allowed []addrUse) (found []addrFinding, unused []addrUse) {
	t.Helper()
	used := make([]bool, len(allowed))
	trailing := regexp.MustCompile(`\s//\s.*$`)
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if path != dir && (strings.HasPrefix(d.Name(), ".") || d.Name() == "node_modules") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(d.Name(), "_test.go") {
			return nil
		}
		rel, err := filepath.Rel(dir, path)
		if err != nil {
			return err
		}
		rel = filepath.ToSlash(rel)
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for i, l := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(strings.TrimSpace(l), "//") {
				continue
			}
			l = trailing.ReplaceAllString(l, "")
		next:
			for _, a := range fixedAddr.FindAllString(l, -1) {
				a = strings.Trim(a, `"`)
				for k, u := range allowed {
					inFile := u.file == rel || strings.HasSuffix(u.file, "/") && strings.HasPrefix(rel, u.file)
					if inFile && (u.addr == "" || u.addr == a) {
						used[k] = true
						continue next
					}
				}
				found = append(found, addrFinding{rel, i + 1, a})
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for k, u := range allowed {
		if !used[k] {
			unused = append(unused, u)
		}
	}
	return found, unused
}

// TestNoFixedAddresses: no test dials or listens on a fixed address or
// port (another process may hold it, or answer on it): tests listen on
// 127.0.0.1:0 and pass the address the kernel chose. A fixed address in a
// test that nothing dials is on the allow-list with its reason.
func TestNoFixedAddresses(t *testing.T) {
	found, unused := scanFixedAddrs(t, root(t), fixedAddrAllowed)
	for _, f := range found {
		t.Errorf("%s:%d: fixed address %s in a test: listen on 127.0.0.1:0 and use the address it got (or, if nothing dials it, add it to fixedAddrAllowed with why)", f.file, f.line, f.addr)
	}
	for _, u := range unused {
		t.Errorf("fixedAddrAllowed: %s %q matches nothing any more: remove the entry", u.file, u.addr)
	}
}

// TestNoFixedAddressesCatches: the scan finds a dialled fixed address, a
// listen on a fixed port, localhost and IPv6 ones, and leaves alone port 0,
// comments, and the allow-listed uses.
func TestNoFixedAddressesCatches(t *testing.T) {
	dir := t.TempDir()
	// Built from pieces, so that this file holds none of the literals.
	addr := func(host, port string) string { return host + ":" + port }
	write := func(rel, body string) {
		t.Helper()
		p := filepath.Join(dir, filepath.FromSlash(rel))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("x/dial_test.go", "package x\n\nfunc TestX(t *testing.T) {\n\tc, err := net.Dial(\"tcp\", \""+addr("127.0.0.1", "5020")+"\")\n"+
		"\tln, err := net.Listen(\"tcp\", \""+addr("", "8080")+"\")\n"+
		"\tmqtt := \"tcp://"+addr("localhost", "1883")+"\"\n"+
		"\tu := net.ListenUDP(\"udp\", \""+addr("[::1]", "502")+"\")\n"+
		"\tok := net.Listen(\"tcp\", \""+addr("127.0.0.1", "0")+"\")\n"+
		"\t// e.g. "+addr("192.168.1.20", "502")+" in a comment\n"+
		"\tjs := `{\"seq\":1}` // not an address: "+addr("10.0.0.1", "502")+"\n"+
		"\tdoc := \""+addr("10.0.0.9", "502")+"\"\n}\n")
	write("x/plain.go", "package x\nvar a = \""+addr("127.0.0.1", "5020")+"\"\n")
	write("node_modules/y/z_test.go", "var a = \""+addr("127.0.0.1", "5020")+"\"\n")
	allowed := []addrUse{
		{"x/dial_test.go", addr("10.0.0.9", "502"), "documentation of a parser"},
		{"x/", addr("10.0.0.7", "502"), "stale"},
	}
	found, unused := scanFixedAddrs(t, dir, allowed)
	var got []string
	for _, f := range found {
		got = append(got, f.file+":"+f.addr)
	}
	want := []string{
		"x/dial_test.go:" + addr("127.0.0.1", "5020"),
		"x/dial_test.go:" + addr("", "8080"),
		"x/dial_test.go:" + addr("localhost", "1883"),
		"x/dial_test.go:" + addr("[::1]", "502"),
	}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("found %q, want %q", got, want)
	}
	if len(found) > 0 && found[0].line != 4 {
		t.Errorf("the dial is on line %d, want 4", found[0].line)
	}
	if len(unused) != 1 || unused[0].why != "stale" {
		t.Errorf("unused entries %v, want the stale one", unused)
	}
}
