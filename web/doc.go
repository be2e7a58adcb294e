// Package web owns local delivery: the HTTP server with the three delivery
// methods of the SCADA benchmark (short polling, long polling, WebSocket),
// the device/health API (/api/devices, /api/status, /healthz), the
// Prometheus exposition (/metrics) and the embedded live page (/).
//
// It never polls devices, pushes upstream or writes to the ring: it reads the
// ring (Since, Snapshot) and the stats records through small interfaces and
// imports neither edge nor push. Every client is bounded (MaxClients per
// method, MaxRequestBytes, timeouts, a bounded WebSocket queue) and a slow
// WebSocket client is dropped, never waited for.
//
// Concurrency: New starts nothing; Serve owns every goroutine (the HTTP
// server, the one hub goroutine that waits on the ring and encodes each batch
// once, and per WebSocket connection one writer and one reader) and returns
// after all of them exited. Only a connection's writer writes data frames;
// close frames go through WriteControl, which gorilla allows concurrently.
package web
