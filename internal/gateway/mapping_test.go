package gateway

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"edgegw/conf"
	"edgegw/ringstore"
	"edgegw/web"
)

// The ring's default size follows the poll rate: 60 s of samples, at most
// [ring] max_bytes (8 MiB) of them; [ring] size wins when set.
func TestRingSizeByRate(t *testing.T) {
	mk := func(n int, interval time.Duration, size int) *conf.Config {
		var b strings.Builder
		if size > 0 {
			fmt.Fprintf(&b, "[ring]\nsize = %d\n", size)
		}
		for i := range n {
			fmt.Fprintf(&b, "[[device]]\nname = \"l%d\"\ntransport = \"udp\"\naddress = \"127.0.0.1:%d\"\ninterval = %q\ntimeout = \"50ms\"\n"+
				"tags = [ { name = \"a\", address = 0 }, { name = \"b\", address = 1 } ]\n", i, 1000+i, interval)
		}
		c, err := conf.Parse("t.toml", []byte(b.String()))
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	capN := conf.DefaultRingMax / ringstore.SlotBytes
	for _, c := range []struct {
		name     string
		cfg      *conf.Config
		size     int
		windowS  float64
		approxWS bool
	}{
		{"48 loggers × 2 tags at 1 s", mk(48, time.Second, 0), 5760, 60, false},
		{"1 logger at 1 s: the floor of 200", mk(1, time.Second, 0), 200, 100, false},
		{"1000 loggers × 2 tags at 100 ms: the 8 MiB cap", mk(1000, 100*time.Millisecond, 0), capN, float64(capN) / 20000, true},
		{"[ring] size set", mk(48, time.Second, 1000), 1000, 1000.0 / 96, true},
	} {
		n, w := ringSize(c.cfg)
		if n != c.size || (c.approxWS && (w.Seconds() < c.windowS-0.01 || w.Seconds() > c.windowS+0.01)) || (!c.approxWS && w.Seconds() != c.windowS) {
			t.Errorf("%s: %d samples, %v; want %d, %.2f s", c.name, n, w, c.size, c.windowS)
		}
		t.Logf("%s: %d samples (%d bytes), resume window %.1f s", c.name, n, n*ringstore.SlotBytes, w.Seconds())
	}
	big := mk(1000, 100*time.Millisecond, 0)
	big.Ring.MaxBytes = 16 << 20
	if n, w := ringSize(big); n != 16<<20/ringstore.SlotBytes || w.Seconds() < float64(n)/20000-0.01 || w.Seconds() > float64(n)/20000+0.01 {
		t.Errorf("1000 loggers × 2 tags at 100 ms, max_bytes 16 MiB: %d samples, %v; want %d", n, w, 16<<20/ringstore.SlotBytes)
	}
	big.Ring.MaxBytes = 32 << 20 // 60 s of 20,000 samples a second fit
	if n, w := ringSize(big); n != 1_200_000 || w != time.Minute {
		t.Errorf("1000 loggers × 2 tags at 100 ms, max_bytes 32 MiB: %d samples, %v; want 1200000, 60 s", n, w)
	}
	c, err := conf.Parse("t.toml", []byte("[ring]\nmax_bytes = \"32MiB\"\n"))
	if err != nil || c.Ring.MaxBytes != 32<<20 {
		t.Fatalf("[ring] max_bytes = \"32MiB\": %v, %d", err, c.Ring.MaxBytes)
	}
}

// [http.limits] maps onto web's RateLimits key by key: absent keys stay
// zero (web's defaults), -1 stays negative (no limit).
func TestWebLimitsMapping(t *testing.T) {
	c, err := conf.Parse("t.toml", []byte("[http]\nexempt_loopback = true\n[http.limits]\npoll_rate = 2500\npoll_burst = 3000\n"+
		"read_rate = 7\nconnect_burst = 9\nmonitor_rate = -1\nwrite_rate = 1\nwrite_burst = 2\nauth_rate = 0.25\nconnections_per_client = 10\n"))
	if err != nil {
		t.Fatal(err)
	}
	got := webLimits(c.HTTP)
	want := web.RateLimits{
		Poll: web.Rate{PerSec: 2500, Burst: 3000}, Read: web.Rate{PerSec: 7}, Connect: web.Rate{Burst: 9},
		Monitor: web.Rate{PerSec: -1}, Write: web.Rate{PerSec: 1, Burst: 2}, Auth: web.Rate{PerSec: 0.25},
		ConnsPerClient: 10, ExemptLoopback: true,
	}
	if got != want {
		t.Errorf("got  %+v\nwant %+v", got, want)
	}
}

// web's fallbacks for a zero Config are conf's defaults: a test or bench
// that leaves a field zero serves like the gateway with that key absent.
func TestWebFallbacksAreConfDefaults(t *testing.T) {
	for _, c := range []struct {
		key       string
		web, conf any
	}{
		{"[http] listen", web.DefaultListen, conf.DefaultHTTPListen},
		{"[http] long_poll_timeout", web.DefaultLongPollTimeout, conf.DefaultLongPollTimeout},
		{"[http] max_clients", web.DefaultMaxClients, conf.DefaultMaxClients},
		{"[http] max_request_bytes", int64(web.DefaultMaxRequestBytes), int64(conf.DefaultMaxRequestBytes)},
		{"[http] read_header_timeout", web.DefaultReadHeaderTimeout, conf.DefaultReadHeaderTimeout},
		{"[http] idle_timeout", web.DefaultIdleTimeout, conf.DefaultIdleTimeout},
	} {
		if c.web != c.conf {
			t.Errorf("%s: web falls back to %v, conf's default is %v", c.key, c.web, c.conf)
		}
	}
}
