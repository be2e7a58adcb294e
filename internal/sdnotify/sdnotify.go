package sdnotify

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strconv"
	"strings"
	"time"
)

// States understood by systemd (sd_notify(3)). Several may be sent in one
// datagram, separated by newlines.
const (
	Ready        = "READY=1"     // start-up finished (Type=notify)
	Stopping     = "STOPPING=1"  // shutdown began
	WatchdogPing = "WATCHDOG=1"  // keep-alive ping (WatchdogSec=)
	reloading    = "RELOADING=1" // see Reloading
)

// ErrUnsupportedSocket is returned for a $NOTIFY_SOCKET that is neither an
// absolute path nor "@abstract" (systemd's vsock: form is not supported).
var ErrUnsupportedSocket = errors.New("sdnotify: unsupported NOTIFY_SOCKET address")

// Status is the free-form one-line status systemctl shows.
func Status(msg string) string {
	return "STATUS=" + strings.ReplaceAll(msg, "\n", " ")
}

// Reloading is the state sent when a SIGHUP reload begins; send Ready when
// it has finished. MONOTONIC_USEC is required by Type=notify-reload and
// harmless otherwise.
func Reloading() string {
	usec, ok := monotonicUsec()
	if !ok {
		return reloading
	}
	return reloading + "\nMONOTONIC_USEC=" + strconv.FormatInt(usec, 10)
}

// Notify sends state to the socket in $NOTIFY_SOCKET. It reports false and
// no error when the variable is unset (not started by systemd, or
// NotifyAccess=none).
func Notify(state string) (bool, error) {
	return send(os.Getenv("NOTIFY_SOCKET"), state)
}

// send writes state as one datagram to socket. An empty socket is "not
// under systemd": (false, nil).
func send(socket, state string) (bool, error) {
	if socket == "" {
		return false, nil
	}
	// Linux: a leading '@' is the abstract namespace (a leading NUL on the
	// wire); the net package translates "@name" itself.
	if socket[0] != '/' && socket[0] != '@' {
		return false, fmt.Errorf("%w: %q", ErrUnsupportedSocket, socket)
	}
	addr := &net.UnixAddr{Name: socket, Net: "unixgram"}
	conn, err := net.DialUnix("unixgram", nil, addr)
	if err != nil {
		return false, fmt.Errorf("sdnotify: dial %s: %w", socket, err)
	}
	defer conn.Close()
	// Wire: one datagram, "KEY=VALUE" lines separated by '\n', no framing.
	if _, err := conn.Write([]byte(state)); err != nil {
		return false, fmt.Errorf("sdnotify: send %q to %s: %w", firstLine(state), socket, err)
	}
	return true, nil
}

func firstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	return s
}

// WatchdogInterval returns the watchdog timeout systemd expects pings
// within ($WATCHDOG_USEC), and false when no watchdog is set up for this
// process (unset, unparsable or zero, or $WATCHDOG_PID naming another
// process). Ping at half of it (Watchdog does).
func WatchdogInterval() (time.Duration, bool) {
	return watchdogInterval(os.Getenv("WATCHDOG_USEC"), os.Getenv("WATCHDOG_PID"), os.Getpid())
}

func watchdogInterval(usecStr, pidStr string, self int) (time.Duration, bool) {
	if usecStr == "" {
		return 0, false
	}
	usec, err := strconv.ParseUint(usecStr, 10, 64)
	if err != nil || usec == 0 || usec > uint64(1<<63-1)/uint64(time.Microsecond) {
		return 0, false
	}
	if pidStr != "" {
		pid, err := strconv.Atoi(pidStr)
		if err != nil || pid != self {
			return 0, false
		}
	}
	return time.Duration(usec) * time.Microsecond, true
}

// Config configures a Watchdog. The zero value means: socket from
// $NOTIFY_SOCKET, period half of $WATCHDOG_USEC, no health check, no log.
type Config struct {
	// Socket overrides $NOTIFY_SOCKET (tests, or a caller that cleared the
	// environment for its children).
	Socket string
	// Interval between pings. Zero: half of WatchdogInterval(). When it is
	// zero and no watchdog is configured, Run only waits for its context.
	Interval time.Duration
	// Check, when set, is called before every ping; an error skips the ping
	// (so systemd restarts a gateway whose main loop is stuck) and is logged.
	Check func() error
	// Logger for send and check failures; nil discards.
	Logger *slog.Logger
}

// Watchdog pings systemd's watchdog ("WATCHDOG=1") from Run.
type Watchdog struct {
	socket   string
	interval time.Duration
	check    func() error
	log      *slog.Logger
}

// New fills defaults from the environment. It starts no goroutine.
func New(cfg Config) *Watchdog {
	w := &Watchdog{socket: cfg.Socket, interval: cfg.Interval, check: cfg.Check, log: cfg.Logger}
	if w.socket == "" {
		w.socket = os.Getenv("NOTIFY_SOCKET")
	}
	if w.interval <= 0 {
		if d, ok := WatchdogInterval(); ok {
			w.interval = d / 2
		}
	}
	if w.log == nil {
		w.log = slog.New(slog.DiscardHandler)
	}
	return w
}

// Enabled reports whether Run will ping (a socket and a period are known).
func (w *Watchdog) Enabled() bool { return w.socket != "" && w.interval > 0 }

// Interval is the ping period (zero when disabled).
func (w *Watchdog) Interval() time.Duration {
	if !w.Enabled() {
		return 0
	}
	return w.interval
}

// Notify sends state to the watchdog's socket (see the package Notify).
func (w *Watchdog) Notify(state string) (bool, error) { return send(w.socket, state) }

// Run pings once at start and then every interval until ctx ends; it
// returns nil then. Send and check failures are logged (at most once per
// failure streak) and do not stop the loop: a missed ping is what tells
// systemd to restart us. When disabled, Run just waits for ctx.
func (w *Watchdog) Run(ctx context.Context) error {
	if !w.Enabled() {
		<-ctx.Done()
		return nil
	}
	t := time.NewTicker(w.interval)
	defer t.Stop()
	failing := false
	for {
		err := w.ping()
		switch {
		case err != nil && !failing:
			w.log.Warn("sdnotify: watchdog ping skipped", "err", err)
			failing = true
		case err == nil && failing:
			w.log.Info("sdnotify: watchdog ping resumed")
			failing = false
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

func (w *Watchdog) ping() error {
	if w.check != nil {
		if err := w.check(); err != nil {
			return fmt.Errorf("sdnotify: health check: %w", err)
		}
	}
	_, err := send(w.socket, WatchdogPing)
	return err
}
