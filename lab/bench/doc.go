// Package bench owns the measurement stand behind `edgegw bench acquire` and
// `edgegw bench deliver`: simulated loggers and delivery clients as load
// generators, the gateway under test in a child process (the same binary
// re-executed with `bench child ROLE`; with -before also an earlier edgegw
// binary's, beside it in the same run) so its CPU and RSS are its own, the
// optional peers (Debian's mosquitto, Telegraf's modbus input), and the
// reports: a table, JSON, Markdown and SVG line charts. `edgegw bench soak`
// runs the real gateway instead (`edgegw run -config FILE`, this binary or
// -gateway) against loggers, a reference receiver (receiver.Receiver, in this
// process), a slow WebSocket client and request floods on a schedule, and
// samples the gateway's /proc entries and API. `edgegw bench acquire -full`
// runs the gateway build that ships (built here with build/gateway.flags, or
// -gateway) as `edgegw run` with a default config against the loggers, beside
// Telegraf, and reads its /proc entries, /api/devices and -pprof profiles. `edgegw bench ingest` runs
// receivers (`bench child receiver`: package receiver's Main) storing into
// a PostgreSQL database given by URL, fed by synthetic gateways speaking
// the wire protocol, and times psql's \copy of as many rows beside them.
//
// It never runs inside the gateway (edge, web and push never import it),
// never downloads or builds a peer, and talks only to loopback.
//
// Concurrency: RunAcquire, RunDeliver, RunSoak and RunIngest own every goroutine and
// process they start (fleets, clients, children, peers, the gateway, the
// receiver, the soak's event goroutines) and return after all of them have
// exited; each client goroutine owns its own counters and histogram, which
// are merged only after it has exited. A child serves one command at a time
// on its stdin/stdout.
package bench
