// Package demo owns the lab's commands that the root's lab.go registers:
// `edgegw demo` (simulated loggers, a gateway polling them through
// internal/gateway, and with -upstream the reference receiver and an
// embedded MQTT broker, all on loopback, from a generated config: Config),
// `edgegw sim` (simulated loggers alone, with the fault knobs) and
// `edgegw receive` (package receiver's Main).
//
// It is never in the gateway binary: the release build (-tags nolab)
// leaves out lab.go, the only importer. It never opens anything but
// loopback sockets and the files its flags name.
//
// Concurrency: each command runs its pieces through gateway.RunStages and
// returns after all of them have stopped.
package demo
