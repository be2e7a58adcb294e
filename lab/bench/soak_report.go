package bench

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

func (r *SoakReport) table() *table {
	t := &table{head: []string{"resource", "first after warm-up", "last (settled)", "max after warm-up"}}
	t.add("rss MiB", f1(r.RSSMiB.First), f1(r.RSSMiB.Last), f1(r.RSSMiB.Max))
	t.add("open descriptors", fmt.Sprint(r.FDs.First), fmt.Sprint(r.FDs.Last), fmt.Sprint(r.FDs.Max))
	t.add("threads", fmt.Sprint(r.Threads.First), fmt.Sprint(r.Threads.Last), fmt.Sprint(r.Threads.Max))
	if r.GoroutinesFrom == "go_goroutines" {
		t.add("goroutines", fmt.Sprint(r.Goroutine.First), fmt.Sprint(r.Goroutine.Last), fmt.Sprint(r.Goroutine.Max))
	}
	return t
}

func (r *SoakReport) figures() *table {
	t := &table{head: []string{"figure", "value"}}
	t.add("gateway alive at the end", fmt.Sprintf("%v (exit %d after SIGTERM)", r.Alive, r.ExitCode))
	t.add("untouched loggers", fmt.Sprint(r.Untouched))
	t.add("valid sample rate (untouched)", fmt.Sprintf("%s of %d windows (bound %s)", pct(r.ValidRate), r.UntouchedSched, pct(r.ValidBound)))
	t.add("windows missed, one alone / two or more in a row", fmt.Sprintf("%d / %d (longest gap %.2f intervals)", r.SingleMisses, r.DoubleMisses, r.MaxGapIntervals))
	t.add("demotions (untouched)", fmt.Sprint(r.Demotions))
	t.add("samples numbered by the gateway", fmt.Sprint(r.Numbered))
	t.add("received after dedup", fmt.Sprintf("%d (%d duplicates dropped)", r.Received, r.Duplicates))
	t.add("lost at the receiver", fmt.Sprint(r.Lost))
	t.add("gateway's upstream dropped counter", fmt.Sprint(r.Dropped))
	t.add("most samples queued (uplink cut)", fmt.Sprint(r.QueueMax))
	t.add("receiver caught up", fmt.Sprintf("%.1f s after the end", r.CaughtUpS))
	t.add("gateway cpu (mean, % of one core)", f1(r.CPUPercent))
	e := r.Events
	t.add("events", fmt.Sprintf("%d restarts, %d reloads (%d applied, %d refused; %d with an unopenable device), %d uplink cuts, %d slow WebSocket clients (%d dropped by the gateway), %d floods",
		e.Restarts, e.Reloads, r.Log.ReloadsApplied, r.Log.ReloadsRefused, e.UnopenableAdds, e.UplinkCuts, e.SlowClients, e.WSDropped, e.Floods))
	if e.Floods > 0 {
		t.add("flood replies", fmt.Sprintf("%d requests (%s, %d clients): %s", e.FloodRequests, e.FloodKind, e.FloodClients, statusString(e.FloodStatus)))
	}
	t.add("gateway log", fmt.Sprintf("%d lines: %d errors, %d warnings, %d panics", r.Log.Lines, r.Log.Errors, r.Log.Warnings, r.Log.Panics))
	return t
}

func statusString(m map[string]uint64) string {
	var keys []string
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s×%d", k, m[k]))
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}

func (r *SoakReport) notes() []string {
	n := []string{
		fmt.Sprintf("%d loggers (%s) at %s, timeout %s, retries %d, loss %.2f%% each way, seed %d; %s measured, warm-up %s",
			r.Devices, r.Transport, r.Interval, r.Timeout, r.Retries, 100*r.Loss, r.Seed, r.Duration, r.Warmup),
		r.Schedule,
		"the gateway is `edgegw run` in its own process; loggers, receiver, slow client and flood run in the bench process",
		"resources from /proc/PID (VmRSS, fd, Threads); goroutines: " + r.GoroutinesFrom + "; last = after the events stopped and the receiver caught up",
		"untouched loggers: never restarted and unchanged by every reload; valid rate = good polls (/api/devices) / windows by the clock; gaps between good samples at the receiver (1.5–3 intervals: one window missed; ≥ 3: two or more in a row)",
		"lost = samples the gateway numbered (1..seq) that the receiver never wrote, after dedup by (gateway, epoch, seq)",
	}
	if r.Log.Panics > 0 || !r.Alive {
		n = append(n, "gateway log tail: "+strings.Join(r.Log.Last, " | "))
	}
	return n
}

// WriteText prints the soak's tables.
func (r *SoakReport) WriteText(w io.Writer) {
	fmt.Fprintf(w, "edgegw bench soak — %d CPUs (%s), %s\n", r.Machine.CPUs, r.Machine.Model, r.Machine.Note)
	r.table().text(w)
	fmt.Fprintln(w)
	for _, row := range r.figures().rows {
		fmt.Fprintf(w, "%s: %s\n", row[0], row[1])
	}
	for _, n := range r.notes() {
		fmt.Fprintln(w, "  "+n)
	}
}

// WriteMarkdown writes the soak's tables as Markdown.
func (r *SoakReport) WriteMarkdown(w io.Writer) {
	fmt.Fprintf(w, "Soak: %d loggers × %s for %s, loss %.2f%% each way\n\n", r.Devices, r.Interval, r.Duration, 100*r.Loss)
	r.table().markdown(w)
	fmt.Fprintln(w)
	r.figures().markdown(w)
	fmt.Fprintln(w)
	for _, n := range r.notes() {
		fmt.Fprintln(w, "- "+n)
	}
	fmt.Fprintln(w)
}

// Chart is RSS, descriptors and goroutines (or threads) over time.
func (r *SoakReport) Chart() *Chart {
	c := &Chart{Title: "Gateway resources during the soak", XLabel: "minutes", YLabel: "MiB / count"}
	rss, fds, gr := Series{Name: "RSS MiB"}, Series{Name: "open fds"}, Series{Name: "goroutines"}
	if r.GoroutinesFrom != "go_goroutines" {
		gr.Name = "threads"
	}
	for _, s := range r.Samples {
		x := s.T / 60
		rss.X, rss.Y = append(rss.X, x), append(rss.Y, s.RSSMiB)
		fds.X, fds.Y = append(fds.X, x), append(fds.Y, float64(s.FDs))
		g := float64(s.Goroutines)
		if gr.Name == "threads" {
			g = float64(s.Threads)
		}
		gr.X, gr.Y = append(gr.X, x), append(gr.Y, g)
	}
	c.Series = []Series{rss, fds, gr}
	return c
}

// WriteSVGs writes soak.svg into dir.
func (r *SoakReport) WriteSVGs(dir string) ([]string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("bench: svg: %w", err)
	}
	f, err := os.Create(filepath.Join(dir, "soak.svg"))
	if err != nil {
		return nil, fmt.Errorf("bench: svg: %w", err)
	}
	err = r.Chart().WriteSVG(f)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, fmt.Errorf("bench: svg soak.svg: %w", err)
	}
	return []string{"soak.svg"}, nil
}
