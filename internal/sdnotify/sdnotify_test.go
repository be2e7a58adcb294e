package sdnotify

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"edgegw/internal/testenv"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// listen opens a real unixgram socket standing in for systemd's and returns
// its NOTIFY_SOCKET value.
func listen(t *testing.T, name string) (string, *net.UnixConn) {
	t.Helper()
	c, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: name, Net: "unixgram"})
	if err != nil {
		t.Fatalf("listen %s: %v", name, err)
	}
	t.Cleanup(func() { c.Close() })
	return name, c
}

func listenPath(t *testing.T) (string, *net.UnixConn) {
	return listen(t, filepath.Join(t.TempDir(), "notify.sock"))
}

// recv reads one datagram or fails after timeout.
func recv(t *testing.T, c *net.UnixConn, timeout time.Duration) string {
	t.Helper()
	buf := make([]byte, 4096)
	if err := c.SetReadDeadline(time.Now().Add(timeout)); err != nil {
		t.Fatal(err)
	}
	n, err := c.Read(buf)
	if err != nil {
		t.Fatalf("no datagram within %v: %v", timeout, err)
	}
	return string(buf[:n])
}

// nothing asserts that no datagram arrives within d.
func nothing(t *testing.T, c *net.UnixConn, d time.Duration) {
	t.Helper()
	buf := make([]byte, 4096)
	_ = c.SetReadDeadline(time.Now().Add(d))
	if n, err := c.Read(buf); err == nil {
		t.Fatalf("unexpected datagram %q", buf[:n])
	}
}

func TestNotifyPathSocket(t *testing.T) {
	sock, c := listenPath(t)
	t.Setenv("NOTIFY_SOCKET", sock)
	for _, state := range []string{Ready, Status("polling 48 devices"), Stopping, Ready + "\n" + Status("up")} {
		ok, err := New(Config{}).Notify(state)
		if !ok || err != nil {
			t.Fatalf("Notify(%q) = %v, %v", state, ok, err)
		}
		if got := recv(t, c, 5*time.Second); got != state {
			t.Fatalf("received %q, sent %q", got, state)
		}
	}
}

func TestNotifyAbstractSocket(t *testing.T) {
	name := fmt.Sprintf("@edgegw-sdnotify-test-%d-%d", os.Getpid(), time.Now().UnixNano())
	sock, c := listen(t, name)
	t.Setenv("NOTIFY_SOCKET", sock)
	ok, err := New(Config{}).Notify(Ready)
	if !ok || err != nil {
		t.Fatalf("Notify = %v, %v", ok, err)
	}
	if got := recv(t, c, 5*time.Second); got != Ready {
		t.Fatalf("received %q", got)
	}
	// An abstract name must not have created a file named "@…".
	if _, err := os.Stat(name); err == nil {
		t.Fatalf("a file %q exists: '@' was not mapped to the abstract namespace", name)
	}
}

func TestNotifyWithoutSystemd(t *testing.T) {
	t.Setenv("NOTIFY_SOCKET", "")
	ok, err := New(Config{}).Notify(Ready)
	if ok || err != nil {
		t.Fatalf("Notify without NOTIFY_SOCKET = %v, %v; want false, nil", ok, err)
	}
}

func TestReloadingCarriesMonotonicTime(t *testing.T) {
	got := Reloading()
	lines := strings.Split(got, "\n")
	if lines[0] != "RELOADING=1" || len(lines) != 2 || !strings.HasPrefix(lines[1], "MONOTONIC_USEC=") {
		t.Fatalf("Reloading() = %q", got)
	}
	a, err := strconv.ParseInt(strings.TrimPrefix(lines[1], "MONOTONIC_USEC="), 10, 64)
	if err != nil || a <= 0 {
		t.Fatalf("MONOTONIC_USEC %q: %v", lines[1], err)
	}
	b, _ := strconv.ParseInt(strings.TrimPrefix(strings.Split(Reloading(), "\n")[1], "MONOTONIC_USEC="), 10, 64)
	if b < a {
		t.Fatalf("monotonic clock went back: %d then %d", a, b)
	}
	if s := Status("a\nb"); s != "STATUS=a b" {
		t.Fatalf("Status kept a newline: %q", s)
	}
}

func TestWatchdogIntervalFromEnv(t *testing.T) {
	t.Setenv("WATCHDOG_USEC", "30000000")
	t.Setenv("WATCHDOG_PID", strconv.Itoa(os.Getpid()))
	w := New(Config{})
	if w.Interval() != 15*time.Second {
		t.Fatalf("default ping period %v, want half of WATCHDOG_USEC", w.Interval())
	}
	t.Setenv("WATCHDOG_PID", "1")
	if d := New(Config{}).Interval(); d != 0 {
		t.Fatalf("watchdog of pid 1 taken as ours: period %v", d)
	}
}

// TestWatchdogRunPings runs the loop against a real socket: it pings at
// once, then every interval, and returns promptly when its context ends.
func TestWatchdogRunPings(t *testing.T) {
	sock, c := listenPath(t)
	t.Setenv("NOTIFY_SOCKET", sock)
	w := New(Config{Interval: 10 * time.Millisecond})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	for i := 0; i < 5; i++ {
		if got := recv(t, c, 5*time.Second); got != "WATCHDOG=1" {
			t.Fatalf("ping %d = %q", i, got)
		}
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run returned %v on cancel", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return after cancel")
	}
}

// TestWatchdogHealthCheck: a failing check stops the pings (so systemd's
// watchdog fires), a passing one resumes them.
func TestWatchdogHealthCheck(t *testing.T) {
	sock, c := listenPath(t)
	var healthy atomic.Bool
	checked := make(chan struct{}, 1)
	t.Setenv("NOTIFY_SOCKET", sock)
	w := New(Config{Interval: 5 * time.Millisecond, Check: func() error {
		select {
		case checked <- struct{}{}:
		default:
		}
		if healthy.Load() {
			return nil
		}
		return errors.New("scheduler stuck")
	}})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	defer func() {
		cancel()
		testenv.Recv(t, done, 10*time.Second, "the watchdog's Run to return after cancel")
	}()
	// Wait until the loop has run several unhealthy rounds.
	for i := 0; i < 5; i++ {
		select {
		case <-checked:
		case <-time.After(5 * time.Second):
			t.Fatal("health check not called")
		}
	}
	nothing(t, c, 30*time.Millisecond)
	healthy.Store(true)
	if got := recv(t, c, 5*time.Second); got != "WATCHDOG=1" {
		t.Fatalf("after recovery got %q", got)
	}
}

func TestWatchdogDisabledWaitsForContext(t *testing.T) {
	t.Setenv("NOTIFY_SOCKET", "")
	t.Setenv("WATCHDOG_USEC", "")
	w := New(Config{})
	if w.Interval() != 0 {
		t.Fatalf("watchdog enabled outside systemd: interval %v", w.Interval())
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	select {
	case err := <-done:
		t.Fatalf("disabled Run returned early: %v", err)
	default:
	}
	cancel()
	if err := testenv.Recv(t, done, 10*time.Second, "the disabled watchdog's Run to return after cancel"); err != nil {
		t.Fatal(err)
	}
}
