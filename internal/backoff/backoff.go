package backoff

import (
	"context"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"
)

// Delay doubles from Min to Max with "equal jitter" (half fixed, half
// random) and starts over after Reset (a successful connection).
type Delay struct {
	Min, Max time.Duration
	cur      time.Duration
}

// Next is the delay before the next attempt.
func (b *Delay) Next() time.Duration {
	if b.cur == 0 {
		b.cur = b.Min
	} else {
		b.cur = min(2*b.cur, b.Max)
	}
	half := b.cur / 2
	return half + rand.N(half+1)
}

// Reset starts over from Min.
func (b *Delay) Reset() { b.cur = 0 }

// Gate is a Delay with the time before which no attempt may be made (a
// dial, a port's reopen): Failed starts the next wait, Wait says what is
// left of it, OK opens the gate and starts the delays over. After the n-th
// consecutive failure the wait is a random time in [d/2, d] with
// d = min(Max, Min·2^(n-1)).
type Gate struct {
	Delay
	Failures int       // consecutive failures since the last OK
	Until    time.Time // no attempt before it (zero: go ahead)
}

// Failed counts a failure at now and returns the wait it starts.
func (g *Gate) Failed(now time.Time) time.Duration {
	g.Failures++
	d := g.Next()
	g.Until = now.Add(d)
	return d
}

// Wait is how long the caller must still wait at now (0: go ahead).
func (g *Gate) Wait(now time.Time) time.Duration {
	if now.Before(g.Until) {
		return g.Until.Sub(now)
	}
	return 0
}

// OK opens the gate after a success: the next failure waits Min again.
func (g *Gate) OK() {
	g.Reset()
	g.Failures, g.Until = 0, time.Time{}
}

// Log writes one line per key at most once per Every, with the number of
// lines it left out since the last one ("suppressed"). A flood of events
// costs a map lookup each, never a log line each. Keys are few and fixed
// (kinds of events, not client addresses).
type Log struct {
	Every time.Duration
	Level slog.Level // the level of every line (zero: Info; set Warn for trouble)

	mu    sync.Mutex
	keys  map[string]*logKey
	clock func() time.Time // nil: time.Now (tests set it)
}

type logKey struct {
	last  time.Time
	quiet int
}

// Log writes msg unless a line of key was written less than Every ago.
// It reports whether it wrote.
func (l *Log) Log(lg *slog.Logger, key, msg string, args ...any) bool {
	now := clockNow(l.clock)
	l.mu.Lock()
	if l.keys == nil {
		l.keys = make(map[string]*logKey)
	}
	k := l.keys[key]
	if k == nil {
		k = &logKey{}
		l.keys[key] = k
	} else if now.Sub(k.last) < l.Every {
		k.quiet++
		l.mu.Unlock()
		return false
	}
	n := k.quiet
	k.last, k.quiet = now, 0
	l.mu.Unlock()
	if n > 0 {
		args = append(args, "suppressed", n)
	}
	lg.Log(context.Background(), l.Level, msg, args...)
	return true
}

// Reset forgets key: its next event is logged at once.
func (l *Log) Reset(key string) {
	l.mu.Lock()
	delete(l.keys, key)
	l.mu.Unlock()
}

// State logs the changes of one state (a link: connected, refused for a
// reason, …): one line when the state changes, nothing while it repeats
// except, at most once per Every, a line saying it still holds with the
// number of repeats since the last line. A state is named by its key
// (e.g. the error text); the line says how long the previous state held.
type State struct {
	Every time.Duration // 0: one minute

	mu      sync.Mutex
	key     string
	since   time.Time // when the current state began
	line    time.Time // when its last line was written
	repeats int       // reports of it since that line
	clock   func() time.Time
}

func clockNow(f func() time.Time) time.Time {
	if f != nil {
		return f()
	}
	return time.Now()
}

// Set reports the state named key. When key differs from the current
// state, msg is logged at level at once (with "was" = the previous state's
// key and "for" = how long it held); when it is the same, the report is
// counted and, once Every has passed since the last line, msg is logged
// again with "repeated" = the count and "since" = how long it has held.
// It reports whether it wrote a line.
func (s *State) Set(lg *slog.Logger, level slog.Level, key, msg string, args ...any) bool {
	now := clockNow(s.clock)
	every := s.Every
	if every <= 0 {
		every = time.Minute
	}
	s.mu.Lock()
	if s.since.IsZero() || key != s.key {
		prev, held := s.key, now.Sub(s.since)
		first := s.since.IsZero()
		s.key, s.since, s.line, s.repeats = key, now, now, 0
		s.mu.Unlock()
		if !first && prev != "" {
			args = append(args, "was", prev, "for", held.Round(time.Second))
		}
		lg.Log(context.Background(), level, msg, args...)
		return true
	}
	s.repeats++
	if now.Sub(s.line) < every {
		s.mu.Unlock()
		return false
	}
	n, since := s.repeats, s.since
	s.line, s.repeats = now, 0
	s.mu.Unlock()
	args = append(args, "repeated", n, "since", now.Sub(since).Round(time.Second))
	lg.Log(context.Background(), level, msg, args...)
	return true
}

// Key is the current state's key ("" before the first Set).
func (s *State) Key() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.key
}
