// Package push owns the upstream: the WebSocket uplink with acknowledged
// batches, the MQTT publisher (fallback path for the batches, per-tag
// retained topics, status with a last will) and the failover policy between
// them. It is the uplink client only: the frames are package wire's, the
// reference receiver is package receiver, the demo's broker lab/mqttbroker.
//
// It never polls devices, never serves local clients and never imports edge
// or web: it reads the durable queue through its own cursor (a
// spool.Reader: the gateway's one queue, shared with Sparkplug, is written
// once) and the latest values (a func returning a ringstore.Snapshot), and
// publishes its state in a stats.Upstream. Only acknowledged samples move
// its cursor on: a WebSocket batch on the receiver's ack, an MQTT batch on
// its PUBACK; what the queue's bound dropped below its cursor is counted
// for it and reported as a loss with its next batch. The WebSocket
// uplink is up ("connected") only from a session's first batch acked
// within AckTimeout: a receiver that answers the handshake and stores
// nothing counts as down, for the fallback and for the path /healthz reads. Everything else
// is resent, so receivers dedup by (gateway, epoch, seq). The WebSocket
// uplink tries its receiver URLs in order (the next on failure, back to the
// first after PrimaryRetry, handing the stream over without loss) and
// offers permessage-deflate (gorilla: each message deflated alone); MQTT
// gives paho every broker of a cluster. Which URL and broker is current is
// in stats.Upstream, each change logged once. Write commands come
// back the same ways (the receiver over the WebSocket uplink; MQTT
// <prefix>/write/<device>/<tag> only with MQTT.WriteCommands, which trusts
// the broker's ACLs: whoever may publish there may write) and are handed to
// a Writer declared here; push never touches a device itself.
//
// Concurrency: Pusher.Run owns every goroutine it starts (the WebSocket dial
// loop and, per connection, one reader and one writer; the MQTT batch
// sender; the per-tag publisher; the mirror of "always" mode) and returns
// after they have exited. At most one path sends batches at a time: the
// dispatcher in Run stops the MQTT sender before a WebSocket session may
// start. Write commands run in goroutines owned by the session that read
// them (at most MaxWrites each, answered through the session's one writer)
// or by the MQTT write loop in Run.
package push
