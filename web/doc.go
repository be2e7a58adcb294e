// Package web owns local delivery: the HTTP server with the three delivery
// methods of the SCADA benchmark (short polling, long polling, WebSocket),
// the device/health API (/api/devices, /api/status, /healthz), the history
// API (/api/history, /api/trends), the Prometheus exposition (/metrics), the embedded live
// page (/) with its chart library (/assets/), the local write API
// (POST /api/write) and the server's access control: bearer tokens or basic
// auth, a CORS/origin allow-list, allowed networks, trusted proxies, per-client
// rate limits and held-connection slots, a connection bound and optional
// TLS. The delivery replies, WebSocket messages and write bodies are package
// wire's frames (their layouts are documented there).
//
// It never polls devices, pushes upstream or writes to the ring: it reads the
// ring (Since, Snapshot), the history (Query, Health) and the stats records
// through small interfaces, hands writes to a Writer (edge's scheduler behind
// internal/gateway's adapter) and imports neither edge nor push. The one secret file it
// reads is the TLS key, with its certificate (at Check and Listen); tokens
// and the password hash come in from internal/gateway as values.
// Every client is bounded (MaxConns, MaxClients per method, rate limits and
// ConnsPerClient per client IP, MaxRequestBytes, MaxWriteBody, timeouts, a
// bounded WebSocket queue, a gateway-wide budget of bytes encoded for one
// WebSocket client alone, a resume served in chunks as the client reads) and
// a slow WebSocket client is dropped, never waited for.
//
// Concurrency: New starts nothing; Serve owns every goroutine (the HTTP
// server and its listener's accept loop, the one hub goroutine that waits on
// the ring and encodes each batch once, the parker that holds every waiting
// long poll, and per WebSocket connection one writer and one reader, started
// by the handler, which returns after the handshake) and returns after all of
// them exited. A waiting long poll holds no goroutine and no buffer: its
// connection is parked (park.go) and given back to net/http once answered. Only a connection's writer writes data frames;
// close frames go through WriteControl, which gorilla allows concurrently.
// /healthz's hold (the state it answers with, storage.go) is one
// mutex-guarded record updated at each request.
// The rate limiter, the per-client connection slots and the basic-auth
// verdict cache are mutex-guarded maps; password hashing runs in the request's goroutine, at most
// RateLimits.HashConcurrency at once (a semaphore).
package web
