// Package gateway owns the gateway's assembly: the mapping of a parsed
// config onto each package's Config (mapping.go, upstream.go,
// sparkplug_mapping.go, modbus_server.go, storage*.go: the ring's size by
// rate, the history, web's limits, the queues and pusher, the Sparkplug
// node, the Modbus servers, the data_dir's state), building the pieces in
// order and releasing what was built when one refuses (New), the ring's
// consumers registered in one place (consume), the running parts started
// in order and stopped in reverse (Pieces, RunStages), preflight (what run
// needs beyond a valid file, the same for check and run, with the
// warnings of config_warnings.go), and the reload policy (Reload: an
// invalid file or one without devices is refused and the running config
// stays, the device set is applied at once, removed tags are marked stale,
// other sections are named as needing a restart).
//
// It never parses flags, handles signals, prints a command's output or
// exits: the commands at the root (run, check) and the lab's demo do, and
// call New, Listen, Pieces, RunStages, Reload and Preflight. It imports no
// lab package.
//
// Concurrency: New, Listen, Release and Pieces are called by one goroutine
// before the pieces run; RunStages runs each piece in its own goroutine and
// returns after every one has returned or been given up after its limit;
// Reload is called by one goroutine (run's reload loop) while the pieces
// run, and goes through the scheduler's own Reload.
package gateway
