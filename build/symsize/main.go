package main

import (
	"debug/elf"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
)

func main() {
	top := flag.Int("n", 15, "how many packages to list")
	flag.Usage = func() {
		fmt.Fprintln(os.Stderr, "usage: symsize [-n 15] BINARY (built without -ldflags -s)")
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() != 1 {
		flag.Usage()
		os.Exit(2)
	}
	if err := run(os.Stdout, flag.Arg(0), *top); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

// sizes is what one binary's symbols add up to.
type sizes struct {
	pkg   map[string]uint64 // file bytes per package
	total uint64            // file bytes of all symbols
	bss   uint64            // zero-filled bytes (not in the file)
}

func measure(path string) (sizes, error) {
	s := sizes{pkg: map[string]uint64{}}
	f, err := elf.Open(path)
	if err != nil {
		return s, fmt.Errorf("symsize: %w", err)
	}
	defer f.Close()
	syms, err := f.Symbols()
	if err != nil {
		return s, fmt.Errorf("symsize: %s: %w (build without -ldflags -s)", path, err)
	}
	for _, sym := range syms {
		if sym.Size == 0 || sym.Section == elf.SHN_UNDEF || int(sym.Section) >= len(f.Sections) {
			continue
		}
		sec := f.Sections[sym.Section]
		if sec.Flags&elf.SHF_ALLOC == 0 {
			continue
		}
		if sec.Type == elf.SHT_NOBITS {
			s.bss += sym.Size
			continue
		}
		s.pkg[pkgOf(sym.Name)] += sym.Size
		s.total += sym.Size
	}
	return s, nil
}

// pkgOf is the import path a symbol belongs to: the name up to the first
// '.' after its last '/', generic arguments ("[...]") cut first. Linker
// symbols such as "go:string.*" or "type:*T" are grouped by their prefix
// ("go:", "type:").
func pkgOf(name string) string {
	if i := strings.IndexByte(name, ':'); i > 0 && !strings.ContainsAny(name[:i], "/.[") {
		return name[:i+1]
	}
	if i := strings.IndexByte(name, '['); i >= 0 {
		name = name[:i]
	}
	dir, base := "", name
	if i := strings.LastIndexByte(name, '/'); i >= 0 {
		dir, base = name[:i+1], name[i+1:]
	}
	if i := strings.IndexByte(base, '.'); i >= 0 {
		base = base[:i]
	}
	return dir + base
}

func run(w io.Writer, path string, top int) error {
	s, err := measure(path)
	if err != nil {
		return err
	}
	type entry struct {
		pkg  string
		size uint64
	}
	list := make([]entry, 0, len(s.pkg))
	for p, n := range s.pkg {
		list = append(list, entry{p, n})
	}
	sort.Slice(list, func(i, j int) bool {
		if list[i].size != list[j].size {
			return list[i].size > list[j].size
		}
		return list[i].pkg < list[j].pkg
	})
	for i, e := range list {
		if i == top {
			break
		}
		fmt.Fprintf(w, "  %9.1f KiB  %s\n", float64(e.size)/1024, e.pkg)
	}
	fmt.Fprintf(w, "  %9.1f KiB  all symbols in the file (%d packages)\n", float64(s.total)/1024, len(list))
	fmt.Fprintf(w, "  %9.1f KiB  zero-filled at start (bss; address space, not flash)\n", float64(s.bss)/1024)
	return nil
}
