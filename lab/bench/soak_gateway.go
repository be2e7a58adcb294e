// The soak's process management: the gateway under test as a child
// process, its log counted line by line, its stop.

package bench

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"

	"edgegw/lab/sim"
)

// soakLogger is one simulated logger the gateway polls.
type soakLogger struct {
	name, transport, addr string
	l                     *sim.Logger
	untouched             bool
}

// gatewayProc is the gateway under test: `edgegw run -config FILE`.
type gatewayProc struct {
	cmd  *exec.Cmd
	page chan string   // the page URL, once
	done chan struct{} // closed after exit (log read to the end)
	code int

	mu   sync.Mutex
	sum  LogSum
	tail []string
}

func startGateway(bin, config, logPath string) (*gatewayProc, error) {
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, fmt.Errorf("bench: soak: %w", err)
	}
	g := &gatewayProc{cmd: exec.Command(bin, "run", "-config", config), page: make(chan string, 1), done: make(chan struct{})}
	pr, pw, err := os.Pipe()
	if err != nil {
		logf.Close()
		return nil, fmt.Errorf("bench: soak: %w", err)
	}
	g.cmd.Stdout, g.cmd.Stderr = pw, pw
	if err := g.cmd.Start(); err != nil {
		logf.Close()
		pr.Close()
		pw.Close()
		return nil, fmt.Errorf("bench: soak: start %s: %w", bin, err)
	}
	pw.Close()
	go func() {
		defer close(g.done)
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		w := bufio.NewWriter(logf)
		for sc.Scan() {
			line := sc.Text()
			w.WriteString(line + "\n")
			g.count(line)
		}
		pr.Close()
		w.Flush()
		logf.Close()
		_ = g.cmd.Wait()
		g.code = g.cmd.ProcessState.ExitCode()
	}()
	return g, nil
}

func (g *gatewayProc) count(line string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	s := &g.sum
	s.Lines++
	switch {
	case strings.Contains(line, "reload: devices applied"):
		s.ReloadsApplied++
	case strings.Contains(line, "reload: config invalid"), strings.Contains(line, "reload: devices not applied"):
		s.ReloadsRefused++
	}
	switch {
	case strings.Contains(line, "level=ERROR"):
		s.Errors++
	case strings.Contains(line, "level=WARN"):
		s.Warnings++
	}
	if strings.HasPrefix(line, "panic:") || strings.HasPrefix(line, "fatal error:") {
		s.Panics++
	}
	if i := strings.Index(line, " page="); i >= 0 && strings.Contains(line, "edgegw running") {
		if f := strings.Fields(line[i+len(" page="):]); len(f) > 0 {
			select {
			case g.page <- f[0]:
			default:
			}
		}
	}
	g.tail = append(g.tail, line)
	if len(g.tail) > 20 {
		g.tail = g.tail[1:]
	}
}

func (g *gatewayProc) exited() bool {
	select {
	case <-g.done:
		return true
	default:
		return false
	}
}

// stop sends SIGTERM and waits at most 15 s, then kills; it returns the exit code.
func (g *gatewayProc) stop() int {
	if g.exited() {
		return g.code
	}
	_ = g.cmd.Process.Signal(syscall.SIGTERM)
	t := time.NewTimer(15 * time.Second)
	defer t.Stop()
	select {
	case <-g.done:
	case <-t.C:
		_ = g.cmd.Process.Kill()
		<-g.done
	}
	return g.code
}

func (g *gatewayProc) logSum() LogSum {
	g.mu.Lock()
	defer g.mu.Unlock()
	s := g.sum
	s.Last = append([]string(nil), g.tail...)
	return s
}
