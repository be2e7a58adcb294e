package web

import (
	"crypto/pbkdf2"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Access control, rate limits and connection bounds.
//
//	Authorization: Bearer <token>            read token (API, page) or write token (writes; reads too)
//	Authorization: Basic base64(user:pass)   page and API reads only, never writes (browsers attach
//	                                         it to every request of the origin: a CSRF vector)
//	401 {"error":"…"} with WWW-Authenticate: Bearer realm="edgegw" (and Basic realm="edgegw" when set)
//	429 {"error":"…"} with Retry-After: <seconds>

// Rate is a token bucket: PerSec tokens per second, at most Burst saved.
// A negative PerSec turns the limit off; zero fields take the defaults.
type Rate struct {
	PerSec float64
	Burst  int
}

// RateLimits bounds the expensive requests of each client IP: Read counts
// shortPolling, longPolling, devices and WebSocket upgrades; Write counts
// writes and failed authentications. Loopback clients (the gateway's own
// host: bench, demo, a local reverse proxy) are exempt unless Loopback is
// set.
type RateLimits struct {
	Read     Rate // 20/s, burst 40
	Write    Rate // 2/s, burst 5
	Loopback bool // limit loopback clients too
	Clients  int  // client IPs tracked (4096); beyond it the unknown ones share one bucket
}

// Defaults of RateLimits.
var (
	DefaultReadRate  = Rate{PerSec: 20, Burst: 40}
	DefaultWriteRate = Rate{PerSec: 2, Burst: 5}
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

// Request classes of the rate limiter.
const (
	classRead = iota
	classWrite
	nClasses
)

var classNames = [nClasses]string{classRead: "read", classWrite: "write"}

type buckets struct {
	tokens [nClasses]float64
	last   time.Time
}

// limiter holds one pair of token buckets per client IP.
type limiter struct {
	cfg     RateLimits
	mu      sync.Mutex
	clients map[netip.Addr]*buckets
	limited [nClasses]atomic.Uint64
}

func newLimiter(cfg RateLimits) *limiter {
	cfg.Read.fill(DefaultReadRate)
	cfg.Write.fill(DefaultWriteRate)
	if cfg.Clients <= 0 {
		cfg.Clients = 4096
	}
	return &limiter{cfg: cfg, clients: make(map[netip.Addr]*buckets)}
}

func (l *limiter) rate(class int) Rate {
	if class == classWrite {
		return l.cfg.Write
	}
	return l.cfg.Read
}

// allow takes one token of class for ip; when there is none it returns the
// time until there is.
func (l *limiter) allow(ip netip.Addr, class int, now time.Time) (bool, time.Duration) {
	rt := l.rate(class)
	if rt.PerSec < 0 || (ip.IsLoopback() && !l.cfg.Loopback) {
		return true, 0
	}
	l.mu.Lock()
	defer l.mu.Unlock()
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
			b = &buckets{last: now}
			b.tokens[classRead] = float64(l.cfg.Read.Burst)
			b.tokens[classWrite] = float64(l.cfg.Write.Burst)
			l.clients[ip] = b
		}
	}
	l.refill(b, now)
	if b.tokens[class] >= 1 {
		b.tokens[class]--
		return true, 0
	}
	l.limited[class].Add(1)
	wait := time.Duration((1 - b.tokens[class]) / rt.PerSec * float64(time.Second))
	return false, wait
}

func (l *limiter) refill(b *buckets, now time.Time) {
	dt := now.Sub(b.last).Seconds()
	if dt <= 0 {
		return
	}
	b.last = now
	for c := range nClasses {
		rt := l.rate(c)
		if rt.PerSec > 0 {
			b.tokens[c] = min(float64(rt.Burst), b.tokens[c]+dt*rt.PerSec)
		}
	}
}

// sweep forgets clients whose buckets are full again (they lose nothing).
func (l *limiter) sweep(now time.Time) {
	for ip, b := range l.clients {
		l.refill(b, now)
		full := true
		for c := range nClasses {
			if rt := l.rate(c); rt.PerSec > 0 && b.tokens[c] < float64(rt.Burst) {
				full = false
			}
		}
		if full {
			delete(l.clients, ip)
		}
	}
}

// clientIP is the peer address (forwarding headers are not trusted).
func clientIP(r *http.Request) netip.Addr {
	ap, err := netip.ParseAddrPort(r.RemoteAddr)
	if err != nil {
		return netip.Addr{}
	}
	return ap.Addr().Unmap()
}

// limit refuses a request beyond its client's rate with 429 + Retry-After.
func (s *Server) limit(class int, next http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if !s.admit(w, r, class) {
			return
		}
		next(w, r)
	}
}

func (s *Server) admit(w http.ResponseWriter, r *http.Request, class int) bool {
	ip := clientIP(r)
	ok, wait := s.lim.allow(ip, class, time.Now())
	if ok {
		return true
	}
	secs := max(1, int(math.Ceil(wait.Seconds())))
	w.Header().Set("Retry-After", strconv.Itoa(secs))
	s.rlog.log(s.log, "rate limit "+classNames[class], "web: client over its rate limit", "client", ip.String(), "class", classNames[class])
	writeError(w, http.StatusTooManyRequests, "too many "+classNames[class]+" requests from "+ip.String()+"; retry in "+strconv.Itoa(secs)+"s")
	return false
}

// tokenEqual compares in constant time (for equal lengths; the length of a
// configured token is not a secret worth hiding).
func tokenEqual(got, want string) bool {
	return want != "" && subtle.ConstantTimeCompare([]byte(got), []byte(want)) == 1
}

func bearer(r *http.Request) (string, bool) {
	h := r.Header.Get("Authorization")
	if len(h) < 7 || !strings.EqualFold(h[:7], "bearer ") {
		return "", false
	}
	return strings.TrimSpace(h[7:]), true
}

// readProtected reports whether reads need credentials.
func (s *Server) readProtected() bool {
	return s.cfg.ReadToken != "" || s.basic != nil
}

// readAuthorized: the read token, the write token, or basic credentials.
func (s *Server) readAuthorized(r *http.Request) bool {
	if tok, ok := bearer(r); ok {
		return tokenEqual(tok, s.cfg.ReadToken) || tokenEqual(tok, s.cfg.WriteToken)
	}
	if s.basic != nil {
		if u, p, ok := r.BasicAuth(); ok {
			return s.basic.check(u, p)
		}
	}
	return false
}

// readAuth guards the page and the API when a read token or basic auth is set.
func (s *Server) readAuth(next http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if s.readProtected() && !s.readAuthorized(r) {
			msg := "credentials required: Authorization: Bearer <read token>"
			if s.basic != nil {
				msg += " or basic auth"
			}
			s.unauthorized(w, r, msg)
			return
		}
		next(w, r)
	}
}

// unauthorized answers 401 and charges the client's write bucket, so that
// guessing tokens runs into 429 after a few tries.
func (s *Server) unauthorized(w http.ResponseWriter, r *http.Request, msg string) {
	s.authFailures.Add(1)
	if !s.admit(w, r, classWrite) {
		return
	}
	s.rlog.log(s.log, "auth", "web: request without valid credentials", "client", clientIP(r).String(), "path", r.URL.Path)
	w.Header().Set("WWW-Authenticate", `Bearer realm="edgegw"`)
	if s.basic != nil {
		w.Header().Add("WWW-Authenticate", `Basic realm="edgegw", charset="UTF-8"`)
	}
	writeError(w, http.StatusUnauthorized, msg)
}

// Basic auth passwords are stored as PBKDF2-HMAC-SHA256 hashes:
//
//	pbkdf2-sha256$<iterations>$<salt, base64 raw std>$<32-byte key, base64 raw std>
const hashPrefix = "pbkdf2-sha256$"

// DefaultHashIterations is what HashPassword uses when given 0.
const DefaultHashIterations = 100_000

// HashPassword returns the stored form of a basic-auth password.
func HashPassword(password string, iterations int) (string, error) {
	if iterations <= 0 {
		iterations = DefaultHashIterations
	}
	salt := make([]byte, 16)
	if _, err := rand.Read(salt); err != nil {
		return "", fmt.Errorf("web: salt: %w", err)
	}
	key, err := pbkdf2.Key(sha256.New, password, salt, iterations, 32)
	if err != nil {
		return "", fmt.Errorf("web: hash: %w", err)
	}
	enc := base64.RawStdEncoding
	return hashPrefix + strconv.Itoa(iterations) + "$" + enc.EncodeToString(salt) + "$" + enc.EncodeToString(key), nil
}

// basicAuth checks basic credentials. Verifying a PBKDF2 hash is slow on
// purpose; a browser sends the credentials with every request, so the
// digests of credentials that were right once are remembered (a few).
type basicAuth struct {
	user  string
	iter  int
	salt  []byte
	key   []byte
	mu    sync.Mutex
	known map[[32]byte]bool // sha256(user\x00password) of accepted credentials
}

func parseBasic(user, hash string) (*basicAuth, error) {
	if user == "" && hash == "" {
		return nil, nil
	}
	if user == "" || hash == "" {
		return nil, errors.New("web: basic auth needs both a user and a password hash")
	}
	parts := strings.Split(strings.TrimPrefix(hash, hashPrefix), "$")
	if !strings.HasPrefix(hash, hashPrefix) || len(parts) != 3 {
		return nil, errors.New("web: basic auth password hash: want pbkdf2-sha256$<iterations>$<salt>$<key> (edgegw hash-password)")
	}
	iter, err := strconv.Atoi(parts[0])
	if err != nil || iter < 1000 {
		return nil, fmt.Errorf("web: basic auth password hash: iterations %q: want at least 1000", parts[0])
	}
	enc := base64.RawStdEncoding
	salt, err1 := enc.DecodeString(parts[1])
	key, err2 := enc.DecodeString(parts[2])
	if err1 != nil || err2 != nil || len(salt) < 8 || len(key) != 32 {
		return nil, errors.New("web: basic auth password hash: bad salt or key encoding")
	}
	return &basicAuth{user: user, iter: iter, salt: salt, key: key, known: make(map[[32]byte]bool)}, nil
}

func (b *basicAuth) check(user, password string) bool {
	d := sha256.Sum256([]byte(user + "\x00" + password))
	b.mu.Lock()
	ok := b.known[d]
	b.mu.Unlock()
	if ok {
		return true
	}
	key, err := pbkdf2.Key(sha256.New, password, b.salt, b.iter, len(b.key))
	if err != nil {
		return false
	}
	userOK := subtle.ConstantTimeCompare([]byte(user), []byte(b.user))
	if subtle.ConstantTimeCompare(key, b.key)&userOK != 1 {
		return false
	}
	b.mu.Lock()
	if len(b.known) >= 16 {
		clear(b.known)
	}
	b.known[d] = true
	b.mu.Unlock()
	return true
}

// connLimiter accepts at most max connections at once; beyond it a new
// connection is closed at once and counted (memory stays bounded whatever
// the flood; the kernel backlog is not left to fill).
type connLimiter struct {
	net.Listener
	s   *Server
	max int64
}

func (l *connLimiter) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if l.s.connsOpen.Add(1) > l.max {
			l.s.connsOpen.Add(-1)
			l.s.connsRefused.Add(1)
			_ = c.Close()
			l.s.rlog.log(l.s.log, "conns", "web: connection limit reached; closing new connections", "max_conns", l.max)
			continue
		}
		return &countedConn{Conn: c, s: l.s}, nil
	}
}

type countedConn struct {
	net.Conn
	s      *Server
	closed atomic.Bool
}

func (c *countedConn) Close() error {
	if c.closed.CompareAndSwap(false, true) {
		c.s.connsOpen.Add(-1)
	}
	return c.Conn.Close()
}

// rateLog logs one kind of event at most once per interval, with the number
// of events left out since the last line: a flood must not flood the log.
type rateLog struct {
	every time.Duration
	mu    sync.Mutex
	last  map[string]time.Time
	quiet map[string]int
}

func (l *rateLog) log(lg *slog.Logger, kind, msg string, args ...any) {
	now := time.Now()
	l.mu.Lock()
	if l.last == nil {
		l.last, l.quiet = make(map[string]time.Time), make(map[string]int)
	}
	if t, ok := l.last[kind]; ok && now.Sub(t) < l.every {
		l.quiet[kind]++
		l.mu.Unlock()
		return
	}
	n := l.quiet[kind]
	l.last[kind], l.quiet[kind] = now, 0
	l.mu.Unlock()
	if n > 0 {
		args = append(args, "suppressed", n)
	}
	lg.Warn(msg, args...)
}
