package backoff

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
	"time"
)

type fakeClock struct{ t time.Time }

func (c *fakeClock) now() time.Time          { return c.t }
func (c *fakeClock) add(d time.Duration)     { c.t = c.t.Add(d) }
func newLogger(b *bytes.Buffer) *slog.Logger { return slog.New(slog.NewTextHandler(b, nil)) }
func lines(b *bytes.Buffer) []string         { return strings.Split(strings.TrimSpace(b.String()), "\n") }
func count(b *bytes.Buffer) int              { return strings.Count(b.String(), "\n") }
func last(b *bytes.Buffer) string            { l := lines(b); return l[len(l)-1] }

func TestDelay(t *testing.T) {
	d := Delay{Min: 100 * time.Millisecond, Max: time.Second}
	want := []time.Duration{100, 200, 400, 800, 1000, 1000}
	for i, w := range want {
		w *= time.Millisecond
		if got := d.Next(); got < w/2 || got > w {
			t.Fatalf("attempt %d: %v, want in [%v, %v]", i, got, w/2, w)
		}
	}
	d.Reset()
	if got := d.Next(); got > 100*time.Millisecond {
		t.Fatalf("after reset: %v", got)
	}
}

func TestLogThrottles(t *testing.T) {
	var b bytes.Buffer
	lg, c := newLogger(&b), &fakeClock{t: time.Unix(1000, 0)}
	l := Log{Every: 10 * time.Second, Level: slog.LevelWarn, clock: c.now}
	if !l.Log(lg, "a", "first") {
		t.Fatal("first line not written")
	}
	for range 5 {
		c.add(time.Second)
		if l.Log(lg, "a", "again") {
			t.Fatal("written within Every")
		}
	}
	if !l.Log(lg, "b", "other key") {
		t.Fatal("another key is throttled by the first")
	}
	c.add(5 * time.Second)
	if !l.Log(lg, "a", "later") || !strings.Contains(last(&b), "suppressed=5") || !strings.Contains(last(&b), "level=WARN") {
		t.Fatalf("after Every: %q", last(&b))
	}
	l.Reset("a")
	if !l.Log(lg, "a", "after reset") {
		t.Fatal("reset key throttled")
	}
	if count(&b) != 4 {
		t.Fatalf("%d lines:\n%s", count(&b), b.String())
	}
}

func TestStateOneLinePerChange(t *testing.T) {
	var b bytes.Buffer
	lg, c := newLogger(&b), &fakeClock{t: time.Unix(1000, 0)}
	s := State{Every: time.Minute, clock: c.now}
	if !s.Set(lg, slog.LevelWarn, "refused", "down", "err", "refused") {
		t.Fatal("first state not logged")
	}
	for range 59 { // retries every second: no line
		c.add(time.Second)
		if s.Set(lg, slog.LevelWarn, "refused", "down", "err", "refused") {
			t.Fatalf("repeat logged: %s", b.String())
		}
	}
	c.add(time.Second)
	if !s.Set(lg, slog.LevelWarn, "refused", "down") || !strings.Contains(last(&b), "repeated=60") || !strings.Contains(last(&b), "since=1m0s") {
		t.Fatalf("minute line: %q", last(&b))
	}
	c.add(time.Second)
	if !s.Set(lg, slog.LevelInfo, "up", "connected") || !strings.Contains(last(&b), "was=refused") || !strings.Contains(last(&b), "for=1m1s") {
		t.Fatalf("change line: %q", last(&b))
	}
	if s.Set(lg, slog.LevelInfo, "up", "connected") || s.Key() != "up" {
		t.Fatal("same state logged twice")
	}
	if count(&b) != 3 {
		t.Fatalf("%d lines:\n%s", count(&b), b.String())
	}
}

func TestGate(t *testing.T) {
	g := Gate{Delay: Delay{Min: 100 * time.Millisecond, Max: 400 * time.Millisecond}}
	now := time.Unix(1000, 0)
	if w := g.Wait(now); w != 0 {
		t.Fatalf("closed before any failure: %v", w)
	}
	for i, d := range []time.Duration{100, 200, 400, 400} {
		d *= time.Millisecond
		w := g.Failed(now)
		if w < d/2 || w > d || g.Wait(now) != w || g.Failures != i+1 {
			t.Fatalf("failure %d: wait %v (want in [%v, %v]), Wait %v, Failures %d", i+1, w, d/2, d, g.Wait(now), g.Failures)
		}
		if g.Wait(now.Add(w)) != 0 || g.Wait(now.Add(w/2)) != w-w/2 {
			t.Fatalf("failure %d: not open at the end of its wait", i+1)
		}
	}
	g.OK()
	if g.Wait(now) != 0 || g.Failures != 0 {
		t.Fatalf("after OK: wait %v, failures %d", g.Wait(now), g.Failures)
	}
	if w := g.Failed(now); w > 100*time.Millisecond {
		t.Fatalf("after OK the first wait is %v, want at most Min", w)
	}
}
