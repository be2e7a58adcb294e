// Package edge owns acquisition: it turns the configured devices into read
// plans, polls them on schedule over edge/modbus, decodes registers into
// samples, appends each poll's samples to the ring, and keeps per-device
// statistics (stats.Device).
//
// A device whose transport cannot be opened (a missing serial port, an
// unresolvable host, no descriptor left) is down — stats.Device.Down, with
// the reason — and its bus retries the open with a jittered backoff (1 s to
// 30 s); the rest of the gateway starts and polls regardless, at start-up
// and at reload. No poll or write touches a connection that is not open.
//
// It never serves clients, never talks upstream and never encodes JSON:
// samples leave through the Sink interface only.
//
// Concurrency: one goroutine owns each bus — a TCP connection (parallel mode),
// every TCP device (serial mode), one UDP device's request stream, or a serial
// port with all its units — and does every request on it, writes included
// (Write queues them to the bus goroutine, which does them between polls and
// owns the lazy TCP connections UDP devices write over); polls on one bus
// never overlap and never stack. Run owns those goroutines and returns after
// they have exited. Devices, Plan, Healthy and Write are safe to call at any
// time.
package edge
