package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"edgegw/receiver"
	"edgegw/ringstore"
	"edgegw/stats"
	"edgegw/wire"

	"github.com/gorilla/websocket"
)

// roleReceiver is the child role that runs a receiver (package receiver's
// Main, the same code as edgegw-receiver) for bench ingest.
const roleReceiver = "receiver"

// IngestConfig configures `bench ingest`: Gateways synthetic gateways
// (the wire protocol's batches, one in flight each, as a gateway sends
// them) over WebSocket to Receivers receiver processes storing into the
// PostgreSQL database at Postgres, for Duration after Warmup; then the same
// number of rows loaded by psql's \copy straight into a copy of the table.
type IngestConfig struct {
	Gateways, Receivers int
	Batch               int // samples per batch (500: the gateway's batch_max)
	Duration, Warmup    time.Duration
	Postgres            string
	Psql                string // psql binary ("" = on PATH)
	Exec                Exec   // how to run this binary's children
	Logger              interface{ Info(string, ...any) }
}

// IngestReport is what `bench ingest` measured.
type IngestReport struct {
	Gateways, Receivers, Batch int
	Seconds                    float64
	Stored                     uint64  // samples stored in the measured time
	Rate                       float64 // samples/s stored
	Duplicates                 uint64
	ReceiverCPU, PostgresCPU   float64 // % of one core, over the measured time
	ReceiverCPUPer1k           float64 // % of one core per 1000 samples/s stored
	PostgresCPUPer1k           float64
	CommitP50MS, CommitP99MS   float64
	BytesPerSample             float64 // read on the gateways' sockets per stored sample
	CopyRows                   uint64
	CopySeconds                float64
	CopyRate                   float64 // rows/s by psql \copy: the floor
	OfCopy                     float64 // Rate / CopyRate
	Machine                    Machine
}

func mainIngest(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("bench ingest", flag.ContinueOnError)
	var c IngestConfig
	fs.IntVar(&c.Gateways, "gateways", 8, "synthetic gateways (one WebSocket connection each)")
	fs.IntVar(&c.Receivers, "receivers", 2, "receiver processes (gateways spread over them in turn)")
	fs.IntVar(&c.Batch, "batch", 500, "samples per batch (a gateway's batch_max)")
	fs.DurationVar(&c.Duration, "duration", 30*time.Second, "measured time")
	fs.DurationVar(&c.Warmup, "warmup", 3*time.Second, "sent before measuring")
	fs.StringVar(&c.Postgres, "postgres", os.Getenv("DATABASE_URL"), "PostgreSQL URL (default $DATABASE_URL); the bench writes edgegw_samples and edgegw_copyfloor")
	fs.StringVar(&c.Psql, "psql", "", "psql binary for the \\copy floor (default: on PATH)")
	out := outputFlags(fs, false)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if l := out.logger(); l != nil {
		c.Logger = l
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	rep, err := RunIngest(ctx, c)
	if err != nil {
		return err
	}
	rep.WriteTable(stdout)
	if *out.json != "" {
		b, _ := json.MarshalIndent(rep, "", "  ")
		if err := os.WriteFile(*out.json, append(b, '\n'), 0o644); err != nil {
			return fmt.Errorf("bench: ingest: %w", err)
		}
	}
	if *out.markdown != "" {
		return appendMarkdown(*out.markdown, rep.WriteMarkdown)
	}
	return nil
}

// WriteTable prints the report.
func (r *IngestReport) WriteTable(w io.Writer) {
	fmt.Fprintf(w, "ingest: %d gateways -> %d receivers -> PostgreSQL, batches of %d, %.0f s\n", r.Gateways, r.Receivers, r.Batch, r.Seconds)
	fmt.Fprintf(w, "  stored        %10.0f samples/s (%d samples, %d duplicates)\n", r.Rate, r.Stored, r.Duplicates)
	fmt.Fprintf(w, "  psql \\copy    %10.0f rows/s (%d rows in %.2f s): receivers at %.0f%% of it\n", r.CopyRate, r.CopyRows, r.CopySeconds, 100*r.OfCopy)
	fmt.Fprintf(w, "  CPU           receivers %.0f%%, PostgreSQL %.0f%% of a core; per 1000 samples/s: %.1f%% and %.1f%%\n", r.ReceiverCPU, r.PostgresCPU, r.ReceiverCPUPer1k, r.PostgresCPUPer1k)
	fmt.Fprintf(w, "  commit        p50 %.1f ms, p99 %.1f ms\n", r.CommitP50MS, r.CommitP99MS)
	fmt.Fprintf(w, "  socket bytes  %.1f per stored sample\n", r.BytesPerSample)
}

// WriteMarkdown appends the report as a Markdown table.
func (r *IngestReport) WriteMarkdown(w io.Writer) {
	fmt.Fprintf(w, "\n| gateways | receivers | batch | stored samples/s | \\copy rows/s | of \\copy | receivers CPU / 1k/s | PostgreSQL CPU / 1k/s | commit p99 | bytes/sample |\n|---|---|---|---|---|---|---|---|---|---|\n")
	fmt.Fprintf(w, "| %d | %d | %d | %.0f | %.0f | %.0f%% | %.1f%% | %.1f%% | %.1f ms | %.1f |\n", r.Gateways, r.Receivers, r.Batch, r.Rate, r.CopyRate, 100*r.OfCopy,
		r.ReceiverCPUPer1k, r.PostgresCPUPer1k, r.CommitP99MS, r.BytesPerSample)
}

type recvChild struct {
	cmd  *exec.Cmd
	addr string
	done chan struct{}
}

// RunIngest runs the bench.
func RunIngest(ctx context.Context, c IngestConfig) (*IngestReport, error) {
	if c.Postgres == "" {
		return nil, errors.New("bench: ingest: -postgres URL (or DATABASE_URL) is required")
	}
	c.Gateways, c.Receivers, c.Batch = max(c.Gateways, 1), max(c.Receivers, 1), max(c.Batch, 1)
	if c.Psql == "" {
		p, err := exec.LookPath("psql")
		if err != nil {
			return nil, fmt.Errorf("bench: ingest: psql for the \\copy floor: %w", err)
		}
		c.Psql = p
	}
	x, err := c.Exec.fill()
	if err != nil {
		return nil, err
	}
	logf := func(msg string, args ...any) {
		if c.Logger != nil {
			c.Logger.Info(msg, args...)
		}
	}
	var recvs []*recvChild
	defer func() {
		for _, r := range recvs {
			_ = r.cmd.Process.Signal(os.Interrupt)
			select {
			case <-r.done:
			case <-time.After(10 * time.Second):
				_ = r.cmd.Process.Kill()
				<-r.done
			}
		}
	}()
	for i := 0; i < c.Receivers; i++ {
		r, err := startReceiverChild(ctx, x, c.Postgres, fmt.Sprintf("bench-r%d", i+1))
		if err != nil {
			return nil, err
		}
		recvs = append(recvs, r)
	}
	logf("bench: ingest: receivers up", "n", len(recvs))
	run := fmt.Sprintf("%08x", rand.Uint32())
	var sent atomic.Uint64
	gctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	errc := make(chan error, c.Gateways)
	for g := 0; g < c.Gateways; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := synthGateway(gctx, "ws://"+recvs[g%len(recvs)].addr+"/ingest", fmt.Sprintf("bench-%s-%02d", run, g+1), c.Batch, &sent); err != nil && gctx.Err() == nil {
				errc <- err
			}
		}()
	}
	stopAll := func() { cancel(); wg.Wait() }
	// wait runs the gateways for d; an error (ctx, a gateway's) stops them.
	wait := func(d time.Duration) error {
		select {
		case <-time.After(d):
			return nil
		case <-ctx.Done():
			stopAll()
			return ctx.Err()
		case err := <-errc:
			stopAll()
			return err
		}
	}
	if err := wait(c.Warmup); err != nil {
		return nil, err
	}
	m0, err := scrapeAll(recvs)
	if err != nil {
		stopAll()
		return nil, err
	}
	rc0, pg0 := childrenCPU(recvs), postgresCPU()
	t0 := time.Now()
	if err := wait(c.Duration); err != nil {
		return nil, err
	}
	m1, err := scrapeAll(recvs)
	rc1, pg1 := childrenCPU(recvs), postgresCPU()
	wall := time.Since(t0)
	stopAll()
	if err != nil {
		return nil, err
	}
	rep := &IngestReport{Gateways: c.Gateways, Receivers: c.Receivers, Batch: c.Batch, Seconds: wall.Seconds(), Machine: thisMachine()}
	rep.Stored = m1.samples - m0.samples
	rep.Duplicates = m1.dups - m0.dups
	rep.Rate = float64(rep.Stored) / wall.Seconds()
	rep.ReceiverCPU = 100 * (rc1 - rc0).Seconds() / wall.Seconds()
	rep.PostgresCPU = 100 * (pg1 - pg0).Seconds() / wall.Seconds()
	if rep.Rate > 0 {
		rep.ReceiverCPUPer1k = rep.ReceiverCPU / (rep.Rate / 1000)
		rep.PostgresCPUPer1k = rep.PostgresCPU / (rep.Rate / 1000)
		rep.BytesPerSample = float64(m1.wsBytes-m0.wsBytes) / float64(rep.Stored)
	}
	var h stats.HistogramSnapshot
	for i := range h.Counts {
		h.Counts[i] = m1.commit.Counts[i] - m0.commit.Counts[i]
	}
	rep.CommitP50MS, rep.CommitP99MS = h.Quantile(0.5)/1000, h.Quantile(0.99)/1000
	logf("bench: ingest: measured", "samples_per_s", int(rep.Rate))
	rows := max(rep.Stored, 10000)
	rep.CopyRows = min(rows, 2_000_000)
	rep.CopySeconds, err = copyFloor(ctx, c.Psql, c.Postgres, run, int(rep.CopyRows))
	if err != nil {
		return nil, err
	}
	rep.CopyRate = float64(rep.CopyRows) / rep.CopySeconds
	rep.OfCopy = rep.Rate / rep.CopyRate
	return rep, nil
}

// startReceiverChild runs `SELF bench child receiver -listen … -postgres …`
// and waits for its "receiving on" line.
func startReceiverChild(ctx context.Context, x Exec, db, id string) (*recvChild, error) {
	for attempt := 0; ; attempt++ {
		port, err := freePort()
		if err != nil {
			return nil, fmt.Errorf("bench: ingest: %w", err)
		}
		addr := fmt.Sprintf("127.0.0.1:%d", port)
		args := append(append([]string{}, x.Args...), "child", roleReceiver, "-listen", addr, "-postgres", db, "-id", id, "-log-level", "warn")
		cmd := exec.Command(x.Path, args...)
		cmd.Env = append(os.Environ(), ChildEnv+"="+roleReceiver)
		errp, err := cmd.StderrPipe()
		if err != nil {
			return nil, fmt.Errorf("bench: ingest: %w", err)
		}
		if err := cmd.Start(); err != nil {
			return nil, fmt.Errorf("bench: ingest: start receiver: %w", err)
		}
		r := &recvChild{cmd: cmd, addr: addr, done: make(chan struct{})}
		ready := make(chan bool, 1)
		var tail []string
		go func() {
			sc := bufio.NewScanner(errp)
			ok := false
			for sc.Scan() {
				if !ok && strings.Contains(sc.Text(), "receiving on") {
					ok = true
					ready <- true
				}
				if !ok && len(tail) < 20 {
					tail = append(tail, sc.Text())
				}
			}
			if !ok {
				ready <- false
			}
			_ = cmd.Wait()
			close(r.done)
		}()
		select {
		case ok := <-ready:
			if ok {
				return r, nil
			}
			<-r.done
			if attempt < 3 {
				continue // the port was taken meanwhile
			}
			return nil, fmt.Errorf("bench: ingest: receiver did not start: %s", strings.Join(tail, "\n"))
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			<-r.done
			return nil, errors.New("bench: ingest: receiver did not start within 30 s")
		case <-ctx.Done():
			_ = cmd.Process.Kill()
			<-r.done
			return nil, ctx.Err()
		}
	}
}

// childReceiver is the receiver child: package receiver's Main.
func childReceiver(args []string) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return receiver.Main(ctx, "receiver", args, os.Stderr)
}

// synthGateway sends batches of n samples (two tags of 24 loggers, as a
// gateway's queue holds them) and waits for each ack before the next.
func synthGateway(ctx context.Context, url, id string, n int, sent *atomic.Uint64) error {
	d := websocket.Dialer{HandshakeTimeout: 10 * time.Second}
	c, _, err := d.DialContext(ctx, url, http.Header{wire.GatewayHeader: {id}})
	if err != nil {
		return fmt.Errorf("bench: ingest: %s: %w", id, err)
	}
	defer c.Close()
	go func() { <-ctx.Done(); c.Close() }()
	epoch := rand.Uint64()
	gw, _ := json.Marshal(id)
	samples := make([]ringstore.Sample, n)
	var frame []byte
	seq := uint64(1)
	ts := time.Now().UnixMicro()
	for ctx.Err() == nil {
		for i := range samples {
			tag := "temperature"
			if seq%2 == 0 {
				tag = "humidity"
			}
			samples[i] = ringstore.Sample{Seq: seq, Epoch: epoch, Device: fmt.Sprintf("logger-%02d", (seq/2)%24+1), Tag: tag,
				Value: float64(200+seq%50) / 10, TS: ts + int64(seq)*20833, Kind: ringstore.KindFloat64}
			seq++
		}
		frame = wire.AppendBatch(frame[:0], gw, samples, false, nil)
		if err := c.WriteMessage(websocket.TextMessage, frame); err != nil {
			return err
		}
		_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
		_, msg, err := c.ReadMessage()
		if err != nil {
			return err
		}
		if m, err := wire.ParseUplink(msg); err != nil || m.Type != "ack" || m.Last != seq-1 {
			return fmt.Errorf("bench: ingest: %s: ack %q, want %d", id, msg, seq-1)
		}
		sent.Add(uint64(n))
	}
	return nil
}

type recvMetrics struct {
	samples, dups, wsBytes uint64
	commit                 stats.HistogramSnapshot
}

// scrapeAll sums the receivers' /metrics.
func scrapeAll(rs []*recvChild) (recvMetrics, error) {
	var m recvMetrics
	for _, r := range rs {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		req, _ := http.NewRequestWithContext(ctx, "GET", "http://"+r.addr+"/metrics", nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			cancel()
			return m, fmt.Errorf("bench: ingest: metrics: %w", err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		cancel()
		var prev uint64
		bucket := 0
		for _, l := range strings.Split(string(b), "\n") {
			name, val, ok := strings.Cut(l, " ")
			if !ok || strings.HasPrefix(l, "#") {
				continue
			}
			v, _ := strconv.ParseUint(val, 10, 64)
			switch {
			case name == "edgegw_receiver_samples_total":
				m.samples += v
			case name == "edgegw_receiver_duplicates_total":
				m.dups += v
			case name == "edgegw_receiver_ws_read_bytes_total":
				m.wsBytes += v
			case strings.HasPrefix(name, "edgegw_receiver_commit_seconds_bucket") && bucket < len(m.commit.Counts):
				m.commit.Counts[bucket] += v - prev // cumulative in the exposition
				prev = v
				bucket++
			}
		}
	}
	return m, nil
}

func childrenCPU(rs []*recvChild) time.Duration {
	var t time.Duration
	for _, r := range rs {
		if u, err := procUsage(r.cmd.Process.Pid); err == nil {
			t += u.CPU
		}
	}
	return t
}

// postgresCPU is the CPU time of every process named postgres on the
// machine (the server and its backends; the bench's cluster should be the
// only one).
func postgresCPU() time.Duration {
	var t time.Duration
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		comm, err := os.ReadFile(filepath.Join("/proc", e.Name(), "comm"))
		if err != nil || strings.TrimSpace(string(comm)) != "postgres" {
			continue
		}
		if u, err := procUsage(pid); err == nil {
			t += u.CPU
		}
	}
	return t
}

// copyFloor writes n rows like the bench's into a CSV file and times
// psql's \copy of it into edgegw_copyfloor (edgegw_samples' columns and
// primary key, emptied first): the rate this machine's PostgreSQL takes
// rows at without the receiver.
func copyFloor(ctx context.Context, psql, url, run string, n int) (float64, error) {
	dir, err := os.MkdirTemp("", "edgegw-copyfloor-")
	if err != nil {
		return 0, fmt.Errorf("bench: ingest: %w", err)
	}
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "rows.csv")
	f, err := os.Create(path)
	if err != nil {
		return 0, fmt.Errorf("bench: ingest: %w", err)
	}
	w := bufio.NewWriterSize(f, 1<<20)
	ts := time.Now().UTC()
	var b []byte
	for i := 1; i <= n; i++ {
		b = b[:0]
		b = fmt.Appendf(b, "bench-%s-copy,%016x,%d,logger-%02d,%s,%.1f,,good,%s\n", run, uint64(42), i, (i/2)%24+1,
			[]string{"temperature", "humidity"}[i%2], float64(200+i%50)/10, ts.Add(time.Duration(i)*20833*time.Microsecond).Format(time.RFC3339Nano))
		w.Write(b)
	}
	if err := w.Flush(); err != nil {
		f.Close()
		return 0, fmt.Errorf("bench: ingest: %w", err)
	}
	f.Close()
	sql := func(s string) error {
		out, err := exec.CommandContext(ctx, psql, "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", url, "-c", s).CombinedOutput()
		if err != nil {
			return fmt.Errorf("bench: ingest: psql %q: %v: %s", s, err, out)
		}
		return nil
	}
	if err := sql(`CREATE TABLE IF NOT EXISTS edgegw_copyfloor (LIKE edgegw_samples INCLUDING ALL); TRUNCATE edgegw_copyfloor`); err != nil {
		return 0, err
	}
	t0 := time.Now()
	if err := sql(`\copy edgegw_copyfloor (gateway, epoch, seq, device, tag, value, value_text, quality, ts) FROM '` + path + `' WITH (FORMAT csv)`); err != nil {
		return 0, err
	}
	el := time.Since(t0).Seconds()
	_ = sql(`TRUNCATE edgegw_copyfloor`)
	return el, nil
}
