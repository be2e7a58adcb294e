package web

import (
	"math"
	"net/http"
	"net/netip"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"
)

// Rate limits per client IP and route class.
//
//	429 {"error":"…"} with Retry-After: <seconds>

// Rate is a token bucket: PerSec tokens per second, at most Burst saved.
// A negative PerSec turns the limit off; zero fields take the defaults.
type Rate struct {
	PerSec float64
	Burst  int
}

// RateLimits bounds each client IP. What costs is counted: a request by a
// token of its class's bucket, checked before any other work on the request
// (parsing credentials, hashing a password, reading the ring); a held
// connection (a WebSocket, a waiting long poll) by a slot of the client's
// ConnsPerClient while it is open, never by a token per second.
//
//	Poll     GET /api/shortPolling, and a long poll answered with the full snapshot
//	         (lastSequence 0, or older than the ring)
//	Read     the page, its assets, /api/devices, status, history, trends, preflights
//	Connect  WebSocket upgrades (then the connection holds a slot)
//	Monitor  /metrics and /healthz
//	Write    POST /api/write
//	Auth     failed authentications, and password verifications (a PBKDF2 of basic
//	         credentials not in the cache): guessing runs into 429 after a few tries
//
// The defaults serve, from one host (a SCADA server, an HMI server, a
// reverse proxy), 1000 WebSocket clients, 100 long pollers and 50 short
// pollers at 10 Hz at once, with room to spare; a client hammering
// shortPolling with no pause is still refused beyond 1000/s.
//
// Loopback clients are limited like any other unless ExemptLoopback is set.
// Behind a reverse proxy, list it in Config.TrustedProxies so that the
// limits apply to each real client (X-Forwarded-For).
type RateLimits struct {
	Poll           Rate // 1000/s, burst 1000
	Read           Rate // 100/s, burst 400
	Connect        Rate // 200/s, burst 2000
	Monitor        Rate // 5/s, burst 20
	Write          Rate // 2/s, burst 5
	Auth           Rate // 0.5/s, burst 5
	ConnsPerClient int  // WebSocket connections plus waiting long polls per client IP (2000); negative: no limit
	ExemptLoopback bool // loopback clients are not limited
	Clients        int  // client IPs tracked (4096); beyond it the unknown ones share one bucket

	// Hold: a 429 is sent after this delay (500ms; negative: at once), so
	// that a client looping on its refusals costs a few replies a second,
	// not thousands. At most MaxHeld (256) replies are held at once; beyond
	// that they go at once with Connection: close.
	Hold    time.Duration
	MaxHeld int

	// Password hashing (basic auth) is the one expensive step a client can
	// cause; polling must keep its CPU. At most HashConcurrency (1)
	// verifications run at once, and they may use at most HashCPU (0.1) of
	// one core over time (1 s of hashing saved at most); beyond either a
	// client gets 429 and the request costs nothing more.
	HashConcurrency int
	HashCPU         float64 // negative: no CPU budget
}

// Defaults of RateLimits.
var (
	DefaultPollRate    = Rate{PerSec: 1000, Burst: 1000}
	DefaultReadRate    = Rate{PerSec: 100, Burst: 400}
	DefaultConnectRate = Rate{PerSec: 200, Burst: 2000}
	DefaultMonitorRate = Rate{PerSec: 5, Burst: 20}
	DefaultWriteRate   = Rate{PerSec: 2, Burst: 5}
	DefaultAuthRate    = Rate{PerSec: 0.5, Burst: 5}
)

const (
	DefaultConnsPerClient = 2000
	DefaultHold           = 500 * time.Millisecond
	DefaultHashCPU        = 0.1
)

func (r *Rate) fill(def Rate) {
	if r.PerSec == 0 {
		r.PerSec = def.PerSec
	}
	if r.Burst <= 0 {
		r.Burst = def.Burst
		if r.PerSec > 0 && float64(r.Burst) < r.PerSec {
			r.Burst = int(math.Ceil(r.PerSec))
		}
	}
}

func (c *RateLimits) fill() {
	c.Poll.fill(DefaultPollRate)
	c.Read.fill(DefaultReadRate)
	c.Connect.fill(DefaultConnectRate)
	c.Monitor.fill(DefaultMonitorRate)
	c.Write.fill(DefaultWriteRate)
	c.Auth.fill(DefaultAuthRate)
	if c.ConnsPerClient == 0 {
		c.ConnsPerClient = DefaultConnsPerClient
	}
	if c.Clients <= 0 {
		c.Clients = 4096
	}
	if c.Hold == 0 {
		c.Hold = DefaultHold
	}
	if c.MaxHeld <= 0 {
		c.MaxHeld = 256
	}
	if c.HashConcurrency <= 0 {
		c.HashConcurrency = 1
	}
	if c.HashCPU == 0 {
		c.HashCPU = DefaultHashCPU
	}
}

// Request classes of the rate limiter.
const (
	classPoll = iota
	classRead
	classConnect
	classMonitor
	classWrite
	classAuth
	nClasses
)

var classNames = [nClasses]string{classPoll: "poll", classRead: "read", classConnect: "connect",
	classMonitor: "monitor", classWrite: "write", classAuth: "auth"}

func (c *RateLimits) rate(class int) Rate {
	switch class {
	case classPoll:
		return c.Poll
	case classConnect:
		return c.Connect
	case classMonitor:
		return c.Monitor
	case classWrite:
		return c.Write
	case classAuth:
		return c.Auth
	}
	return c.Read
}

// limiter holds one token bucket per class and client IP.
type limiter struct {
	cfg     RateLimits
	mu      sync.Mutex
	clients map[netip.Addr]*[nClasses]*rate.Limiter
	limited [nClasses]atomic.Uint64
}

func newLimiter(cfg RateLimits) *limiter {
	cfg.fill()
	return &limiter{cfg: cfg, clients: make(map[netip.Addr]*[nClasses]*rate.Limiter)}
}

// allow takes one token of class for ip; when there is none it returns the
// time until there is.
func (l *limiter) allow(ip netip.Addr, class int, now time.Time) (bool, time.Duration) {
	rt := l.cfg.rate(class)
	if rt.PerSec < 0 || (ip.IsLoopback() && l.cfg.ExemptLoopback) {
		return true, 0
	}
	l.mu.Lock()
	b := l.clients[ip]
	if b == nil {
		if len(l.clients) >= l.cfg.Clients {
			l.sweep(now)
		}
		if len(l.clients) >= l.cfg.Clients {
			ip = netip.Addr{} // the overflow bucket, shared
			b = l.clients[ip]
		}
		if b == nil {
			b = new([nClasses]*rate.Limiter)
			for c := range nClasses {
				if r := l.cfg.rate(c); r.PerSec > 0 {
					b[c] = rate.NewLimiter(rate.Limit(r.PerSec), r.Burst)
				}
			}
			l.clients[ip] = b
		}
	}
	lim := b[class]
	l.mu.Unlock()
	if lim.AllowN(now, 1) {
		return true, 0
	}
	l.limited[class].Add(1)
	wait := time.Duration((1 - lim.TokensAt(now)) / rt.PerSec * float64(time.Second))
	return false, wait
}

// sweep forgets clients whose buckets are full again (they lose nothing).
func (l *limiter) sweep(now time.Time) {
	for ip, b := range l.clients {
		full := true
		for _, lim := range b {
			if lim != nil && lim.TokensAt(now) < float64(lim.Burst()) {
				full = false
			}
		}
		if full {
			delete(l.clients, ip)
		}
	}
}

// limit refuses a request beyond its client's rate of class with 429 +
// Retry-After, before anything else is done for it.
func (s *Server) limit(class int, next http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if !s.admit(w, r, class) {
			return
		}
		next(w, r)
	}
}

func (s *Server) admit(w http.ResponseWriter, r *http.Request, class int) bool {
	ip := s.clientIP(r)
	ok, wait := s.lim.allow(ip, class, time.Now())
	if ok {
		return true
	}
	s.rlog.Log(s.log, "rate limit "+classNames[class], "web: client over its rate limit", "client", ip.String(), "class", classNames[class])
	s.tooMany(w, r, wait, "too many "+classNames[class]+" requests from "+ip.String())
	return false
}

// tooMany answers 429 with Retry-After (whole seconds, at least 1), after
// holding the reply for RateLimits.Hold.
func (s *Server) tooMany(w http.ResponseWriter, r *http.Request, wait time.Duration, msg string) {
	secs := max(1, int(math.Ceil(wait.Seconds())))
	w.Header().Set("Retry-After", strconv.Itoa(secs))
	s.hold(w, r)
	writeError(w, http.StatusTooManyRequests, msg+"; retry in "+strconv.Itoa(secs)+"s")
}

func (s *Server) hold(w http.ResponseWriter, r *http.Request) {
	d := s.lim.cfg.Hold
	if d <= 0 {
		return
	}
	if s.held.Add(1) > int64(s.lim.cfg.MaxHeld) {
		s.held.Add(-1)
		w.Header().Set("Connection", "close")
		return
	}
	defer s.held.Add(-1)
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-r.Context().Done():
	case <-s.shutdown:
	}
}

// refusedJSON is /api/status's "refused": every request the server turned
// away since start, by cause (the same counters as /metrics).
//
//	"refused":{"rate_limited":{"poll":0,"read":0,"connect":0,"monitor":0,"write":0,"auth":0,"hash":0},
//	           "connections_per_client":0,"forbidden":0,"unauthorized":0,"max_clients":0,"max_conns":0,"too_large":0}
type refusedJSON struct {
	RateLimited struct {
		Poll    uint64 `json:"poll"`
		Read    uint64 `json:"read"`
		Connect uint64 `json:"connect"`
		Monitor uint64 `json:"monitor"`
		Write   uint64 `json:"write"`
		Auth    uint64 `json:"auth"`
		Hash    uint64 `json:"hash"`
	} `json:"rate_limited"`
	ConnsPerClient uint64 `json:"connections_per_client"` // 429: the client held its ConnsPerClient
	Forbidden      uint64 `json:"forbidden"`              // 403: outside AllowedNetworks
	Unauthorized   uint64 `json:"unauthorized"`           // 401
	MaxClients     uint64 `json:"max_clients"`            // 503 beyond MaxClients, every method
	MaxConns       uint64 `json:"max_conns"`              // closed at accept beyond MaxConns
	TooLarge       uint64 `json:"too_large"`              // 413/431
}

func refused(st ClientStats) refusedJSON {
	var j refusedJSON
	rl := &j.RateLimited
	rl.Poll, rl.Read, rl.Connect = st.RateLimitedPoll, st.RateLimitedRead, st.RateLimitedConnect
	rl.Monitor, rl.Write, rl.Auth, rl.Hash = st.RateLimitedMonitor, st.RateLimitedWrite, st.RateLimitedAuth, st.HashRefused
	j.ConnsPerClient, j.Forbidden, j.Unauthorized = st.ConnsPerClientLimited, st.Forbidden, st.AuthFailures
	j.MaxClients = st.ShortPolling.Rejected + st.LongPolling.Rejected + st.WebSocket.Rejected
	j.MaxConns, j.TooLarge = st.ConnsRefused, st.TooLarge
	return j
}
