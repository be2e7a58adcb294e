// Package edge owns acquisition: it turns the configured devices into read
// plans, polls them on schedule over edge/modbus, decodes registers into
// samples, appends each poll's samples to the ring, and keeps per-device
// statistics (stats.Device).
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
