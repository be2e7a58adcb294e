// Package ringstore owns the Sample type and its JSON encoding, the global
// sequence with its epochs (and the Skip a restart leaves in it), and the
// in-memory ring of recent samples (in 24-byte slots without pointers, read
// back as Samples) with its latest-value snapshot and wake-ups. The durable
// queue that upstream pushes from is package spool.
//
// It never polls devices, serves clients, talks to the network or keeps
// samples on disk (only the sequence's high-water mark); it imports no
// project package: whatever else sees the samples (the durable queues, the
// history) registers as a Consumer (Consume: a list, in one place, internal/gateway's
// gateway assembly; no consumer can replace another), so spool and history
// import ringstore, never the reverse.
//
// Concurrency: Ring and Sequence are safe for concurrent use. Append holds
// the ring's lock while numbering, storing and handing the batch to each
// consumer's HandOff (the queues' hand-off: memory only, no I/O), so every
// consumer sees batches in sequence order; it calls each consumer's After
// (the queues' disk writes, the history) after releasing it, so no disk I/O
// runs under the ring's lock. Waiters get a channel from Since under that same lock:
// no wake-up can be lost. Sequence.Run is the package's goroutine, owned by
// the caller.
package ringstore
