package web

import (
	"context"
	"crypto/hmac"
	"crypto/pbkdf2"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Authentication: bearer tokens and basic auth with cached PBKDF2 verdicts.
//
//	Authorization: Bearer <token>            read token (API, page) or write token (writes; reads too)
//	Authorization: Basic base64(user:pass)   page and API reads only, never writes (browsers attach
//	                                         it to every request of the origin: a CSRF vector)
//	401 {"error":"…"} with WWW-Authenticate: Bearer realm="edgegw" (and Basic realm="edgegw" when set)

const (
	hashWait    = time.Second // a verification waits this long for a hashing slot, then 429
	goodTTL     = 5 * time.Minute
	badTTL      = time.Minute
	verdictsMax = 1024
)

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

// Outcomes of an authentication.
type authResult int

const (
	authOK       authResult = iota
	authFailed              // no or wrong credentials: 401 (charged to the client's auth bucket)
	authWrong               // wrong password, verified: 401, already charged
	authAnswered            // a 429 was written (auth bucket empty, or no hashing budget)
)

// checkRead: the read token, the write token, or basic credentials.
func (s *Server) checkRead(w http.ResponseWriter, r *http.Request) authResult {
	if tok, ok := bearer(r); ok {
		if tokenEqual(tok, s.cfg.ReadToken) || tokenEqual(tok, s.cfg.WriteToken) {
			return authOK
		}
		return authFailed
	}
	if s.basic != nil {
		if u, p, ok := r.BasicAuth(); ok {
			return s.checkBasic(w, r, u, p)
		}
	}
	return authFailed
}

// checkBasic answers from the verdict cache when it can. Otherwise the
// password must be hashed: the client first pays a token of its auth
// bucket, then the request waits (at most hashWait) for a hashing slot and
// needs the gateway-wide hashing budget; only then is PBKDF2 run.
func (s *Server) checkBasic(w http.ResponseWriter, r *http.Request, user, pass string) authResult {
	b := s.basic
	d := b.digest(user, pass)
	if ok, found := b.lookup(d, time.Now()); found {
		if ok {
			return authOK
		}
		return authFailed
	}
	if !s.admit(w, r, classAuth) {
		return authAnswered
	}
	if !b.acquire(r.Context()) {
		s.hashRefused.Add(1)
		s.rlog.Log(s.log, "hash busy", "web: password verification busy; client refused", "client", s.clientIP(r).String())
		s.tooMany(w, r, time.Second, "busy verifying passwords")
		return authAnswered
	}
	defer b.release()
	if ok, found := b.lookup(d, time.Now()); found { // verified by another request meanwhile
		if ok {
			return authOK
		}
		return authWrong
	}
	if wait := b.budget.take(time.Now()); wait > 0 {
		s.hashRefused.Add(1)
		s.rlog.Log(s.log, "hash budget", "web: password hashing over its CPU budget; client refused", "client", s.clientIP(r).String())
		s.tooMany(w, r, wait, "busy verifying passwords")
		return authAnswered
	}
	start := time.Now()
	ok := b.verify(user, pass)
	b.budget.charge(time.Since(start))
	b.hashes.Add(1)
	b.remember(d, ok, time.Now())
	if ok {
		return authOK
	}
	return authWrong
}

// readAuth guards the page and the API when a read token or basic auth is set.
func (s *Server) readAuth(next http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if !s.readProtected() {
			next(w, r)
			return
		}
		res := s.checkRead(w, r)
		switch res {
		case authOK:
			next(w, r)
		case authFailed, authWrong:
			msg := "credentials required: Authorization: Bearer <read token>"
			if s.basic != nil {
				msg += " or basic auth"
			}
			s.unauthorized(w, r, msg, res == authWrong)
		}
	}
}

// unauthorized answers 401 and, unless the attempt was charged already,
// takes a token of the client's auth bucket: guessing runs into 429 after
// a few tries.
func (s *Server) unauthorized(w http.ResponseWriter, r *http.Request, msg string, charged bool) {
	s.authFailures.Add(1)
	if !charged && !s.admit(w, r, classAuth) {
		return
	}
	s.rlog.Log(s.log, "auth", "web: request without valid credentials", "client", s.clientIP(r).String(), "path", r.URL.Path)
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
// purpose, and a browser sends the credentials with every request, so
// verdicts are cached: a map from an HMAC of user and password (under a key
// made at start, so the map holds nothing a password could be guessed
// from offline) to the verdict, good for goodTTL when right and badTTL when
// wrong, at most verdictsMax entries. A user costs one PBKDF2 per goodTTL;
// repeating a wrong password costs none.
type basicAuth struct {
	user   string
	iter   int
	salt   []byte
	key    []byte
	mac    []byte // key of the cache digests
	sem    chan struct{}
	budget cpuBudget
	hashes atomic.Uint64 // PBKDF2 verifications run

	mu       sync.Mutex
	verdicts map[[32]byte]verdict
}

type verdict struct {
	ok    bool
	until time.Time
}

func parseBasic(user, hash string, lim RateLimits) (*basicAuth, error) {
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
	mac := make([]byte, 32)
	if _, err := rand.Read(mac); err != nil {
		return nil, fmt.Errorf("web: basic auth: %w", err)
	}
	lim.fill()
	return &basicAuth{user: user, iter: iter, salt: salt, key: key, mac: mac,
		sem:      make(chan struct{}, lim.HashConcurrency),
		budget:   cpuBudget{share: lim.HashCPU, max: time.Second, bal: time.Second},
		verdicts: make(map[[32]byte]verdict)}, nil
}

func (b *basicAuth) digest(user, password string) (d [32]byte) {
	h := hmac.New(sha256.New, b.mac)
	h.Write([]byte(user))
	h.Write([]byte{0})
	h.Write([]byte(password))
	h.Sum(d[:0])
	return d
}

func (b *basicAuth) lookup(d [32]byte, now time.Time) (ok, found bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	v, found := b.verdicts[d]
	if !found || now.After(v.until) {
		return false, false
	}
	return v.ok, true
}

// remember stores a verdict; a full map first loses its expired entries,
// then its wrong ones, then everything.
func (b *basicAuth) remember(d [32]byte, ok bool, now time.Time) {
	ttl := badTTL
	if ok {
		ttl = goodTTL
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.verdicts) >= verdictsMax {
		for k, v := range b.verdicts {
			if now.After(v.until) {
				delete(b.verdicts, k)
			}
		}
	}
	if len(b.verdicts) >= verdictsMax {
		for k, v := range b.verdicts {
			if !v.ok {
				delete(b.verdicts, k)
			}
		}
	}
	if len(b.verdicts) >= verdictsMax {
		clear(b.verdicts)
	}
	b.verdicts[d] = verdict{ok: ok, until: now.Add(ttl)}
}

// acquire takes a hashing slot, waiting at most hashWait.
func (b *basicAuth) acquire(ctx context.Context) bool {
	select {
	case b.sem <- struct{}{}:
		return true
	default:
	}
	t := time.NewTimer(hashWait)
	defer t.Stop()
	select {
	case b.sem <- struct{}{}:
		return true
	case <-t.C:
	case <-ctx.Done():
	}
	return false
}

func (b *basicAuth) release() { <-b.sem }

// verify runs PBKDF2 and compares in constant time.
func (b *basicAuth) verify(user, password string) bool {
	key, err := pbkdf2.Key(sha256.New, password, b.salt, b.iter, len(b.key))
	if err != nil {
		return false
	}
	userOK := subtle.ConstantTimeCompare([]byte(user), []byte(b.user))
	return subtle.ConstantTimeCompare(key, b.key)&userOK == 1
}

// cpuBudget is a token bucket of CPU time: it fills at share seconds per
// second up to max; work may start while the balance is positive and is
// charged what it took (the balance may go below zero).
type cpuBudget struct {
	share float64 // negative: no budget
	max   time.Duration

	mu   sync.Mutex
	bal  time.Duration
	last time.Time
}

// take returns 0 when work may start, else the time until it may.
func (c *cpuBudget) take(now time.Time) time.Duration {
	if c.share < 0 {
		return 0
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.last.IsZero() && now.After(c.last) {
		c.bal = min(c.max, c.bal+time.Duration(float64(now.Sub(c.last))*c.share))
	}
	c.last = now
	if c.bal > 0 {
		return 0
	}
	return time.Duration(float64(-c.bal)/c.share) + time.Millisecond
}

func (c *cpuBudget) charge(d time.Duration) {
	if c.share < 0 {
		return
	}
	c.mu.Lock()
	c.bal -= d
	c.mu.Unlock()
}
