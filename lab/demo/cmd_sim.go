package demo

import (
	"flag"
	"fmt"
	"os"

	"edgegw/internal/cli"
	"edgegw/lab/sim"
)

// faultFlags adds the simulator's fault knobs to fs.
func faultFlags(fs *flag.FlagSet) *sim.Faults {
	f := &sim.Faults{}
	fs.DurationVar(&f.Delay, "delay", 0, "fixed extra delay before every reply")
	fs.DurationVar(&f.Jitter, "jitter", 0, "plus a random delay of 0..jitter")
	fs.Float64Var(&f.DropRequest, "drop-request", 0, "probability a request is ignored")
	fs.Float64Var(&f.DropResponse, "drop-response", 0, "probability a reply is not sent")
	fs.Float64Var(&f.Exception, "exception", 0, "probability of an exception reply (code 4)")
	fs.Float64Var(&f.Duplicate, "duplicate", 0, "probability a reply is sent twice")
	fs.Float64Var(&f.WrongTID, "wrong-tid", 0, "probability a reply carries a wrong transaction id")
	fs.Float64Var(&f.OtherPort, "other-port", 0, "udp: probability a reply comes from another port")
	fs.Float64Var(&f.Truncate, "truncate", 0, "probability a reply loses its last byte")
	fs.Float64Var(&f.BadCRC, "bad-crc", 0, "rtu: probability a reply has a bad CRC")
	return f
}

// Sim runs simulated loggers alone, for benches and field tests.
func Sim(args []string) error {
	fs := flag.NewFlagSet("sim", flag.ContinueOnError)
	n := fs.Int("devices", 48, "number of loggers (tcp/udp: one per loopback address 127.0.1.N)")
	transport := fs.String("transport", "udp", "tcp, udp or rtu")
	port := fs.Int("port", 5020, "port of every tcp/udp logger (0: a random port each)")
	serial := fs.String("serial", "", "rtu: serial device path (e.g. one end of a socat pty pair)")
	baud := fs.Int("baud", 9600, "rtu: baud rate")
	seed := fs.Int64("seed", 1, "seed of the simulated values and faults")
	faults := faultFlags(fs)
	newLog := cli.LogFlags(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	log, err := newLog(os.Stderr)
	if err != nil {
		return err
	}
	ctx, stop := cli.SignalContext()
	defer stop()
	if *transport == "rtu" {
		if *serial == "" {
			return fmt.Errorf("-serial is required with -transport rtu")
		}
		units := make([]uint8, 0, *n)
		for u := 1; u <= *n && u <= 247; u++ {
			units = append(units, uint8(u))
		}
		bus, err := sim.NewRTUBus(sim.RTUConfig{Path: *serial, Baud: *baud, Units: units, Seed: *seed, Faults: *faults, Logger: log})
		if err != nil {
			return err
		}
		fmt.Printf("rtu bus %s: units 1..%d at %d baud\n", *serial, len(units), *baud)
		return bus.Run(ctx)
	}
	fleet, err := sim.NewFleet(sim.Config{Devices: *n, Transport: *transport, Port: *port, Seed: *seed, Faults: *faults, Logger: log})
	if err != nil {
		return err
	}
	for i := 0; i < fleet.Len(); i++ {
		fmt.Printf("%s %s %s\n", fleet.Logger(i).Name(), *transport, fleet.Addr(i))
	}
	return fleet.Run(ctx)
}
