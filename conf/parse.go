package conf

import (
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"sort"
	"strconv"
	"time"
)

// Load reads the file at path and parses it (see Parse).
func Load(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		msg := err.Error()
		var pe *fs.PathError
		if errors.As(err, &pe) {
			msg = "cannot " + pe.Op + ": " + pe.Err.Error()
		}
		return nil, Errors{{File: path, Msg: msg, err: err}}
	}
	return Parse(path, data)
}

// Parse decodes, resolves and validates a config file; name is used in
// messages only. On any problem it returns (nil, Errors) listing all of them,
// in line order. A TOML syntax error stops the parser, so it is reported alone.
func Parse(name string, data []byte) (*Config, error) {
	raw, lines, synErr := parseTOML(string(data))
	if synErr != nil {
		return nil, Errors{{File: name, Line: synErr.line, Msg: "syntax: " + synErr.msg, err: synErr}}
	}
	d := &decoder{file: name, lines: lines}
	cfg := d.config(raw)
	if len(d.errs) > 0 {
		sort.SliceStable(d.errs, func(i, j int) bool {
			li, lj := d.errs[i].Line, d.errs[j].Line
			if li == 0 || lj == 0 {
				return li != 0 && lj == 0 // known lines first
			}
			return li < lj
		})
		return nil, d.errs
	}
	cfg.File = name
	return cfg, nil
}

// decoder walks the decoded TOML tree against the schema, collecting every
// problem with its line.
type decoder struct {
	file  string
	lines lineIndex
	errs  Errors
}

// where names what a message is about.
type where struct{ profile, device, tag string }

// table is a cursor over one TOML table: it reads keys by type, records which
// were read, and reports the rest as unknown in done.
type table struct {
	d      *decoder
	path   string // position path (see pos.go)
	prefix string // how keys are named in messages: "http." or ""
	m      map[string]any
	used   map[string]bool
	asked  []string // every key the schema looked for, for suggestions
	at     where
}

func (d *decoder) newTable(path, prefix string, m map[string]any, at where) *table {
	if m == nil {
		m = map[string]any{}
	}
	return &table{d: d, path: path, prefix: prefix, m: m, used: map[string]bool{}, at: at}
}

// line is the line of key in t, or of t itself when key is "" or unknown.
func (t *table) line(key string) int {
	if key != "" {
		if l := t.d.lines.line(pathKey(t.path, key)); l > 0 {
			return l
		}
	}
	return t.d.lines.line(t.path)
}

// errf records a problem about key (or the table, for key "").
func (t *table) errf(key, format string, args ...any) {
	t.d.errs = append(t.d.errs, &Error{
		File: t.d.file, Line: t.line(key),
		Profile: t.at.profile, Device: t.at.device, Tag: t.at.tag,
		Msg: fmt.Sprintf(format, args...),
	})
}

func (t *table) name(key string) string { return t.prefix + key }

func (t *table) get(key string) (any, bool) {
	t.asked = append(t.asked, key)
	v, ok := t.m[key]
	if ok {
		t.used[key] = true
	}
	return v, ok
}

func (t *table) has(key string) bool { _, ok := t.m[key]; return ok }

func (t *table) wrongType(key, want string, v any) {
	t.errf(key, "%s: want %s, got %s", t.name(key), want, tomlType(v))
}

func tomlType(v any) string {
	switch v := v.(type) {
	case string:
		return fmt.Sprintf("a string (%q)", v)
	case int64:
		return fmt.Sprintf("an integer (%d)", v)
	case float64:
		return fmt.Sprintf("a float (%g)", v)
	case bool:
		return fmt.Sprintf("a boolean (%t)", v)
	case time.Time:
		return "a date/time"
	case []any, []map[string]any:
		return "an array"
	case map[string]any:
		return "a table"
	}
	return fmt.Sprintf("a %T", v)
}

func (t *table) str(key string) (string, bool) {
	v, ok := t.get(key)
	if !ok {
		return "", false
	}
	s, ok := v.(string)
	if !ok {
		t.wrongType(key, "a string", v)
	}
	return s, ok
}

func (t *table) integer(key string) (int64, bool) {
	v, ok := t.get(key)
	if !ok {
		return 0, false
	}
	n, ok := v.(int64)
	if !ok {
		t.wrongType(key, "an integer", v)
	}
	return n, ok
}

// intIn reads an integer in lo..hi, or def when absent or wrong.
func (t *table) intIn(key string, def, lo, hi int64) int64 {
	n, ok := t.integer(key)
	if !ok {
		return def
	}
	if n < lo || n > hi {
		t.errf(key, "%s %d outside %d..%d", t.name(key), n, lo, hi)
		return def
	}
	return n
}

// float reads a float; integers are accepted ("scale = 1").
func (t *table) float(key string) (float64, bool) {
	v, ok := t.get(key)
	if !ok {
		return 0, false
	}
	switch f := v.(type) {
	case float64:
		if math.IsNaN(f) || math.IsInf(f, 0) {
			t.errf(key, "%s: %g is not a finite number", t.name(key), f)
			return 0, false
		}
		return f, true
	case int64:
		return float64(f), true
	}
	t.wrongType(key, "a number", v)
	return 0, false
}

func (t *table) boolean(key string, def bool) bool {
	v, ok := t.get(key)
	if !ok {
		return def
	}
	b, ok := v.(bool)
	if !ok {
		t.wrongType(key, "a boolean", v)
		return def
	}
	return b
}

func (t *table) duration(key string) (time.Duration, bool) {
	v, ok := t.get(key)
	if !ok {
		return 0, false
	}
	s, ok := v.(string)
	if !ok {
		if n, isInt := v.(int64); isInt {
			t.errf(key, "%s: bad duration %d: write a string with a unit, e.g. \"%dms\" or \"%ds\"", t.name(key), n, n, n)
			return 0, false
		}
		t.wrongType(key, "a duration string such as \"200ms\"", v)
		return 0, false
	}
	var d Duration
	if err := d.UnmarshalText([]byte(s)); err != nil {
		t.errf(key, "%s: %v", t.name(key), err)
		return 0, false
	}
	return time.Duration(d), true
}

// positive reads a duration that must be > 0 (min >= 0 when zeroOK).
func (t *table) positive(key string, def time.Duration, zeroOK bool) time.Duration {
	d, ok := t.duration(key)
	if !ok {
		return def
	}
	if d < 0 || (d == 0 && !zeroOK) {
		want := "> 0"
		if zeroOK {
			want = ">= 0"
		}
		t.errf(key, "%s %v: must be %s", t.name(key), d, want)
		return def
	}
	return d
}

// size reads a byte size > 0.
func (t *table) size(key string, def int64) int64 {
	v, ok := t.get(key)
	if !ok {
		return def
	}
	var sz Size
	switch x := v.(type) {
	case int64:
		sz = Size(x)
	case string:
		if err := sz.UnmarshalText([]byte(x)); err != nil {
			t.errf(key, "%s: %v", t.name(key), err)
			return def
		}
	default:
		t.wrongType(key, "a size such as \"64MiB\" or an integer", v)
		return def
	}
	if sz <= 0 {
		t.errf(key, "%s %d: must be > 0", t.name(key), sz)
		return def
	}
	return int64(sz)
}

func (t *table) strs(key string) []string {
	v, ok := t.get(key)
	if !ok {
		return nil
	}
	arr, ok := v.([]any)
	if !ok {
		t.wrongType(key, "an array of strings", v)
		return nil
	}
	out := make([]string, 0, len(arr))
	for i, e := range arr {
		s, ok := e.(string)
		if !ok {
			t.errf(key, "%s[%d]: want a string, got %s", t.name(key), i, tomlType(e))
			continue
		}
		out = append(out, s)
	}
	return out
}

// sub returns the sub-table key (empty when absent).
func (t *table) sub(key string) *table {
	v, ok := t.get(key)
	m, isMap := v.(map[string]any)
	if ok && !isMap {
		t.wrongType(key, "a table", v)
	}
	return t.d.newTable(pathKey(t.path, key), t.prefix+key+".", m, t.at)
}

// tables returns the array of tables at key, written as [[key]] or as
// key = [ {...}, ... ].
func (t *table) tables(key string) []*table {
	v, ok := t.get(key)
	if !ok {
		return nil
	}
	base := pathKey(t.path, key)
	var out []*table
	switch arr := v.(type) {
	case []map[string]any:
		for i, m := range arr {
			out = append(out, t.d.newTable(pathIndex(base, i), "", m, t.at))
		}
	case []any:
		for i, e := range arr {
			m, ok := e.(map[string]any)
			if !ok {
				t.errf(key, "%s[%d]: want a table, got %s", t.name(key), i, tomlType(e))
				continue
			}
			out = append(out, t.d.newTable(pathIndex(base, i), "", m, t.at))
		}
	default:
		t.wrongType(key, "an array of tables", v)
	}
	return out
}

// done reports every key that was never read as unknown.
func (t *table) done() {
	var unknown []string
	for k := range t.m {
		if !t.used[k] {
			unknown = append(unknown, k)
		}
	}
	sort.Strings(unknown)
	for _, k := range unknown {
		msg := "unknown key " + strconv.Quote(t.name(k))
		if s := t.suggest(k); s != "" {
			msg += " (did you mean " + strconv.Quote(t.name(s)) + "?)"
		}
		t.errf(k, "%s", msg)
	}
}

// suggest returns the known key closest to k (edit distance <= 2), or "".
func (t *table) suggest(k string) string {
	best, bestD := "", 3
	for _, a := range t.asked {
		if d := editDistance(k, a, bestD); d < bestD && !t.used[a] {
			best, bestD = a, d
		}
	}
	return best
}

// editDistance is the Levenshtein distance of a and b, or max when it is at
// least max (keys are short; long inputs stop early).
func editDistance(a, b string, max int) int {
	if len(a) > 64 || len(b) > 64 || len(a)-len(b) >= max || len(b)-len(a) >= max {
		return max
	}
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return min(prev[len(b)], max)
}

// oneOf reads a string that must be one of allowed (def when absent).
func (t *table) oneOf(key, def string, allowed ...string) string {
	s, ok := t.str(key)
	if !ok {
		return def
	}
	for _, a := range allowed {
		if s == a {
			return s
		}
	}
	t.errf(key, "%s %q: want %s", t.name(key), s, orList(allowed))
	return def
}

func orList(xs []string) string {
	switch len(xs) {
	case 0:
		return ""
	case 1:
		return xs[0]
	}
	out := ""
	for i, x := range xs[:len(xs)-1] {
		if i > 0 {
			out += ", "
		}
		out += x
	}
	return out + " or " + xs[len(xs)-1]
}
