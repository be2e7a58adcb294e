package sparkplug

import (
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

var quiet = slog.New(slog.DiscardHandler)

func TestBdSeqPersistsAndWraps(t *testing.T) {
	dir := t.TempDir()
	s := openBdSeq(dir, quiet, new(writeHealth))
	for want := uint64(0); want < 3; want++ {
		if got := s.next(); got != want {
			t.Fatalf("next = %d, want %d", got, want)
		}
	}
	s = openBdSeq(dir, quiet, new(writeHealth)) // a restart
	if got := s.next(); got != 3 {
		t.Fatalf("after reopen next = %d, want 3", got)
	}
	if err := os.WriteFile(filepath.Join(dir, "bdseq"), []byte("255\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	s = openBdSeq(dir, quiet, new(writeHealth))
	if got := s.next(); got != 0 {
		t.Fatalf("after 255 next = %d, want 0", got)
	}
	if err := os.WriteFile(filepath.Join(dir, "bdseq"), []byte("300\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var log strings.Builder
	s = openBdSeq(dir, slog.New(slog.NewTextHandler(&log, nil)), new(writeHealth))
	if n := s.next(); n > 255 || !strings.Contains(log.String(), "want 0..255") {
		t.Fatalf("bad bdseq file: next %d, log %q", n, log.String())
	}
}

// A directory that cannot be written (a read-only card: here the path
// runs through a file) never stops the node: bdSeq counts in memory and
// the aliases follow the config order, each logged.
func TestStoreOnUnwritableDir(t *testing.T) {
	blocker := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(blocker, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(blocker, "sparkplug")
	var log strings.Builder
	l := slog.New(slog.NewTextHandler(&log, nil))
	wh := new(writeHealth)
	s := openBdSeq(dir, l, wh)
	if a, b := s.next(), s.next(); b != (a+1)%256 {
		t.Fatalf("bdSeq %d, %d in memory, want consecutive", a, b)
	}
	m := loadAliases(dir, []Device{{Name: "a", Tags: []Tag{{Name: "t1"}, {Name: "t2"}}}}, l, wh)
	if m[aliasKey{"a", "t2"}] != firstTagAlias+1 {
		t.Fatalf("aliases %v", m)
	}
	// The state writer says so (WriteHealth): failing, with its last error and time.
	if wh.failing == nil || wh.lastErr == nil || wh.lastErrAt.IsZero() {
		t.Fatalf("write health after failed writes: %v, %v at %v", wh.failing, wh.lastErr, wh.lastErrAt)
	}
	for _, want := range []string{"bdseq not saved", "aliases not saved"} {
		if !strings.Contains(log.String(), want) {
			t.Errorf("log lacks %q:\n%s", want, log.String())
		}
	}
	// A corrupt aliases file: numbered again from the config order, logged.
	good := t.TempDir()
	if err := os.WriteFile(filepath.Join(good, "aliases"), []byte("junk\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	log.Reset()
	if m := loadAliases(good, []Device{{Name: "a", Tags: []Tag{{Name: "t1"}}}}, l, new(writeHealth)); m[aliasKey{"a", "t1"}] != firstTagAlias ||
		!strings.Contains(log.String(), "aliases not readable") {
		t.Fatalf("corrupt aliases: %v, log %q", m, log.String())
	}
}

func TestAliasesStableAcrossConfigEdits(t *testing.T) {
	dir := t.TempDir()
	devs := []Device{{Name: "a", Tags: []Tag{{Name: "t1"}, {Name: "t2"}}}, {Name: "b", Tags: []Tag{{Name: "t1"}}}}
	first := loadAliases(dir, devs, quiet, new(writeHealth))
	if first[aliasKey{"a", "t1"}] != firstTagAlias || first[aliasKey{"b", "t1"}] != firstTagAlias+2 {
		t.Fatalf("aliases %v, want config order from %d", first, firstTagAlias)
	}
	// A tag inserted in front and a device removed: the old keep theirs.
	devs2 := []Device{{Name: "a", Tags: []Tag{{Name: "t0"}, {Name: "t1"}, {Name: "t2"}}}}
	second := loadAliases(dir, devs2, quiet, new(writeHealth))
	for k, a := range first {
		if k.device == "a" && second[k] != a {
			t.Fatalf("%v: alias %d then %d", k, a, second[k])
		}
	}
	if got := second[aliasKey{"a", "t0"}]; got != firstTagAlias+3 {
		t.Fatalf("new tag alias %d, want %d (next free)", got, firstTagAlias+3)
	}
	// Without a directory: config order.
	mem := loadAliases("", devs2, quiet, new(writeHealth))
	if mem[aliasKey{"a", "t0"}] != firstTagAlias {
		t.Fatalf("memory aliases %v", mem)
	}
}

func TestCheckID(t *testing.T) {
	for _, bad := range []string{"", "a/b", "a+", "#", "x\x00"} {
		if CheckID("group_id", bad) == nil {
			t.Errorf("%q accepted", bad)
		}
	}
	if err := CheckID("group_id", "Plant 1.A-b_c"); err != nil {
		t.Error(err)
	}
}
