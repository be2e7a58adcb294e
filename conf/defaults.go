package conf

import "time"

// Defaults: every default of the config file, in one place. A key that is
// absent from the file takes its default; a key that is present means what
// it says (so retries = 0 and per_tag_topics = false are honoured, and
// scale = 0 or interval = "0s" are errors). One value is taken otherwise,
// with a warning at start: qos = 0 sends batches at QoS 1, since a batch
// leaves the durable queue only on its PUBACK (QoS 0 has none: a batch
// published while reconnecting would be dropped and still counted sent).
//
//	key                              default                      valid
//	allow_empty (top level)          false                        true: a reload may remove every device
//	[gateway] id                     host name                    [A-Za-z0-9_.-]+
//	[gateway] data_dir               "" (memory only)             path
//	[http] listen                    "127.0.0.1:8080"             host:port
//	[http] long_poll_timeout         "30s"                        > 0
//	[http] max_clients               5000 (per method)            > 0
//	[http] max_request_bytes         "64KiB"                      > 0
//	[http] read_header_timeout       "10s"                        > 0
//	[http] write_timeout             "0s" (derived by web)        >= 0
//	[http] idle_timeout              "120s"                       > 0
//	[http] allowed_origins           [] (same origin only)        "http(s)://host[:port]"
//	[http] write_token_file          "" (writes off)              path
//	[http] read_token_file           "" (reads open)              path
//	[http] basic_auth_user, basic_auth_hash_file  "" (off)        both or neither; hash from edgegw hash-password
//	[http] protect_metrics           false                        /metrics needs read credentials
//	[http] tls_cert_file, tls_key_file  "" (plain HTTP)           both or neither
//	[http] exempt_loopback           false (loopback limited)     true: no rate limit for 127.0.0.0/8, ::1
//	[http] healthz_upstream_max_down "10m"                        >= 0 (0: /healthz ignores the upstream)
//	[http] trusted_proxies           [] (X-Forwarded-For ignored)  CIDRs or addresses: their X-Forwarded-For names the client
//	[http] allowed_networks          [] (every client)            CIDRs or addresses; other clients get 403
//	[http.limits] poll_rate, poll_burst        1000/s, 1000       shortPolling, and long polls answered with the snapshot
//	[http.limits] read_rate, read_burst        100/s, 400         page, assets, devices, status, history, trends
//	[http.limits] connect_rate, connect_burst  200/s, 2000        WebSocket upgrades
//	[http.limits] monitor_rate, monitor_burst  5/s, 20            /metrics, /healthz
//	[http.limits] write_rate, write_burst      2/s, 5             POST /api/write
//	[http.limits] auth_rate, auth_burst        0.5/s, 5           failed authentications, password hashing
//	[http.limits] connections_per_client       2000               WebSocket + waiting long polls held at once
//	                                 (every [http.limits] key is per client IP; 0 = the default,
//	                                 -1 = no limit for a rate or connections_per_client; rates 0..1000000)
//	[ring] size                      0: 60 s of samples, ≤ 8 MiB  1..10000000
//	[ring] max_bytes                 "8MiB" (with size 0)         64KiB..1GiB; caps the ring sized from the rate
//	[poll] tcp_mode                  "parallel"                   parallel | serial
//	[poll] max_gap                   8 registers                  0..125
//	[poll] max_registers             125                          1..125
//	[poll] max_bits                  2000                         1..2000
//	[poll] udp_listen                ":0" (any address, ephemeral port)  host:port
//	[poll] udp_buffer_bytes          "4MiB"                       > 0
//	[[endpoint]] address             (required)                   host[:port] or serial path of some device
//	[[endpoint]] max_connections     1                            1..16 (serial line: 1)
//	[[endpoint]] pause               "0s"                         >= 0
//	[[device]] transport             (required)                   tcp | udp | rtu | rtuovertcp | ascii | asciiovertcp
//	[[device]] address               (required); port 502 added   host[:port]; rtu, ascii: /dev/...
//	[[device]] unit                  1                            0..247 (rtu, ascii: 1..247)
//	[[device]] interval              "1s"                         > 0
//	[[device]] timeout               interval/(retries+1), at most  > 0, <= interval
//	                                 udp "200ms", tcp/rtuovertcp/asciiovertcp "500ms", rtu/ascii "1s"
//	[[device]] retries               1                            >= 0
//	[[device]] max_gap               [poll] max_gap               0..125
//	[[device]] max_registers         [poll] max_registers         1..125
//	[[device]] write_transport       udp devices: "tcp"           tcp | udp (udp devices only)
//	[device.serial] baud             9600                         > 0
//	[device.serial] data_bits        8                            5..8
//	[device.serial] parity           "N"                          N | E | O
//	[device.serial] stop_bits        1                            1 | 2
//	[device.serial] rs485            false
//	[device.serial] rs485_delay_rts_before_send, rs485_delay_rts_after_send  "0s"  >= 0
//	tag register                     "holding"                    holding | input | coil | discrete
//	tag address                      (required)                   0..65535 (+ words - 1)
//	tag type                         "uint16"; coil/discrete "bool"  int16 uint16 int32 uint32 float32 int64 uint64 float64 bool string
//	                                                              int8_high int8_low uint8_high uint8_low float16 (see "Tag types")
//	tag length                       (required for string)        1..125 registers
//	tag string_register_location     "both" (string only)         both (two characters a register) | lower | upper (one, in that byte)
//	tag order                        "ABCD"                       ABCD CDAB BADC DCBA (16-bit, string: ABCD BADC; bool, 8-bit, string lower/upper: ABCD)
//	tag bit                          none (-1)                    0..15, bool on holding/input only (and required there)
//	tag scale                        1                            != 0, not on bool
//	tag offset                       0                            not on bool
//	tag deadband                     0                            >= 0, not on bool
//	tag deadband_percent             0                            >= 0, not on bool: kept when moved more than this % of |last kept| (at 0: any change)
//	tag max_silence                  "0s" (off)                   >= 0, with deadband or deadband_percent: an unchanged good value kept at least this often
//	tag interval                     the device's interval        a multiple of it; some tag of the device at it; at most 8 rates a device
//	tag writable                     false                        holding and coil only; not 8-bit types or string
//	tag min, max                     none                         min <= max
//	[upstream] ts_unit               "us"                         us | ms: ts in every upstream payload
//	[upstream.websocket] url         "" (none)                    ws:// or wss://; or urls = [...] (not both)
//	[upstream.websocket] urls        [] (none)                    tried in order; on failure the next
//	[upstream.websocket] primary_retry "5m"                       > 0; away from urls[0] this long, back to it
//	[upstream.websocket] compression true                         offer permessage-deflate
//	[upstream.websocket] fallback_after  "10s"                    > 0
//	[upstream.websocket] batch_max   500 samples                  > 0
//	[upstream.websocket] batch_wait  "200ms"                      > 0
//	[upstream.mqtt] broker           "" (none)                    tcp ssl tls mqtt mqtts ws wss :// host:port
//	[upstream.mqtt] brokers          [] (none)                    a cluster, tried in order (not with broker)
//	[upstream.mqtt] topic_prefix     "edgegw/<gateway id>"        no + # or trailing /
//	[upstream.mqtt] mode             "fallback" if broker set, else "off"   fallback | always | off
//	[upstream.mqtt] qos              1 (the batch topic's)        1 | 2; 0 runs as 1 (warned)
//	[upstream.mqtt] client_id        "edgegw-<gateway id>"
//	[upstream.mqtt] per_tag_topics   true
//	[upstream.mqtt] write_commands   false
//	[upstream.sparkplug] group_id    (required; the section is optional)  no + # / ; needs [upstream.mqtt] broker
//	[upstream.sparkplug] node_id     the gateway id               no + # /
//	[upstream.sparkplug] primary_host_id  "" (none)               no + # /
//	[upstream.sparkplug] writes      false                        DCMD writes to writable tags
//	[upstream.sparkplug] client_id   "<mqtt client_id>-sparkplug"
//	[buffer] max_bytes               "64MiB"                      > 0; "512KiB", "64MiB", "1GB" or an integer
//	[buffer] fsync                   "batched"                    batched | always | never
//	[buffer] fsync_interval          "1s"                         > 0
//	[history] raw_window             "10m" (within max_ram)         > 0
//	[history] max_ram                "4MiB" (raw chunks, all tags)  > 0; oldest chunks go first beyond it
//	[history] fine_keep              "6h" (1-minute buckets, RAM)  >= 1m
//	[history] keep                   "168h" (10-minute in RAM, 1-minute in data_dir)  >= 10m
//	[[modbus_server]] listen         (required; the section is optional)  host:port
//	[[modbus_server]] allowed_networks  [] (every client)          CIDRs or addresses
//	[[modbus_server]] max_connections  16                         1..4096
//	[[modbus_server]] max_in_flight  4 (per client address)       1..1024
//	[[modbus_server]] idle_timeout   "60s"                        > 0
//	[[modbus_server]] writes         false                        FC5/6/16 pass through; else exception 0x01
//	[[modbus_server]] units          {} ({ 5 = "meter-3" })       unit 1..247 → a tcp, rtu or rtuovertcp device
//	[[modbus_server]] endpoints      [] (["/dev/ttyUSB0"])        every device at that address, at its own unit
//	[modbus_server.mirror] unit      (required with the table)    1..247, no pass-through unit
//	[modbus_server.mirror] format    "float32"                    float32 | int16 | uint16 | raw (per map entry too)
//	[modbus_server.mirror] multiplier  1                          int16/uint16: register = round(value × it)
//	[modbus_server.mirror] on_bad    "exception"                  exception (0x04) | value (bad_value / NaN)
//	[modbus_server.mirror] bad_value -32768                       -32768..65535
//	[modbus_server.mirror] quality_address  -1 (none)             one quality register per slot from there
//	[modbus_server.mirror] map       (required)                   [{ device = "logger-*", tags = [...], address, format, multiplier }]
//
// Sizes take B, KB/MB/GB/TB (powers of 1000) and KiB/MiB/GiB/TiB (powers of
// 1024), or a plain integer of bytes. Durations are Go durations ("200ms",
// "1s", "1m30s").
const (
	DefaultHTTPListen        = "127.0.0.1:8080"
	DefaultLongPollTimeout   = 30 * time.Second
	DefaultMaxClients        = 5000
	DefaultMaxRequestBytes   = 64 << 10
	DefaultReadHeaderTimeout = 10 * time.Second
	DefaultWriteTimeout      = 0 // derived by web
	DefaultIdleTimeout       = 120 * time.Second

	DefaultRingSize = 0 // sized by main from the poll rate: a resume window of 60 s, at most 8 MiB
	MaxRingSize     = 10_000_000
	DefaultRingMax  = 8 << 20 // [ring] max_bytes
	MinRingBytes    = 64 << 10
	MaxRingBytes    = 1 << 30

	DefaultTCPMode        = "parallel"
	DefaultMaxGap         = 8
	DefaultMaxRegisters   = 125
	LimitMaxRegisters     = 125 // Modbus: registers per read
	LimitRates            = 8   // distinct tag intervals of one device (edge.MaxRates)
	DefaultMaxBits        = 2000
	LimitMaxBits          = 2000 // Modbus: coils per read
	DefaultUDPListen      = ":0"
	DefaultUDPBufferBytes = 4 << 20

	DefaultModbusPort     = "502"
	DefaultUnit           = 1
	MaxUnit               = 247
	DefaultInterval       = time.Second
	DefaultTimeoutUDP     = 200 * time.Millisecond
	DefaultTimeoutTCP     = 500 * time.Millisecond // tcp and rtuovertcp
	DefaultTimeoutRTU     = time.Second
	DefaultRetries        = 1
	DefaultWriteTransport = TransportTCP // udp devices

	DefaultBaud     = 9600
	DefaultDataBits = 8
	DefaultParity   = "N"
	DefaultStopBits = 1

	DefaultRegister     = RegisterHolding
	DefaultRegisterType = "uint16" // holding/input
	DefaultBitType      = "bool"   // coil/discrete
	DefaultOrder        = "ABCD"
	DefaultScale        = 1.0

	DefaultTSUnit        = TSUnitMicros
	DefaultFallbackAfter = 10 * time.Second
	DefaultBatchMax      = 500
	DefaultPrimaryRetry  = 5 * time.Minute
	DefaultCompression   = true
	DefaultBatchWait     = 200 * time.Millisecond

	DefaultTopicPrefixBase = "edgegw/" // + gateway id
	DefaultClientIDPrefix  = "edgegw-" // + gateway id
	DefaultQoS             = 1
	DefaultPerTagTopics    = true
	DefaultWriteCommands   = false

	DefaultBufferMaxBytes = 64 << 20
	DefaultFsync          = FsyncBatched
	DefaultFsyncInterval  = time.Second

	DefaultHistoryRawWindow = 10 * time.Minute
	DefaultHistoryFineKeep  = 6 * time.Hour
	DefaultHistoryKeep      = 7 * 24 * time.Hour
	DefaultHistoryMaxRAM    = 4 << 20
)

// MaxLimitRate bounds every [http.limits] rate, burst and count.
const MaxLimitRate = 1_000_000

// DefaultHealthzUpstreamMaxDown is [http] healthz_upstream_max_down.
const DefaultHealthzUpstreamMaxDown = 10 * time.Minute

// derivedTimeout is the timeout of a device that sets none: every attempt
// (retries + 1) fits in one interval, and no attempt waits longer than the
// transport's default. interval = "100ms" with retries = 1 gets 50ms.
func derivedTimeout(transport string, interval time.Duration, retries int) time.Duration {
	return max(min(defaultTimeout(transport), interval/time.Duration(retries+1)), time.Microsecond)
}

// defaultTimeout is the longest device timeout conf derives for a transport.
func defaultTimeout(transport string) time.Duration {
	switch transport {
	case TransportUDP:
		return DefaultTimeoutUDP
	case TransportRTU, TransportASCII:
		return DefaultTimeoutRTU
	}
	return DefaultTimeoutTCP
}
