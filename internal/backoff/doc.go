// Package backoff owns what must slow down when something keeps failing:
// the delay before the next retry (Delay: exponential with jitter, reset on
// success; Gate: a Delay with the time before which no attempt may be made)
// and the log lines about it (Log: a keyed throttle that counts what it
// leaves out; State: one line when a state changes, a repeat count at most
// once per interval while it stays). The gateway's retry delays and log
// throttles are these: push's reconnects and logs, spool's disk writes and
// store reads, Sparkplug's reconnects and logs, web's and history's logs,
// edge's reopening of transports and edge/modbus's redials and reopens. The one retry that is
// not is the demotion of a device that does not answer (edge's scheduler):
// it skips whole poll windows, doubling, so that its polls stay on the
// device's clock.
//
// It never sleeps, starts no goroutine and never decides whether to retry:
// callers keep their loops. It imports nothing of the project.
//
// Concurrency: Log and State are safe for concurrent use (one mutex each;
// the log call happens outside it). Delay and Gate are owned by one
// goroutine (or used under their owner's lock).
package backoff
