// Package wire owns every frame that crosses a process boundary: the sample
// object, the upstream protocol (batches, acks, write commands and their
// answers, MQTT payloads), the local API's polling replies, WebSocket
// messages and write bodies, and the client-side readers of those replies.
// Its doc comment is the protocol's reference for a third-party receiver or
// client.
//
// It never opens a socket, a file or a goroutine: it encodes into and
// decodes from byte slices (and one io.Reader, a write body). It imports
// ringstore for the Sample type and its encoder, nothing else of the
// project; web, push, the reference receiver (package receiver) and the
// lab import it.
//
// Concurrency: every function is pure and safe for concurrent use; a
// Scanner belongs to one goroutine.
//
// # Sample
//
// One value of one tag from one poll, the same object everywhere (local
// API, upstream, the reference receiver's output), fields in this order:
//
//	{"seq":1042,"device":"logger-01","tag":"temperature","value":21.5,"quality":"good","ts":1764450000123456}
//
// Its fields:
//   - seq: unsigned, strictly increasing within the gateway's epoch, never
//     given to two samples of one epoch.
//   - device, tag: names from the configuration, [A-Za-z0-9_.-]{1,128}.
//   - value: a number; true/false for bool tags; a string for string tags;
//     null when quality is not "good". Integers as integers (3000000000,
//     exact up to 2^53), float32 registers in their shortest float32 form
//     (123.456), others in the shortest float64 form, without exponent for
//     1e-6 <= |v| < 1e21. A NaN or infinite register is never written: it
//     gives null with quality "error".
//   - quality: "good", "timeout" (no answer), "error" (exception,
//     malformed reply, transport error, not a number) or "stale" (a reload
//     stopped polling the tag or its device: its last sample, once).
//   - ts: acquisition time in Unix microseconds (16 digits), or in
//     milliseconds where a frame says "ts_unit":"ms".
//
// The encoder is ringstore's Sample.AppendJSON (a method on the type, on
// the hot path of every delivery, allocation-free): ringstore imports no
// project package, so it stays there and this package defines the shape.
//
// # Upstream protocol, version 2
//
// The gateway opens a WebSocket to the receiver's URL with
// "Authorization: Bearer TOKEN" and "Edgegw-Gateway: <gateway id>"
// (GatewayHeader; a receiver may also learn the id from the first batch).
// A refused token (HTTP 401 or 403) stops the gateway from dialling. Each
// WebSocket text message is one JSON object; the same batch frames are the
// payload of MQTT <prefix>/batch (QoS 1) when the gateway falls back.
//
// Gateway → receiver, a batch (AppendBatch; ParseBatch reads it):
//
//	{"type":"batch","v":2,"gateway":"gw-01","epoch":"9f3c04e1a2b3c4d5","first":41,"last":42,
//	 "skip":[[11,1048616]],
//	 "samples":[{"seq":41,"device":"logger-01","tag":"temperature","value":21.5,"quality":"good","ts":1764450000123456},{"seq":42,…}]}
//
// Its fields:
//   - samples are consecutive in the gateway's queue (seq strictly
//     increasing; a hole only where samples were dropped, and counted), all
//     of one epoch; first and last are the first and last sample's seq. A
//     gateway sends at most 500 a batch by default; a receiver refuses more
//     than DefaultMaxBatch.
//   - epoch (16 hex digits, a string: JSON numbers lose precision above
//     2^53) names one unbroken numbering. Seqs increase across a change of
//     epoch too. The gateway starts a new epoch whenever it cannot prove that
//     its numbering continues (a fresh or wiped data_dir, a memory-only
//     start, an unreadable mark, a disk that refuses the next mark).
//   - skip (only when there is one; at most MaxSkips): ranges [a,b] of the
//     epoch, below last, that were never given to a sample — what a restart
//     skipped of the block the previous run had reserved. Sent with the
//     batch that crosses them.
//   - loss (only when there is one; at most MaxLoss; AppendBatchLoss):
//     ranges of seqs, below last, that WERE given to samples the gateway
//     then lost, counted and with the reason, so that a receiver reports
//     them as a gap, with the reason, instead of a silent hole (layout
//     below). epoch is the lost samples' epoch (it may be an older one than the
//     batch's: seqs increase across epochs); reason is LossCrash ("crash":
//     a power cut or SIGKILL took them — a torn or corrupt tail cut, or
//     samples only in memory while the disk failed), LossFull ("full":
//     dropped at the queue bound, oldest first, also at an epoch's start)
//     or LossUnwritten ("unwritten": not writable at shutdown); a receiver
//     shows any other reason as it comes. Sent with the batch that crosses
//     them (its end lies below the batch's last), again after a reconnect
//     until that batch is acknowledged. A seq is never both in a loss range
//     and in a skip range; a sample in a loss range that does arrive (a
//     batch in flight when the bound dropped it) is a duplicate, not a loss.
//   - ts_unit "ms" (only with the gateway's ts_unit = "ms", right after the
//     epoch): every ts of the batch is in milliseconds. ParseBatch turns
//     them back into microseconds.
//
// A batch's loss field:
//
//	"loss":[{"epoch":"9f3c04e1a2b3c4d5","first":1048617,"last":1048640,"reason":"crash"}]
//
// Version 1 frames (no v, no epoch, no skip, no loss) are the epoch "".
//
// Receiver → gateway, the ack (AppendAck), cumulative: everything up to
// last is stored. Only acknowledged samples leave the gateway's queue; it
// keeps up to 4 batches in flight and, with no ack within 10 s, drops the
// connection and resends from the oldest unacknowledged sample, so every
// batch may arrive more than once (reconnects, both paths). An ack beyond
// what was sent is a protocol error.
//
//	{"type":"ack","last":42}
//
// The dedup rule for any receiver: a sample is identified by (gateway,
// epoch, seq). Keep, per (gateway, epoch), the seqs seen (a high-water mark
// and ranges above it); count skip ranges as seen; write a sample only if
// its (gateway, epoch, seq) is new; ack last only after the batch is
// stored. A hole in the seqs is a gap only inside one epoch and outside the
// skip ranges; a new epoch is not a gap. A loss range is a gap the gateway
// reports: count the seqs of it not seen yet as lost (with the reason),
// then count them as seen, so the hole is reported once, as a loss, and not
// again as an unexplained gap. An old receiver that ignores v, epoch, skip
// and loss keeps working (dedup by seq only: after a wiped data_dir it
// would take the new numbers for duplicates; a loss shows there as a gap
// without its reason).
//
// The reference receiver writes one line per new sample, the sample with
// the gateway and the epoch in front (AppendStored):
//
//	{"gateway":"gw-01","epoch":"9f3c04e1a2b3c4d5","seq":42,"device":"logger-01",…,"ts":1764450000123456}
//
// # Write commands
//
// Receiver → gateway over the same WebSocket (AppendWriteCommand;
// ParseUplink reads it with the acks):
//
//	{"type":"write","id":"7","device":"boiler-plc","tag":"setpoint","value":42.5}
//
// value: a finite JSON number, or true/false (1/0); id: a string of at
// most MaxIDLen bytes, echoed in the answer; device and tag as in samples.
// Gateway → receiver, the answer (AppendWriteResult, WriteAnswer; a number
// that is not finite is null):
//
//	{"type":"write_result","id":"7","ok":true,"written":42.5,"read_back":42.5}
//	{"type":"write_result","id":"7","ok":false,"error":"edge: …: out of range","kind":"out of range"}
//
// kind is one of KindBusy, KindRefused, KindBadRequest, KindTimeout,
// KindFailed, or the writer's: "unknown device", "unknown tag", "not
// writable", "out of range", "busy", "device" (the device answered with an
// error), "mismatch" (the read-back differs), "stopped". A malformed
// command is answered (kind "bad request"); an uplink message that is not
// JSON, of an unknown type, or an ack without last closes the connection.
// A command is not resent by the gateway: a receiver that gets no answer
// (the connection closed) does not know whether it was carried out. Over
// MQTT (below) delivery is at least once. Write absolute values and use
// ids.
//
// # MQTT topics
//
//   - <prefix>/batch: batch frames as above, QoS 1, not retained; the
//     PUBACK acknowledges them.
//   - <prefix>/status: retained "online" (StatusOnline), and "offline" as
//     the last will and on a clean stop.
//   - <prefix>/<device>/<tag>: retained, the latest value of every tag
//     (AppendTagPayload, below), ts in µs or ms as the batches; '/', '+',
//     '#' and NUL in names become '_'.
//   - <prefix>/write/<device>/<tag> (only when the gateway enables MQTT
//     writes): a write command, its payload a JSON number, true/false, or
//     {"value":…,"id":"…"} (ParseMQTTWrite; at most MaxMQTTWrite bytes;
//     retained commands are ignored). The answer, the write_result object
//     above, goes to the same topic + "/result", QoS 1, not retained.
//
// A per-tag payload (unit only when the tag has one):
//
//	{"value":21.5,"quality":"good","ts":1764450000123456,"seq":1042,"unit":"°C"}
//
// # Local API
//
// Samples as above, ts always in µs. epoch as in batches (AppendEpochField).
//
//	GET /api/shortPolling (AppendShortPoll): the ring's last seq, the latest sample of every tag
//	  {"seq":1042,"epoch":"9f3c04e1a2b3c4d5","tags":[{"seq":1041,…},…]}
//	GET /api/longPolling?lastSequence=N (AppendLongPoll): every sample > N still in the ring,
//	  oldest first, waiting for one up to long_poll_timeout (then "samples":[]);
//	  reset when N fell out of the ring or is ahead of it, with the latest of every tag
//	  {"seq":1042,"epoch":"9f3c04e1a2b3c4d5","reset":false,"samples":[…]}
//	GET /api/ws, server → client (AppendWSSnapshot, AppendWSSamples): first
//	  {"type":"snapshot","seq":1042,"epoch":"…","reset":false,"samples":[…latest of every tag…]}
//	  then per ring batch, samples in seq order with no gap and no duplicate
//	  {"type":"samples","seq":1045,"epoch":"…","samples":[{"seq":1043,…},…]}
//	GET /api/ws, client → server, to resume after N (ParseResume): the samples > N as one
//	  "samples" message, or a snapshot with "reset":true
//	  {"lastSequence":1030}
//	POST /api/write (ParseWriteRequest; at most MaxWriteDepth deep, no other field)
//	  {"device":"boiler-plc","tag":"setpoint","value":21.5}
//	  200 {"device":"boiler-plc","tag":"setpoint","written":21.5,"read_back":21.5,"duration_ms":3.2}   (WriteReply)
//	  4xx/5xx {"error":"…","kind":"out of range"}                                               (WriteFailure)
//
// A client passes the returned seq as its next lastSequence; when epoch
// changes it starts again from 0. ReadHead and EachSample read these
// replies without a full decode.
package wire
