package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"strings"

	"edgegw/conf"
	"edgegw/edge"
	"edgegw/internal/cli"
	"edgegw/internal/gateway"
	"edgegw/ringstore"
)

// cmdCheck validates a config file and prints what the gateway would do
// with it: the device/tag table and the read requests of every poll. It
// takes run's steps up to the listeners: the file (conf), what run needs
// beyond it (gateway.Preflight: the files it names), then every piece run builds
// (gateway.New: the queue, the sequence, the history, the scheduler, the
// pusher, the Sparkplug node, the web server, each from the Config mapped
// from the file), without opening a listener, a device or anything under
// data_dir. So it fails when run would refuse to start, with run's
// message, and warns about what run starts without (a data_dir it cannot
// write, a missing serial port) and what the file asks for that cannot
// work as written (internal/gateway's configWarnings: retries that cannot fit the interval,
// writable tags with no write path, empty token files). What only the
// running machine can refuse is not seen: the listen address taken or not
// allowed. With -poll it then polls every device (or -device NAME) once
// through that scheduler, as run polls (checkPoll), and fails naming the
// devices that did not answer well.
func cmdCheck(args []string, out io.Writer) error {
	fs := flag.NewFlagSet("check", flag.ContinueOnError)
	path := fs.String("config", "", "config file to validate (required)")
	poll := fs.Bool("poll", false, "after validation, poll every device once (as run does) and print each tag's value and quality; exit 1 if a device fails")
	only := fs.String("device", "", "with -poll: poll this device only")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *path == "" {
		fs.Usage()
		return errors.New("-config is required")
	}
	c, err := conf.Load(*path)
	if err != nil {
		cli.PrintConfErrors(os.Stderr, err)
		return cli.ErrInvalidConfig
	}
	if errs, warns := gateway.Preflight(c); !gateway.PrintPreflight(os.Stderr, errs, warns) {
		return cli.ErrInvalidConfig
	}
	// Warnings the pieces log as they are built (run logs them too).
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	g, err := gateway.New(c, log, true)
	if err != nil {
		return err
	}
	defer g.Release()
	sched := g.Scheduler()
	c.WriteTable(out)
	c.WriteModbusServers(out)
	fmt.Fprintln(out, "\nread plan (one poll of each device; a device with tags at several intervals: the polls of each):")
	plan, rates := sched.Plan(), sched.RatePlans()
	for _, d := range c.Devices {
		if rs := rates[d.Name]; rs != nil {
			for _, rp := range rs {
				for _, r := range rp.Reads {
					fmt.Fprintf(out, "  %-24s every %-6v %s\n", d.Name, rp.Every, r)
				}
			}
			continue
		}
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
	if *poll {
		return checkPoll(sched, c, *only, out)
	}
	return nil
}

// checkPoll polls every device (or only) once through the scheduler check
// built, as run polls it, and prints what came back: each tag's value, unit
// and quality, each device's round trip, the reason of each failure. It
// fails naming the devices that did not poll good.
func checkPoll(sched *edge.Scheduler, c *conf.Config, only string, out io.Writer) error {
	if only != "" && !slices.ContainsFunc(c.Devices, func(d conf.Device) bool { return d.Name == only }) {
		return fmt.Errorf("-device %q: no such device in %s", only, c.File)
	}
	fmt.Fprintln(out, "\npoll (each device once, as run polls it):")
	ctx, stop := cli.SignalContext()
	defer stop()
	res, err := sched.PollOnce(ctx, only)
	if err != nil {
		return err
	}
	var failed []string
	for _, r := range res {
		state := "good"
		switch {
		case r.Down:
			state = "DOWN: " + r.Reason
		case !r.Good:
			state = "FAILED: " + r.Reason
		}
		rtt := "-"
		if r.RTT > 0 {
			rtt = fmtRTT(r.RTT)
		}
		fmt.Fprintf(out, "  %-24s rtt %-9s %s\n", r.Device, rtt, state)
		if !r.Good {
			failed = append(failed, r.Device)
		}
		for _, t := range r.Tags {
			fmt.Fprintf(out, "      %-24s %16s %-6s %s\n", t.Name, sampleValue(t.Sample), t.Unit, t.Sample.Quality)
		}
	}
	if len(failed) > 0 {
		return fmt.Errorf("poll failed: %s", strings.Join(failed, ", "))
	}
	fmt.Fprintf(out, "poll: ok (%d devices)\n", len(res))
	return nil
}

// sampleValue is a sample's value as the page shows it ("-" when not good).
func sampleValue(s ringstore.Sample) string {
	switch {
	case s.Quality != ringstore.Good:
		return "-"
	case s.Kind == ringstore.KindString && s.Text != nil:
		return strconv.Quote(*s.Text)
	case s.Bool:
		return strconv.FormatBool(s.Value != 0)
	case s.Kind == ringstore.KindFloat32:
		return strconv.FormatFloat(s.Value, 'g', -1, 32)
	}
	return strconv.FormatFloat(s.Value, 'g', -1, 64)
}
