// Package modbus owns the Modbus protocol for edgegw: PDU checks the goburrow
// client lacks (quantity limits, reply length vs quantity, write echoes) in
// a packager wrapping goburrow's (pduPackager: its Verify), MBAP and RTU
// framing and the RTU CRC in the transporters, and the transporters plugged
// into goburrow's NewClient2(packager, transporter): TCP
// with backoff reconnects (one stream per device, or one TCPPort shared by
// the units behind a TCP→RTU gateway; while a redial or a serial reopen
// backs off, calls fail at once with a *BackoffError that reads as the
// failure that started the backoff, plus the wait), UDP over one shared socket with transaction-id
// matching, RTU on a serial line and RTU over a TCP stream, and Modbus
// ASCII on both (OpenASCII, NewASCIIOverTCP: an RTUPort whose frames are
// ':', hex, LRC, CRLF, with goburrow's ASCII packager; the same locking,
// drain, timeouts, counters and errors as RTU). Besides the reads and
// writes, every connection sends the two identification functions
// goburrow lacks through the same packager and transporter: Read Device
// Identification (43/14, basic objects) and Report Server ID (17).
//
// Two ways to poll. The Read*/Write* methods of TCPConn, UDPConn and RTUConn
// go through goburrow's client (a few small allocations per call). For the
// acquisition hot path, a Request (a read, function 1–4) is prepared once
// and reused: TCPConn.Do and UDPConn.Do run one, UDPSocket.SendRound runs a
// round of them — requests to many UDP devices sent back to back (one
// sendmmsg on Linux amd64/arm/arm64, else one write each; UDPConfig.NoBatch
// forces the latter), the replies read by Run (recvmmsg, many datagrams per
// call) and filled into their Requests in place, the caller woken once when
// the last reply is in or at the round's deadline; a Round keeps such
// batches in flight for an event loop (per-request deadlines, woken once
// per completed batch, each request taken back when it ends). Matching, checks and
// counters are the same on every path, and none of Do, SendRound or the
// reader allocates per poll in steady state: a Request encodes its MBAP
// ADU into its own buffer (the bytes goburrow's packager would encode,
// which allocates).
//
// UDP transaction ids are random per request (ChaCha8 seeded from
// crypto/rand), never 0 and never reused while pending or among the
// destination's last 64; a datagram from a device's address with an id
// neither pending nor recent makes the requests waiting on that address
// untrusted (refused, counted): see UDPSocket.
//
// It never schedules polls, decodes register values into tags, retries a
// request or keeps statistics beyond the cumulative Counters of each
// connection (and of the UDP socket); of the project it imports only
// internal/backoff (the reconnect delays).
//
// Concurrency: the methods of one per-device connection (TCPConn, UDPConn,
// RTUConn) are called from ONE goroutine, the device's or the bus's poller;
// Counters may be read from any goroutine. A UDPSocket is shared by many
// UDPConns used concurrently, and SendRound may be called from several
// goroutines at once (a Round is driven by one); its Run is the one reader goroutine. An RTUPort
// takes its own lock around every request, so units of one port may also be
// polled from several goroutines (they are then serialised on the line). A
// TCPPort and its TCPUnitConns are used from one goroutine (the endpoint's bus).
// A Request is used by one call at a time. Constructors start no goroutine.
package modbus
