package conf

import (
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/BurntSushi/toml"
)

func p(segs ...string) string { return strings.Join(segs, segSep) }

func TestIndexLines(t *testing.T) {
	src := `# comment with [[device]] and key = "x"
title = "a # not a comment" # comment
"quoted.key" = 1
'lit' = 2
x.y.z = 3
esc = "a \" [[device]] \\"
ml = """
[[device]]
name = "inside"
""""
ml2 = '''
x = 1 '''''
arr = [
  [1, 2],
  # comment ] inside
  "s,]",
]
[[device]]
name = "a"
tags = [
  { name = "t1", address = 0 },
  {
    name = "t2",
    address = 1,
  },
]
[device.serial]
baud = 9600
[[device]]
name = "b"
[[device.tags]]
name = "u1"
[[device.tags]]
name = "u2"
[device.tags.sub]
k = 1
[a."b.c".d]
e = 1
dt = 1979-05-27 07:32:00Z
`
	src = strings.ReplaceAll(src, "\n", "\r\n") // CRLF must not move lines
	if _, err := toml.Decode(src, new(map[string]any)); err != nil {
		t.Fatal(err)
	}
	li := indexLines(src)
	want := map[string]int{
		p("title"):                            2,
		p("quoted.key"):                       3,
		p("lit"):                              4,
		p("x"):                                5,
		p("x", "y", "z"):                      5,
		p("esc"):                              6,
		p("ml"):                               7,
		p("ml2"):                              11,
		p("arr"):                              13,
		p("arr[0]"):                           14,
		p("arr[1]"):                           16,
		p("device"):                           18,
		p("device[0]"):                        18,
		p("device[0]", "name"):                19,
		p("device[0]", "tags"):                20,
		p("device[0]", "tags[0]"):             21,
		p("device[0]", "tags[0]", "address"):  21,
		p("device[0]", "tags[1]"):             22,
		p("device[0]", "tags[1]", "name"):     23,
		p("device[0]", "tags[1]", "address"):  24,
		p("device[0]", "serial"):              27,
		p("device[0]", "serial", "baud"):      28,
		p("device[1]"):                        29,
		p("device[1]", "name"):                30,
		p("device[1]", "tags[0]"):             31,
		p("device[1]", "tags[0]", "name"):     32,
		p("device[1]", "tags[1]"):             33,
		p("device[1]", "tags[1]", "name"):     34,
		p("device[1]", "tags[1]", "sub", "k"): 36,
		p("a", "b.c", "d", "e"):               38,
		p("a", "b.c", "d", "dt"):              39,
	}
	for path, line := range want {
		if got := li[path]; got != line {
			t.Errorf("%q: line %d, want %d", strings.ReplaceAll(path, segSep, "."), got, line)
		}
	}
	if _, ok := li[p("device[2]")]; ok {
		t.Errorf("a [[device]] inside a string was counted")
	}
	if li.line(noPath) != 0 || pathKey("a", "x[0]") != noPath || pathKey(noPath, "x") != noPath {
		t.Errorf("noPath")
	}
}

// lineKeys is the set of dotted keys (without array indices) in a line
// index, comparable with the reference's MetaData.Keys.
var indexRE = regexp.MustCompile(`\[[0-9]+\]`)

func lineKeys(li lineIndex) []string {
	set := map[string]bool{}
	for path := range li {
		set[indexRE.ReplaceAllString(path, "")] = true
	}
	return sortedKeys(set)
}

func tomlKeys(md toml.MetaData) []string {
	set := map[string]bool{}
	for _, k := range md.Keys() {
		set[strings.Join(k, segSep)] = true
	}
	return sortedKeys(set)
}

func sortedKeys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// checkLinesAgree: on any text both parsers accept, the line index holds
// exactly the reference's keys, and every key's line is inside the file.
func checkLinesAgree(t testing.TB, src string) {
	var m map[string]any
	md, err := toml.Decode(src, &m)
	if err != nil {
		return
	}
	for _, k := range md.Keys() {
		for _, seg := range k {
			if strings.ContainsAny(seg, segSep+"[\x00") {
				return // such keys get no path by design
			}
		}
	}
	li := indexLines(src)
	if li == nil {
		return // refused by parseTOML: checkAgrees judges that
	}
	got, want := lineKeys(li), tomlKeys(md)
	// The reference lists explicit keys and tables; the index also names the
	// implicit parents ("upstream" of [upstream.mqtt]).
	gotSet := map[string]bool{}
	for _, k := range got {
		gotSet[k] = true
	}
	for _, k := range want {
		if !gotSet[k] {
			t.Fatalf("line index missed key %q\nsrc: %.2000q", strings.ReplaceAll(k, segSep, "."), src)
		}
	}
	for _, k := range got {
		found := false
		for _, w := range want {
			found = found || w == k || strings.HasPrefix(w, k+segSep)
		}
		if !found {
			t.Fatalf("line index invented key %q\nsrc: %.2000q", strings.ReplaceAll(k, segSep, "."), src)
		}
	}
	lines := strings.Split(src, "\n")
	for path, line := range li {
		if line < 1 || line > len(lines) {
			t.Fatalf("%q: line %d out of range", path, line)
		}
	}
}

func TestLinesAgreeWithReference(t *testing.T) {
	checkLinesAgree(t, readFile(t, examplePath))
	for _, tc := range errorCases {
		checkLinesAgree(t, tc.text)
	}
}

func TestErrorLinesOnExample(t *testing.T) {
	// Break the 30th logger: the message must point at its own address line.
	text := readFile(t, examplePath)
	broken := strings.Replace(text, `address = "192.168.1.130:502"`, `address = "192.168.1.130:502x"`, 1)
	_, err := Parse("edgegw.toml", []byte(broken))
	if err == nil {
		t.Fatal("no error")
	}
	line := 0
	for i, l := range strings.Split(broken, "\n") {
		if strings.Contains(l, "130:502x") {
			line = i + 1
		}
	}
	want := `conf: edgegw.toml:` + strconv.Itoa(line) + `: device "logger-30": address "192.168.1.130:502x": port "502x": want a number 1..65535`
	if err.Error() != want {
		t.Errorf("got  %s\nwant %s", err, want)
	}
}
