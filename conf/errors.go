package conf

import (
	"strconv"
	"strings"
)

// Error is one problem in a config file. It prints as
//
//	conf: edgegw.toml:42: device "logger-07": tag "humidity": address 70000 > 65535
//
// File is omitted when empty, Line when 0 (unknown), Profile/Device/Tag when
// the problem is not about one.
type Error struct {
	File    string
	Line    int
	Profile string // set for problems inside a [[profile]]
	Device  string
	Tag     string
	Msg     string

	err error // the cause, when there is one (a failed read)
}

// Unwrap returns the cause (for errors.Is(err, fs.ErrNotExist)), or nil.
func (e *Error) Unwrap() error { return e.err }

func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString("conf: ")
	if e.File != "" {
		b.WriteString(e.File)
		if e.Line > 0 {
			b.WriteByte(':')
			b.WriteString(strconv.Itoa(e.Line))
		}
		b.WriteString(": ")
	} else if e.Line > 0 {
		b.WriteString("line ")
		b.WriteString(strconv.Itoa(e.Line))
		b.WriteString(": ")
	}
	if e.Profile != "" {
		b.WriteString("profile ")
		b.WriteString(strconv.Quote(e.Profile))
		b.WriteString(": ")
	}
	if e.Device != "" {
		b.WriteString("device ")
		b.WriteString(strconv.Quote(e.Device))
		b.WriteString(": ")
	}
	if e.Tag != "" {
		b.WriteString("tag ")
		b.WriteString(strconv.Quote(e.Tag))
		b.WriteString(": ")
	}
	b.WriteString(e.Msg)
	return b.String()
}

// Errors is every problem found in one file, in line order. It is the only
// error type Load and Parse return for a file that was read.
type Errors []*Error

// Error prints one line per problem.
func (es Errors) Error() string {
	var b strings.Builder
	for i, e := range es {
		if i > 0 {
			b.WriteByte('\n')
		}
		b.WriteString(e.Error())
	}
	return b.String()
}

// Unwrap lets errors.As find the individual *Error values.
func (es Errors) Unwrap() []error {
	out := make([]error, len(es))
	for i, e := range es {
		out[i] = e
	}
	return out
}
