package stats

import "sync/atomic"

// ModbusServer holds the counters of one [[modbus_server]] (package
// mbserver writes them; web shows them in /api/status and /metrics). The
// zero value is ready.
type ModbusServer struct {
	Listen string // the configured listen address, for display; set before use

	Connections  atomic.Int64  // open now
	Accepted     atomic.Uint64 // connections accepted
	ConnsRefused atomic.Uint64 // closed at accept: not an allowed network, or max_connections open
	AcceptErrors atomic.Uint64 // accept failures (out of descriptors): retried after 50 ms

	Requests       atomic.Uint64     // requests answered (every unit: pass-through, mirror, unknown)
	PassRequests   atomic.Uint64     // pass-through requests that reached a bus
	MirrorRequests atomic.Uint64     // requests answered by the mirror
	Writes         atomic.Uint64     // pass-through writes sent to a device
	WritesRefused  atomic.Uint64     // writes answered 0x01 because writes are off (or to the mirror)
	Busy           atomic.Uint64     // answered 0x06: the client's in-flight bound or the bus's queue was full
	Exceptions     [12]atomic.Uint64 // answers by exception code (index = code; 0 unused)

	Wait      Histogram        // pass-through: time from the queue to the bus taking the request up
	WaitPolls [4]atomic.Uint64 // pass-through: polls waited for: 0, 1, 2, 3 or more
}

// ModbusServerSnapshot is a copy of a ModbusServer for display.
type ModbusServerSnapshot struct {
	Listen                                 string
	Connections                            int64
	Accepted, ConnsRefused, AcceptErrors   uint64
	Requests, PassRequests, MirrorRequests uint64
	Writes, WritesRefused, Busy            uint64
	Exceptions                             [12]uint64
	Wait                                   HistogramSnapshot
	WaitPolls                              [4]uint64
}

// Snapshot copies the counters (each read atomically, not all at once).
func (m *ModbusServer) Snapshot() ModbusServerSnapshot {
	s := ModbusServerSnapshot{
		Listen: m.Listen, Connections: m.Connections.Load(), Accepted: m.Accepted.Load(), ConnsRefused: m.ConnsRefused.Load(), AcceptErrors: m.AcceptErrors.Load(),
		Requests: m.Requests.Load(), PassRequests: m.PassRequests.Load(), MirrorRequests: m.MirrorRequests.Load(),
		Writes: m.Writes.Load(), WritesRefused: m.WritesRefused.Load(), Busy: m.Busy.Load(),
		Wait: m.Wait.Snapshot(),
	}
	for i := range m.Exceptions {
		s.Exceptions[i] = m.Exceptions[i].Load()
	}
	for i := range m.WaitPolls {
		s.WaitPolls[i] = m.WaitPolls[i].Load()
	}
	return s
}
