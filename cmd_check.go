package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"edgegw/conf"
)

// cmdCheck validates a config file and prints what the gateway would do
// with it: the device/tag table and the read requests of every poll. It
// also checks what run needs (preflight): it fails exactly when run would
// refuse to start, and warns about what run starts without (a missing
// serial port).
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
	sched, err := newScheduler(c, nil, nil, nil)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return errInvalidConfig
	}
	if errs, warns := preflight(c); !printPreflight(os.Stderr, errs, warns) {
		return errInvalidConfig
	}
	c.WriteTable(out)
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
