// Package sdnotify owns the gateway's side of systemd's service protocol:
// the watchdog loop that pings only while the gateway's own health check
// passes, and the RELOADING state with MONOTONIC_USEC. The protocol itself
// (the $NOTIFY_SOCKET datagram, $WATCHDOG_USEC and $WATCHDOG_PID) is
// go-systemd's daemon package.
//
// It never links libsystemd and never fails the service outside systemd:
// without $NOTIFY_SOCKET every Notify is a no-op that reports false.
//
// Concurrency: Notify is safe for concurrent use (each send dials its own
// socket). New starts nothing; Watchdog.Run is the only goroutine-owning
// call, it pings until its context ends and returns only then.
package sdnotify
