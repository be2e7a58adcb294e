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
// Concurrency: one goroutine owns each TCP or RTU bus — a connection to a
// TCP or RTU-over-TCP endpoint with every device (unit) dealt to it
// (parallel mode; an endpoint has MaxConnections of them), every TCP device
// (serial mode), or a serial port with all its units — and does every
// request on it, with the endpoint's pause between them, writes included
// (Write queues them to the bus goroutine, which does them between polls,
// and so does Pass with the requests of a Modbus server passing through:
// passthrough.go says how they interleave with the polls);
// these goroutines have no timer each: one clock (clock.go) wakes every bus
// due within RoundWindow with one timer event. Every UDP device is polled
// by one goroutine, the UDP round (round.go): one request per device in
// flight, the requests of all devices due together sent as one batch, the
// round woken once per batch by the socket's reader; a UDP device's writes
// (over the lazy TCP connection the round owns for it) and the reopening of
// a UDP device that is down run aside, on a goroutine the round owns,
// while that device is left out of rounds. Polls of one device never
// overlap and never stack. Run owns those goroutines and returns after
// they have exited. Devices, Plan, Healthy and Write are safe to call at
// any time.
package edge
