// Package cli owns what the commands of the edgegw binary share, the
// gateway's (run, check, at the root) and the lab's (demo, sim, receive, in
// lab/demo): the -log-format/-log-level flags and the logger they build,
// the context that SIGINT or SIGTERM cancels, the printing of a config's
// problems one a line, and ErrInvalidConfig, the error after which main
// exits 1 without printing more.
//
// It never parses a config, builds a piece of the gateway or exits.
//
// Concurrency: LogFlags' result is called once, after the flags are parsed;
// the rest holds no state.
package cli
