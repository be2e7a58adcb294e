package push

import (
	"context"
	"log/slog"
	"math/rand/v2"
	"time"
)

// backoff doubles from min to max with "equal jitter" (half fixed, half
// random), and starts over after reset (a successful connection).
type backoff struct {
	min, max, cur time.Duration
}

func (b *backoff) next() time.Duration {
	if b.cur == 0 {
		b.cur = b.min
	} else {
		b.cur = min(2*b.cur, b.max)
	}
	half := b.cur / 2
	return half + rand.N(half+1)
}

func (b *backoff) reset() { b.cur = 0 }

// rateLog logs a repeating failure at most once per interval, with the
// number of occurrences since the last line.
type rateLog struct {
	every  time.Duration
	last   time.Time
	missed int
}

func (r *rateLog) log(l *slog.Logger, level slog.Level, msg string, args ...any) {
	if !r.last.IsZero() && time.Since(r.last) < r.every {
		r.missed++
		return
	}
	if r.missed > 0 {
		args = append(args, "repeated", r.missed)
	}
	l.Log(context.Background(), level, msg, args...)
	r.last, r.missed = time.Now(), 0
}

func (r *rateLog) reset() { r.last, r.missed = time.Time{}, 0 }
