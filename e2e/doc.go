// Package e2e holds the end-to-end tests: each drives the edgegw binary
// (built once by TestMain from the repository's root, which is also the
// tests' working directory) as a process against real peers (simulated
// loggers, pymodbus, mosquitto, chromium, the reference receiver) on
// loopback, and asserts what its commands print, what it serves, stores
// and sends.
//
// It has no code but its tests and is imported by nothing.
//
// Concurrency: every process a test starts is killed at the test's
// cleanup; goleak checks, after the run, that no goroutine of the tests
// outlived it.
package e2e
