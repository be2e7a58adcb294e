package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
)

// table is rows of cells, printed aligned (text) or as a Markdown table.
type table struct {
	head []string
	rows [][]string
}

func (t *table) add(cells ...string) { t.rows = append(t.rows, cells) }

func (t *table) text(w io.Writer) {
	tw := tabwriter.NewWriter(w, 2, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, strings.Join(t.head, "\t")+"\t")
	for _, r := range t.rows {
		fmt.Fprintln(tw, strings.Join(r, "\t")+"\t")
	}
	tw.Flush()
}

func (t *table) markdown(w io.Writer) {
	fmt.Fprintf(w, "| %s |\n|", strings.Join(t.head, " | "))
	for range t.head {
		fmt.Fprint(w, "---:|")
	}
	fmt.Fprintln(w)
	for _, r := range t.rows {
		fmt.Fprintf(w, "| %s |\n", strings.Join(r, " | "))
	}
}

func f1(v float64) string { return fmt.Sprintf("%.1f", v) }
func f2(v float64) string { return fmt.Sprintf("%.2f", v) }
func f3(v float64) string { return fmt.Sprintf("%.3f", v) }
func pct(v float64) string {
	return fmt.Sprintf("%.2f%%", 100*v)
}
func opt(v float64, f func(float64) string) string {
	if v == 0 {
		return "–"
	}
	return f(v)
}

func (r *AcquireReport) table() *table {
	t := &table{head: []string{"mode", "devices", "polls", "cycle p50 ms", "cycle p99 ms", "rtt p50 ms", "rtt p95 ms", "rtt p99 ms",
		"loss", "valid", "cpu % core", "cpu µs/poll", "rss MiB", "peak MiB", "loggers cpu %", "machine cpu %"}}
	for _, m := range r.Modes {
		if m.Skipped != "" {
			continue
		}
		if m.Mode == "telegraf" {
			t.add(m.Mode, fmt.Sprint(m.Devices), fmt.Sprint(m.Polls), "–", "–", "–", "–", "–",
				pct(m.LossRate), "–", f2(m.CPUPercent), f1(m.CPUPerPollUS), f1(m.RSSMiB), f1(m.HWMMiB), "–", "–")
			continue
		}
		t.add(m.Mode, fmt.Sprint(m.Devices), fmt.Sprint(m.Polls), f2(m.CycleP50), f2(m.CycleP99), f3(m.RTTP50), f3(m.RTTP95), f3(m.RTTP99),
			pct(m.LossRate), pct(m.ValidRate), f2(m.CPUPercent), f1(m.CPUPerPollUS), f1(m.RSSMiB), f1(m.HWMMiB), f1(m.LoadCPU), f1(m.MachineCPU))
	}
	for _, s := range r.Study {
		t.add(s.Label, "48", "–", opt(s.CycleP50, f1), opt(s.CycleP99, f1), opt(s.RTTP50, f1), "–", opt(s.RTTP99, f1),
			opt(s.Loss, pct), opt(s.Valid, pct), s.CPU, "–", s.RSS, "–", "–", "–")
	}
	return t
}

func (r *AcquireReport) notes() []string {
	n := []string{
		fmt.Sprintf("%d loggers at %s, %s measured per mode; loss %.2f%% each way; faults %s; timeout %s, retries %d (inside the interval)",
			r.Devices, r.Interval, r.Duration, 100*r.Loss, r.Faults, r.Timeout, r.Retries),
		"cycle = one device's whole poll (all its reads, retries included), all devices merged; rtt = one request; both from the gateway's stats histograms (buckets 50/100/200/300/500/750 µs, 1/2/3/5/7.5 ms, …: interpolated)",
		"cpu, rss: the gateway child (edge + ring) alone, getrusage/VmRSS; loggers run in the bench process (loggers cpu); machine cpu: every process (/proc/stat), other work on the machine included",
	}
	if r.Restart != "" {
		n = append(n, "one logger restarted every "+r.Restart)
	}
	for _, m := range r.Modes {
		if m.Skipped != "" {
			n = append(n, m.Mode+": "+m.Skipped)
		}
		if m.Mode == ModeFull && m.Skipped == "" {
			n = append(n, fmt.Sprintf("full: %s; polls and valid from its /api/devices, cpu and rss from /proc (rss %.1f MiB anonymous, %.1f MiB of the binary's pages)", m.Where, m.RSSAnonMiB, m.RSSFileMiB))
		}
	}
	if s := r.fullRatios(); s != "" {
		n = append(n, s)
	}
	return n
}

// WriteText prints the acquisition table.
func (r *AcquireReport) WriteText(w io.Writer) {
	fmt.Fprintf(w, "edgegw bench acquire — %d CPUs (%s), %s\n", r.Machine.CPUs, r.Machine.Model, r.Machine.Note)
	r.table().text(w)
	for _, n := range r.notes() {
		fmt.Fprintln(w, "  "+n)
	}
}

// WriteMarkdown writes the acquisition table as Markdown.
func (r *AcquireReport) WriteMarkdown(w io.Writer) {
	fmt.Fprintf(w, "Acquisition: %d loggers × %s, %s per mode, loss %.2f%%, timeout %s, retries %d", r.Devices, r.Interval, r.Duration, 100*r.Loss, r.Timeout, r.Retries)
	if r.Restart != "" {
		fmt.Fprintf(w, ", one restart every %s", r.Restart)
	}
	fmt.Fprint(w, "\n\n")
	r.table().markdown(w)
	fmt.Fprintln(w)
	for _, n := range r.notes() {
		fmt.Fprintln(w, "- "+n)
	}
	fmt.Fprintln(w)
}

var methodLabel = map[string]string{MethodShort: "short polling", MethodLong: "long polling", MethodWS: "websocket", MethodMQTT: "mosquitto (mqtt)"}

// label names a step's method in the tables: "websocket", "websocket@before".
func label(method string) string {
	if m, ok := strings.CutSuffix(method, "@before"); ok {
		return methodLabel[m] + "@before"
	}
	return methodLabel[method]
}

func (r *DeliverReport) table() *table {
	t := &table{head: []string{"method", "clients", "served", "p50 ms", "p95 ms", "p99 ms", "max ms", "sent", "received", "missed", "dup",
		"payload", "wire", "payload %", "new data %", "dials", "cpu % core", "rss MiB", "clients cpu %", "machine cpu %", "errors"}}
	for _, s := range r.Steps {
		if s.Skipped != "" {
			continue
		}
		name := label(s.Method)
		if s.Run > 0 {
			name += fmt.Sprintf(" #%d", s.Run)
		}
		t.add(name, fmt.Sprint(s.Clients), fmt.Sprint(s.Connected), f2(s.LatP50), f2(s.LatP95), f2(s.LatP99), f1(s.LatMax),
			fmt.Sprint(s.Sent), fmt.Sprint(s.Received), fmt.Sprint(s.Missed), fmt.Sprint(s.Duplicates),
			bytesStr(s.PayloadBytes), bytesStr(s.WireBytes), f1(100*s.PayloadShare), f1(100*s.UsefulShare), fmt.Sprint(s.Dials),
			f1(s.CPUPercent), f1(s.RSSMiB), f1(s.LoadCPU), f1(s.MachineCPU), fmt.Sprint(s.Errors))
	}
	return t
}

// compareTable is the medians of each side and the ratios after / before.
func (r *DeliverReport) compareTable() *table {
	t := &table{head: []string{"method", "clients", "runs", "before p50 ms", "before p99 ms", "before cpu %",
		"after p50 ms", "after p99 ms", "after cpu %", "p99 after/before", "cpu after/before"}}
	for _, c := range r.Compare {
		b := []string{"–", "–", "–"}
		if c.Before != nil {
			b = []string{f2(c.Before.LatP50), f2(c.Before.LatP99), f1(c.Before.CPU)}
		}
		t.add(methodLabel[c.Method], fmt.Sprint(c.Clients), fmt.Sprint(c.After.Runs), b[0], b[1], b[2],
			f2(c.After.LatP50), f2(c.After.LatP99), f1(c.After.CPU), opt(c.P99Ratio, f2), opt(c.CPURatio, f2))
	}
	return t
}

func bytesStr(n uint64) string {
	switch {
	case n >= 10<<20:
		return fmt.Sprintf("%.0fM", float64(n)/(1<<20))
	case n >= 10<<10:
		return fmt.Sprintf("%.0fk", float64(n)/(1<<10))
	}
	return fmt.Sprint(n)
}

func (r *DeliverReport) notes() []string {
	n := []string{
		"source: " + r.Source,
		fmt.Sprintf("%s measured per step; short polling every %s per client (open loop), long polling back to back, websocket pushed", r.Duration, r.ShortPeriod),
		"latency = receipt − sample ts (one clock), HDR-style histogram (1.6% relative error), measured window only",
		"missed: samples appended after a client's first reply that it never received (short polling: overwritten between two looks); received + missed = samples appended while connected, checked per client",
		"payload = JSON bodies / message payloads; wire = bytes read+written on the client sockets (HTTP headers, WebSocket/MQTT framing; TCP/IP headers not counted); new data = JSON of the samples each client received for the first time (no envelope, no repeats)",
		"cpu, rss: the gateway child (ring + web + source) or mosquitto (/proc/PID/stat, 10 ms ticks), alone; clients cpu: the bench process; machine cpu: every process (/proc/stat), other work on the machine included",
		DeliverStudy,
	}
	if r.Before != "" {
		n = append(n, "METHOD@before: the same step, the same clients (this binary's), against the gateway child of "+r.Before+
			"; before and after run back to back, the order alternating from one run to the next (before first in odd runs)")
	}
	if len(r.Compare) > 0 {
		runs := max(r.Repeat, 1)
		n = append(n, fmt.Sprintf("second table: medians over %d run(s) per side (mean of the middle two when even); ratios after / before of those medians (the machine's load moves both sides alike only within a pair)", runs))
	}
	bad := 0
	for _, s := range r.Steps {
		if s.Skipped != "" {
			n = append(n, fmt.Sprintf("%s × %d: %s", s.Method, s.Clients, s.Skipped))
		}
		bad += s.Inconsistent
	}
	if bad > 0 {
		n = append(n, fmt.Sprintf("WARNING: %d clients where received + missed ≠ samples appended", bad))
	}
	return n
}

// WriteText prints the delivery table.
func (r *DeliverReport) WriteText(w io.Writer) {
	fmt.Fprintf(w, "edgegw bench deliver — %d CPUs (%s), %s\n", r.Machine.CPUs, r.Machine.Model, r.Machine.Note)
	r.table().text(w)
	if len(r.Compare) > 0 {
		fmt.Fprintln(w)
		r.compareTable().text(w)
	}
	for _, n := range r.notes() {
		fmt.Fprintln(w, "  "+n)
	}
}

// WriteMarkdown writes the delivery table as Markdown.
func (r *DeliverReport) WriteMarkdown(w io.Writer) {
	fmt.Fprintf(w, "Delivery: %.0f updates/s, %s per step\n\n", r.Rate, r.Duration)
	r.table().markdown(w)
	fmt.Fprintln(w)
	if len(r.Compare) > 0 {
		r.compareTable().markdown(w)
		fmt.Fprintln(w)
	}
	for _, n := range r.notes() {
		fmt.Fprintln(w, "- "+n)
	}
	fmt.Fprintln(w)
}

// Charts are the study's figures: one line per method against clients (log x).
func (r *DeliverReport) Charts() map[string]*Chart {
	mk := func(title, ylabel string, y func(*StepReport) float64) *Chart {
		c := &Chart{Title: title, XLabel: "clients", YLabel: ylabel, LogX: true}
		var order []string
		by := map[string]*Series{}
		for i := range r.Steps {
			s := &r.Steps[i]
			if s.Skipped != "" || s.Connected == 0 || s.Run > 1 {
				continue // a repeated step: its first run only
			}
			se := by[s.Method]
			if se == nil {
				se = &Series{Name: label(s.Method)}
				by[s.Method] = se
				order = append(order, s.Method)
			}
			se.X = append(se.X, float64(s.Clients))
			v := y(s)
			if math.IsInf(v, 0) {
				v = math.NaN()
			}
			se.Y = append(se.Y, v)
		}
		for _, m := range order {
			c.Series = append(c.Series, *by[m])
		}
		return c
	}
	return map[string]*Chart{
		"cpu.svg":            mk("Server CPU vs clients", "% of one core", func(s *StepReport) float64 { return s.CPUPercent }),
		"rss.svg":            mk("Server RSS vs clients", "MiB", func(s *StepReport) float64 { return s.RSSMiB }),
		"latency_p50.svg":    mk("Latency p50 vs clients", "ms", func(s *StepReport) float64 { return s.LatP50 }),
		"latency_p95.svg":    mk("Latency p95 vs clients", "ms", func(s *StepReport) float64 { return s.LatP95 }),
		"latency_p99.svg":    mk("Latency p99 vs clients", "ms", func(s *StepReport) float64 { return s.LatP99 }),
		"payload_share.svg":  mk("Payload share of bytes on the wire", "%", func(s *StepReport) float64 { return 100 * s.PayloadShare }),
		"new_data_share.svg": mk("New-data share of bytes on the wire", "%", func(s *StepReport) float64 { return 100 * s.UsefulShare }),
	}
}

// WriteSVGs writes the charts into dir and returns the file names.
func (r *DeliverReport) WriteSVGs(dir string) ([]string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("bench: svg: %w", err)
	}
	var names []string
	for name, c := range r.Charts() {
		f, err := os.Create(filepath.Join(dir, name))
		if err != nil {
			return names, fmt.Errorf("bench: svg: %w", err)
		}
		err = c.WriteSVG(f)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return names, fmt.Errorf("bench: svg %s: %w", name, err)
		}
		names = append(names, name)
	}
	return names, nil
}

func writeJSONFile(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(path, append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	return nil
}
