// Package ringstore owns the Sample type, the global sequence, the in-memory
// ring of recent samples with its latest-value snapshot and wake-ups, and the
// durable store-and-forward queue that upstream pushes from.
//
// It never polls devices, serves clients or talks to the network; it imports
// no project package.
//
// Concurrency: Ring and Sequence are safe for concurrent use. Append holds the
// ring's lock while numbering, storing and handing the batch to the OnAppend
// hook, so every consumer sees batches in sequence order. Waiters get a
// channel from Since under that same lock: no wake-up can be lost.
package ringstore
