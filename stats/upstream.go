package stats

import "sync/atomic"

// Upstream paths, as shown on the page and in /metrics.
const (
	PathOff          = "off"          // no upstream configured
	PathWebSocket    = "websocket"    // batches go over the WebSocket uplink, and its receiver acknowledges them
	PathMQTT         = "mqtt"         // WebSocket down longer than fallback_after; batches go to MQTT
	PathBuffering    = "buffering"    // no path up: samples wait in the durable queue
	PathUnauthorized = "unauthorized" // the receiver refused our token (401/403); not retrying
)

// Upstream is the live state of the upstream pusher. push writes it; web reads it.
type Upstream struct {
	Path          atomic.Value  // string, one of the Path constants
	PathSinceUS   atomic.Int64  // Unix µs when Path last changed (0: never set)
	QueueSamples  atomic.Int64  // samples waiting for an acknowledgement
	QueueBytes    atomic.Int64  // bytes they take in the queue
	QueueMode     atomic.Value  // string: "disk", "memory", or "memory (disk: <error>)" while the disk fails
	QueueCorrupt  atomic.Uint64 // queue records skipped because their checksum failed
	OldestUnackUS atomic.Int64  // Unix µs of the oldest unacknowledged sample's ts, 0 if none
	Dropped       atomic.Uint64 // samples dropped because the queue hit its bound
	Reconnects    atomic.Uint64 // WebSocket and MQTT reconnects
	SentWS        atomic.Uint64 // samples acknowledged over WebSocket
	SentMQTT      atomic.Uint64 // samples acknowledged over MQTT (PUBACK)
	// WSSessionsFailed counts WebSocket sessions that ended without a batch
	// acknowledged: the receiver answered the handshake but stored nothing
	// (no ack within the ack timeout, a bad frame, a close after a batch).
	WSSessionsFailed atomic.Uint64
	// The receivers and brokers configured ([]string each, passwords
	// redacted; set once by push.New) and which one the link uses now
	// (string: the one being tried or connected; "" before the first try).
	WSURLs, MQTTBrokers atomic.Value
	WSURL, MQTTBroker   atomic.Value
}

// UpstreamSnapshot is a plain copy of Upstream.
type UpstreamSnapshot struct {
	Path                                    string
	PathSinceUS                             int64
	QueueMode                               string
	QueueSamples, QueueBytes, OldestUnackUS int64
	Dropped, Reconnects, SentWS, SentMQTT   uint64
	QueueCorrupt, WSSessionsFailed          uint64
	WSURL, MQTTBroker                       string
	WSURLs, MQTTBrokers                     []string
}

// Snapshot copies the record.
func (u *Upstream) Snapshot() UpstreamSnapshot {
	p, _ := u.Path.Load().(string)
	if p == "" {
		p = PathOff
	}
	m, _ := u.QueueMode.Load().(string)
	wsURL, _ := u.WSURL.Load().(string)
	broker, _ := u.MQTTBroker.Load().(string)
	wsURLs, _ := u.WSURLs.Load().([]string)
	brokers, _ := u.MQTTBrokers.Load().([]string)
	return UpstreamSnapshot{
		WSURL: wsURL, MQTTBroker: broker, WSURLs: wsURLs, MQTTBrokers: brokers,
		Path: p, PathSinceUS: u.PathSinceUS.Load(), QueueMode: m, QueueCorrupt: u.QueueCorrupt.Load(), QueueSamples: u.QueueSamples.Load(), QueueBytes: u.QueueBytes.Load(),
		OldestUnackUS: u.OldestUnackUS.Load(), Dropped: u.Dropped.Load(), Reconnects: u.Reconnects.Load(),
		SentWS: u.SentWS.Load(), SentMQTT: u.SentMQTT.Load(), WSSessionsFailed: u.WSSessionsFailed.Load(),
	}
}
