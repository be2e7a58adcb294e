// Package spool owns the durable store-and-forward queue between the ring
// and the upstream senders (push, sparkplug): the hand-off of every
// appended batch, the store the samples are written to (segment files of
// CRC-checked records in a directory, or RAM without one, behind one
// interface), reading them back in seq order, removal only on
// acknowledgement, the MaxBytes bound with every drop counted and located,
// falling back to memory while the disk refuses writes, recovery at open
// (torn tails cut, corrupt records skipped and counted), the fsync policy,
// the ack mark and the restart skips kept beside the segments, and the
// loss accounting: the handed mark (the highest seq handed to the queue,
// kept apart from the last durable one) and the loss ranges (seqs handed
// to samples and then lost: cut by a crash, dropped at the bound, not
// writable at shutdown), kept until a batch that crosses them is
// acknowledged, so that no loss is silent. One queue serves every
// consumer: each reads with its own Cursor (Config.Cursors, positions
// kept in queue.cursors beside the ack mark), so a sample is written and
// synced once whatever the number of senders; a sample leaves the store
// only when every cursor has acknowledged it, the bound is over what the
// slowest cursor holds, and a cursor the bound overtakes is moved past
// the drop with the loss counted for it (its Stats().Dropped) and sent
// with its next batch.
//
// It never numbers samples (ringstore's Sequence does), never sends or
// serves anything, and never decides what is acknowledged (each sender
// does, on its cursor); it imports no project package but ringstore. It never deletes an
// unacknowledged sample except when the bound drops it (counted), and a
// read error never deletes or skips anything.
//
// Concurrency: every Queue method is safe for concurrent use. HandOff does
// no I/O (the ring calls it under its lock); Persist writes in the caller's
// goroutine; Run is the package's only goroutine (the writer for what
// Persist left, the batched fsync, the ack mark, segment deletion), started
// and owned by the caller; Open starts none. Close after Run has returned.
//
// Why it is hand-written and not github.com/tidwall/wal (telegraf's disk
// buffer): wal's records carry no checksum (a length and the data), so a
// flipped bit on an SD card would be sent as a sample; here every record
// is CRC-32C checked, and one that fails is skipped, counted and logged.
// wal also requires contiguous indexes (Write(index) with index ==
// last+1) where seqs jump after a restart and at drops, refuses to open a
// log whose last entry is torn (ErrCorrupt) where the tail must be cut and
// logged, and rewrites the head segment on TruncateFront, which an ack
// would call each time. A segment here is append-only records and a
// whole-file delete.
package spool
