package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"

	"edgegw/conf"
)

// cmdCheck validates a config file and prints what the gateway would do
// with it: the device/tag table and the read requests of every poll. It
// takes run's steps up to the listeners: the file (conf), what run needs
// beyond it (preflight: the files it names), then every piece run builds
// (newGateway: the queue, the sequence, the history, the scheduler, the
// pusher, the Sparkplug node, the web server, each from the Config mapped
// from the file), without opening a listener, a device or anything under
// data_dir. So it fails when run would refuse to start, with run's
// message, and warns about what run starts without (a data_dir it cannot
// write, a missing serial port). What only the running machine can refuse
// is not seen: the listen address taken or not allowed.
func cmdCheck(args []string, out io.Writer) error {
	fs := flag.NewFlagSet("check", flag.ContinueOnError)
	path := fs.String("config", "", "config file to validate (required)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *path == "" {
		fs.Usage()
		return errors.New("-config is required")
	}
	c, err := conf.Load(*path)
	if err != nil {
		printConfErrors(os.Stderr, err)
		return errInvalidConfig
	}
	if errs, warns := preflight(c); !printPreflight(os.Stderr, errs, warns) {
		return errInvalidConfig
	}
	// Warnings the pieces log as they are built (run logs them too).
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	g, err := newGateway(c, log, true)
	if err != nil {
		return err
	}
	defer g.release()
	sched := g.sched
	c.WriteTable(out)
	c.WriteModbusServers(out)
	fmt.Fprintln(out, "\nread plan (one poll of each device):")
	plan := sched.Plan()
	for _, d := range c.Devices {
		for _, r := range plan[d.Name] {
			fmt.Fprintf(out, "  %-24s %s\n", d.Name, r)
		}
	}
	fmt.Fprintln(out, "\nbuses (each one goroutine doing its requests one at a time; #n: the n-th connection to an endpoint):")
	for _, b := range sched.Buses() {
		pause := ""
		if b.Pause > 0 {
			pause = fmt.Sprintf(" (pause %v)", b.Pause)
		}
		fmt.Fprintf(out, "  %-32s %s%s\n", b.Name, strings.Join(b.Devices, ", "), pause)
	}
	fmt.Fprintf(out, "\n%s: ok (%d devices)\n", *path, len(c.Devices))
	return nil
}

// printConfErrors prints one problem a line.
func printConfErrors(w io.Writer, err error) {
	var es conf.Errors
	if errors.As(err, &es) {
		for _, e := range es {
			fmt.Fprintln(w, e)
		}
		fmt.Fprintf(w, "%d problem(s)\n", len(es))
		return
	}
	fmt.Fprintln(w, err)
}
