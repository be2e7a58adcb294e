package wire

import (
	"os"
	"regexp"
	"strings"
	"testing"
)

// The README's "Upstream protocol" section summarises this package's
// comment: every frame it shows in full must stand here too, byte for byte.
func TestREADMEUpstreamMatchesDoc(t *testing.T) {
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	src, err := os.ReadFile("doc.go")
	if err != nil {
		t.Fatal(err)
	}
	var doc strings.Builder
	for _, l := range strings.Split(string(src), "\n") {
		doc.WriteString(strings.TrimLeft(strings.TrimPrefix(l, "//"), " \t"))
		doc.WriteByte('\n')
	}
	_, section, ok := strings.Cut(string(readme), "\n## Upstream protocol\n")
	if !ok {
		t.Fatal("README has no Upstream protocol section")
	}
	section, _, _ = strings.Cut(section, "\n## ")
	var frames []string
	_, block, _ := strings.Cut(section, "```json\n")
	block, _, _ = strings.Cut(block, "```")
	for _, l := range strings.Split(block, "\n") {
		frames = append(frames, strings.TrimSpace(l))
	}
	for _, m := range regexp.MustCompile("`(\\{\"[^`]*\\})`").FindAllStringSubmatch(section, -1) {
		frames = append(frames, m[1])
	}
	n := 0
	for _, f := range frames {
		if f == "" || strings.Contains(f, "…") {
			continue // elided: not a whole frame
		}
		n++
		if !strings.Contains(doc.String(), f) {
			t.Errorf("README frame %s is not in wire's doc comment", f)
		}
	}
	if n < 4 {
		t.Fatalf("%d frames checked in the README section, want the batch's head, its skip, the ack and a per-tag payload", n)
	}
}
