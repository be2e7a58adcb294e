package conf

import (
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/BurntSushi/toml"
)

// The reference for parseTOML is BurntSushi/toml v1.6 (TOML 1.1), the
// parser conf used before, kept as a test dependency: on every input both
// accept or both refuse, and what both accept decodes to the same tree.
// The exceptions, where the reference is the lenient one: it accepts 16 of
// toml-test's invalid documents (a table defined again by a header or a
// dotted key, an inline table extended, an offset of +12:60), which
// parseTOML refuses as the suite says; it takes six quotes as the end of a
// multi-line string when an escaped backslash comes before them (three of
// them its content), where the spec allows five at most; and it skips a
// UTF-16 byte order mark, which parseTOML refuses with a message that says
// what to do.

// refusedOnPurpose: err is one of those refusals.
func refusedOnPurpose(err *tomlError) bool {
	for _, m := range []string{"is already defined", "a dotted key cannot add to it", "closed where it ends", "not a valid date/time", "more than five quotes", "UTF-16"} {
		if strings.Contains(err.msg, m) {
			return true
		}
	}
	return false
}

// indexLines is parseTOML's line index (nil when src does not parse).
func indexLines(src string) lineIndex {
	_, li, _ := parseTOML(src)
	return li
}

// checkAgrees compares parseTOML with the reference on src.
func checkAgrees(t testing.TB, src string) {
	t.Helper()
	var want map[string]any
	_, refErr := toml.Decode(src, &want)
	got, _, err := parseTOML(src)
	if err != nil && strings.Contains(err.msg, "nested more than") {
		return // our bound, which the reference does not have
	}
	switch {
	case refErr != nil && err == nil:
		t.Fatalf("accepted what the reference refuses (%v)\nsrc: %.2000q", refErr, src)
	case refErr == nil && err != nil && !refusedOnPurpose(err):
		t.Fatalf("refused what the reference accepts: %v\nsrc: %.2000q", err, src)
	case err != nil:
		if err.line < 1 || err.line > strings.Count(src, "\n")+1 || err.msg == "" {
			t.Fatalf("error %+v outside the file", err)
		}
	case err == nil:
		if d := treeDiff("", got, want); d != "" {
			t.Fatalf("tree differs at %s\nsrc: %.2000q", d, src)
		}
	}
}

// treeDiff returns where a and b differ ("" when equal). Floats compare
// bit for bit except NaNs (any NaN with the same sign); times compare
// their instant, zone offset for offset kinds, and wall clock for local ones.
func treeDiff(at string, a, b any) string {
	switch a := a.(type) {
	case map[string]any:
		bm, ok := b.(map[string]any)
		if !ok || len(a) != len(bm) {
			return at + ": " + typeAndLen(a) + " vs " + typeAndLen(b)
		}
		for k, v := range a {
			if d := treeDiff(at+"."+k, v, bm[k]); d != "" {
				return d
			}
		}
		return ""
	case []map[string]any:
		return sliceDiff(at, a, b)
	case []any:
		return sliceDiff(at, a, b)
	case float64:
		bf, ok := b.(float64)
		if ok && (math.Float64bits(a) == math.Float64bits(bf) ||
			math.IsNaN(a) && math.IsNaN(bf) && math.Signbit(a) == math.Signbit(bf)) {
			return ""
		}
	case time.Time:
		bt, ok := b.(time.Time)
		if !ok {
			break
		}
		an, aoff := a.Zone()
		bn, boff := bt.Zone()
		local := strings.HasSuffix(an, "-local")
		if local && an == bn && a.Format(time.DateTime+".999999999") == bt.Format(time.DateTime+".999999999") ||
			!local && !strings.HasSuffix(bn, "-local") && a.Equal(bt) && aoff == boff {
			return ""
		}
	default:
		if reflect.DeepEqual(a, b) {
			return ""
		}
	}
	return at + ": " + typeAndLen(a) + " " + short(a) + " vs " + typeAndLen(b) + " " + short(b)
}

func sliceDiff[T any](at string, a []T, b any) string {
	bs, ok := b.([]T)
	if !ok || len(a) != len(bs) {
		return at + ": " + typeAndLen(a) + " vs " + typeAndLen(b)
	}
	for i := range a {
		if d := treeDiff(at+"["+strconv.Itoa(i)+"]", a[i], bs[i]); d != "" {
			return d
		}
	}
	return ""
}

func typeAndLen(v any) string {
	rv := reflect.ValueOf(v)
	switch rv.Kind() {
	case reflect.Invalid:
		return "nothing"
	case reflect.Map, reflect.Slice:
		return rv.Type().String() + "(" + strconv.Itoa(rv.Len()) + ")"
	}
	return rv.Type().String()
}

func short(v any) string {
	s := strings.TrimSpace(strings.ReplaceAll(strings.ReplaceAll(toString(v), "\n", `\n`), "\r", `\r`))
	return s[:min(len(s), 80)]
}

func toString(v any) string {
	if v == nil {
		return ""
	}
	if t, ok := v.(time.Time); ok {
		return t.Format(time.RFC3339Nano) + " " + t.Location().String()
	}
	return fmt.Sprint(v)
}

// tomlSuite is the toml-test suite (valid and invalid documents) that the
// reference's module carries: the directory of the module in the module
// cache.
func tomlSuite(t *testing.T) string {
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "github.com/BurntSushi/toml").Output()
	if err != nil {
		t.Fatalf("go list -m github.com/BurntSushi/toml: %v", err)
	}
	dir := filepath.Join(strings.TrimSpace(string(out)), "internal", "toml-test", "tests")
	if _, err := os.Stat(dir); err != nil {
		t.Fatalf("toml-test suite: %v", err)
	}
	return dir
}

// notTOML11 are the suite's documents that do not hold for TOML 1.1 (the
// suite's own list for version 1.1.0): TOML 1.0's spec examples, and
// invalid documents that TOML 1.1 made valid.
var notTOML11 = []string{
	"valid/spec-1.0.0/*", "invalid/spec-1.0.0/*",
	"invalid/datetime/no-secs", "invalid/local-time/no-secs", "invalid/local-datetime/no-secs",
	"invalid/string/basic-byte-escapes", "invalid/inline-table/trailing-comma",
	"invalid/inline-table/linebreak-01", "invalid/inline-table/linebreak-02",
	"invalid/inline-table/linebreak-03", "invalid/inline-table/linebreak-04",
}

// TestTOMLSuite: every valid TOML 1.1 document of toml-test parses to the
// reference's tree; every invalid one is refused.
func TestTOMLSuite(t *testing.T) {
	dir := tomlSuite(t)
	counts := map[string]int{}
	err := filepath.WalkDir(dir, func(path string, e os.DirEntry, err error) error {
		if err != nil || e.IsDir() || !strings.HasSuffix(path, ".toml") {
			return err
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, path)
		for _, pat := range notTOML11 {
			if ok, _ := filepath.Match(pat, strings.TrimSuffix(rel, ".toml")); ok {
				return nil
			}
		}
		kind := strings.Split(rel, string(filepath.Separator))[0]
		counts[kind]++
		t.Run(rel, func(t *testing.T) {
			checkAgrees(t, string(data))
			_, _, perr := parseTOML(string(data))
			if kind == "valid" && perr != nil {
				t.Errorf("valid document refused: %v", perr)
			}
			if kind == "invalid" && perr == nil {
				t.Errorf("invalid document accepted")
			}
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if counts["valid"] < 200 || counts["invalid"] < 400 {
		t.Fatalf("suite too small: %v", counts)
	}
}

// FuzzTOML: on any input parseTOML agrees with the reference.
func FuzzTOML(f *testing.F) {
	f.Add(readFile(f, examplePath))
	for _, s := range []string{
		"a = 1\n[b]\nc.d = 'x'\n[[e]]\nf = [1, 2.5, \"s\", {g = true}]\n",
		"t = 1979-05-27T07:32:00.999-08:00\nd = 1979-05-27\nlt = 07:32\nldt = 1979-05-27 07:32:00\n",
		"m = \"\"\"\\\n  a \\\n b\"\"\"\"\"\nl = '''\nx''''\n",
		"n = [0x_1, 0o7, 0b1, 1_000, -0.0, +inf, -nan, 1e-7, 6.626e-34]\n",
		"a = {\n b = 1, # c\n c.d = 2,\n}\n",
		"\"k\\u00e9\" = \"\\x41\\e\\U0001F600\"\n",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, src string) {
		checkAgrees(t, src)
	})
}

// TestTOMLErrors: what a user sees for common mistakes, and on which line.
func TestTOMLErrors(t *testing.T) {
	for _, tc := range []struct {
		src  string
		line int
		msg  string
	}{
		{"a = 1 2\n", 1, `want a new line after the value of "a", found '2'`},
		{"a = \n", 1, `want a value for "a", found the end of the line`},
		{"x = 1\ntransport = tcp\n", 2, `want a value for "transport", found "tcp" (a string needs quotes)`},
		{"a = 1\n\na = 2\n", 3, `key "a" is already defined (line 1)`},
		{"[http]\nx = 1\n[http]\n", 3, `[http]: "http" is already defined (line 1)`},
		{"[[device]\n", 1, `want "]]" after [[device, found ']'`},
		{"a = \"\"\"\\\\\"\"\"\"\"\"\n", 1, `more than five quotes in a row end a multi-line string`},
		{"a = \"x\n", 1, `a string must end on its line; want a closing '"'`},
		{"a = \"\\q\"\n", 1, `unknown escape "\\q" in a string`},
		{"a = \"\\uD800\"\n", 1, `\uD800: want 4 hex digits of a Unicode scalar value`},
		{"a = \"\\u+041\"\n", 1, `\u+041: want 4 hex digits of a Unicode scalar value`},
		{"a = \"\\u_041\"\n", 1, `\u_041: want 4 hex digits of a Unicode scalar value`},
		{"a = 012\n", 1, `"012": not a valid number`},
		{"a = 1__0\n", 1, `"1__0": not a valid number`},
		{"a = 99999999999999999999\n", 1, `"99999999999999999999": out of range`},
		{"a = 1979-02-30\n", 1, `"1979-02-30": not a valid date/time`},
		{"a = [1,\n2\n", 3, `want "," or "]" after an element of the array "a", found the end of the file`},
		{"a = {b = 1 c = 2}\n", 1, `want "," or "}" after the value of "b", found 'c'`},
		{"a = [1,\n", 2, `the array "a" has no "]"`},
		{"a = {b = 1,\n", 2, `an inline table has no "}"`},
		{"a = {b = 1}\n[a.c]\n", 2, `[a.c]: "a" is an inline table, closed where it ends (line 1)`},
		{"[a.b]\n[a]\nb.c = 1\n", 3, `key "b.c": "b" is a table defined elsewhere (line 1); a dotted key cannot add to it`},
		{"a = [1]\n[[a]]\n", 2, `[[a]]: "a" is already defined, not as an array of tables (line 1)`},
		{"# ok\n\x01\n", 2, `want a key, found '\x01'`},
		{"a = 1 # \x7f\n", 1, `control character U+007F in a comment`},
		{"a = 1\r", 1, `want a new line after the value of "a", found the end of the line`},
		{"a = 1\n\xff\n", 2, `the file is not valid UTF-8`},
		{"\xff\xfea = 1\n", 1, `the file starts with a UTF-16 byte order mark: save it as UTF-8`},
	} {
		_, _, err := parseTOML(tc.src)
		if err == nil {
			t.Errorf("%q: no error", tc.src)
			continue
		}
		if err.line != tc.line || err.msg != tc.msg {
			t.Errorf("%q:\ngot  line %d: %s\nwant line %d: %s", tc.src, err.line, err.msg, tc.line, tc.msg)
		}
		checkAgrees(t, tc.src)
	}
}

// TestTOMLNesting: hostile nesting is refused, not a stack overflow.
func TestTOMLNesting(t *testing.T) {
	src := "a = " + strings.Repeat("[", 100000) + strings.Repeat("]", 100000) + "\n"
	if _, _, err := parseTOML(src); err == nil || !strings.Contains(err.msg, "nested more than 64 deep") {
		t.Fatalf("got %v", err)
	}
	ok := "a = " + strings.Repeat("[", maxNesting) + strings.Repeat("]", maxNesting) + "\n"
	if _, _, err := parseTOML(ok); err != nil {
		t.Fatalf("%d deep: %v", maxNesting, err)
	}
}

// TestTreeDiffFindsDifferences: the comparison the reference tests rest on
// can fail.
func TestTreeDiffFindsDifferences(t *testing.T) {
	local := time.Date(1979, 5, 27, 7, 32, 0, 0, localDatetime)
	for _, c := range []struct{ a, b any }{
		{map[string]any{"x": int64(1)}, map[string]any{"y": int64(1)}},
		{map[string]any{"x": []any{int64(1)}}, map[string]any{"x": []any{int64(2)}}},
		{map[string]any{"x": []map[string]any{{}}}, map[string]any{"x": []any{map[string]any{}}}},
		{1.5, 2.5},
		{math.NaN(), math.Copysign(math.NaN(), -1)},
		{local, local.Add(time.Second)},
		{local, time.Date(1979, 5, 27, 7, 32, 0, 0, time.UTC)},
		{"a", "b"},
	} {
		if d := treeDiff("", c.a, c.b); d == "" {
			t.Errorf("no difference found between %v and %v", c.a, c.b)
		}
	}
	same := map[string]any{"x": []any{1.0, math.NaN(), local, "s"}}
	if d := treeDiff("", same, same); d != "" {
		t.Errorf("a tree differs from itself: %s", d)
	}
}
