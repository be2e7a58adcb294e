package mbserver_test

import (
	"strings"
	"testing"
	"time"

	"edgegw/stats"
)

func snapshots(es []stats.Entry) map[string]stats.Snapshot {
	out := map[string]stats.Snapshot{}
	for _, e := range es {
		out[e.Info.Name] = e.Stats.Snapshot()
	}
	return out
}

// checkWindows: the named devices' polls kept their windows, counting a
// window lost to the device (a poll with a timeout or error: a stalled
// machine, for a live pty slave) apart from one lost to the scheduler
// (overrun, or a poll without any failed request that ended late), and
// both apart from the machine's: control is a device on a line of its own
// that no pass-through request touches, polled alike meanwhile. A stall of
// the shared machine costs the control windows too, as either kind (a
// timeout there, an overrun here), so the pass-through may cost the shared
// devices no more scheduler windows than the control lost in all, plus
// 0.5% (at least one window of a short run), and no more windows in all
// than the control plus 5% (at least two).
// It returns the requests that failed on the shared line meanwhile (names
// and the other devices of the line: timeouts and errors, each holding
// the line for a whole timeout).
func checkWindows(t *testing.T, before, after map[string]stats.Snapshot, names []string, control string, line ...string) (stalls uint64) {
	t.Helper()
	losses := func(n string) (windows, device, sched uint64) {
		a, b := after[n], before[n]
		windows = (a.Polls - b.Polls) + (a.Overruns - b.Overruns)
		lost := windows - min(windows, a.GoodPolls-b.GoodPolls)
		device = min(lost, (a.Timeouts-b.Timeouts)+(a.Errors-b.Errors))
		sched = lost - device
		t.Logf("%s: %d windows, %d good, lost %d to the device (timeouts %d, errors %d), %d to the scheduler (overruns %d)",
			n, windows, a.GoodPolls-b.GoodPolls, device, a.Timeouts-b.Timeouts, a.Errors-b.Errors, sched, a.Overruns-b.Overruns)
		return windows, device, sched
	}
	_, baseDev, baseSched := losses(control)
	base := baseDev + baseSched
	for _, n := range names {
		windows, device, sched := losses(n)
		if windows == 0 {
			t.Errorf("%s: no windows", n)
			continue
		}
		if float64(sched) > float64(base)+max(1, 0.005*float64(windows)) {
			t.Errorf("%s: the scheduler lost %d of %d windows, the control device %d in all: the pass-through cost more than 0.5%%", n, sched, windows, base)
		}
		if float64(device+sched) > float64(base)+max(2, 0.05*float64(windows)) {
			t.Errorf("%s: lost %d of %d windows, the control device %d: more than 5%% more", n, device+sched, windows, base)
		}
	}
	for _, n := range append(names, line...) {
		stalls += (after[n].Timeouts - before[n].Timeouts) + (after[n].Errors - before[n].Errors)
	}
	return stalls
}

// checkWaits: the wait's p99 is within one poll cycle (two when requests
// timed out on the line), and pass-through
// requests waited for at most one poll: two clients' requests may wait
// together, and the second waits for the next poll when the gap before it
// is shorter than the device's timeout (at most 2% of them); a request
// that timed out (stalls: on the shared line, polls and pass-through
// alike) held the line for its whole timeout and may push two more past a
// poll.
func checkWaits(t *testing.T, st *stats.ModbusServer, cycle time.Duration, stalls uint64) {
	t.Helper()
	s := st.Snapshot()
	n := s.WaitPolls[0] + s.WaitPolls[1] + s.WaitPolls[2] + s.WaitPolls[3]
	p50, p99 := time.Duration(s.Wait.Quantile(0.5))*time.Microsecond, time.Duration(s.Wait.Quantile(0.99))*time.Microsecond
	t.Logf("pass-through: %d requests; wait p50 %v p99 %v; waited 0/1/2/3+ polls: %v; busy %d; exceptions %v",
		n, p50, p99, s.WaitPolls, s.Busy, s.Exceptions)
	if n == 0 {
		t.Fatal("no pass-through request measured")
	}
	stalls += s.Exceptions[0x0B]
	if more := s.WaitPolls[2] + s.WaitPolls[3]; more > n/50+2*stalls {
		t.Errorf("%d of %d requests waited for more than one poll (%d for three or more; %d requests timed out on the line)", more, n, s.WaitPolls[3], stalls)
	}
	limit := cycle
	if stalls > 0 { // each held the line for a whole timeout: a loaded machine
		limit = 2 * cycle
	}
	if p99 > limit {
		t.Errorf("wait p99 %v > %v (one poll cycle, two with %d requests timed out on the line)", p99, limit, stalls)
	}
}

func tail(s string) string {
	if len(s) > 2000 {
		return "…" + s[len(s)-2000:]
	}
	return s
}

func lastLines(s string, n int) string {
	ls := strings.Split(strings.TrimSpace(s), "\n")
	if len(ls) > n {
		ls = ls[len(ls)-n:]
	}
	return strings.Join(ls, " | ")
}
