package conf

import (
	"strconv"
	"strings"
	"unicode/utf8"
)

// segSep joins the segments of a path; quoted keys that contain it (or "[")
// get no path at all, so they can never alias another key.
const segSep = "\x1f"

// noPath marks a path that cannot be named; lines never holds it.
const noPath = "\x00"

func pathKey(parent, key string) string {
	if parent == noPath || strings.ContainsAny(key, segSep+"[\x00") {
		return noPath
	}
	if parent == "" {
		return key
	}
	return parent + segSep + key
}

func pathIndex(parent string, i int) string {
	if parent == noPath {
		return noPath
	}
	return parent + "[" + strconv.Itoa(i) + "]"
}

// lineIndex maps a path to the 1-based line that defines it.
type lineIndex map[string]int

func (li lineIndex) line(path string) int {
	if path == noPath {
		return 0
	}
	return li[path]
}

type lineScanner struct {
	s      string
	i      int
	line   int
	lines  lineIndex
	arrays map[string]int // array-of-tables path → elements seen so far
	depth  int
}

// maxNesting bounds recursion on hostile input (the TOML parser has its own
// limits; this keeps the scanner safe on its own).
const maxNesting = 64

// indexLines scans TOML text (already accepted by the parser) for key lines.
//
// Why a hand-written scanner: BurntSushi/toml v1.6 keeps key positions
// private (MetaData has no exported position of a key) and keys them by the
// dotted key alone, so every [[device]] would share one entry anyway. The
// line numbers in config errors come from this scanner instead: it records,
// for every key path, the line where it is defined. Paths name array
// elements by index, so
//
//	device[3]              the fourth [[device]] header
//	device[3].tags[1]      its second tag: the "{" of an inline table or a [[device.tags]] header
//	device[3].tags[1].bit  the line of that key
//
// (with segSep in place of the dots). When the scanner meets anything it does
// not understand it stops: a path it has not seen has line 0 ("unknown"),
// never a wrong line.
func indexLines(src string) lineIndex {
	sc := &lineScanner{s: src, line: 1, lines: lineIndex{}, arrays: map[string]int{}}
	sc.top()
	return sc.lines
}

func (sc *lineScanner) eof() bool { return sc.i >= len(sc.s) }

func (sc *lineScanner) peek(off int) byte {
	if sc.i+off < len(sc.s) {
		return sc.s[sc.i+off]
	}
	return 0
}

// skipSpace skips blanks and, if nl, newlines and comments too.
func (sc *lineScanner) skipSpace(nl bool) {
	for !sc.eof() {
		switch c := sc.s[sc.i]; {
		case c == ' ' || c == '\t':
			sc.i++
		case c == '\r' && nl:
			sc.i++
		case c == '\n' && nl:
			sc.i++
			sc.line++
		case c == '#' && nl:
			for !sc.eof() && sc.s[sc.i] != '\n' {
				sc.i++
			}
		default:
			return
		}
	}
}

func (sc *lineScanner) setIfAbsent(path string, line int) {
	if path == noPath {
		return
	}
	if _, ok := sc.lines[path]; !ok {
		sc.lines[path] = line
	}
}

func (sc *lineScanner) set(path string, line int) {
	if path != noPath {
		sc.lines[path] = line
	}
}

// top scans the document: headers and key/value lines.
func (sc *lineScanner) top() {
	table := ""
	for {
		sc.skipSpace(true)
		if sc.eof() {
			return
		}
		line := sc.line
		if sc.s[sc.i] == '[' {
			array := sc.peek(1) == '['
			sc.i++
			if array {
				sc.i++
			}
			keys, ok := sc.key()
			if !ok || len(keys) == 0 {
				return
			}
			sc.skipSpace(false)
			if sc.peek(0) != ']' || (array && sc.peek(1) != ']') {
				return
			}
			sc.i++
			if array {
				sc.i++
			}
			cur := ""
			for n, k := range keys {
				cur = pathKey(cur, k)
				if n == len(keys)-1 {
					break
				}
				sc.setIfAbsent(cur, line)
				if c, ok := sc.arrays[cur]; ok {
					cur = pathIndex(cur, c-1)
				}
			}
			if array {
				sc.setIfAbsent(cur, line)
				n := sc.arrays[cur]
				sc.arrays[cur] = n + 1
				cur = pathIndex(cur, n)
			}
			sc.set(cur, line)
			table = cur
			continue
		}
		if !sc.keyValue(table) {
			return
		}
	}
}

// keyValue scans `a.b = value` inside table and records the lines.
func (sc *lineScanner) keyValue(table string) bool {
	line := sc.line
	keys, ok := sc.key()
	if !ok || len(keys) == 0 {
		return false
	}
	sc.skipSpace(false)
	if sc.peek(0) != '=' {
		return false
	}
	sc.i++
	sc.skipSpace(false)
	cur := table
	for n, k := range keys {
		cur = pathKey(cur, k)
		if n < len(keys)-1 {
			sc.setIfAbsent(cur, line)
		}
	}
	sc.set(cur, line)
	return sc.value(cur)
}

// key scans a possibly dotted, possibly quoted key.
func (sc *lineScanner) key() ([]string, bool) {
	var keys []string
	for {
		sc.skipSpace(false)
		if sc.eof() {
			return nil, false
		}
		var k string
		switch sc.s[sc.i] {
		case '"':
			raw, ok := sc.basicString()
			if !ok {
				return nil, false
			}
			k = unescapeBasic(raw)
		case '\'':
			raw, ok := sc.literalString()
			if !ok {
				return nil, false
			}
			k = raw
		default:
			start := sc.i
			for !sc.eof() && !strings.ContainsRune(" \t\r\n=.[]\"'#,{}", rune(sc.s[sc.i])) {
				sc.i++
			}
			if sc.i == start {
				return nil, false
			}
			k = sc.s[start:sc.i]
		}
		keys = append(keys, k)
		sc.skipSpace(false)
		if sc.peek(0) != '.' {
			return keys, true
		}
		sc.i++
	}
}

// value scans one value; path is where it lives.
func (sc *lineScanner) value(path string) bool {
	if sc.eof() {
		return false
	}
	switch sc.s[sc.i] {
	case '"':
		if strings.HasPrefix(sc.s[sc.i:], `"""`) {
			return sc.multiline('"')
		}
		_, ok := sc.basicString()
		return ok
	case '\'':
		if strings.HasPrefix(sc.s[sc.i:], `'''`) {
			return sc.multiline('\'')
		}
		_, ok := sc.literalString()
		return ok
	case '[':
		return sc.nested(func() bool { return sc.array(path) })
	case '{':
		return sc.nested(func() bool { return sc.inlineTable(path) })
	}
	for !sc.eof() && !strings.ContainsRune(",]}#\r\n", rune(sc.s[sc.i])) {
		sc.i++
	}
	return true
}

func (sc *lineScanner) nested(f func() bool) bool {
	if sc.depth >= maxNesting {
		return false
	}
	sc.depth++
	ok := f()
	sc.depth--
	return ok
}

func (sc *lineScanner) array(path string) bool {
	sc.i++ // [
	for n := 0; ; n++ {
		sc.skipSpace(true)
		if sc.eof() {
			return false
		}
		if sc.s[sc.i] == ']' {
			sc.i++
			return true
		}
		elem := pathIndex(path, n)
		sc.set(elem, sc.line)
		if !sc.value(elem) {
			return false
		}
		sc.skipSpace(true)
		switch sc.peek(0) {
		case ',':
			sc.i++
		case ']':
			sc.i++
			return true
		default:
			return false
		}
	}
}

// inlineTable scans { k = v, ... }; TOML 1.1 (accepted by BurntSushi v1.6)
// allows newlines, comments and a trailing comma inside.
func (sc *lineScanner) inlineTable(path string) bool {
	sc.i++ // {
	for {
		sc.skipSpace(true)
		if sc.eof() {
			return false
		}
		if sc.s[sc.i] == '}' {
			sc.i++
			return true
		}
		if !sc.keyValue(path) {
			return false
		}
		sc.skipSpace(true)
		switch sc.peek(0) {
		case ',':
			sc.i++
		case '}':
			sc.i++
			return true
		default:
			return false
		}
	}
}

// basicString scans "..." and returns the raw text between the quotes.
func (sc *lineScanner) basicString() (string, bool) {
	sc.i++
	start := sc.i
	for !sc.eof() {
		switch sc.s[sc.i] {
		case '\\':
			sc.i += 2
		case '"':
			raw := sc.s[start:sc.i]
			sc.i++
			return raw, true
		case '\n':
			return "", false
		default:
			sc.i++
		}
	}
	return "", false
}

func (sc *lineScanner) literalString() (string, bool) {
	sc.i++
	start := sc.i
	for !sc.eof() {
		switch sc.s[sc.i] {
		case '\'':
			raw := sc.s[start:sc.i]
			sc.i++
			return raw, true
		case '\n':
			return "", false
		default:
			sc.i++
		}
	}
	return "", false
}

// multiline scans a multi-line basic or literal string (triple quotes); up
// to two extra quote characters may come before the closing three.
func (sc *lineScanner) multiline(q byte) bool {
	sc.i += 3
	for !sc.eof() {
		c := sc.s[sc.i]
		switch {
		case c == '\\' && q == '"':
			sc.i++
			if sc.peek(0) == '\n' {
				sc.line++
			}
			sc.i++
		case c == '\n':
			sc.line++
			sc.i++
		case c == q && sc.peek(1) == q && sc.peek(2) == q:
			sc.i += 3
			for extra := 0; extra < 2 && sc.peek(0) == q; extra++ {
				sc.i++
			}
			return true
		default:
			sc.i++
		}
	}
	return false
}

// unescapeBasic decodes the escapes of a TOML basic string (TOML 1.1 adds \e
// and \xHH). Malformed escapes are kept as written: the parser has already
// rejected them, this only has to name keys.
func unescapeBasic(raw string) string {
	if !strings.Contains(raw, `\`) {
		return raw
	}
	var b strings.Builder
	for i := 0; i < len(raw); i++ {
		c := raw[i]
		if c != '\\' || i+1 >= len(raw) {
			b.WriteByte(c)
			continue
		}
		i++
		switch e := raw[i]; e {
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
			b.WriteByte(e)
		case 'x', 'u', 'U':
			n := map[byte]int{'x': 2, 'u': 4, 'U': 8}[e]
			if i+1+n > len(raw) {
				b.WriteByte('\\')
				b.WriteByte(e)
				continue
			}
			v, err := strconv.ParseUint(raw[i+1:i+1+n], 16, 32)
			if err != nil || !utf8.ValidRune(rune(v)) {
				b.WriteByte('\\')
				b.WriteByte(e)
				continue
			}
			b.WriteRune(rune(v))
			i += n
		default:
			b.WriteByte('\\')
			b.WriteByte(e)
		}
	}
	return b.String()
}
