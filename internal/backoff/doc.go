// Package backoff owns what must slow down when something keeps failing:
// the delay before the next retry (Delay: exponential with jitter, reset on
// success) and the log lines about it (Log: a keyed throttle that counts
// what it leaves out; State: one line when a state changes, a repeat count
// at most once per interval while it stays).
//
// It never sleeps, starts no goroutine and never decides whether to retry:
// callers keep their loops. (edge/modbus keeps its own poll backoff.)
//
// Concurrency: Log and State are safe for concurrent use (one mutex each;
// the log call happens outside it). Delay is owned by one goroutine.
package backoff
