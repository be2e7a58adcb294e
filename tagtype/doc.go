// Package tagtype is the one vocabulary of tag types: which types exist,
// their config names and aliases, the registers each occupies, the byte
// orders and register kinds each may use, the kind of value it yields
// (number, bool, text), whether it can be written, its raw range, and its
// Sparkplug 3.0 datatype. conf validates with it, edge plans and decodes
// with it, sparkplug births and commands with it.
//
// It never decodes a register, does I/O or keeps state: it is tables and
// pure functions, imports only the standard library, and is safe for
// concurrent use.
package tagtype
