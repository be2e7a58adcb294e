// Package mbserver owns the gateway's Modbus TCP server ([[modbus_server]]):
// the MBAP framing of its clients, the unit-id map, access control (allowed
// networks, a connection bound, a bound of requests in flight per client
// address), pass-through of requests to the gateway's own buses, the
// mirror (a virtual unit that serves the latest values from a declared
// register map) and the counters of both (stats.ModbusServer).
//
// Every bound answers at once and is counted: a connection outside the
// allowed networks or past MaxConns is closed at accept; a pass-through
// request past the client's MaxInFlight, or refused by the bus's full
// queue, gets exception 0x06 (server busy) on a connection that stays open.
//
// It never opens a device, never polls and never writes to the ring: a
// pass-through request goes to the bus owner through the Passer interface
// (edge's scheduler behind internal/gateway's adapter), which does it between two
// polls; the mirror reads the ring's latest values (Latest.Snapshot) and
// causes no bus traffic. It imports neither edge nor web nor push.
//
// Concurrency: New starts nothing; Serve owns every goroutine (one accept
// loop and one goroutine per connection, which reads a request, answers it
// and reads the next: one request in flight per connection) and returns
// after all of them exited. The per-client in-flight counts are one
// mutex-guarded map; counters are atomics.
package mbserver
