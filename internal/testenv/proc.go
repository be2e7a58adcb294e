package testenv

import (
	"bufio"
	"io"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// Proc is a process a test runs (the built edgegw, edgegw-receiver,
// haproxy): its output lines, its exit, and its stop. It is SIGKILLed and
// waited for when the test ends, if it is still running.
type Proc struct {
	Name string    // how failures name it
	Cmd  *exec.Cmd // started; Cmd.Process signals it, Cmd.ProcessState once Done
	// Lines carries its stdout and stderr lines, up to 10,000 that nobody
	// has taken; further ones are dropped rather than block the process.
	Lines <-chan string
	// Done is closed once the process has exited.
	Done <-chan struct{}

	t testing.TB
}

// StartProc runs path with args until the test ends.
func StartProc(t testing.TB, name, path string, args ...string) *Proc {
	t.Helper()
	cmd := exec.Command(path, args...)
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = pw, pw
	if err := cmd.Start(); err != nil {
		t.Fatalf("testenv: start %s: %v", name, err)
	}
	lines, done := make(chan string, 10000), make(chan struct{})
	p := &Proc{Name: name, Cmd: cmd, Lines: lines, Done: done, t: t}
	go func() {
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			select {
			case lines <- sc.Text():
			default: // nobody reads: drop rather than block the child
			}
		}
		_, _ = io.Copy(io.Discard, pr) // a line over 1 MiB ends the scan, not the reading
	}()
	go func() {
		_ = cmd.Wait()
		pw.Close()
		close(done)
	}()
	t.Cleanup(p.Kill)
	return p
}

// WaitLine returns the first line from now on that contains substr, and
// fails the test when the process exits or limit passes first.
func (p *Proc) WaitLine(substr string, limit time.Duration) string {
	p.t.Helper()
	deadline := time.NewTimer(limit)
	defer deadline.Stop()
	for {
		select {
		case l := <-p.Lines:
			if strings.Contains(l, substr) {
				return l
			}
		case <-p.Done:
			p.t.Fatalf("%s exited before printing %q", p.Name, substr)
		case <-deadline.C:
			p.t.Fatalf("%s did not print %q within %v", p.Name, substr, limit)
		}
	}
}

// Kill sends SIGKILL, unless the process has exited, and waits for its exit.
func (p *Proc) Kill() {
	select {
	case <-p.Done:
	default:
		_ = p.Cmd.Process.Kill()
		Closed(p.t, p.Done, 20*time.Second, p.Name+" to exit after SIGKILL")
	}
}

// Stop sends sig and waits at most limit for the process to exit: it
// returns the exit code, or fails the test.
func (p *Proc) Stop(sig os.Signal, limit time.Duration) int {
	p.t.Helper()
	_ = p.Cmd.Process.Signal(sig)
	Closed(p.t, p.Done, limit, p.Name+" to exit after "+sig.String())
	return p.Cmd.ProcessState.ExitCode()
}
