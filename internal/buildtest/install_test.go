package buildtest

import (
	"path/filepath"
	"strings"
	"testing"

	"edgegw/internal/testenv"
)

// installer runs build/install.sh with /bin/sh (dash on Debian: POSIX
// only) into one scratch DESTDIR.
type installer struct {
	t       *testing.T
	script  string
	destdir string
	binary  string
}

func newInstaller(t *testing.T) *installer {
	t.Helper()
	testenv.Need(t, "sh")
	dir := t.TempDir()
	bin := filepath.Join(dir, "edgegw")
	writeFile(t, bin, "#!/bin/sh\necho 'edgegw test binary'\n", 0o755)
	return &installer{
		t:       t,
		script:  filepath.Join(root(t), "build", "install.sh"),
		destdir: filepath.Join(dir, "root"),
		binary:  bin,
	}
}

func (in *installer) run(args ...string) result {
	in.t.Helper()
	return run(in.t, filepath.Dir(in.script), []string{"DESTDIR=" + in.destdir},
		"sh", append([]string{in.script, "--binary", in.binary}, args...)...)
}

func (in *installer) must(args ...string) string {
	in.t.Helper()
	r := in.run(args...)
	if r.code != 0 {
		in.t.Fatalf("install.sh %s: exit %d\n%s", strings.Join(args, " "), r.code, r.out)
	}
	return r.out
}

func (in *installer) path(p string) string { return filepath.Join(in.destdir, p) }

func TestInstallTwiceSameTree(t *testing.T) {
	in := newInstaller(t)
	in.must("--systemd")
	first := tree(t, in.destdir)
	in.must("--systemd")
	if d := diffTrees(first, tree(t, in.destdir)); d != "" {
		t.Fatalf("second run changed the tree:\n%s", d)
	}

	example := readFile(t, filepath.Join(root(t), "build", "edgegw.example.toml"))
	for _, want := range []string{
		"usr/local/bin/edgegw -rwxr-xr-x",
		"etc/edgegw drwxr-xr-x",
		"etc/edgegw/edgegw.toml -rw-r--r--",
		"etc/systemd/system/edgegw.service -rw-r--r--",
		"usr/lib/sysusers.d/edgegw.conf -rw-r--r--",
		"var/lib/edgegw drwxr-x---",
	} {
		found := false
		for _, line := range first {
			if strings.HasPrefix(line, want) {
				found = true
			}
		}
		if !found {
			t.Errorf("tree lacks %q:\n%s", want, strings.Join(first, "\n"))
		}
	}
	if got := readFile(t, in.path("usr/local/bin/edgegw")); got != readFile(t, in.binary) {
		t.Error("installed binary differs from the source")
	}
	if readFile(t, in.path("etc/edgegw/edgegw.toml")) != example {
		t.Error("installed config is not the example")
	}
	unit := readFile(t, in.path("etc/systemd/system/edgegw.service"))
	if !strings.Contains(unit, "ExecStart=/usr/local/bin/edgegw run -config /etc/edgegw/edgegw.toml") {
		t.Errorf("unit ExecStart wrong:\n%s", unit)
	}
	if got := readFile(t, in.path("usr/lib/sysusers.d/edgegw.conf")); !strings.HasPrefix(got, "u edgegw ") {
		t.Errorf("sysusers.d entry %q", got)
	}
	if exists(in.path("etc/init.d/edgegw")) {
		t.Error("--systemd installed the OpenWrt init script too")
	}
}

func TestInstallKeepsExistingConfig(t *testing.T) {
	in := newInstaller(t)
	const mine = "# my gateway\n[gateway]\nid = \"gw-mine\"\n"
	writeFile(t, in.path("etc/edgegw/edgegw.toml"), mine, 0o640)
	out := in.must("--systemd")
	if got := readFile(t, in.path("etc/edgegw/edgegw.toml")); got != mine {
		t.Fatalf("existing config overwritten:\n%s", got)
	}
	example := readFile(t, filepath.Join(root(t), "build", "edgegw.example.toml"))
	if got := readFile(t, in.path("etc/edgegw/edgegw.toml.new")); got != example {
		t.Fatal("edgegw.toml.new is not the new example")
	}
	if !strings.Contains(out, "edgegw.toml.new") {
		t.Errorf("install.sh did not say where the new example went:\n%s", out)
	}
	before := tree(t, in.destdir)
	in.must("--systemd")
	if d := diffTrees(before, tree(t, in.destdir)); d != "" {
		t.Fatalf("second run with a kept config changed the tree:\n%s", d)
	}
}

func TestUninstallKeepsDataUnlessPurge(t *testing.T) {
	in := newInstaller(t)
	in.must("--systemd")
	const mine = "[gateway]\nid = \"gw-07\"\n"
	writeFile(t, in.path("etc/edgegw/edgegw.toml"), mine, 0o644)
	writeFile(t, in.path("var/lib/edgegw/queue/00000001"), "samples", 0o640)

	in.must("--uninstall")
	for _, gone := range []string{"usr/local/bin/edgegw", "etc/systemd/system/edgegw.service", "usr/lib/sysusers.d/edgegw.conf"} {
		if exists(in.path(gone)) {
			t.Errorf("--uninstall left %s", gone)
		}
	}
	if readFile(t, in.path("etc/edgegw/edgegw.toml")) != mine {
		t.Error("--uninstall touched the config")
	}
	if readFile(t, in.path("var/lib/edgegw/queue/00000001")) != "samples" {
		t.Error("--uninstall touched the data")
	}
	after := tree(t, in.destdir)
	in.must("--uninstall") // idempotent too
	if d := diffTrees(after, tree(t, in.destdir)); d != "" {
		t.Fatalf("second --uninstall changed the tree:\n%s", d)
	}

	in.must("--uninstall", "--purge")
	for _, gone := range []string{"etc/edgegw", "var/lib/edgegw"} {
		if exists(in.path(gone)) {
			t.Errorf("--purge left %s", gone)
		}
	}
}

func TestInstallOpenWrt(t *testing.T) {
	in := newInstaller(t)
	// An OpenWrt image root is recognised by /etc/openwrt_release.
	writeFile(t, in.path("etc/openwrt_release"), "DISTRIB_ID='OpenWrt'\n", 0o644)
	in.must()
	first := tree(t, in.destdir)
	in.must()
	if d := diffTrees(first, tree(t, in.destdir)); d != "" {
		t.Fatalf("second run changed the tree:\n%s", d)
	}
	if !exists(in.path("usr/bin/edgegw")) || exists(in.path("usr/local/bin/edgegw")) {
		t.Errorf("OpenWrt binary not in /usr/bin:\n%s", strings.Join(first, "\n"))
	}
	if exists(in.path("etc/systemd/system/edgegw.service")) {
		t.Error("OpenWrt install wrote a systemd unit")
	}
	init := readFile(t, in.path("etc/init.d/edgegw"))
	if !strings.Contains(init, "\nPROG=/usr/bin/edgegw\n") {
		t.Errorf("init script PROG wrong:\n%s", init)
	}
	in.must("--uninstall")
	if exists(in.path("etc/init.d/edgegw")) || exists(in.path("usr/bin/edgegw")) {
		t.Error("--uninstall left the OpenWrt files")
	}
}

func TestInstallPrefixRewritesServiceFiles(t *testing.T) {
	in := newInstaller(t)
	in.must("--systemd", "--prefix", "/opt/edgegw")
	unit := readFile(t, in.path("etc/systemd/system/edgegw.service"))
	for _, want := range []string{
		"ExecStartPre=/opt/edgegw/bin/edgegw check -config /etc/edgegw/edgegw.toml",
		"ExecStart=/opt/edgegw/bin/edgegw run -config /etc/edgegw/edgegw.toml",
	} {
		if !strings.Contains(unit, want) {
			t.Errorf("unit lacks %q", want)
		}
	}
	if strings.Contains(unit, "/usr/local/bin") {
		t.Error("unit still names /usr/local/bin")
	}
	in.must("--openwrt", "--prefix", "/opt/edgegw")
	if !strings.Contains(readFile(t, in.path("etc/init.d/edgegw")), "\nPROG=/opt/edgegw/bin/edgegw\n") {
		t.Error("init script PROG not rewritten for --prefix")
	}
}

func TestInstallRejectsBadUsage(t *testing.T) {
	in := newInstaller(t)
	for _, args := range [][]string{{"--bogus"}, {"--prefix"}, {"--prefix", "relative/dir"}, {"--purge"}} {
		if r := in.run(args...); r.code == 0 {
			t.Errorf("install.sh %v succeeded:\n%s", args, r.out)
		}
	}
	// A missing binary is an error, not a half install.
	r := run(t, filepath.Dir(in.script), []string{"DESTDIR=" + in.destdir}, "sh", in.script, "--binary", filepath.Join(t.TempDir(), "nope"), "--systemd")
	if r.code == 0 || !strings.Contains(r.out, "no binary") {
		t.Errorf("missing binary: exit %d\n%s", r.code, r.out)
	}
	if exists(in.destdir) {
		t.Errorf("a failed install wrote into DESTDIR:\n%s", strings.Join(tree(t, in.destdir), "\n"))
	}
}
