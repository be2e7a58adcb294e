// Command edgegw is the gateway: see README.md. main parses the flags and
// runs the subcommand: run assembles the gateway (the config mapped onto
// each package's Config, the preflight checks, the pieces started in order
// and stopped in reverse order, reloads), check, read, scan,
// hash-password and version are the field's tools, and the lab's commands
// exist only in builds without -tags nolab.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"runtime"
	"syscall"
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
	case errors.Is(err, errInvalidConfig):
		os.Exit(1) // already printed
	case err != nil:
		fmt.Fprintf(os.Stderr, "edgegw %s: %v\n", cmd, err)
		os.Exit(1)
	}
}

var errInvalidConfig = errors.New("invalid config")

// logFlags adds -log-format and -log-level to fs; the returned function
// builds the logger after parsing.
func logFlags(fs *flag.FlagSet) func(w io.Writer) (*slog.Logger, error) {
	format := fs.String("log-format", "text", "log format on stderr: text (journald-friendly) or json")
	level := fs.String("log-level", "info", "debug, info, warn or error")
	return func(w io.Writer) (*slog.Logger, error) {
		var lv slog.Level
		if err := lv.UnmarshalText([]byte(*level)); err != nil {
			return nil, fmt.Errorf("-log-level: %w", err)
		}
		opts := &slog.HandlerOptions{Level: lv}
		switch *format {
		case "text":
			return slog.New(slog.NewTextHandler(w, opts)), nil
		case "json":
			return slog.New(slog.NewJSONHandler(w, opts)), nil
		}
		return nil, fmt.Errorf("-log-format %q is not text or json", *format)
	}
}

// signalContext is cancelled by SIGINT or SIGTERM.
func signalContext() (context.Context, context.CancelFunc) {
	return signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
}
