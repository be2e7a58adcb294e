// Package stats owns the per-device health record: counters and the RTT
// histogram that edge writes on every poll and that web, bench and internal/gateway read,
// the device and tag identities beside it (Info, with UnitIndex, the one
// lookup of a tag's unit for push's per-tag topics and web's /metrics); and
// the like records of the upstream (push) and of each Modbus TCP server
// (mbserver's ModbusServer).
//
// It never does I/O and imports no project package, so edge, web and push
// can all share it without importing each other.
//
// Concurrency: every method of Device is safe for concurrent use; writers
// use atomics only (no lock on the poll path); Snapshot is a consistent-enough
// copy for display (each counter is read atomically, not all at once).
package stats
