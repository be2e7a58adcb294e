package bench

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"
)

const usage = `usage:
  edgegw bench acquire [flags]   poll simulated loggers: tcp-serial, tcp-parallel, udp (+ telegraf)
  edgegw bench deliver [flags]   serve clients: short polling, long polling, websocket (+ mosquitto)
  edgegw bench soak [flags]      the real gateway for -duration (30m) under field events: restarts,
                                 reloads, uplink cuts, a slow WebSocket client, request floods
  edgegw bench ingest [flags]    gateways -> receivers -> PostgreSQL (-postgres URL), beside psql \copy
Run "edgegw bench acquire -h" (deliver, soak, ingest) for the flags.
`

// Main runs `edgegw bench ARGS…` (args after "bench"): it parses flags,
// runs the bench until done or SIGINT/SIGTERM, prints the table to stdout
// and writes -json, -markdown (appended) and -svg files. main.go calls it.
func Main(args []string, stdout io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(os.Stderr, usage)
		return flag.ErrHelp
	}
	switch args[0] {
	case "acquire":
		return mainAcquire(args[1:], stdout)
	case "deliver":
		return mainDeliver(args[1:], stdout)
	case "soak":
		return mainSoak(args[1:], stdout)
	case "ingest":
		return mainIngest(args[1:], stdout)
	case "child":
		if len(args) < 2 {
			return errors.New("bench: child: missing role")
		}
		if args[1] == roleReceiver {
			return childReceiver(args[2:])
		}
		return RunChild(args[1], os.Stdin, stdout)
	case "-h", "-help", "--help", "help":
		fmt.Fprint(stdout, usage)
		return nil
	}
	return fmt.Errorf("bench: unknown bench %q (acquire, deliver, soak or ingest)", args[0])
}

// RunChild runs one child role of the stand on the given pipes.
func RunChild(role string, in io.Reader, out io.Writer) error {
	switch role {
	case roleAcquire:
		return childAcquire(in, out)
	case roleDeliver:
		return childDeliver(in, out)
	}
	return fmt.Errorf("bench: unknown child role %q", role)
}

type outputs struct {
	json, markdown, svg *string
	quiet               *bool
}

func outputFlags(fs *flag.FlagSet, svg bool) outputs {
	o := outputs{
		json:     fs.String("json", "", "write the report as JSON to this file"),
		markdown: fs.String("markdown", "", "append the tables as Markdown to this file"),
		quiet:    fs.Bool("quiet", false, "no progress on stderr"),
	}
	if svg {
		o.svg = fs.String("svg", "", "write the charts (SVG) into this directory")
	}
	return o
}

func (o outputs) logger() *slog.Logger {
	if *o.quiet {
		return nil
	}
	return slog.New(slog.NewTextHandler(os.Stderr, nil))
}

func appendMarkdown(path string, write func(io.Writer)) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return fmt.Errorf("bench: markdown: %w", err)
	}
	write(f)
	if err := f.Close(); err != nil {
		return fmt.Errorf("bench: markdown: %w", err)
	}
	return nil
}

func mainAcquire(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("bench acquire", flag.ContinueOnError)
	var c AcquireConfig
	fs.IntVar(&c.Devices, "devices", 48, "number of simulated loggers")
	fs.DurationVar(&c.Interval, "interval", time.Second, "poll interval of every logger")
	fs.DurationVar(&c.Duration, "duration", 60*time.Second, "measured time per mode")
	fs.DurationVar(&c.Warmup, "warmup", 0, "polled before measuring (default 2 intervals, at least 1s)")
	modes := fs.String("modes", strings.Join(AllModes, ","), "modes, in order: tcp-serial, tcp-parallel, udp")
	fs.DurationVar(&c.Timeout, "timeout", 0, "request timeout (default 200ms udp, 500ms tcp, at most the interval)")
	fs.IntVar(&c.Retries, "retries", 1, "retries inside the interval (0: none)")
	fs.Float64Var(&c.Loss, "loss", 0, "probability a request is dropped, and (separately) a reply (0.01 = 1%)")
	fs.DurationVar(&c.Faults.Delay, "delay", 0, "fixed extra delay before every reply")
	fs.DurationVar(&c.Faults.Jitter, "jitter", 0, "plus a random delay of 0..jitter")
	fs.Float64Var(&c.Faults.Duplicate, "duplicate", 0, "probability a reply is sent twice")
	fs.DurationVar(&c.RestartEvery, "restart-every", 0, "restart one logger (round robin) this often")
	fs.StringVar(&c.Profile, "pprof", "", "write a CPU profile of each gateway child into this directory")
	fs.StringVar(&c.Telegraf, "telegraf", "", `telegraf binary with inputs.modbus ("": look on PATH, "off": skip)`)
	before := fs.String("before", "", "another edgegw lab binary (an earlier commit): each mode also runs its gateway, as MODE@before")
	full := fs.Bool("full", false, "measure the whole gateway instead: `edgegw run` (the shipped build, default config) polling the loggers over TCP (mode full), beside telegraf")
	fs.StringVar(&c.Gateway, "gateway", "", "with -full: the gateway binary (default: built here as make amd64 does)")
	fullConf := fs.String("full-config", "", "with -full: a TOML file whose sections ([ring], [history], …) are added to the gateway's default config")
	out := outputFlags(fs, false)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if c.Retries == 0 {
		c.Retries = -1
	}
	c.Modes = splitList(*modes)
	if *full {
		c.Modes = []string{ModeFull}
	}
	if *fullConf != "" {
		if !*full {
			return errors.New("bench acquire: -full-config needs -full")
		}
		b, err := os.ReadFile(*fullConf)
		if err != nil {
			return fmt.Errorf("bench acquire: -full-config: %w", err)
		}
		c.FullConfig = string(b)
	}
	if *before != "" {
		var err error
		if c.Before, err = OtherBinary(*before); err != nil {
			return err
		}
	}
	c.Logger = out.logger()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	rep, err := RunAcquire(ctx, c)
	if rep == nil {
		return err
	}
	rep.WriteText(stdout)
	return errors.Join(err, writeOutputs(out, rep, rep.WriteMarkdown, nil))
}

func mainDeliver(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("bench deliver", flag.ContinueOnError)
	var c DeliverConfig
	clients := fs.String("clients", joinInts(DefaultClients), "client counts, comma separated")
	methods := fs.String("methods", strings.Join(AllMethods, ","), "methods: short, long, ws, mqtt (mosquitto peer)")
	fs.DurationVar(&c.Duration, "duration", 30*time.Second, "measured time per step")
	fs.Float64Var(&c.Rate, "rate", 10, "updates per second appended to the gateway's ring")
	fs.IntVar(&c.Batch, "batch", 1, "samples per update")
	fs.IntVar(&c.Tags, "tags", 48, "distinct tags the updates cycle through")
	fs.DurationVar(&c.ShortPeriod, "period", 100*time.Millisecond, "short polling period per client")
	fs.DurationVar(&c.Ramp, "ramp", 0, "connect the clients over this time (default 1s + 1ms per client)")
	fs.StringVar(&c.Profile, "pprof", "", "write a CPU profile of each gateway child into this directory")
	fs.StringVar(&c.Mosquitto, "mosquitto", "", `mosquitto binary ("": look on PATH, "off": skip)`)
	before := fs.String("before", "", "another edgegw lab binary (an earlier commit): each short/long/ws step also runs its gateway, as METHOD@before, interleaved")
	fs.IntVar(&c.Repeat, "repeat", 1, "run each step (with -before: each before/after pair, alternating the order) this many times; medians reported")
	out := outputFlags(fs, true)
	if err := fs.Parse(args); err != nil {
		return err
	}
	var err error
	if c.Clients, err = parseInts(*clients); err != nil {
		return err
	}
	if c.Repeat < 1 {
		return fmt.Errorf("bench: -repeat %d: want at least 1", c.Repeat)
	}
	if *before != "" {
		if c.Before, err = OtherBinary(*before); err != nil {
			return err
		}
	}
	c.Methods = splitList(*methods)
	c.Logger = out.logger()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	rep, err := RunDeliver(ctx, c)
	if rep == nil {
		return err
	}
	rep.WriteText(stdout)
	return errors.Join(err, writeOutputs(out, rep, rep.WriteMarkdown, rep.WriteSVGs))
}

func mainSoak(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("bench soak", flag.ContinueOnError)
	var c SoakConfig
	fs.DurationVar(&c.Duration, "duration", 30*time.Minute, "how long the events run (30 min at 100 ms = 5 h of field time at 1 s)")
	fs.IntVar(&c.Devices, "devices", 48, "simulated loggers")
	fs.DurationVar(&c.Interval, "interval", 100*time.Millisecond, "poll interval of every logger")
	fs.DurationVar(&c.Timeout, "timeout", 0, "request timeout (default 2/5 of the interval)")
	fs.Float64Var(&c.Loss, "loss", 0.01, "probability a request is dropped, and (separately) a reply")
	fs.StringVar(&c.Transport, "transport", "udp", "udp, or mixed (every other logger over TCP)")
	fs.Int64Var(&c.Seed, "seed", 1, "seed of the loggers' model and faults")
	fs.DurationVar(&c.RestartEvery, "restart-every", 10*time.Second, "restart one logger (of a quarter of them, round robin) this often")
	fs.DurationVar(&c.ReloadEvery, "reload-every", 30*time.Second, "rewrite the config (one device in, one out) and SIGHUP this often")
	fs.DurationVar(&c.UplinkEvery, "uplink-every", 60*time.Second, "cut the uplink (stop the receiver) this often")
	fs.DurationVar(&c.UplinkDown, "uplink-down", 10*time.Second, "for this long")
	fs.DurationVar(&c.FloodEvery, "flood-every", 60*time.Second, "a request flood this often")
	fs.DurationVar(&c.FloodFor, "flood-for", 3*time.Second, "for this long")
	fs.IntVar(&c.FloodClients, "flood-clients", 20, "concurrent flood clients")
	fs.StringVar(&c.Flood, "flood", FloodWrongPassword, "flood requests: wrong-password (Basic auth), plain (no credentials) or off")
	fs.BoolVar(&c.Unopenable, "unopenable", true, "every other reload also adds a device that cannot open (RTU at a missing port, UDP at a .invalid name)")
	fs.DurationVar(&c.Warmup, "warmup", 0, "resources before this are not compared (default the longest event period, at least duration/10)")
	fs.StringVar(&c.Gateway, "gateway", "", "the edgegw binary to run (default: this one)")
	fs.StringVar(&c.Dir, "dir", "", "keep the work directory here (config, gateway.log, received.jsonl); default: a temporary one, removed")
	out := outputFlags(fs, true)
	if err := fs.Parse(args); err != nil {
		return err
	}
	c.Logger = out.logger()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	rep, err := RunSoak(ctx, c)
	if rep == nil {
		return err
	}
	rep.WriteText(stdout)
	return errors.Join(err, writeOutputs(out, rep, rep.WriteMarkdown, rep.WriteSVGs))
}

func writeOutputs(o outputs, rep any, md func(io.Writer), svg func(string) ([]string, error)) error {
	var errs []error
	if *o.json != "" {
		errs = append(errs, writeJSONFile(*o.json, rep))
	}
	if *o.markdown != "" {
		errs = append(errs, appendMarkdown(*o.markdown, md))
	}
	if svg != nil && o.svg != nil && *o.svg != "" {
		_, err := svg(*o.svg)
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

func splitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

func parseInts(s string) ([]int, error) {
	var out []int
	for _, f := range splitList(s) {
		n, err := strconv.Atoi(f)
		if err != nil || n <= 0 {
			return nil, fmt.Errorf("bench: -clients: %q is not a positive number", f)
		}
		out = append(out, n)
	}
	return out, nil
}

func joinInts(v []int) string {
	s := make([]string, len(v))
	for i, n := range v {
		s[i] = strconv.Itoa(n)
	}
	return strings.Join(s, ",")
}
