// Package sdnotify owns the systemd service-manager protocol (sd_notify)
// without cgo: it writes state datagrams ("READY=1", "WATCHDOG=1", …) to the
// unix datagram socket named by $NOTIFY_SOCKET (a path, or "@name" for the
// abstract namespace) and reads the watchdog period from $WATCHDOG_USEC and
// $WATCHDOG_PID.
//
// It never links libsystemd, never changes the environment and never fails
// the service outside systemd: without $NOTIFY_SOCKET every call is a no-op
// that reports false.
//
// Concurrency: Notify and the package functions are safe for concurrent use
// (each send dials its own socket). New starts nothing; Watchdog.Run is the
// only goroutine-owning call, it pings until its context ends and returns
// only then.
package sdnotify
