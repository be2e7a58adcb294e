package demo

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"sort"
	"strings"
	"time"

	"edgegw/conf"
	"edgegw/internal/cli"
	"edgegw/internal/gateway"
	"edgegw/lab/mqttbroker"
	"edgegw/lab/sim"
	"edgegw/receiver"
	"edgegw/stats"
)

// Demo runs simulated loggers and a gateway polling them, all on
// loopback, with no config file: the gateway's config is generated (and
// printed with -print-config) and goes through the same parser as `run`.
func Demo(args []string) error {
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	n := fs.Int("devices", 48, "number of simulated loggers")
	transport := fs.String("transport", "udp", "how the gateway polls them: udp or tcp")
	tcpMode := fs.String("tcp-mode", "parallel", "tcp scheduling: parallel or serial")
	httpAddr := fs.String("http", "127.0.0.1:8080", "address of the local page and API (port 0: any free port)")
	interval := fs.Duration("interval", time.Second, "poll interval of every logger")
	dataDir := fs.String("data-dir", "", "directory for the sequence mark and queue (empty: memory only)")
	every := fs.Duration("stats", 10*time.Second, "print device statistics this often (0: never)")
	printConfig := fs.Bool("print-config", false, "print the generated gateway config and exit")
	upstream := fs.Bool("upstream", true, "also run the reference receiver and an embedded MQTT broker, and push to them")
	receiveOut := fs.String("receive-out", "", "JSON lines file for what the receiver gets (empty: discard)")
	spb := fs.Bool("sparkplug", false, "also run a Sparkplug B edge node (group \"demo\", node \"demo\", DCMD writes on) on the embedded broker")
	faults := faultFlags(fs)
	newLog := cli.LogFlags(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	log, err := newLog(os.Stderr)
	if err != nil {
		return err
	}
	fleet, err := sim.NewFleet(sim.Config{Devices: *n, Transport: *transport, Seed: 1, Faults: *faults, Logger: log.With("pkg", "sim")})
	if err != nil {
		return err
	}
	up := Upstream{}
	var pre []gateway.Piece
	if *upstream && !*printConfig {
		if up, pre, err = startDemoUpstream(*receiveOut, log); err != nil {
			fleet.Close()
			return err
		}
	}
	if *spb && up.broker == "" && !*printConfig {
		fleet.Close()
		return errors.New("-sparkplug needs -upstream (the embedded broker)")
	}
	up.sparkplug = *spb
	text := Config(fleet, *transport, *tcpMode, *httpAddr, *dataDir, *interval, up)
	if *printConfig {
		fmt.Print(text)
		return fleet.Close()
	}
	c, err := conf.Parse("demo.toml", []byte(text))
	if err != nil {
		cli.PrintConfErrors(os.Stderr, err)
		fleet.Close()
		return cli.ErrInvalidConfig
	}
	g, err := gateway.New(c, log, false)
	if err != nil {
		fleet.Close()
		return err
	}
	page, err := g.Listen()
	if err != nil {
		g.Release()
		fleet.Close()
		return err
	}
	ctx, stop := cli.SignalContext()
	defer stop()
	pieces := append(append([]gateway.Piece{{Name: "sim", Run: fleet.Run}}, pre...), g.Pieces()...)
	if *every > 0 {
		pieces = append(pieces, gateway.Piece{Name: "stats", Run: func(ctx context.Context) error {
			printStatsEvery(ctx, os.Stdout, *every, g.Scheduler().Devices)
			return nil
		}})
	}
	fmt.Printf("edgegw demo: %d simulated loggers (%s) at %s..%s, polled every %v\n",
		fleet.Len(), *transport, fleet.Addr(0), fleet.Addr(fleet.Len()-1), *interval)
	fmt.Printf("page: %s\n", page)
	fmt.Printf("api:  %sapi/shortPolling  %sapi/longPolling?lastSequence=0  %sapi/devices  %smetrics  (WebSocket: %sapi/ws)\n",
		page, page, page, page, "ws"+page[len("http"):])
	if up.wsURL != "" {
		fmt.Printf("upstream: WebSocket receiver %s, MQTT broker %s (fallback)\n", up.wsURL, up.broker)
		fmt.Printf("watch:    mosquitto_sub -h %s -p %s -t 'edgegw/demo/#' -v\n", up.host, up.port)
	}
	if up.sparkplug {
		fmt.Printf("sparkplug: topic spBv1.0/demo/+/demo/# (group demo, node demo; payloads are protobuf, shown in hex)\n")
		fmt.Printf("watch:     mosquitto_sub -h %s -p %s -t 'spBv1.0/#' -F '%%t %%x'\n", up.host, up.port)
	}
	fmt.Println("press Ctrl-C to stop")
	err = gateway.RunStages(ctx, log, 10*time.Second, pieces)
	fmt.Println("edgegw demo: stopped")
	return err
}

// Upstream is where the demo's gateway pushes to ("" fields: nowhere).
type Upstream struct {
	wsURL, broker, host, port string
	sparkplug                 bool // add [upstream.sparkplug] on the broker
}

// startDemoUpstream binds the reference receiver and an embedded MQTT
// broker on loopback; the returned pieces run them.
func startDemoUpstream(out string, log *slog.Logger) (Upstream, []gateway.Piece, error) {
	w := io.Discard
	var f *os.File
	if out != "" {
		var err error
		if f, err = os.OpenFile(out, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o640); err != nil {
			return Upstream{}, nil, err
		}
		w = f
	}
	recv := receiver.New(receiver.Config{Listen: "127.0.0.1:0", Out: w, Logger: log.With("pkg", "receiver")})
	raddr, err := recv.Listen()
	if err != nil {
		return Upstream{}, nil, err
	}
	broker := mqttbroker.New(mqttbroker.Config{Listen: "127.0.0.1:0", Logger: log.With("pkg", "broker")})
	baddr, err := broker.Listen()
	if err != nil {
		return Upstream{}, nil, err
	}
	host, port, _ := net.SplitHostPort(baddr.String())
	up := Upstream{wsURL: "ws://" + raddr.String() + "/ingest", broker: "tcp://" + baddr.String(), host: host, port: port}
	return up, []gateway.Piece{
		{Name: "broker", Run: broker.Run},
		{Name: "receiver", Run: func(ctx context.Context) error {
			err := recv.Serve(ctx)
			if f != nil {
				err = errors.Join(err, f.Close())
			}
			return err
		}},
	}, nil
}

// Config is the config of a gateway polling every logger of the fleet.
func Config(f *sim.Fleet, transport, tcpMode, httpAddr, dataDir string, interval time.Duration, up Upstream) string {
	timeout := 200 * time.Millisecond
	if transport == "tcp" {
		timeout = 500 * time.Millisecond
	}
	timeout = min(timeout, interval)
	var b strings.Builder
	fmt.Fprintf(&b, "# generated by edgegw demo\n[gateway]\nid = \"demo\"\ndata_dir = %q\n\n", dataDir)
	fmt.Fprintf(&b, "[http]\nlisten = %q\n\n[poll]\ntcp_mode = %q\nudp_listen = \"127.0.0.1:0\"\n\n", httpAddr, tcpMode)
	b.WriteString(`[[profile]]
name = "th-logger"
tags = [
  { name = "temperature", register = "holding", address = 0, type = "int16", scale = 0.1, unit = "°C" },
  { name = "humidity", register = "holding", address = 1, type = "uint16", scale = 0.1, unit = "%RH" },
]
`)
	if up.wsURL != "" {
		fmt.Fprintf(&b, "\n[upstream.websocket]\nurl = %q\nfallback_after = \"5s\"\n", up.wsURL)
		fmt.Fprintf(&b, "\n[upstream.mqtt]\nbroker = %q\ntopic_prefix = \"edgegw/demo\"\nmode = \"fallback\"\nqos = 1\n", up.broker)
	}
	if up.sparkplug {
		b.WriteString("\n[upstream.sparkplug]\ngroup_id = \"demo\"\nnode_id = \"demo\"\nwrites = true\n")
	}
	for i := 0; i < f.Len(); i++ {
		fmt.Fprintf(&b, "\n[[device]]\nname = \"logger-%02d\"\ntransport = %q\naddress = %q\nunit = 1\nprofile = \"th-logger\"\ninterval = %q\ntimeout = %q\nretries = 1\n",
			i+1, transport, f.Addr(i), interval.String(), timeout.String())
	}
	return b.String()
}

// printStatsEvery prints a summary of every device until ctx is done.
func printStatsEvery(ctx context.Context, w io.Writer, every time.Duration, devices func() []stats.Entry) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			writeStats(w, devices())
		}
	}
}

// writeStats prints one summary line for all devices and one line for each
// device that is not at a 100% valid sample rate.
func writeStats(w io.Writer, entries []stats.Entry) {
	var all stats.HistogramSnapshot
	var polls, good, sched, timeouts, demoted uint64
	type row struct {
		name string
		s    stats.Snapshot
	}
	var bad []row
	for _, e := range entries {
		s := e.Stats.Snapshot()
		for i := range all.Counts {
			all.Counts[i] += s.RTT.Counts[i]
		}
		polls += s.Polls
		good += s.GoodPolls
		sched += s.Polls + s.Overruns + s.Skipped
		timeouts += s.Timeouts
		if s.Demoted {
			demoted++
		}
		if s.GoodPolls < s.Polls+s.Overruns+s.Skipped {
			bad = append(bad, row{e.Info.Name, s})
		}
	}
	valid := 0.0
	if sched > 0 {
		valid = 100 * float64(good) / float64(sched)
	}
	fmt.Fprintf(w, "%s  devices %d  polls %d  valid %.2f%%  rtt p50 %.2f ms p99 %.2f ms  timeouts %d  demoted %d\n",
		time.Now().Format("15:04:05"), len(entries), polls, valid, all.Quantile(0.5)/1000, all.Quantile(0.99)/1000, timeouts, demoted)
	sort.Slice(bad, func(i, j int) bool { return bad[i].s.ValidRate() < bad[j].s.ValidRate() })
	for i, r := range bad {
		if i == 5 {
			fmt.Fprintf(w, "  … and %d more below 100%%\n", len(bad)-5)
			break
		}
		fmt.Fprintf(w, "  %-12s valid %.2f%%  loss %.2f%%  rtt p99 %.2f ms  timeouts %d  errors %d  overruns %d  demoted %v\n",
			r.name, 100*r.s.ValidRate(), 100*r.s.LossRate(), r.s.RTT.Quantile(0.99)/1000, r.s.Timeouts, r.s.Errors, r.s.Overruns, r.s.Demoted)
	}
}
