package web

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"edgegw/internal/backoff"
	"edgegw/ringstore"
	"edgegw/stats"

	"github.com/gorilla/websocket"
)

// Ring is what web reads from the ring store.
type Ring interface {
	Since(after uint64, dst []ringstore.Sample) ringstore.Result
	SinceN(after uint64, n int, dst []ringstore.Sample) ringstore.Result // at most n samples
	Snapshot() *ringstore.Snapshot
}

var _ Ring = (*ringstore.Ring)(nil)

// Devices lists the polled devices with their live records (edge's scheduler).
type Devices interface {
	Devices() []stats.Entry
}

// Defaults for the zero values of Config. The gateway's defaults are
// conf's (the one place they live; internal/gateway always passes them):
// for the fields that have a config key these are the same values, so that
// a zero Config (tests, the bench) serves like the gateway, and
// internal/gateway's TestWebFallbacksAreConfDefaults holds them equal.
const (
	DefaultListen            = "127.0.0.1:8080"
	DefaultLongPollTimeout   = 30 * time.Second
	DefaultMaxClients        = 5000
	DefaultMaxRequestBytes   = 64 << 10
	DefaultReadHeaderTimeout = 10 * time.Second
	DefaultIdleTimeout       = 120 * time.Second
	DefaultWSQueue           = 64
	DefaultWSWriteTimeout    = 5 * time.Second
	DefaultWSPingInterval    = 20 * time.Second
	DefaultWSReadLimit       = 4 << 10
	DefaultWSChunk           = 128
	DefaultWSQueueBudget     = 8 << 20
	DefaultWSSendBuffer      = 64 << 10
)

// Config is the server's configuration; its zero value means "defaults".
type Config struct {
	Listen          string        // "127.0.0.1:8080"; ":0" picks a port
	LongPollTimeout time.Duration // 30s: a long poll with nothing new returns an empty list after this
	// MaxClients bounds each method separately: short polls in flight, long
	// polls waiting, WebSocket connections open. Beyond it: 503 + Retry-After: 1.
	MaxClients      int
	MaxRequestBytes int64 // 64 KiB: request headers (MaxHeaderBytes) and bodies (413)
	// MaxConns bounds open TCP connections (2*MaxClients+64); beyond it a
	// new connection is closed at accept and counted.
	MaxConns int

	ReadHeaderTimeout time.Duration // 10s
	IdleTimeout       time.Duration // 120s
	WriteTimeout      time.Duration // LongPollTimeout + 10s; raised to that if set lower
	ShutdownTimeout   time.Duration // 5s: bound of the graceful part of shutdown

	AllowedOrigins []string // WebSocket upgrade and CORS allow-list ("http://host:port", "*"); empty = same origin only

	// Access control (auth.go, ratelimit.go, clientip.go). Secrets come from files or the
	// environment (main reads them) and are never logged.
	WriteToken     string     // bearer token for POST /api/write; "" = writes off (403)
	Writer         Writer     // nil = writes off (403)
	ReadToken      string     // bearer token for the page and the API; "" = reads open (unless basic auth)
	BasicAuthUser  string     // basic auth for the page and API reads (with BasicAuthHash)
	BasicAuthHash  string     // HashPassword's output
	ProtectMetrics bool       // /metrics needs read credentials too (/healthz stays open)
	RateLimit      RateLimits // per client IP and route class; zero value = defaults, loopback limited too
	// TrustedProxies: peers whose X-Forwarded-For names the client (clientip.go);
	// empty = the peer is the client. AllowedNetworks: clients outside get
	// 403 (counted); empty = every client.
	TrustedProxies  []netip.Prefix
	AllowedNetworks []netip.Prefix
	TLSCertFile     string // HTTPS when both are set (PEM files)
	TLSKeyFile      string

	WSQueue        int           // 64 frames per client; a full queue drops the client
	WSWriteTimeout time.Duration // 5s per frame
	WSPingInterval time.Duration // 20s; the read deadline is 2 pings + WSWriteTimeout
	WSReadLimit    int64         // 4 KiB per client message
	// WSChunk bounds the samples of one message that a writer encodes for
	// its client alone (a resume, a catch-up after the hub skipped): 128.
	WSChunk int
	// WSQueueBudget bounds the bytes queued to all WebSocket clients in
	// messages encoded for one client alone (snapshots, resume chunks), from
	// the encoding until the write returns: 8 MiB. A client whose next such
	// message would pass it is closed with 1013 and counted. The hub's
	// shared frames are outside it: at most WSQueue+1 of them are alive,
	// however many clients hold them.
	WSQueueBudget int64
	// WSSendBuffer is each WebSocket connection's kernel send buffer
	// (SO_SNDBUF; Linux doubles it): 64 KiB, so a client that does not read
	// parks at most that in the kernel (Linux otherwise grows it to
	// tcp_wmem's 4 MiB) and its writer blocks, holding its one message,
	// until the write times out. < 0: the OS's autotuning.
	WSSendBuffer int

	GatewayID, Version string // shown on the page, /api/status and /healthz

	Ring     Ring            // required
	Devices  Devices         // nil: no devices
	Upstream *stats.Upstream // nil: no upstream configured
	History  History         // nil: /api/history answers 404 (history.go)
	RingInfo RingInfo        // shown in /api/status
	Storage  Storage         // nil: no storage in /api/status, not checked by /healthz (storage.go)
	// HealthzUpstreamMaxDown: /healthz is 503 once no upstream path has
	// carried batches (buffering, unauthorized) for longer; 0 = not checked.
	HealthzUpstreamMaxDown time.Duration
	// HealthzHold: /healthz changes state only after its checks held for
	// this long (storage.go, healthHold); 0 = DefaultHealthzHold, < 0 = none.
	HealthzHold time.Duration

	Acquisition *stats.Acquisition // gateway-wide acquisition counters; nil: not shown
	// ModbusServers: the counters of each [[modbus_server]], shown in
	// /api/status and /metrics (modbusserver.go).
	ModbusServers []*stats.ModbusServer

	Logger *slog.Logger // nil: discard
}

func (c *Config) fill() {
	if c.Listen == "" {
		c.Listen = DefaultListen
	}
	if c.LongPollTimeout <= 0 {
		c.LongPollTimeout = DefaultLongPollTimeout
	}
	if c.MaxClients <= 0 {
		c.MaxClients = DefaultMaxClients
	}
	if c.MaxRequestBytes <= 0 {
		c.MaxRequestBytes = DefaultMaxRequestBytes
	}
	if c.ReadHeaderTimeout <= 0 {
		c.ReadHeaderTimeout = DefaultReadHeaderTimeout
	}
	if c.IdleTimeout <= 0 {
		c.IdleTimeout = DefaultIdleTimeout
	}
	if c.ShutdownTimeout <= 0 {
		c.ShutdownTimeout = 5 * time.Second
	}
	if c.WSQueue <= 0 {
		c.WSQueue = DefaultWSQueue
	}
	if c.WSWriteTimeout <= 0 {
		c.WSWriteTimeout = DefaultWSWriteTimeout
	}
	if c.WSPingInterval <= 0 {
		c.WSPingInterval = DefaultWSPingInterval
	}
	if c.WSReadLimit <= 0 {
		c.WSReadLimit = DefaultWSReadLimit
	}
	if c.WSChunk <= 0 {
		c.WSChunk = DefaultWSChunk
	}
	if c.WSQueueBudget <= 0 {
		c.WSQueueBudget = DefaultWSQueueBudget
	}
	if c.WSSendBuffer == 0 {
		c.WSSendBuffer = DefaultWSSendBuffer
	}
	if c.MaxConns <= 0 {
		c.MaxConns = 2*c.MaxClients + 64
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
}

// method indexes the per-method counters.
type method int

const (
	mShort method = iota
	mLong
	mWS
	nMethods
)

var methodNames = [nMethods]string{mShort: "shortPolling", mLong: "longPolling", mWS: "websocket"}

type methodCounters struct {
	active   atomic.Int64
	served   atomic.Uint64
	rejected atomic.Uint64
}

// MethodStats counts one delivery method.
type MethodStats struct {
	Active   int64  // in flight (short), waiting (long), connected (ws)
	Served   uint64 // requests answered / connections upgraded
	Rejected uint64 // refused with 503 beyond MaxClients (or during shutdown)
}

// ClientStats is a copy of the server's client counters.
type ClientStats struct {
	ShortPolling, LongPolling, WebSocket  MethodStats
	WSDropped                             uint64  // WebSocket clients dropped as too slow, for any reason of WSDroppedBy
	WSDroppedBy                           WSDrops // the same, by reason
	WSQueuedBytes                         int64   // bytes in messages encoded for one WebSocket client alone, not yet written (all clients)
	WSQueueBudget                         int64   // the bound of WSQueuedBytes (Config.WSQueueBudget)
	WSFramesSent                          uint64  // data frames written to WebSocket clients
	TooLarge                              uint64  // requests refused with 413/431
	RateLimitedRead, RateLimitedWrite     uint64  // requests refused with 429, per class
	RateLimitedMonitor, RateLimitedAuth   uint64
	RateLimitedPoll, RateLimitedConnect   uint64
	ConnsPerClientLimited                 uint64 // 429: the client had RateLimits.ConnsPerClient connections held
	Forbidden                             uint64 // 403: the client is outside AllowedNetworks
	HashRefused                           uint64 // 429: no hashing slot or CPU budget for a password verification
	PasswordHashes                        uint64 // PBKDF2 verifications run (credentials not in the cache)
	AuthFailures                          uint64 // requests refused with 401
	ConnsOpen                             int64  // TCP connections open now
	ConnsRefused                          uint64 // connections closed at accept beyond MaxConns
	AcceptErrors                          uint64 // Accept failures (out of file descriptors): clients left waiting
	LongPollsGone                         uint64 // waiting long polls (parked) whose client had closed, or whose reply could not be written
	LongPollsNotKept                      uint64 // answered parked long polls closed, not kept alive: reentryQueue connections waited for net/http already
	WSBadMessages                         uint64 // WebSocket clients closed for a malformed or oversized message
	WritesOK, WritesFailed, WritesRefused uint64 // POST /api/write: confirmed; failed in the writer; refused before it (400/403/413/415)
}

// WSDrops counts the WebSocket clients dropped as too slow, by reason.
type WSDrops struct {
	QueueFull    uint64 `json:"queue_full"`    // the hub found its queue of WSQueue frames full
	WriteTimeout uint64 `json:"write_timeout"` // a write blocked past WSWriteTimeout
	NoPong       uint64 `json:"no_pong"`       // no pong within the read deadline (2 pings + WSWriteTimeout)
	QueueBudget  uint64 `json:"queue_budget"`  // its next message would have passed WSQueueBudget
}

// Server is the local HTTP server. Build it with New.
type Server struct {
	cfg     Config
	log     *slog.Logger
	handler http.Handler
	up      websocket.Upgrader
	started time.Time
	healthz *healthHold // /healthz's state
	origins map[string]bool
	anyOrig bool

	methods  [nMethods]methodCounters
	wsDrops  [nDrops]atomic.Uint64
	wsQueued atomic.Int64 // bytes counted against WSQueueBudget
	wsFrames atomic.Uint64
	tooLarge atomic.Uint64

	lim           *limiter
	basic         *basicAuth
	basicErr      error // reported by Listen
	rlog          backoff.Log
	dropLog       backoff.Log   // slow WebSocket clients: one line each, at most 1/s
	held          atomic.Int64  // 429 replies being held
	slots         connSlots     // held connections per client
	forbidden     atomic.Uint64 // 403: outside AllowedNetworks
	hashRefused   atomic.Uint64 // 429 for want of a hashing slot or budget
	authFailures  atomic.Uint64
	connsOpen     atomic.Int64
	connsRefused  atomic.Uint64
	acceptErrors  atomic.Uint64
	wsBad         atomic.Uint64
	writesOK      atomic.Uint64
	writesFailed  atomic.Uint64
	writesRefused atomic.Uint64
	tlsConf       *tls.Config

	short   atomic.Pointer[encodedSnapshot] // shortPolling body cache, keyed by *Snapshot
	shortMu sync.Mutex                      // serialises re-encoding on a cache miss (no I/O under it)

	hub     hub
	parking parking // waiting long polls, without their goroutines (park.go)

	shutdown     chan struct{} // closed when Serve's ctx is done: long polls return, ws clients close
	shutdownOnce sync.Once

	mu      sync.Mutex
	ln      net.Listener
	closing bool           // no new WebSocket handlers
	wsWG    sync.WaitGroup // WebSocket handlers (hijacked: http.Server does not track them)
	served  bool
}

// New fills cfg's defaults and builds the server. It starts no goroutine.
func New(cfg Config) *Server {
	cfg.fill()
	if cfg.Ring == nil {
		panic("web: Config.Ring is nil")
	}
	if cfg.WriteTimeout <= cfg.LongPollTimeout {
		if cfg.WriteTimeout > 0 {
			cfg.Logger.Warn("web: write timeout must exceed the long-poll timeout; raised",
				"write_timeout", cfg.WriteTimeout, "long_poll_timeout", cfg.LongPollTimeout)
		}
		cfg.WriteTimeout = cfg.LongPollTimeout + 10*time.Second
	}
	s := &Server{
		cfg:      cfg,
		log:      cfg.Logger,
		started:  time.Now(),
		healthz:  &healthHold{hold: holdOf(cfg.HealthzHold)},
		origins:  make(map[string]bool),
		shutdown: make(chan struct{}),
		lim:      newLimiter(cfg.RateLimit),
		rlog:     backoff.Log{Every: 10 * time.Second, Level: slog.LevelWarn},
		dropLog:  backoff.Log{Every: time.Second, Level: slog.LevelWarn},
	}
	s.basic, s.basicErr = parseBasic(cfg.BasicAuthUser, cfg.BasicAuthHash, cfg.RateLimit)
	for _, o := range cfg.AllowedOrigins {
		if o == "*" {
			s.anyOrig = true
		}
		s.origins[strings.ToLower(strings.TrimRight(o, "/"))] = true
	}
	s.hub.clients = make(map[*wsClient]struct{})
	s.parking.kick = make(chan struct{}, 1)
	s.up = websocket.Upgrader{
		HandshakeTimeout:  cfg.ReadHeaderTimeout,
		ReadBufferSize:    wsReadBuffer, // clients send little: a resume, pongs, a close
		WriteBufferSize:   4096,
		WriteBufferPool:   &sync.Pool{}, // idle connections hold no write buffer
		CheckOrigin:       s.checkOrigin,
		EnableCompression: false,
	}
	mux := http.NewServeMux()
	// Every route is rate-limited first (ratelimit.go), then authenticated.
	mux.HandleFunc("GET /{$}", s.limit(classRead, s.readAuth(s.handlePage)))
	// A long poll or a WebSocket holds a slot of its client while open; a
	// long poll takes a poll token only when answered with the snapshot.
	mux.HandleFunc("GET /api/shortPolling", s.limit(classPoll, s.readAuth(s.handleShort)))
	mux.HandleFunc("GET /api/longPolling", s.readAuth(s.slot(s.handleLong)))
	mux.HandleFunc("GET /api/ws", s.limit(classConnect, s.readAuth(s.slot(s.handleWS))))
	mux.HandleFunc("GET /api/devices", s.limit(classRead, s.readAuth(s.handleDevices)))
	mux.HandleFunc("GET /api/status", s.limit(classRead, s.readAuth(s.handleStatus)))
	mux.HandleFunc("GET /api/history", s.limit(classRead, s.readAuth(s.handleHistory)))
	mux.HandleFunc("GET /api/trends", s.limit(classRead, s.readAuth(s.handleTrends)))
	mux.HandleFunc("GET /assets/{file}", s.limit(classRead, s.readAuth(s.handleAsset)))
	mux.HandleFunc("POST /api/write", s.limit(classWrite, s.handleWrite))
	mux.HandleFunc("OPTIONS /api/{path...}", s.limit(classRead, s.handlePreflight))
	mux.HandleFunc("GET /healthz", s.limit(classMonitor, s.handleHealth))
	if cfg.ProtectMetrics {
		mux.HandleFunc("GET /metrics", s.limit(classMonitor, s.readAuth(s.handleMetrics)))
	} else {
		mux.HandleFunc("GET /metrics", s.limit(classMonitor, s.handleMetrics))
	}
	s.handler = s.guard(mux)
	return s
}

// Handler is the server's routes with its request bounds (body size, CORS).
// Serve uses it; tests and main may mount it elsewhere, but the WebSocket hub
// only runs inside Serve.
func (s *Server) Handler() http.Handler { return s.handler }

// Listen checks the access settings, loads the TLS certificate (when set),
// binds cfg.Listen (":0" allowed) and returns the real address. Serve calls
// it when it was not called before.
func (s *Server) Listen() (net.Addr, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ln != nil {
		return s.ln.Addr(), nil
	}
	if err := s.checkLocked(); err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", s.cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("web: listen %s: %w", s.cfg.Listen, err)
	}
	s.ln = ln
	return ln.Addr(), nil
}

// Check reports what Listen refuses before it binds the address (the
// basic auth hash, the TLS pair), without binding it: `edgegw check`
// refuses what run would.
func (s *Server) Check() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.checkLocked()
}

func (s *Server) checkLocked() error {
	if s.basicErr != nil {
		return s.basicErr
	}
	if (s.cfg.TLSCertFile == "") != (s.cfg.TLSKeyFile == "") {
		return errors.New("web: tls needs both a certificate file and a key file")
	}
	if s.cfg.TLSCertFile != "" && s.tlsConf == nil {
		cert, err := tls.LoadX509KeyPair(s.cfg.TLSCertFile, s.cfg.TLSKeyFile)
		if err != nil {
			return fmt.Errorf("web: tls: %w", err)
		}
		// HTTP/1.1 only: WebSocket upgrades and long polls are HTTP/1.1 here.
		s.tlsConf = &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{cert}, NextProtos: []string{"http/1.1"}}
	}
	return nil
}

// Serve serves HTTP and runs the WebSocket hub until ctx is done, then shuts
// down gracefully within ShutdownTimeout: long polls return at once with what
// they have, WebSocket clients get a close frame (1001 going away). It returns
// after every goroutine it started has exited. It may be called once.
func (s *Server) Serve(ctx context.Context) error {
	s.mu.Lock()
	if s.served {
		s.mu.Unlock()
		return errors.New("web: Serve called twice")
	}
	s.served = true
	s.mu.Unlock()
	if _, err := s.Listen(); err != nil {
		return err
	}
	srv := &http.Server{
		Handler:           s.handler,
		ReadHeaderTimeout: s.cfg.ReadHeaderTimeout,
		IdleTimeout:       s.cfg.IdleTimeout,
		WriteTimeout:      s.cfg.WriteTimeout,
		MaxHeaderBytes:    int(s.cfg.MaxRequestBytes),
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelDebug),
		BaseContext:       func(net.Listener) context.Context { return context.WithoutCancel(ctx) },
	}
	hubCtx, stopHub := context.WithCancel(context.Background())
	hubDone := make(chan struct{})
	go func() {
		defer close(hubDone)
		s.runHub(hubCtx)
	}()
	var ln net.Listener = &connLimiter{Listener: acceptLogger{s.ln, s}, s: s, max: int64(s.cfg.MaxConns)}
	scheme := "http"
	if s.tlsConf != nil {
		ln, scheme = tls.NewListener(ln, s.tlsConf), "https"
	}
	re := newReentry(ln)
	srv.ConnState = re.connState
	s.parking.mu.Lock()
	s.parking.back, s.parking.open = re, true
	s.parking.mu.Unlock()
	parkDone := make(chan struct{})
	go func() {
		defer close(parkDone)
		s.runParker(s.shutdown)
	}()
	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(re) }()
	s.log.Info("web: serving", "addr", s.ln.Addr().String(), "scheme", scheme,
		"writes", s.cfg.WriteToken != "" && s.cfg.Writer != nil, "read_auth", s.readProtected())

	var err error
	select {
	case <-ctx.Done():
	case err = <-serveErr:
		err = fmt.Errorf("web: serve %s: %w", s.ln.Addr(), err)
		serveErr <- nil
	}
	s.shutdownOnce.Do(func() { close(s.shutdown) })
	<-parkDone // parked long polls answered (Connection: close)
	sctx, cancel := context.WithTimeout(context.Background(), s.cfg.ShutdownTimeout)
	if serr := srv.Shutdown(sctx); serr != nil {
		s.log.Warn("web: graceful shutdown incomplete; closing", "err", serr)
		_ = srv.Close()
	}
	cancel()
	<-serveErr
	s.mu.Lock()
	s.closing = true
	s.mu.Unlock()
	s.wsWG.Wait() // writers saw s.shutdown: each sends a close frame (bounded by WSWriteTimeout)
	stopHub()
	<-hubDone
	return err
}

// acceptLogger counts the errors of Accept and says them at Warn, at most
// one line per 10 s with the number left out ("suppressed"): out of file
// descriptors (EMFILE, ENFILE) clients wait in the kernel's backlog, not
// served, while net/http retries after a pause and tells only its ErrorLog
// (Debug).
type acceptLogger struct {
	net.Listener
	s *Server
}

func (l acceptLogger) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil && !errors.Is(err, net.ErrClosed) {
		l.s.acceptErrors.Add(1)
		l.s.rlog.Log(l.s.log, "accept", "web: cannot accept connections; clients wait unserved (out of file descriptors? raise LimitNOFILE / ulimit -n)",
			"err", err, "conns_open", l.s.connsOpen.Load(), "accept_errors", l.s.acceptErrors.Load())
	}
	return c, err
}

// Stats copies the client counters.
func (s *Server) Stats() ClientStats {
	get := func(m method) MethodStats {
		c := &s.methods[m]
		return MethodStats{Active: c.active.Load(), Served: c.served.Load(), Rejected: c.rejected.Load()}
	}
	drops := WSDrops{QueueFull: s.wsDrops[dropQueueFull].Load(), WriteTimeout: s.wsDrops[dropWriteTimeout].Load(),
		NoPong: s.wsDrops[dropNoPong].Load(), QueueBudget: s.wsDrops[dropBudget].Load()}
	return ClientStats{
		ShortPolling: get(mShort), LongPolling: get(mLong), WebSocket: get(mWS),
		WSDropped: drops.QueueFull + drops.WriteTimeout + drops.NoPong + drops.QueueBudget, WSDroppedBy: drops,
		WSQueuedBytes: s.wsQueued.Load(), WSQueueBudget: s.cfg.WSQueueBudget,
		WSFramesSent: s.wsFrames.Load(), TooLarge: s.tooLarge.Load(),
		RateLimitedRead: s.lim.limited[classRead].Load(), RateLimitedWrite: s.lim.limited[classWrite].Load(),
		RateLimitedMonitor: s.lim.limited[classMonitor].Load(), RateLimitedAuth: s.lim.limited[classAuth].Load(),
		RateLimitedPoll: s.lim.limited[classPoll].Load(), RateLimitedConnect: s.lim.limited[classConnect].Load(),
		ConnsPerClientLimited: s.slots.limited.Load(), Forbidden: s.forbidden.Load(),
		HashRefused: s.hashRefused.Load(), PasswordHashes: s.passwordHashes(),
		AuthFailures: s.authFailures.Load(), ConnsOpen: s.connsOpen.Load(), ConnsRefused: s.connsRefused.Load(),
		AcceptErrors: s.acceptErrors.Load(), LongPollsGone: s.parking.gone.Load(), LongPollsNotKept: s.parking.notKept(),
		WSBadMessages: s.wsBad.Load(), WritesOK: s.writesOK.Load(), WritesFailed: s.writesFailed.Load(),
		WritesRefused: s.writesRefused.Load(),
	}
}

func (s *Server) passwordHashes() uint64 {
	if s.basic == nil {
		return 0
	}
	return s.basic.hashes.Load()
}

// acquire takes a slot of method m; false (and a 503 written) beyond MaxClients.
func (s *Server) acquire(w http.ResponseWriter, m method) bool {
	c := &s.methods[m]
	if c.active.Add(1) > int64(s.cfg.MaxClients) {
		c.active.Add(-1)
		c.rejected.Add(1)
		w.Header().Set("Retry-After", "1")
		writeError(w, http.StatusServiceUnavailable, "too many "+methodNames[m]+" clients")
		return false
	}
	return true
}

func (s *Server) release(m method) {
	s.methods[m].active.Add(-1)
	s.methods[m].served.Add(1)
}

// guard applies the request bounds every route shares: clients outside
// AllowedNetworks are refused (403), bodies beyond MaxRequestBytes are
// refused (413) or cut (MaxBytesReader), and CORS headers are set for
// allowed cross origins.
func (s *Server) guard(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if len(s.cfg.AllowedNetworks) > 0 {
			if ip := s.clientIP(r); !s.allowedClient(ip) {
				s.forbidden.Add(1)
				s.rlog.Log(s.log, "forbidden", "web: client outside allowed_networks refused", "client", ip.String())
				writeError(w, http.StatusForbidden, "client "+ip.String()+" is not in allowed_networks")
				return
			}
		}
		if r.ContentLength > s.cfg.MaxRequestBytes {
			s.tooLarge.Add(1)
			w.Header().Set("Connection", "close")
			writeError(w, http.StatusRequestEntityTooLarge,
				"request body of "+strconv.FormatInt(r.ContentLength, 10)+" bytes exceeds "+strconv.FormatInt(s.cfg.MaxRequestBytes, 10))
			return
		}
		r.Body = http.MaxBytesReader(w, r.Body, s.cfg.MaxRequestBytes)
		if o := r.Header.Get("Origin"); o != "" && !sameOrigin(o, r.Host) && s.allowed(o) {
			w.Header().Set("Access-Control-Allow-Origin", o)
			w.Header().Add("Vary", "Origin")
		}
		next.ServeHTTP(w, r)
	})
}

func (s *Server) allowed(origin string) bool {
	return s.anyOrig || s.origins[strings.ToLower(strings.TrimRight(origin, "/"))]
}

// checkOrigin: no Origin (not a browser) or same origin, else the allow-list.
func (s *Server) checkOrigin(r *http.Request) bool {
	o := r.Header.Get("Origin")
	if o == "" || sameOrigin(o, r.Host) {
		return true
	}
	return s.allowed(o)
}

func sameOrigin(origin, host string) bool {
	u, err := url.Parse(origin)
	if err != nil || u.Host == "" {
		return false
	}
	return strings.EqualFold(u.Host, host)
}

// Error replies: {"error":"message"}.
func writeError(w http.ResponseWriter, code int, msg string) {
	b, _ := json.Marshal(struct {
		Error string `json:"error"`
	}{msg})
	writeJSON(w, code, append(b, '\n'))
}

// maxEchoed bounds how much of a client's input an error message repeats.
const maxEchoed = 64

// quoteInput quotes a value from a request for an error message: at most
// maxEchoed bytes of it (cut at a rune boundary), then how long it was. A
// message stays short whatever a client sends, even bytes that quote to four
// characters each.
func quoteInput(v string) string {
	if len(v) <= maxEchoed {
		return strconv.Quote(v)
	}
	cut := maxEchoed
	for cut > 0 && !utf8.RuneStart(v[cut]) {
		cut--
	}
	return strconv.Quote(v[:cut]) + "... (" + strconv.Itoa(len(v)) + " bytes)"
}

func writeJSON(w http.ResponseWriter, code int, body []byte) {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Cache-Control", "no-store")
	h.Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(code)
	_, _ = w.Write(body)
}
