package conf

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// The config file's TOML parser: TOML 1.1 (inline tables may span lines and
// end with a comma, \e and \xHH escapes, seconds optional in a time). It
// builds the tree the rest of conf walks and records, as it goes, the line
// of every key (see lineIndex in pos.go). The tree holds:
//
//	string, int64, float64, bool
//	time.Time         a date/time (local kinds in the zones below)
//	[]any             an array
//	map[string]any    a table
//	[]map[string]any  an array of tables, [[name]]
//
// Why our own: the parser we used before (BurntSushi/toml) decoded through
// reflection and made up 120 KB of the armv7 binary, for one read of a small
// file at start and reload; and it kept key positions private, so a second
// scanner found the lines. It stays as the reference our tests compare with
// (toml_test.go: the toml-test suite and a fuzz target).

// The zones of the local (offset-less) date/time kinds.
var (
	localDatetime = time.FixedZone("datetime-local", 0)
	localDate     = time.FixedZone("date-local", 0)
	localTime     = time.FixedZone("time-local", 0)
)

// maxNesting bounds arrays and inline tables inside one another: hostile
// input cannot exhaust the stack.
const maxNesting = 64

// tomlError is a syntax error: the first one stops the parser.
type tomlError struct {
	line int
	msg  string
}

func (e *tomlError) Error() string { return "line " + strconv.Itoa(e.line) + ": " + e.msg }

// tableKind says how a table came to be, which decides what may add to it.
type tableKind uint8

const (
	tableImplicit tableKind = iota // a parent named in a header: a of [a.b]; [a] may still define it
	tableHeader                    // defined by [header] or an element of [[header]]
	tableDotted                    // made by a dotted key: a of a.b = 1; only more dotted keys add to it
	tableInline                    // { ... }: closed where it ends
)

// ttable and tarray are the parser's tables; tree turns them into maps.
type ttable struct {
	kind tableKind
	path string
	m    map[string]any // values; tables as *ttable, arrays of tables as *tarray
}

type tarray struct {
	elems []*ttable
}

func newTTable(kind tableKind, path string) *ttable {
	return &ttable{kind: kind, path: path, m: map[string]any{}}
}

type tomlParser struct {
	s     string
	i     int
	line  int
	depth int
	lines lineIndex
	root  *ttable
}

// parseTOML parses src: the tree and the line of every key path, or the
// first syntax error.
func parseTOML(src string) (tree map[string]any, lines lineIndex, err *tomlError) {
	p := &tomlParser{s: src, line: 1, lines: lineIndex{}, root: newTTable(tableHeader, "")}
	if strings.HasPrefix(src, "\xff\xfe") || strings.HasPrefix(src, "\xfe\xff") {
		return nil, nil, &tomlError{line: 1, msg: "the file starts with a UTF-16 byte order mark: save it as UTF-8"}
	}
	if !utf8.ValidString(src) {
		bad := 0
		for bad < len(src) {
			r, n := utf8.DecodeRuneInString(src[bad:])
			if r == utf8.RuneError && n == 1 {
				break
			}
			bad += n
		}
		return nil, nil, &tomlError{line: 1 + strings.Count(src[:bad], "\n"), msg: "the file is not valid UTF-8"}
	}
	p.i = len(src) - len(strings.TrimPrefix(src, "\ufeff"))
	defer func() {
		if r := recover(); r != nil {
			te, ok := r.(*tomlError)
			if !ok {
				panic(r)
			}
			tree, lines, err = nil, nil, te
		}
	}()
	p.document()
	return p.root.tree(), p.lines, nil
}

// fail stops the parser with a syntax error on the current line; parseTOML
// recovers it (the errorf of text/template's parser, for the same reason: a
// syntax error ends the parse from any depth).
func (p *tomlParser) fail(format string, args ...any) {
	panic(&tomlError{line: p.line, msg: fmt.Sprintf(format, args...)})
}

func (p *tomlParser) eof() bool { return p.i >= len(p.s) }

func (p *tomlParser) peek(off int) byte {
	if p.i+off < len(p.s) {
		return p.s[p.i+off]
	}
	return 0
}

// found names what is at the cursor, for messages.
func (p *tomlParser) found() string {
	if p.eof() {
		return "the end of the file"
	}
	switch p.s[p.i] {
	case '\n', '\r':
		return "the end of the line"
	case '#':
		return "a comment"
	}
	r, _ := utf8.DecodeRuneInString(p.s[p.i:])
	return strconv.QuoteRune(r)
}

// isControl: the characters TOML allows nowhere raw (tab is allowed).
func isControl(c byte) bool { return (c < 0x20 && c != '\t') || c == 0x7f }

func isBareKeyChar(c byte) bool {
	return c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_' || c == '-'
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

// newline consumes "\n" or "\r\n" at the cursor, if there.
func (p *tomlParser) newline() bool {
	switch {
	case p.peek(0) == '\n':
		p.i++
	case p.peek(0) == '\r' && p.peek(1) == '\n':
		p.i += 2
	default:
		return false
	}
	p.line++
	return true
}

// skipSpace skips blanks; with lines, newlines and comments too.
func (p *tomlParser) skipSpace(lines bool) {
	for !p.eof() {
		switch c := p.s[p.i]; {
		case c == ' ' || c == '\t':
			p.i++
		case !lines:
			return
		case c == '#':
			p.comment()
		case c == '\n' || c == '\r':
			if !p.newline() {
				p.fail("a carriage return must be followed by a line feed")
			}
		default:
			return
		}
	}
}

// comment skips a comment up to its end of line.
func (p *tomlParser) comment() {
	for p.i++; !p.eof(); p.i++ {
		c := p.s[p.i]
		if c == '\n' || c == '\r' && p.peek(1) == '\n' {
			return
		}
		if isControl(c) {
			p.fail("control character %U in a comment", rune(c))
		}
	}
}

// endOfLine: after a key/value pair or a header only blanks and a comment
// may follow on the line; after names what came before, in the message.
// (Messages are made only when they are needed: a config with thousands
// of keys builds none.)
func (p *tomlParser) endOfLine(after func() string) {
	p.skipSpace(false)
	if p.peek(0) == '#' {
		p.comment()
	}
	if !p.eof() && !p.newline() {
		p.fail("want a new line after %s, found %s", after(), p.found())
	}
}

func (p *tomlParser) document() {
	cur := p.root
	for {
		p.skipSpace(true)
		if p.eof() {
			return
		}
		if p.s[p.i] == '[' {
			var name string
			cur, name = p.header()
			p.endOfLine(func() string { return name })
			continue
		}
		keys := p.keyValue(cur)
		p.endOfLine(func() string { return valueOf(keys) })
	}
}

// valueOf names the value of keys in messages.
func valueOf(keys []string) string { return "the value of " + strconv.Quote(dotted(keys)) }

// dotted writes keys as a dotted key, for messages.
func dotted(keys []string) string {
	var b strings.Builder
	for n, k := range keys {
		if n > 0 {
			b.WriteByte('.')
		}
		bare := k != ""
		for i := 0; i < len(k) && bare; i++ {
			bare = isBareKeyChar(k[i])
		}
		if bare {
			b.WriteString(k)
		} else {
			b.WriteString(strconv.Quote(k))
		}
	}
	return b.String()
}

// key reads a key, possibly dotted and quoted.
func (p *tomlParser) key() []string {
	var keys []string
	for {
		p.skipSpace(false)
		keys = append(keys, p.simpleKey())
		p.skipSpace(false)
		if p.peek(0) != '.' {
			return keys
		}
		p.i++
	}
}

func (p *tomlParser) simpleKey() string {
	switch {
	case strings.HasPrefix(p.s[p.i:], `"""`), strings.HasPrefix(p.s[p.i:], `'''`):
		p.fail("a key cannot be a multi-line string")
	case p.peek(0) == '"':
		return p.quoted('"')
	case p.peek(0) == '\'':
		return p.quoted('\'')
	}
	start := p.i
	for !p.eof() && isBareKeyChar(p.s[p.i]) {
		p.i++
	}
	if p.i == start {
		p.fail("want a key, found %s", p.found())
	}
	return p.s[start:p.i]
}

// header reads [a.b] or [[a.b]] and returns the table it opens.
func (p *tomlParser) header() (*ttable, string) {
	line := p.line
	p.i++
	array := p.peek(0) == '['
	if array {
		p.i++
	}
	keys := p.key()
	name := "[" + dotted(keys) + "]"
	if array {
		name = "[" + name + "]"
		if p.peek(0) != ']' || p.peek(1) != ']' {
			p.fail("want \"]]\" after %s, found %s", strings.TrimSuffix(name, "]]"), p.found())
		}
		p.i += 2
	} else {
		if p.peek(0) != ']' {
			p.fail("want \"]\" after %s, found %s", strings.TrimSuffix(name, "]"), p.found())
		}
		p.i++
	}
	cur := p.descend(p.root, keys, true, line, name)
	last := keys[len(keys)-1]
	path := pathKey(cur.path, last)
	if !array {
		switch v := cur.m[last].(type) {
		case nil:
			t := newTTable(tableHeader, path)
			cur.m[last] = t
			p.lines.set(path, line)
			return t, name
		case *ttable:
			if v.kind == tableImplicit {
				v.kind = tableHeader
				p.lines.set(path, line)
				return v, name
			}
		}
		p.fail("%s: %q is already defined%s", name, dotted(keys), p.at(path))
	}
	arr, ok := cur.m[last].(*tarray)
	if !ok {
		if cur.m[last] != nil {
			p.fail("%s: %q is already defined, not as an array of tables%s", name, dotted(keys), p.at(path))
		}
		arr = &tarray{}
		cur.m[last] = arr
		p.lines.setIfAbsent(path, line)
	}
	t := newTTable(tableHeader, pathIndex(path, len(arr.elems)))
	arr.elems = append(arr.elems, t)
	p.lines.set(t.path, line)
	return t, name
}

// descend walks from cur to the table that holds the last of keys, making
// the missing ones. A header (name "[a.b]") makes implicit tables and may
// pass through any table but an inline one, and into the last element of
// an array of tables; a dotted key (name "": messages say `key "a.b"`)
// makes dotted tables and passes through those only.
func (p *tomlParser) descend(cur *ttable, keys []string, header bool, line int, name string) *ttable {
	kind := tableDotted
	if header {
		kind = tableImplicit
	}
	for n, k := range keys[:len(keys)-1] {
		path := pathKey(cur.path, k)
		switch v := cur.m[k].(type) {
		case nil:
			t := newTTable(kind, path)
			cur.m[k] = t
			p.lines.setIfAbsent(path, line)
			cur = t
			continue
		case *ttable:
			if header && v.kind == tableInline {
				p.fail("%s: %q is an inline table, closed where it ends%s", who(name, keys), dotted(keys[:n+1]), p.at(path))
			}
			if !header && v.kind != tableDotted {
				p.fail("%s: %q is a table defined elsewhere%s; a dotted key cannot add to it", who(name, keys), dotted(keys[:n+1]), p.at(path))
			}
			cur = v
			continue
		case *tarray:
			if header {
				cur = v.elems[len(v.elems)-1]
				continue
			}
		}
		p.fail("%s: %q is already defined%s", who(name, keys), dotted(keys[:n+1]), p.at(path))
	}
	return cur
}

// who names descend's walk in messages: the header, or `key "a.b"`.
func who(name string, keys []string) string {
	if name != "" {
		return name
	}
	return "key " + strconv.Quote(dotted(keys))
}

// at names the line where path was defined, when known.
func (p *tomlParser) at(path string) string {
	if l := p.lines.line(path); l > 0 {
		return " (line " + strconv.Itoa(l) + ")"
	}
	return ""
}

// keyValue reads `key = value` into t and returns the key.
func (p *tomlParser) keyValue(t *ttable) []string {
	line := p.line
	keys := p.key()
	if p.peek(0) != '=' {
		p.fail("want \"=\" after the key %q, found %s", dotted(keys), p.found())
	}
	p.i++
	p.skipSpace(false)
	cur := p.descend(t, keys, false, line, "")
	last := keys[len(keys)-1]
	path := pathKey(cur.path, last)
	if _, dup := cur.m[last]; dup {
		p.fail("key %q is already defined%s", dotted(keys), p.at(path))
	}
	p.lines.set(path, line)
	cur.m[last] = p.value(path, keys)
	return keys
}

// value reads one value; path is where it lives, keys names it in messages.
func (p *tomlParser) value(path string, keys []string) any {
	switch {
	case strings.HasPrefix(p.s[p.i:], `"""`):
		return p.multiline('"')
	case strings.HasPrefix(p.s[p.i:], `'''`):
		return p.multiline('\'')
	case p.peek(0) == '"':
		return p.quoted('"')
	case p.peek(0) == '\'':
		return p.quoted('\'')
	case p.peek(0) == '[':
		return p.array(path, keys)
	case p.peek(0) == '{':
		return p.inlineTable(path)
	case strings.HasPrefix(p.s[p.i:], "true"):
		p.i += 4
		return true
	case strings.HasPrefix(p.s[p.i:], "false"):
		p.i += 5
		return false
	}
	tok := p.token()
	if tok == "" {
		p.fail("want a value for %q, found %s", dotted(keys), p.found())
	}
	if c := tok[0] | 0x20; c >= 'a' && c <= 'z' && tok != "inf" && tok != "nan" {
		p.fail("want a value for %q, found %q (a string needs quotes)", dotted(keys), tok)
	}
	if isDatePrefix(tok) || isTimePrefix(tok) {
		t, ok := parseDatetime(tok)
		if !ok {
			p.fail("%q: not a valid date/time", tok)
		}
		return t
	}
	return p.number(tok)
}

// token reads the characters a number or a date/time is made of; a date
// and a time may be separated by one space.
func (p *tomlParser) token() string {
	start := p.i
	p.scanToken()
	if p.i-start == 10 && isDatePrefix(p.s[start:p.i]) && p.peek(0) == ' ' &&
		isDigit(p.peek(1)) && isDigit(p.peek(2)) && p.peek(3) == ':' {
		p.i++
		p.scanToken()
	}
	return p.s[start:p.i]
}

func (p *tomlParser) scanToken() {
	for !p.eof() {
		c := p.s[p.i]
		if !isBareKeyChar(c) && c != '+' && c != '.' && c != ':' {
			return
		}
		p.i++
	}
}

// list reads the items of an array or an inline table up to close:
// newlines and comments anywhere (TOML 1.1 in inline tables too), a comma
// after each item, the last one optional. item reads one item; what names
// the list (item false) or its last item (true) in messages.
func (p *tomlParser) list(close byte, item func(), what func(item bool) string) {
	if p.depth++; p.depth > maxNesting {
		p.fail("arrays and inline tables nested more than %d deep", maxNesting)
	}
	p.i++ // [ or {
	for {
		p.skipSpace(true)
		if p.peek(0) == close {
			break
		}
		if p.eof() {
			p.fail("%s has no %q", what(false), string(close))
		}
		item()
		p.skipSpace(true)
		if p.peek(0) == close {
			break
		}
		if p.peek(0) != ',' {
			p.fail("want \",\" or %q after %s, found %s", string(close), what(true), p.found())
		}
		p.i++
	}
	p.i++
	p.depth--
}

func (p *tomlParser) array(path string, keys []string) []any {
	out := []any{}
	p.list(']', func() {
		elem := pathIndex(path, len(out))
		p.lines.set(elem, p.line)
		out = append(out, p.value(elem, keys))
	}, func(item bool) string {
		name := "the array " + strconv.Quote(dotted(keys))
		if item {
			return "an element of " + name
		}
		return name
	})
	return out
}

func (p *tomlParser) inlineTable(path string) *ttable {
	t := newTTable(tableInline, path)
	var last []string
	p.list('}', func() { last = p.keyValue(t) }, func(item bool) string {
		if item {
			return valueOf(last)
		}
		return "an inline table"
	})
	return t
}

// quoted reads a one-line string: "basic" (q '"', with escapes) or
// 'literal' (q is the apostrophe).
func (p *tomlParser) quoted(q byte) string {
	p.i++
	start := p.i
	var b *strings.Builder
	for {
		if p.eof() || p.s[p.i] == '\n' || p.s[p.i] == '\r' {
			p.fail("a string must end on its line; want a closing %q", q)
		}
		switch c := p.s[p.i]; {
		case c == q:
			p.i++
			if b == nil {
				return p.s[start : p.i-1]
			}
			return b.String()
		case c == '\\' && q == '"':
			if b == nil {
				b = &strings.Builder{}
				b.WriteString(p.s[start:p.i])
			}
			p.escape(b)
		case isControl(c):
			p.fail("control character %U in a string", rune(c))
		default:
			if b != nil {
				b.WriteByte(c)
			}
			p.i++
		}
	}
}

// escape decodes the escape at the cursor into b.
func (p *tomlParser) escape(b *strings.Builder) {
	p.i++ // backslash
	c := p.peek(0)
	p.i++
	switch c {
	case 'b':
		b.WriteByte('\b')
	case 't':
		b.WriteByte('\t')
	case 'n':
		b.WriteByte('\n')
	case 'f':
		b.WriteByte('\f')
	case 'r':
		b.WriteByte('\r')
	case 'e':
		b.WriteByte(0x1b)
	case '"', '\\':
		b.WriteByte(c)
	case 'x', 'u', 'U':
		n := map[byte]int{'x': 2, 'u': 4, 'U': 8}[c]
		hex := p.s[p.i:min(p.i+n, len(p.s))]
		v, err := strconv.ParseUint(hex, 16, 32)
		if len(hex) < n || err != nil || !utf8.ValidRune(rune(v)) {
			p.i--
			p.fail("\\%c%s: want %d hex digits of a Unicode scalar value", c, hex, n)
		}
		b.WriteRune(rune(v))
		p.i += n
	default:
		p.i--
		p.fail("unknown escape %s in a string", strconv.Quote("\\"+string(rune(c))))
	}
}

// multiline reads a """basic""" (q '"') or ”'literal”' string. A newline
// right after the opening quotes is not part of it; up to two quotes may
// come before the closing three.
func (p *tomlParser) multiline(q byte) string {
	p.i += 3
	p.newline()
	var b strings.Builder
	for {
		if p.eof() {
			p.fail("a multi-line string has no closing %s", strings.Repeat(string(q), 3))
		}
		c := p.s[p.i]
		switch {
		case c == q:
			run := 0
			for p.peek(run) == q {
				run++
			}
			if run >= 3 {
				if run > 5 {
					p.fail("more than five quotes in a row end a multi-line string")
				}
				b.WriteString(strings.Repeat(string(q), run-3))
				p.i += run
				return b.String()
			}
			b.WriteString(p.s[p.i : p.i+run])
			p.i += run
		case c == '\n' || c == '\r':
			start := p.i
			if !p.newline() {
				p.fail("a carriage return must be followed by a line feed")
			}
			b.WriteString(p.s[start:p.i])
		case c == '\\' && q == '"':
			if p.lineEndingBackslash() {
				continue
			}
			p.escape(&b)
		case isControl(c):
			p.fail("control character %U in a string", rune(c))
		default:
			b.WriteByte(c)
			p.i++
		}
	}
}

// lineEndingBackslash skips a backslash that ends its line, with the blanks
// and newlines after it, and reports whether it did.
func (p *tomlParser) lineEndingBackslash() bool {
	j := p.i + 1
	for j < len(p.s) && (p.s[j] == ' ' || p.s[j] == '\t') {
		j++
	}
	if j < len(p.s) && p.s[j] != '\n' && !(p.s[j] == '\r' && j+1 < len(p.s) && p.s[j+1] == '\n') {
		return false
	}
	p.i = j
	for !p.eof() {
		switch c := p.s[p.i]; {
		case c == ' ' || c == '\t':
			p.i++
		case c == '\n' || c == '\r':
			if !p.newline() {
				p.fail("a carriage return must be followed by a line feed")
			}
		default:
			return true
		}
	}
	return true
}

// number parses an integer or a float.
func (p *tomlParser) number(tok string) any {
	switch tok {
	case "inf", "+inf":
		return math.Inf(1)
	case "-inf":
		return math.Inf(-1)
	case "nan", "+nan":
		return math.NaN()
	case "-nan":
		return math.Copysign(math.NaN(), -1)
	}
	if len(tok) > 2 && tok[0] == '0' && (tok[1] == 'x' || tok[1] == 'o' || tok[1] == 'b') {
		base := map[byte]int{'x': 16, 'o': 8, 'b': 2}[tok[1]]
		digits := tok[2:]
		if !underscoresOK(digits, base) {
			p.fail("%q: not a valid integer", tok)
		}
		n, err := strconv.ParseUint(strings.ReplaceAll(digits, "_", ""), base, 63)
		if err != nil {
			p.failNumber(tok, err)
		}
		return int64(n)
	}
	// [+-] int [. frac] [e[+-] exp]
	s := strings.TrimLeft(tok[:min(1, len(tok))], "+-") + tok[1:]
	intEnd := strings.IndexAny(s, ".eE")
	if intEnd < 0 {
		intEnd = len(s)
	}
	intPart, rest := s[:intEnd], s[intEnd:]
	ok := underscoresOK(intPart, 10) && (intPart == "0" || intPart[0] != '0')
	float := rest != ""
	if strings.HasPrefix(rest, ".") {
		fracEnd := strings.IndexAny(rest, "eE")
		if fracEnd < 0 {
			fracEnd = len(rest)
		}
		ok = ok && underscoresOK(rest[1:fracEnd], 10)
		rest = rest[fracEnd:]
	}
	if rest != "" {
		exp := strings.TrimLeft(rest[1:min(2, len(rest))], "+-") + rest[min(2, len(rest)):]
		ok = ok && underscoresOK(exp, 10)
	}
	if !ok {
		p.fail("%q: not a valid number", tok)
	}
	clean := strings.ReplaceAll(tok, "_", "")
	if float {
		f, err := strconv.ParseFloat(clean, 64)
		if err != nil {
			p.failNumber(tok, err)
		}
		return f
	}
	n, err := strconv.ParseInt(clean, 10, 64)
	if err != nil {
		p.failNumber(tok, err)
	}
	return n
}

func (p *tomlParser) failNumber(tok string, err error) {
	if ne, ok := err.(*strconv.NumError); ok && ne.Err == strconv.ErrRange {
		p.fail("%q: out of range", tok)
	}
	p.fail("%q: not a valid number", tok)
}

// underscoresOK: s is one or more digits of base, an underscore only
// between two of them.
func underscoresOK(s string, base int) bool {
	if s == "" {
		return false
	}
	prevDigit := false
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c == '_' {
			if !prevDigit {
				return false
			}
			prevDigit = false
			continue
		}
		var v int
		switch {
		case c >= '0' && c <= '9':
			v = int(c - '0')
		case c >= 'a' && c <= 'f':
			v = int(c-'a') + 10
		case c >= 'A' && c <= 'F':
			v = int(c-'A') + 10
		default:
			return false
		}
		if v >= base {
			return false
		}
		prevDigit = true
	}
	return prevDigit
}

// digits parses s as exactly len(s) decimal digits.
func digits(s string) (int, bool) {
	n := 0
	for i := 0; i < len(s); i++ {
		if !isDigit(s[i]) {
			return 0, false
		}
		n = n*10 + int(s[i]-'0')
	}
	return n, s != ""
}

func isDatePrefix(s string) bool {
	_, y := digits(s[:min(4, len(s))])
	return y && len(s) >= 10 && s[4] == '-' && s[7] == '-'
}

func isTimePrefix(s string) bool {
	_, h := digits(s[:min(2, len(s))])
	return h && len(s) >= 5 && s[2] == ':'
}

// parseDatetime parses a TOML date/time: an offset date-time, a local
// date-time, a local date or a local time.
func parseDatetime(s string) (time.Time, bool) {
	year, month, day := 0, 1, 1
	zone := localTime
	if isDatePrefix(s) {
		var ok1, ok2, ok3 bool
		year, ok1 = digits(s[:4])
		month, ok2 = digits(s[5:7])
		day, ok3 = digits(s[8:10])
		if !ok1 || !ok2 || !ok3 || month < 1 || month > 12 || day < 1 ||
			day > time.Date(year, time.Month(month)+1, 0, 0, 0, 0, 0, time.UTC).Day() {
			return time.Time{}, false
		}
		if len(s) == 10 {
			return time.Date(year, time.Month(month), day, 0, 0, 0, 0, localDate), true
		}
		if c := s[10]; c != 'T' && c != 't' && c != ' ' {
			return time.Time{}, false
		}
		s = s[11:]
		zone = localDatetime
	}
	if !isTimePrefix(s) {
		return time.Time{}, false
	}
	hour, _ := digits(s[:2])
	minute, ok := digits(s[3:5])
	sec, nsec := 0, 0
	s = s[5:]
	if ok && strings.HasPrefix(s, ":") {
		sec, ok = digits(s[1:min(3, len(s))])
		ok = ok && len(s) >= 3
		s = s[min(3, len(s)):]
		if ok && strings.HasPrefix(s, ".") {
			end := 1
			for end < len(s) && isDigit(s[end]) {
				end++
			}
			frac := s[1:end] + "000000000"
			nsec, _ = digits(frac[:9])
			ok = end > 1
			s = s[end:]
		}
	}
	if !ok || hour > 23 || minute > 59 || sec > 59 {
		return time.Time{}, false
	}
	if s != "" {
		if zone != localDatetime {
			return time.Time{}, false // a time alone has no offset
		}
		switch {
		case s == "Z" || s == "z":
			zone = time.UTC
		case len(s) == 6 && (s[0] == '+' || s[0] == '-') && s[3] == ':':
			oh, ok1 := digits(s[1:3])
			om, ok2 := digits(s[4:6])
			if !ok1 || !ok2 || oh > 23 || om > 59 {
				return time.Time{}, false
			}
			off := (oh*60 + om) * 60
			if s[0] == '-' {
				off = -off
			}
			zone = time.FixedZone("", off)
		default:
			return time.Time{}, false
		}
	}
	return time.Date(year, time.Month(month), day, hour, minute, sec, nsec, zone), true
}

// tree turns the parser's tables into maps.
func (t *ttable) tree() map[string]any {
	m := make(map[string]any, len(t.m))
	for k, v := range t.m {
		m[k] = treeValue(v)
	}
	return m
}

func treeValue(v any) any {
	switch v := v.(type) {
	case *ttable:
		return v.tree()
	case *tarray:
		out := make([]map[string]any, len(v.elems))
		for i, e := range v.elems {
			out[i] = e.tree()
		}
		return out
	case []any:
		for i, e := range v {
			v[i] = treeValue(e)
		}
	}
	return v
}
