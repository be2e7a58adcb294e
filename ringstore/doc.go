// Package ringstore owns the Sample type, the global sequence and its epochs, the in-memory
// ring of recent samples with its latest-value snapshot and wake-ups, and the
// durable store-and-forward queue that upstream pushes from.
//
// It never polls devices, serves clients or talks to the network; it imports
// no project package.
//
// Concurrency: Ring, Sequence and Queue are safe for concurrent use. Append
// holds the ring's lock while numbering, storing and handing the batch to the
// OnAppend hook (the queue's memory, no I/O), so every consumer sees batches
// in sequence order; it calls the AfterAppend hook (the queue's disk write)
// after releasing it, so no disk I/O ever runs under the ring's lock. Waiters
// get a channel from Since under that same lock: no wake-up can be lost.
// Sequence.Run and Queue.Run are the package's goroutines, owned by the caller.
package ringstore
