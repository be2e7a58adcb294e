// Package receiver owns the upstream receiver: the server end of the
// gateways' WebSocket uplink, shipped as its own binary edgegw-receiver
// (cmd/edgegw-receiver) and as the lab's `edgegw receive` (the demo's and
// the soak's receiver), both running Main with the flags of Flags.
//
// It accepts gateways at /ingest, checks their bearer token, acks every
// batch once stored, dedups by (gateway, epoch, seq), takes the loss
// ranges and restart skips a gateway announces, ingests batches that came
// another way (MQTT: Ingest, and MQTTIngest's shared subscription of the
// batch topic, acknowledged after Ingest), sends write commands to connected
// gateways,
// and serves /healthz and Prometheus /metrics beside /ingest. It accepts
// permessage-deflate (without context takeover, as gorilla offers) and
// bounds each message after decompression. It stores
// either
//   - in PostgreSQL (Config.Postgres, pg.go): each batch in one
//     transaction (COPY into a per-session stage table, INSERT … ON
//     CONFLICT DO NOTHING, the epoch and ranges), acked after COMMIT; the
//     dedup state is the primary key, so receivers sharing a database are
//     stateless and interchangeable; the schema (SchemaVersion) is created
//     by Open; Gaps finds holes by window functions; connections are
//     recorded in edgegw_connections so that a write for a gateway held by
//     another receiver names it; or
//   - as JSON lines (Config.Out) with dedup state files (dedup.go) that
//     survive its own restarts, gaps reported as they appear.
//
// It is the protocol's reference implementation: the frames it reads and
// writes are package wire's (its doc comment is the protocol), the dedup
// rule is the one stated there. It never polls devices, never reads a
// gateway's queue and imports neither edge, web nor push; it is never in
// the release gateway binary (neither is its PostgreSQL driver).
//
// Concurrency: New starts nothing; Open connects (a pgx pool). Serve owns
// the HTTP server and one handler goroutine per gateway connection (its
// only reader) and returns after they have exited; a connection's writes
// (acks, pongs, write commands) are serialized by its own mutex. In file
// mode the dedup state and the output are guarded by one mutex, so Ingest
// (from any goroutine) and the handlers write whole batches one at a time;
// with PostgreSQL the batches of different connections are written
// concurrently, each on its own pooled connection. Write may be called
// from any goroutine. Close after Serve has returned. MQTTIngest.Run owns
// paho's client; batches are ingested on its one delivery goroutine, in
// order.
package receiver
