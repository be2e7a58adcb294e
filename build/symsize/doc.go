// Command symsize prints the packages of a Go ELF binary (built without -s)
// that take the most file bytes, by summing the sizes of their symbols in
// allocated sections that occupy the file (text, rodata, data); zero-filled
// sections (bss, noptrbss) are reported as one separate total, since they
// cost address space, not flash. make size uses it so growth is visible.
//
// It never modifies or runs the binary it reads and needs no tool besides
// the Go standard library (no binutils on the build machine).
//
// Concurrency: none; one pass over the symbol table.
package main
