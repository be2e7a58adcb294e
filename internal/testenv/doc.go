// Package testenv owns what tests need from this machine: external tools
// (socat, mosquitto, pymodbus, mbpoll, chromium, also driven over DevTools),
// real pty pairs and a real mosquitto broker on a random loopback port.
//
// It is imported by _test.go files only and never by the binary.
//
// Concurrency: every helper ties the processes it starts to t.Cleanup,
// which stops them and waits for them.
package testenv
