package testenv

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// CI reports whether the tests run under CI (CI=true): then a missing tool
// is a failure, not a skip.
func CI() bool { return os.Getenv("CI") != "" && os.Getenv("CI") != "false" }

// Need returns the path of tool, or skips the test (fails it under CI).
func Need(t testing.TB, tool string) string {
	t.Helper()
	p, err := exec.LookPath(tool)
	if err != nil {
		Missing(t, fmt.Sprintf("%s not found on PATH", tool))
	}
	return p
}

// Missing skips the test with why, or fails it under CI.
func Missing(t testing.TB, why string) {
	t.Helper()
	if CI() {
		t.Fatalf("testenv: %s (CI=true: .ci/run must install it)", why)
	}
	t.Skipf("testenv: %s (skipped outside CI)", why)
}

// Python is Debian's python3 (the one that sees python3-pymodbus), after
// checking that pymodbus imports.
func Python(t testing.TB) string {
	t.Helper()
	const py = "/usr/bin/python3"
	if out, err := exec.Command(py, "-c", "import pymodbus").CombinedOutput(); err != nil {
		Missing(t, fmt.Sprintf("%s cannot import pymodbus (Debian python3-pymodbus): %v %s", py, err, out))
	}
	return py
}

// Start runs cmd, kills it and waits for it at cleanup. It returns a
// reader of the process's stderr lines (stdout too if combined).
func Start(t testing.TB, cmd *exec.Cmd) *bufio.Scanner {
	t.Helper()
	pr, pw := io.Pipe()
	cmd.Stderr = pw
	if cmd.Stdout == nil {
		cmd.Stdout = pw
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("testenv: start %s: %v", cmd.Path, err)
	}
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		pw.Close()
		close(done)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-done
		// drain so the copier goroutine of exec is not stuck
	})
	return bufio.NewScanner(pr)
}

// LineWith is the first line of text containing s ("" if none).
func LineWith(text, s string) string {
	for _, l := range strings.Split(text, "\n") {
		if strings.Contains(l, s) {
			return l
		}
	}
	return ""
}

// WaitLine reads lines from sc until one contains substr or timeout passes.
// Lines read on the way are logged. Returns the matching line.
func WaitLine(t testing.TB, sc *bufio.Scanner, substr string, timeout time.Duration) string {
	t.Helper()
	found := make(chan string, 1)
	go func() {
		for sc.Scan() {
			line := sc.Text()
			if strings.Contains(line, substr) {
				found <- line
				// keep draining so the process never blocks on a full pipe
				for sc.Scan() {
				}
				return
			}
		}
		close(found)
	}()
	select {
	case line, ok := <-found:
		if !ok {
			t.Fatalf("testenv: process ended before printing %q", substr)
		}
		return line
	case <-time.After(timeout):
		t.Fatalf("testenv: %q not printed within %v", substr, timeout)
	}
	return ""
}

// PTYPair starts socat with two linked ptys and returns their paths. The
// pair lives until the test ends.
func PTYPair(t testing.TB) (a, b string) {
	t.Helper()
	socat := Need(t, "socat")
	dir := t.TempDir()
	a, b = filepath.Join(dir, "ptyA"), filepath.Join(dir, "ptyB")
	cmd := exec.Command(socat, "-d", "-d",
		"pty,raw,echo=0,link="+a, "pty,raw,echo=0,link="+b)
	sc := Start(t, cmd)
	WaitLine(t, sc, "starting data transfer loop", 10*time.Second)
	return a, b
}

// FreePort returns a loopback TCP port that was free a moment ago. Only for
// external programs that cannot listen on port 0 and report it; callers must
// retry if the program then fails to bind.
func FreePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// Mosquitto is a real broker started for one test.
type Mosquitto struct {
	Addr       string // 127.0.0.1:PORT
	persistent bool
	listener   string // extra options of the listener (TLS)
	cmd        *exec.Cmd
	done       chan struct{}
}

// StartMosquitto runs Debian's mosquitto in the foreground on a random
// loopback port with a generated config, and waits until it accepts.
func StartMosquitto(t testing.TB) *Mosquitto {
	t.Helper()
	bin := Need(t, "mosquitto")
	dir := t.TempDir()
	return startMosquittoRetry(t, bin, dir, false, "")
}

// StartMosquittoTLS is StartMosquitto with TLS on its listener: the broker
// presents certFile (PEM, with keyFile) and asks no client certificate.
func StartMosquittoTLS(t testing.TB, certFile, keyFile string) *Mosquitto {
	t.Helper()
	return startMosquittoRetry(t, Need(t, "mosquitto"), t.TempDir(), false,
		fmt.Sprintf("certfile %s\nkeyfile %s\n", certFile, keyFile))
}

// StartMosquittoPersistent is StartMosquitto with persistence on: sessions
// of clients with clean session off, and the QoS 1 messages queued or in
// flight for them, are saved when the broker stops (Stop sends SIGTERM) and
// loaded when it starts again, so a subscriber loses nothing across a broker
// restart.
func StartMosquittoPersistent(t testing.TB) *Mosquitto {
	t.Helper()
	return startMosquittoRetry(t, Need(t, "mosquitto"), t.TempDir(), true, "")
}

func startMosquittoRetry(t testing.TB, bin, dir string, persistent bool, listener string) *Mosquitto {
	t.Helper()
	for attempt := 0; attempt < 5; attempt++ {
		port := FreePort(t)
		m, err := startMosquitto(bin, dir, port, persistent, listener)
		if err == nil {
			t.Cleanup(m.Stop)
			return m
		}
		t.Logf("testenv: mosquitto on port %d: %v; retrying", port, err)
	}
	t.Fatal("testenv: mosquitto did not start")
	return nil
}

// RestartMosquitto starts a stopped broker again on the same port.
func (m *Mosquitto) Restart(t testing.TB) {
	t.Helper()
	m.Stop()
	_, port, _ := net.SplitHostPort(m.Addr)
	var p int
	fmt.Sscan(port, &p)
	n, err := startMosquitto(m.cmd.Path, filepath.Dir(m.cmd.Args[2]), p, m.persistent, m.listener)
	if err != nil {
		t.Fatalf("testenv: restart mosquitto: %v", err)
	}
	*m = *n
}

// listener holds options of the listener (certfile, keyfile, …).
func startMosquitto(bin, dir string, port int, persistent bool, listener string) (*Mosquitto, error) {
	conf := filepath.Join(dir, fmt.Sprintf("mosquitto-%d.conf", port))
	body := fmt.Sprintf("listener %d 127.0.0.1\n%sallow_anonymous true\nuser root\nmax_queued_messages 0\nmax_inflight_messages 0\n", port, listener)
	if persistent {
		body += fmt.Sprintf("persistence true\npersistence_location %s/\nautosave_interval 0\n", dir)
	} else {
		body += "persistence false\n"
	}
	if err := os.WriteFile(conf, []byte(body), 0o600); err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, "-c", conf)
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	m := &Mosquitto{Addr: fmt.Sprintf("127.0.0.1:%d", port), persistent: persistent, listener: listener, cmd: cmd, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(m.done) }()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var d net.Dialer
	for {
		c, err := d.DialContext(ctx, "tcp", m.Addr)
		if err == nil {
			c.Close()
			return m, nil
		}
		select {
		case <-m.done:
			return nil, fmt.Errorf("mosquitto exited: %v", cmd.ProcessState)
		case <-ctx.Done():
			m.Stop()
			return nil, fmt.Errorf("mosquitto not accepting on %s", m.Addr)
		case <-time.After(20 * time.Millisecond): // poll interval of a readiness check
		}
	}
}

// Kill ends the broker with SIGKILL (a node's death: nothing saved, its
// connections cut) and waits for it. Idempotent.
func (m *Mosquitto) Kill() {
	select {
	case <-m.done:
		return
	default:
	}
	_ = m.cmd.Process.Kill()
	<-m.done
}

// Stop ends the broker (SIGTERM, so a persistent one saves its sessions;
// SIGKILL if it has not exited within 10 s) and waits for it. Idempotent.
func (m *Mosquitto) Stop() {
	select {
	case <-m.done:
		return
	default:
	}
	_ = m.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-m.done:
	case <-time.After(10 * time.Second):
		_ = m.cmd.Process.Kill()
		<-m.done
	}
}

// WaitFor checks cond until it holds, and fails the test when limit passes
// first. It is how tests wait for a condition: never a bare sleep. The
// checks start 2 ms apart and slow down to 100 ms, so a condition that asks
// the gateway over HTTP (10 requests a second at most, once slowed) stays
// well under its per-client limits (web's RateLimits: 100/s for reads,
// loopback included) and leaves room for the test's other clients.
func WaitFor(t testing.TB, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	wait := 2 * time.Millisecond
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", limit, what)
		}
		time.Sleep(wait) // the poll interval of the condition check
		if wait < 100*time.Millisecond {
			wait += wait / 2
		}
	}
}

// Recv receives one value from ch, and fails the test naming what it waited
// for when limit passes first or ch is closed. It is how tests receive from
// a channel: a bare <-ch waits for the package's 15-minute timeout instead
// of failing with a message.
func Recv[T any](t testing.TB, ch <-chan T, limit time.Duration, what string) T {
	t.Helper()
	timer := time.NewTimer(limit)
	defer timer.Stop()
	select {
	case v, ok := <-ch:
		if !ok {
			t.Fatalf("channel closed while waiting for %s", what)
		}
		return v
	case <-timer.C:
		t.Fatalf("timed out after %v waiting for %s", limit, what)
	}
	var zero T
	return zero
}

// Closed waits until ch is closed or yields a value (a done channel), and
// fails the test naming what it waited for when limit passes first.
func Closed[T any](t testing.TB, ch <-chan T, limit time.Duration, what string) {
	t.Helper()
	timer := time.NewTimer(limit)
	defer timer.Stop()
	select {
	case <-ch:
	case <-timer.C:
		t.Fatalf("timed out after %v waiting for %s", limit, what)
	}
}

// Wait runs wait (a WaitGroup's Wait, a process's Wait) and fails the test
// naming what it waited for when limit passes first. The goroutine running
// wait is left behind only when the test has already failed.
func Wait(t testing.TB, limit time.Duration, what string, wait func()) {
	t.Helper()
	done := make(chan struct{})
	go func() { wait(); close(done) }()
	Closed(t, done, limit, what)
}

// NeedFiles lifts the process's RLIMIT_NOFILE to at least n for the test
// (children started meanwhile inherit it), or skips the test when the hard
// limit is lower.
func NeedFiles(t testing.TB, n uint64) {
	t.Helper()
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		t.Fatal(err)
	}
	if rl.Cur >= n {
		return
	}
	if rl.Max < n {
		t.Skipf("RLIMIT_NOFILE hard limit %d < %d needed", rl.Max, n)
	}
	old := rl
	rl.Cur = n
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Setrlimit(syscall.RLIMIT_NOFILE, &old) })
}

// RunUntilEnd runs run(ctx) in a goroutine until the test ends: its cleanup
// cancels ctx and waits at most limit for run to return (naming what it
// waited for), failing the test when run returned an error.
func RunUntilEnd(t testing.TB, limit time.Duration, what string, run func(context.Context) error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := Recv(t, done, limit, what+" to return"); err != nil {
			t.Errorf("%s: %v", what, err)
		}
	})
}

// Running returns r, made by a constructor that returned err, running
// (its Run(ctx)) until the test ends as RunUntilEnd runs it; a non-nil err
// fails the test at once. A simulated fleet:
//
//	f, err := sim.NewFleet(cfg)
//	return testenv.Running(t, time.Minute, "the simulated fleet", f, err)
func Running[R interface{ Run(context.Context) error }](t testing.TB, limit time.Duration, what string, r R, err error) R {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	RunUntilEnd(t, limit, what, r.Run)
	return r
}
