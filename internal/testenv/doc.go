// Package testenv owns what tests need from this machine and share across
// packages: external tools (socat, mosquitto, pymodbus, mbpoll, chromium,
// also driven over DevTools), real pty pairs and a real mosquitto broker on
// a random loopback port, the processes a test runs (Proc: the built
// edgegw, edgegw-receiver, haproxy), allocation-free Modbus devices
// (FastModbusUDP, FastModbusTCP), and the bounded waits (WaitFor, Recv,
// Closed, RunUntilEnd, Running).
//
// It is imported by _test.go files only and never by the binary, and it
// imports none of the project's packages.
//
// Concurrency: every helper ties the processes and goroutines it starts to
// t.Cleanup, which stops them and waits for them.
package testenv
