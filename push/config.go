package push

import (
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"sync/atomic"
	"time"

	"edgegw/internal/backoff"
	"edgegw/internal/tlsfile"
	"edgegw/ringstore"
	"edgegw/spool"
	"edgegw/stats"
	"edgegw/wire"

	"golang.org/x/time/rate"
)

// MQTT modes.
const (
	ModeFallback = "fallback" // batches go to MQTT when WebSocket is down longer than FallbackAfter
	ModeAlways   = "always"   // besides, every batch sent over WebSocket is mirrored to MQTT (best effort)
	ModeOff      = "off"
)

// Config configures New. Zero values mean the defaults given per field.
type Config struct {
	GatewayID string // required
	WS        WSConfig
	MQTT      MQTTConfig
	Queue     spool.Reader               // required: the batches come from here (a cursor of the shared queue)
	Latest    func() *ringstore.Snapshot // for per-tag retained topics; nil = none
	State     *stats.Upstream            // nil = a private one
	Logger    *slog.Logger

	// Devices gives the tag units for the per-tag payloads; nil = no units.
	Devices func() []stats.Entry
	// TSMillis: ts in Unix milliseconds instead of microseconds in every
	// upstream payload (batch frames say "ts_unit":"ms"; per-tag topics).
	TSMillis bool

	// Writer carries out write commands from the WebSocket uplink and (when
	// MQTT.WriteCommands is set) the MQTT write topic. nil = every write
	// command is answered with kind "refused".
	Writer       Writer
	WriteTimeout time.Duration // per write command (10s); beyond it the answer is kind "timeout"
	MaxWrites    int           // write commands in flight per uplink connection (4); beyond it "busy" at once
}

// WSConfig is the WebSocket uplink. No URL = no WebSocket (MQTT only).
type WSConfig struct {
	URL                        string        // ws:// or wss://; the same as URLs = {URL} (not both)
	URLs                       []string      // receivers, tried in order (see wsLoop); New sets it from URL
	PrimaryRetry               time.Duration // 5m: away from URLs[0] this long, the uplink tries it again
	NoCompression              bool          // do not offer permessage-deflate (offered unless set)
	Token                      string        // bearer token (main reads it from the file)
	CAFile, CertFile, KeyFile  string        // wss: extra CA, client certificate
	ServerName                 string        // TLS server name override
	HandshakeTimeout           time.Duration // 10s
	PingInterval               time.Duration // 20s; the connection is dead after PingInterval+AckTimeout of silence
	BatchMax                   int           // samples per batch (500)
	BatchWait                  time.Duration // how long a partial batch waits for more samples (200ms)
	AckTimeout                 time.Duration // 10s: no ack within it and the connection is dropped
	Window                     int           // batches in flight (4)
	ReconnectMin, ReconnectMax time.Duration // backoff with jitter (500ms, 30s)
}

// MQTTConfig is the MQTT publisher. No broker = no MQTT.
type MQTTConfig struct {
	Broker                    string        // tcp://host:1883, ssl://host:8883; the same as Brokers = {Broker} (not both)
	Brokers                   []string      // a broker cluster: paho tries them in order at each (re)connect; New sets it from Broker
	Mode                      string        // fallback (default), always, off
	FallbackAfter             time.Duration // 10s
	TopicPrefix               string        // "edgegw/<GatewayID>"
	QoS                       byte          // for batches: 1 (0 is not offered: a batch needs a PUBACK); 2 allowed
	ClientID                  string        // "edgegw-<GatewayID>"
	Username, Password        string
	CAFile, CertFile, KeyFile string
	ServerName                string
	NoPerTagTopics            bool          // per-tag retained topics are on unless set
	ReconnectMin              time.Duration // first connect retry interval (1s)
	ReconnectMax              time.Duration // paho's max reconnect interval (30s, at most 60s)

	// WriteCommands subscribes <prefix>/write/+/+ and carries out what is
	// published there (off by default). MQTT writes trust the broker's
	// ACLs: anyone who may publish to that topic can write to the devices.
	WriteCommands bool
	WriteRate     float64 // write commands per second over MQTT (5); beyond it "busy"
	WriteBurst    int     // burst of the rate limit (5)
}

// Pusher sends the queue upstream. Create with New, run with Run.
type Pusher struct {
	cfg     Config
	log     *slog.Logger
	q       spool.Reader
	st      *stats.Upstream
	gwJSON  []byte // the gateway id as a JSON string
	header  http.Header
	tlsWS   *tls.Config
	tlsMQTT *tls.Config
	mirror  func(frame []byte) // mode always: every batch sent over WebSocket (set by Run)

	wsOrigins  []string // "websocket uplink <host>" of each URL, passed to the Writer
	mqttOrigin string   // "mqtt <broker host>"
	wc         writeCounters
	refuseLog  backoff.Log
	mqttRate   *rate.Limiter // write commands over MQTT

	// Link states, each logged once per change (upstreamlog.go): one per
	// receiver URL (wsStates[i] is URLs[i]'s), and which URL or broker
	// carries the stream.
	wsStates                []backoff.State
	mqttState               backoff.State
	wsURLState, brokerState backoff.State
	wsFailures              atomic.Uint64 // failed dials (what the log lines summarise)
	mqttFailures            atomic.Uint64 // failed MQTT connection attempts
}

// New checks cfg, fills the defaults and loads TLS files. It starts nothing.
func New(cfg Config) (*Pusher, error) {
	if cfg.GatewayID == "" {
		return nil, errors.New("push: gateway id is empty")
	}
	if cfg.Queue == nil {
		return nil, errors.New("push: no queue")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.State == nil {
		cfg.State = new(stats.Upstream)
	}
	w := &cfg.WS
	if w.URL != "" && len(w.URLs) > 0 {
		return nil, errors.New("push: websocket: both url and urls are set; use urls alone (url is a one-element urls)")
	}
	if w.URL != "" {
		w.URLs = []string{w.URL}
	}
	w.URLs = append([]string(nil), w.URLs...)
	w.URL = ""
	w.PrimaryRetry = orDur(w.PrimaryRetry, 5*time.Minute)
	w.HandshakeTimeout = orDur(w.HandshakeTimeout, 10*time.Second)
	w.PingInterval = orDur(w.PingInterval, 20*time.Second)
	w.BatchWait = orDur(w.BatchWait, 200*time.Millisecond)
	w.AckTimeout = orDur(w.AckTimeout, 10*time.Second)
	w.ReconnectMin = orDur(w.ReconnectMin, 500*time.Millisecond)
	w.ReconnectMax = max(orDur(w.ReconnectMax, 30*time.Second), w.ReconnectMin)
	if w.BatchMax <= 0 {
		w.BatchMax = 500
	}
	if w.Window <= 0 {
		w.Window = 4
	}
	m := &cfg.MQTT
	if m.Broker != "" && len(m.Brokers) > 0 {
		return nil, errors.New("push: mqtt: both broker and brokers are set; use brokers alone (broker is a one-element brokers)")
	}
	if m.Broker != "" {
		m.Brokers = []string{m.Broker}
	}
	m.Brokers = append([]string(nil), m.Brokers...)
	m.Broker = ""
	switch {
	case len(m.Brokers) == 0:
		m.Mode = ModeOff
	case m.Mode == "":
		m.Mode = ModeFallback
	case m.Mode == ModeFallback, m.Mode == ModeAlways, m.Mode == ModeOff:
	default:
		return nil, fmt.Errorf("push: mqtt: unknown mode %q (fallback, always, off)", m.Mode)
	}
	m.FallbackAfter = orDur(m.FallbackAfter, 10*time.Second)
	if m.TopicPrefix == "" {
		m.TopicPrefix = "edgegw/" + cfg.GatewayID
	}
	m.TopicPrefix = strings.TrimSuffix(m.TopicPrefix, "/")
	if m.QoS == 0 {
		m.QoS = 1
	}
	if m.QoS > 2 {
		return nil, fmt.Errorf("push: mqtt: qos %d", m.QoS)
	}
	if m.ClientID == "" {
		m.ClientID = "edgegw-" + cfg.GatewayID
	}
	m.ReconnectMin = orDur(m.ReconnectMin, time.Second)
	m.ReconnectMax = min(orDur(m.ReconnectMax, 30*time.Second), 60*time.Second)
	if m.WriteRate <= 0 {
		m.WriteRate = 5
	}
	if m.WriteBurst <= 0 {
		m.WriteBurst = 5
	}
	cfg.WriteTimeout = orDur(cfg.WriteTimeout, 10*time.Second)
	if cfg.MaxWrites <= 0 {
		cfg.MaxWrites = 4
	}
	if len(w.URLs) == 0 && m.Mode == ModeOff {
		return nil, errors.New("push: neither a websocket url nor an mqtt broker")
	}
	p := &Pusher{cfg: cfg, log: cfg.Logger, q: cfg.Queue, st: cfg.State,
		refuseLog: backoff.Log{Every: 10 * time.Second, Level: slog.LevelWarn}, mqttRate: rate.NewLimiter(rate.Limit(m.WriteRate), m.WriteBurst)}
	p.gwJSON, _ = json.Marshal(cfg.GatewayID)
	var err error
	if len(w.URLs) > 0 {
		hosts := make([]string, 0, len(w.URLs))
		for _, s := range w.URLs {
			u, perr := url.Parse(s)
			if perr != nil || (u.Scheme != "ws" && u.Scheme != "wss") || u.Host == "" {
				return nil, fmt.Errorf("push: websocket: url %q: want ws:// or wss://", s)
			}
			hosts = append(hosts, u.Host)
		}
		if p.tlsWS, err = tlsfile.Client(w.CAFile, w.CertFile, w.KeyFile, w.ServerName); err != nil {
			return nil, fmt.Errorf("push: websocket: %w", err)
		}
		for _, h := range hosts {
			p.wsOrigins = append(p.wsOrigins, "websocket uplink "+h)
		}
		p.wsStates = make([]backoff.State, len(w.URLs))
		p.header = http.Header{}
		p.header.Set(wire.GatewayHeader, cfg.GatewayID)
		if w.Token != "" {
			p.header.Set("Authorization", "Bearer "+w.Token)
		}
		p.st.WSURLs.Store(redacted(w.URLs))
	}
	if m.Mode != ModeOff {
		hosts := make([]string, 0, len(m.Brokers))
		for _, b := range m.Brokers {
			if u, err := url.Parse(b); err == nil && u.Host != "" {
				hosts = append(hosts, u.Host)
			} else {
				hosts = append(hosts, b)
			}
		}
		p.mqttOrigin = "mqtt " + strings.Join(hosts, ",")
		if p.tlsMQTT, err = tlsfile.Client(m.CAFile, m.CertFile, m.KeyFile, m.ServerName); err != nil {
			return nil, fmt.Errorf("push: mqtt: %w", err)
		}
		p.st.MQTTBrokers.Store(redacted(m.Brokers))
	}
	p.setPath(stats.PathBuffering)
	return p, nil
}

// redacted is the URLs as /api/status shows them: a password in one is
// replaced by "xxxxx".
func redacted(urls []string) []string {
	out := make([]string, len(urls))
	for i, s := range urls {
		out[i] = redact(s)
	}
	return out
}

func redact(s string) string {
	if u, err := url.Parse(s); err == nil {
		return u.Redacted()
	}
	return s
}

func orDur(d, def time.Duration) time.Duration {
	if d <= 0 {
		return def
	}
	return d
}
