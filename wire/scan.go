package wire

// Scanner follows JSON text through its strings and its nesting, a chunk at
// a time, without decoding it: what a parser needs to bound a frame (how
// deep it nests, how many elements it lists) before paying for a decode.
// It does not validate; feed it text a decoder will check anyway. The zero
// value is at the top level. It is the one JSON scanner of the project:
// the receiver counts a batch's samples with it, the local write API bounds
// a body's nesting with it.
type Scanner struct {
	Depth   int // arrays and objects open at the end of what was scanned
	Deepest int // the deepest nesting seen

	commas           int // commas at depth 1
	inStr, esc, seen bool
}

// Scan reads the next chunk of the text.
func (s *Scanner) Scan(p []byte) {
	depth, deepest, inStr, esc, seen, commas := s.Depth, s.Deepest, s.inStr, s.esc, s.seen, s.commas
	for _, c := range p {
		if inStr {
			switch {
			case esc:
				esc = false
			case c == '\\':
				esc = true
			case c == '"':
				inStr = false
			}
			continue
		}
		switch c {
		case ' ', '\t', '\n', '\r':
			continue
		case '"':
			inStr = true
		case '[', '{':
			depth++
			deepest = max(deepest, depth)
			if depth == 1 {
				continue
			}
		case ']', '}':
			depth--
			continue
		case ',':
			if depth == 1 {
				commas++
			}
			continue
		}
		if depth >= 1 {
			seen = true // something inside the outermost array or object
		}
	}
	s.Depth, s.Deepest, s.inStr, s.esc, s.seen, s.commas = depth, deepest, inStr, esc, seen, commas
}

// Elements is the number of elements of the outermost array (members of
// the outermost object) scanned so far: its commas plus one, or 0 when it
// holds nothing.
func (s *Scanner) Elements() int {
	if !s.seen {
		return 0
	}
	return s.commas + 1
}

// CountElements counts the elements of a JSON array (0 for an empty one,
// or for a scalar) without decoding them.
func CountElements(data []byte) int {
	var s Scanner
	s.Scan(data)
	return s.Elements()
}
