// Package receiver owns the reference upstream receiver (`edgegw receive`,
// the demo's and the soak's receiver): a WebSocket server at /ingest that
// checks the gateways' bearer token, acks every batch after writing it,
// dedups by (gateway, epoch, seq) with state files that survive its own
// restarts, reports gaps, the loss ranges a gateway announces (counted apart
// from gaps, with their reason) and new epochs, ingests batches that came another
// way (MQTT: Ingest, and MQTTIngest's shared subscription of the batch
// topic, acknowledged after Ingest), and sends write commands to connected
// gateways. It accepts permessage-deflate (without context takeover, as
// gorilla offers) and bounds each message after decompression.
//
// It is a server, and the protocol's reference implementation: the frames
// it reads and writes are package wire's (its doc comment is the protocol),
// the dedup rule is the one stated there. It never polls devices, never
// reads a gateway's queue and imports neither edge, web nor push; it is in
// the lab binary only, never in the release gateway binary.
//
// Concurrency: New starts nothing. Serve owns the HTTP server and one
// handler goroutine per gateway connection (its only reader) and returns
// after they have exited; a connection's writes (acks, pongs, write
// commands) are serialized by its own mutex. The dedup state and the output
// are guarded by one mutex, so Ingest (from any goroutine) and the handlers
// write whole batches one at a time. Write may be called from any
// goroutine. MQTTIngest.Run owns paho's client; batches are ingested on
// its one delivery goroutine, in order.
package receiver
