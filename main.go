// Command edgegw is the gateway: see README.md. The files of package main
// are the commands: they parse flags, dispatch, handle signals and print.
// run has internal/gateway assemble the gateway (the config mapped onto
// each package's Config, the preflight checks, the pieces started in order
// and stopped in reverse order, the reload policy); check, read, scan,
// hash-password and version are the field's tools; the lab's commands
// (lab.go, left out by -tags nolab) are lab/demo's and lab/bench's.
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"runtime"

	"edgegw/internal/cli"
	"edgegw/internal/gateway"
)

// Stamped by the Makefile (-X main.version=… etc.).
var (
	version = "dev"
	commit  = "unknown"
	date    = "unknown"
)

const usage = `edgegw: a Modbus edge gateway (TCP, UDP, RTU, ASCII) with local delivery and lossless upstream

usage:
  edgegw run     -config FILE              the gateway
  edgegw check   -config FILE [-poll [-device NAME]]
                                           validate a config, print devices, tags and read plan;
                                           -poll: poll every device once and print its values
  edgegw read    -transport T -address A [-unit N] holding|input|coil|discrete START COUNT
                                           one read of one device, every type and byte order
  edgegw scan    -transport T -address A [-baud 9600,19200 -parity N,E] [-units 1-247]
                                           find the units that answer, identify them, print [[device]]s
  edgegw hash-password < password          hash for [http] basic_auth_hash_file
  edgegw version
`

// labUsage lists the lab's commands; lab.go sets it (and fills labCommands)
// unless the binary is built with -tags nolab, as the release gateway is.
var labUsage = `
The lab (demo, sim, receive, bench) is not in this build: it ships as edgegw-lab.
`

// labCommands are the lab's subcommands by name, filled by lab.go.
var labCommands = map[string]func(args []string) error{}

const usageTail = `
Run "edgegw COMMAND -h" for the flags of one command.
`

func main() {
	if len(os.Args) < 2 {
		fmt.Fprint(os.Stderr, usage+labUsage+usageTail)
		os.Exit(2)
	}
	cmd, args := os.Args[1], os.Args[2:]
	gateway.SetVersion(version)
	gateway.SetVersion(version)
	var err error
	switch cmd {
	case "run":
		err = cmdRun(args)
	case "check":
		err = cmdCheck(args, os.Stdout)
	case "read":
		err = cmdRead(args, os.Stdout)
	case "scan":
		err = cmdScan(args, os.Stdout)
	case "hash-password":
		err = cmdHashPassword(args)
	case "version", "-version", "--version":
		fmt.Printf("edgegw %s (commit %s, built %s, %s %s/%s)\n", version, commit, date, runtime.Version(), runtime.GOOS, runtime.GOARCH)
	case "help", "-h", "-help", "--help":
		fmt.Print(usage + labUsage + usageTail)
	default:
		lab, ok := labCommands[cmd]
		if !ok {
			fmt.Fprintf(os.Stderr, "edgegw: unknown command %q\n\n%s", cmd, usage+labUsage+usageTail)
			os.Exit(2)
		}
		err = lab(args)
	}
	switch {
	case errors.Is(err, flag.ErrHelp):
		os.Exit(2)
	case errors.Is(err, cli.ErrInvalidConfig):
		os.Exit(1) // already printed
	case err != nil:
		fmt.Fprintf(os.Stderr, "edgegw %s: %v\n", cmd, err)
		os.Exit(1)
	}
}
