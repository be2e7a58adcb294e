//go:build !nolab

package main

import (
	"os"

	"edgegw/lab/bench"
	"edgegw/lab/demo"
)

// The lab: simulated loggers, the demo, the reference receiver and the
// measurement stand. None of it runs on a gateway; the release gateway
// binary is built with -tags nolab and leaves these files out (make size
// holds it to its budget), and make release ships the full build beside it
// as edgegw-lab.
func init() {
	labUsage = `
lab (not in the release gateway binary; shipped as edgegw-lab):
  edgegw demo    [-devices 48] [-http 127.0.0.1:8080]
                                           simulated loggers + gateway + page, all on loopback
  edgegw sim     -devices N -transport tcp|udp|rtu …   simulated loggers alone
  edgegw receive -listen ADDR -out FILE.jsonl          reference upstream receiver
  edgegw bench   acquire|deliver|soak …                the measurement stand and the soak (docs/BENCHMARKS.md)
`
	labCommands["demo"] = demo.Demo
	labCommands["sim"] = demo.Sim
	labCommands["receive"] = demo.Receive
	labCommands["bench"] = func(args []string) error { return bench.Main(args, os.Stdout) }
}
