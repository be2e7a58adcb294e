// Package edge owns acquisition: it turns the configured devices into read
// plans, polls them on schedule over edge/modbus, decodes registers into
// samples (every type tagtype names: the vocabulary is tagtype's, the
// decoding this package's), appends each poll's samples to the ring, and
// keeps per-device statistics (stats.Device). A tag may have an interval of
// its own, a multiple of its device's: each poll reads the tags due at it,
// coalesced together (plan.go), and a slow tag is read once in each window
// of its own interval, at the first poll inside it. Report by exception
// (deadband, deadband_percent, max_silence: keep in device.go) is applied
// here, when a poll's samples are made: a sample left out reaches no output.
//
// A device whose transport cannot be opened (a missing serial port, an
// unresolvable host, no descriptor left) is down — stats.Device.Down, with
// the reason — and its bus retries the open with a jittered backoff (1 s to
// 30 s); the rest of the gateway starts and polls regardless, at start-up
// and at reload. No poll or write touches a connection that is not open.
//
// Outside a running Scheduler, PollOnce polls every device once through
// the same transports and poll code (edgegw check -poll), and a ProbeBus
// opens one device's transport for one-off reads and identification
// (edgegw read and scan).
//
// It never serves clients, never talks upstream and never encodes JSON:
// samples leave through the Sink interface only.
//
// Concurrency: one goroutine owns each TCP or serial bus — a connection to a
// TCP, RTU-over-TCP or ASCII-over-TCP endpoint with every device (unit) dealt to it
// (parallel mode; an endpoint has MaxConnections of them), every TCP device
// (serial mode), or a serial port (RTU or ASCII) with all its units — and does every
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
