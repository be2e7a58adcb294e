package sparkplug

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestBdSeqPersistsAndWraps(t *testing.T) {
	dir := t.TempDir()
	s, err := openBdSeq(dir)
	if err != nil {
		t.Fatal(err)
	}
	for want := uint64(0); want < 3; want++ {
		if got, err := s.next(); err != nil || got != want {
			t.Fatalf("next = %d %v, want %d", got, err, want)
		}
	}
	s, err = openBdSeq(dir) // a restart
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := s.next(); got != 3 {
		t.Fatalf("after reopen next = %d, want 3", got)
	}
	if err := os.WriteFile(filepath.Join(dir, "bdseq"), []byte("255\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	s, _ = openBdSeq(dir)
	if got, _ := s.next(); got != 0 {
		t.Fatalf("after 255 next = %d, want 0", got)
	}
	if err := os.WriteFile(filepath.Join(dir, "bdseq"), []byte("300\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := openBdSeq(dir); err == nil || !strings.Contains(err.Error(), "want 0..255") {
		t.Fatalf("bad bdseq file: err = %v", err)
	}
}

func TestAliasesStableAcrossConfigEdits(t *testing.T) {
	dir := t.TempDir()
	devs := []Device{{Name: "a", Tags: []Tag{{Name: "t1"}, {Name: "t2"}}}, {Name: "b", Tags: []Tag{{Name: "t1"}}}}
	first, err := loadAliases(dir, devs)
	if err != nil {
		t.Fatal(err)
	}
	if first[aliasKey{"a", "t1"}] != firstTagAlias || first[aliasKey{"b", "t1"}] != firstTagAlias+2 {
		t.Fatalf("aliases %v, want config order from %d", first, firstTagAlias)
	}
	// A tag inserted in front and a device removed: the old keep theirs.
	devs2 := []Device{{Name: "a", Tags: []Tag{{Name: "t0"}, {Name: "t1"}, {Name: "t2"}}}}
	second, err := loadAliases(dir, devs2)
	if err != nil {
		t.Fatal(err)
	}
	for k, a := range first {
		if k.device == "a" && second[k] != a {
			t.Fatalf("%v: alias %d then %d", k, a, second[k])
		}
	}
	if got := second[aliasKey{"a", "t0"}]; got != firstTagAlias+3 {
		t.Fatalf("new tag alias %d, want %d (next free)", got, firstTagAlias+3)
	}
	// Without a directory: config order.
	mem, _ := loadAliases("", devs2)
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
