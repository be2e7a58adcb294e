// Package history owns the gateway's own memory of the past: per tag, the raw
// samples of a recent window, compressed in chunks (delta-of-delta times,
// XOR'd float values, a bool form, quality changes; chunk.go has the layout)
// within one RAM budget for every tag (Config.MaxRAM: the oldest chunks go
// first, counted), and downsampled buckets (min, max, mean, last,
// good and bad polls) in two tiers, per device its health over time (valid
// rate, RTT), closed buckets encoded a block of 32 at a time (block.go), and,
// with a directory, the closed fine buckets on disk so that a restart keeps
// them.
//
// It never polls devices, serves clients or numbers samples: internal/gateway tees the
// samples edge hands to the ring into Add, and web reads through Query and
// Health. It imports ringstore (Sample, Quality), stats (the health record)
// and internal/backoff (the throttle of its write-error line) only.
//
// Concurrency: Store is safe for concurrent use; one mutex guards every series
// and Add does no I/O under it (it runs in the poll path); a query decodes
// the raw chunks and the bucket blocks one at a time into its answer, under
// the same mutex. Run is the one
// goroutine: at each bucket boundary it closes open buckets, samples the
// device records and writes the closed buckets of that step in one batch.
// Open does the disk reading before any goroutine exists.
package history
