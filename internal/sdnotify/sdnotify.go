package sdnotify

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/coreos/go-systemd/v22/daemon"
)

// States understood by systemd (sd_notify(3)), as go-systemd spells them.
const (
	Ready        = daemon.SdNotifyReady    // start-up finished (Type=notify)
	Stopping     = daemon.SdNotifyStopping // shutdown began
	WatchdogPing = daemon.SdNotifyWatchdog // keep-alive ping (WatchdogSec=)
)

// Status is the free-form one-line status systemctl shows.
func Status(msg string) string {
	return "STATUS=" + strings.ReplaceAll(msg, "\n", " ")
}

// Reloading is the state sent when a SIGHUP reload begins; send Ready when
// it has finished. MONOTONIC_USEC is required by Type=notify-reload and
// harmless otherwise (go-systemd leaves it to the caller).
func Reloading() string {
	usec, ok := monotonicUsec()
	if !ok {
		return daemon.SdNotifyReloading
	}
	return daemon.SdNotifyReloading + "\nMONOTONIC_USEC=" + strconv.FormatInt(usec, 10)
}

// Config configures a Watchdog. The zero value means: period half of
// $WATCHDOG_USEC, no health check, no log.
type Config struct {
	// Interval between pings. Zero: half of the watchdog period systemd set
	// ($WATCHDOG_USEC for this process). When it is zero and no watchdog is
	// configured, Run only waits for its context.
	Interval time.Duration
	// Check, when set, is called before every ping; an error skips the ping
	// (so systemd restarts a gateway whose main loop is stuck) and is logged.
	Check func() error
	// Logger for send and check failures; nil discards.
	Logger *slog.Logger
}

// Watchdog pings systemd's watchdog ("WATCHDOG=1") from Run, after a health
// check: that check is what go-systemd does not do for us.
type Watchdog struct {
	interval time.Duration
	check    func() error
	log      *slog.Logger
}

// New fills defaults from the environment. It starts no goroutine.
func New(cfg Config) *Watchdog {
	w := &Watchdog{interval: cfg.Interval, check: cfg.Check, log: cfg.Logger}
	if w.interval <= 0 {
		if d, err := daemon.SdWatchdogEnabled(false); err == nil && d > 0 {
			w.interval = d / 2
		}
	}
	if w.log == nil {
		w.log = slog.New(slog.DiscardHandler)
	}
	return w
}

// Interval is the ping period (zero when no watchdog is set up).
func (w *Watchdog) Interval() time.Duration { return w.interval }

// Notify sends state to $NOTIFY_SOCKET. It reports false and no error when
// the variable is unset (not started by systemd, or NotifyAccess=none).
func (w *Watchdog) Notify(state string) (bool, error) {
	ok, err := daemon.SdNotify(false, state)
	if err != nil {
		return false, fmt.Errorf("sdnotify: send %q: %w", firstLine(state), err)
	}
	return ok, nil
}

func firstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	return s
}

// Run pings once at start and then every interval until ctx ends; it
// returns nil then. Send and check failures are logged (at most once per
// failure streak) and do not stop the loop: a missed ping is what tells
// systemd to restart us. Without a watchdog, Run just waits for ctx.
func (w *Watchdog) Run(ctx context.Context) error {
	if w.interval <= 0 {
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
	_, err := w.Notify(WatchdogPing)
	return err
}
