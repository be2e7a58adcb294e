package conf

import (
	"strconv"
	"strings"
)

// Key paths: the parser (toml.go) records, for every key path, the line
// where it is defined, and config errors name that line. Paths name array
// elements by index, so
//
//	device[3]              the fourth [[device]] header
//	device[3].tags[1]      its second tag: the "{" of an inline table or a [[device.tags]] header
//	device[3].tags[1].bit  the line of that key
//
// (with segSep in place of the dots). A path the parser has not recorded has
// line 0 ("unknown"), never a wrong line.

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

// set records path's line; setIfAbsent only the first one (a parent table
// named by several headers is where it first appears).
func (li lineIndex) set(path string, line int) {
	if path != noPath {
		li[path] = line
	}
}

func (li lineIndex) setIfAbsent(path string, line int) {
	if _, ok := li[path]; !ok && path != noPath {
		li[path] = line
	}
}
