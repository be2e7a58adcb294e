package conf

import (
	"net/netip"
	"time"

	"edgegw/tagtype"
)

// Config is a resolved configuration: defaults applied, profiles merged,
// validated. Every field is filled; see defaults.go for each default.
type Config struct {
	File     string // the name given to Parse (the path given to Load)
	Gateway  Gateway
	HTTP     HTTP
	Ring     Ring
	Poll     Poll
	Profiles []Profile // in file order
	Devices  []Device  // in file order
	Upstream Upstream
	Buffer   Buffer
	History  History

	// AllowEmpty (top-level allow_empty): a reload may leave no device
	// polling. Without it a reload to zero devices is refused.
	AllowEmpty bool
	Endpoints  []Endpoint // [[endpoint]] tables, in file order
	// ModbusServers are the [[modbus_server]] tables (modbus_server.go).
	ModbusServers []ModbusServer
}

// Gateway identifies this gateway.
type Gateway struct {
	ID      string // default: the host name (characters outside [A-Za-z0-9_.-] become "_")
	DataDir string // "" = memory only: no durable queue, no sequence high-water mark
}

// HTTP is the local server.
type HTTP struct {
	Listen            string        // host:port
	LongPollTimeout   time.Duration // > 0
	MaxClients        int           // per delivery method, > 0
	MaxRequestBytes   int64         // > 0
	ReadHeaderTimeout time.Duration // > 0
	WriteTimeout      time.Duration // 0 = derived by web (from LongPollTimeout)
	IdleTimeout       time.Duration // > 0
	AllowedOrigins    []string      // empty = same origin only; each "http(s)://host[:port]"
	WriteTokenFile    string        // "" = writes are off
	ReadTokenFile     string        // "" = reads need no token
	BasicAuthUser     string        // basic auth for the page and API reads (browsers); never for writes
	BasicAuthHashFile string        // file holding the password hash from `edgegw hash-password`
	ProtectMetrics    bool          // /metrics needs the read credentials too
	TLSCertFile       string        // both or neither
	TLSKeyFile        string
	// ExemptLoopback: clients on 127.0.0.0/8 and ::1 are not rate-limited
	// (a local reverse proxy that does its own limiting). Default false.
	ExemptLoopback bool
	// HealthzUpstreamMaxDown: /healthz is 503 once no upstream path has
	// carried batches for longer than this (10m); 0 = upstream not checked.
	HealthzUpstreamMaxDown time.Duration
	// TrustedProxies: peers whose X-Forwarded-For names the real client
	// (limits and allowed_networks then apply to it). AllowedNetworks:
	// clients outside these get 403; empty = every client. A bare address
	// is its /32 or /128.
	TrustedProxies  []netip.Prefix
	AllowedNetworks []netip.Prefix
	Limits          Limits // [http.limits]
}

// Limits is [http.limits]: the local server's limits per client IP. A rate
// is per second; 0 (or absent) takes the server's default, -1 turns the
// limit off. A burst is how many requests may come at once (0: default).
type Limits struct {
	PollRate, ReadRate, ConnectRate, MonitorRate, WriteRate, AuthRate       float64
	PollBurst, ReadBurst, ConnectBurst, MonitorBurst, WriteBurst, AuthBurst int
	// ConnectionsPerClient: WebSocket connections plus waiting long polls
	// one client IP may hold (0: default, -1: no limit).
	ConnectionsPerClient int
}

// Ring is the in-memory ring of recent samples.
type Ring struct {
	Size int // samples, 1..MaxRingSize; 0 = sized by main from the poll rate
	// MaxBytes caps the ring main sizes from the poll rate (Size 0): at
	// most MaxBytes of samples, MinRingBytes..MaxRingBytes.
	MaxBytes int64
}

// Poll holds the acquisition options shared by all devices.
type Poll struct {
	TCPMode        string // "parallel" (one connection per device, polled at once) | "serial"
	MaxGap         int    // registers of gap filled to join two reads, 0..125
	MaxRegisters   int    // per read, 1..125
	MaxBits        int    // coils/discrete inputs per read, 1..2000
	UDPListen      string // local address of the one UDP socket, host:port (":0" = any, ephemeral)
	UDPBufferBytes int64  // SO_RCVBUF of that socket, > 0
}

// Profile is a logger model: a named list of tags reused by many devices.
type Profile struct {
	Name string
	Tags []Tag
	Line int // line of the [[profile]] header

	valid []bool // per tag: read without problems (for the devices' cross-checks)
}

// Transports.
const (
	TransportTCP        = "tcp"
	TransportUDP        = "udp"
	TransportRTU        = "rtu"
	TransportRTUOverTCP = "rtuovertcp"
	// Modbus ASCII (':', hex, LRC, CRLF) on a serial line, and over a TCP
	// stream to a serial gateway.
	TransportASCII        = "ascii"
	TransportASCIIOverTCP = "asciiovertcp"
)

// SerialLine reports a transport on a serial line (rtu, ascii): its address
// is a device path and it has [device.serial] settings.
func SerialLine(transport string) bool {
	return transport == TransportRTU || transport == TransportASCII
}

// Device is one Modbus slave (one unit id at one address).
type Device struct {
	Name      string
	Transport string // tcp | udp | rtu | rtuovertcp | ascii | asciiovertcp
	// Address is host:port for tcp, udp, rtuovertcp and asciiovertcp (":502"
	// is added when the port is missing) and a device path such as
	// /dev/ttyS1 for rtu and ascii.
	Address  string
	Unit     uint8 // 0..247 (0 is refused on rtu: broadcast gets no reply)
	Profile  string
	Interval time.Duration
	Timeout  time.Duration // <= Interval
	// TimeoutDerived: the file sets no timeout, so it is interval/(retries+1)
	// capped at the transport's default (defaults.go).
	TimeoutDerived bool
	Retries        int // >= 0, only while still inside the interval
	MaxGap         int
	MaxRegisters   int
	// WriteTransport is how writes are sent: for udp devices "tcp" (default)
	// or "udp"; for every other device it equals Transport.
	WriteTransport string
	Serial         Serial // rtu and ascii only; the zero value for other transports
	Tags           []Tag  // profile tags first, then the device's own
	Line           int    // line of the device's [[device]] header
}

// Serial settings of an rtu device. Devices sharing a path must agree.
type Serial struct {
	Baud     int
	DataBits int    // 5..8
	Parity   string // "N" | "E" | "O"; never empty (goburrow/serial treats "" as even)
	StopBits int    // 1 | 2
	RS485    bool
	// RS-485 RTS delays, used only when RS485 is set.
	RS485DelayRTSBeforeSend time.Duration
	RS485DelayRTSAfterSend  time.Duration
}

// Register kinds.
const (
	RegisterHolding  = "holding"
	RegisterInput    = "input"
	RegisterCoil     = "coil"
	RegisterDiscrete = "discrete"
)

// Tag is one value read from a device.
//
// Order names the byte order of the value as it comes off the wire, with A
// the most significant byte: ABCD big-endian (Modbus standard), CDAB word
// swapped, BADC byte swapped within each word, DCBA little-endian. For 64-bit
// types the same four names apply word-wise: ABCD = words 1,2,3,4 big-endian;
// CDAB = words in reverse order, bytes big-endian; BADC = words in order,
// bytes swapped; DCBA = fully little-endian. 16-bit types accept only ABCD
// and BADC (there is no word to swap); bool accepts only ABCD: Bit counts
// from the least significant bit of the register value as read.
type Tag struct {
	Name     string
	Register string // holding | input | coil | discrete
	Address  uint16 // 0-based on the wire
	Type     string // a tagtype name (tagtype.Names: int16 … float16), aliases resolved
	Order    string // ABCD CDAB BADC DCBA
	Bit      int    // 0..15 for a bool taken from a holding/input register, else -1
	Length   int    // registers of a string tag (1..125), else 0
	// StringLocation is where a string tag's characters sit in each
	// register: both (two a register), lower or upper (one, in that byte);
	// "" for other types.
	StringLocation string
	Scale          float64
	Offset         float64 // value = raw*Scale + Offset
	Unit           string
	Deadband       float64 // >= 0; 0 = every change is a change
	Writable       bool    // holding and coil only
	Min, Max       *float64
	Profile        string // the profile the tag came from, "" for a device's own tag
	Line           int    // line of the tag entry

	// Poll rate and report by exception.
	Interval        time.Duration // polled every Interval, a multiple of its device's; 0 = the device's
	DeadbandPercent float64       // >= 0: a good value kept only when it moved more than this % of |last kept|
	MaxSilence      time.Duration // >= 0: an unchanged good value kept at least this often; 0 = off
}

// Words is the number of 16-bit registers the tag occupies: 1, 2 or 4, 1
// for a bit or a byte of a register, Length for a string. It is 0 for coil
// and discrete tags, which live in the separate bit address space (see Span).
func (t Tag) Words() int {
	if r, _ := tagtype.ParseRegister(t.Register); r.Bits() {
		return 0
	}
	return t.Span()
}

// Span is the number of addresses the tag occupies in its own address space
// (tagtype.Span): Words for holding/input registers, 1 for coil/discrete.
func (t Tag) Span() int {
	typ, _ := tagtype.Parse(t.Type)
	r, _ := tagtype.ParseRegister(t.Register)
	return tagtype.Span(typ, r, t.Length)
}

// Upstream is where samples are pushed.
type Upstream struct {
	WebSocket WebSocket
	MQTT      MQTT
	Sparkplug *Sparkplug // nil = no [upstream.sparkplug] (sparkplug.go)
	// TSUnit is the unit of ts in every upstream payload (WebSocket and MQTT
	// batches, per-tag topics): "us" (default) or "ms" (Node-RED's Date).
	TSUnit string
}

// Upstream ts units.
const (
	TSUnitMicros = "us"
	TSUnitMillis = "ms"
)

// WebSocket is the primary upstream. No URLs = no WebSocket upstream.
type WebSocket struct {
	URL           string        // the first of URLs ("" = none)
	URLs          []string      // ws:// or wss:// receivers in order (url = "…" is a one-element urls)
	PrimaryRetry  time.Duration // away from URLs[0] this long, go back to it
	Compression   bool          // offer permessage-deflate
	TokenFile     string        // bearer token
	CAFile        string
	CertFile      string // client certificate: both or neither with KeyFile
	KeyFile       string
	ServerName    string // TLS server name override
	FallbackAfter time.Duration
	BatchMax      int // samples per batch
	BatchWait     time.Duration
}

// MQTT modes.
const (
	MQTTFallback = "fallback" // batches go to MQTT while WebSocket is down
	MQTTAlways   = "always"   // batches go to MQTT too
	MQTTOff      = "off"
)

// MQTT is the fallback (or parallel) upstream and the per-tag topics.
type MQTT struct {
	Broker        string   // the first of Brokers ("" = none); Sparkplug uses this one
	Brokers       []string // tcp:// ssl:// tls:// mqtt:// mqtts:// ws:// wss:// (broker = "…" is a one-element brokers)
	TopicPrefix   string
	Mode          string // fallback | always | off
	QoS           int    // 0, 1 or 2
	ClientID      string
	UsernameFile  string
	PasswordFile  string
	CAFile        string
	CertFile      string
	KeyFile       string
	ServerName    string
	PerTagTopics  bool // retained <prefix>/<device>/<tag>
	WriteCommands bool // accept writes on <prefix>/write/<device>/<tag>
}

// Fsync policies of the durable queue.
const (
	FsyncBatched = "batched"
	FsyncAlways  = "always"
	FsyncNever   = "never"
)

// Buffer is the durable store-and-forward queue (used when Gateway.DataDir is set).
// History is the gateway's own history (the page's trends, /api/history).
type History struct {
	RawWindow time.Duration // raw samples kept per tag
	FineKeep  time.Duration // 1-minute buckets kept in RAM
	Keep      time.Duration // 10-minute buckets in RAM, 1-minute ones in data_dir
	MaxRAM    int64         // bytes of the raw window's compressed chunks, every tag together
}

type Buffer struct {
	MaxBytes      int64  // oldest dropped and counted beyond it
	Fsync         string // batched | always | never
	FsyncInterval time.Duration
}
