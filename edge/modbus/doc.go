// Package modbus owns the Modbus protocol for edgegw: PDU checks the goburrow
// client lacks (quantity limits, reply length vs quantity, write echoes),
// MBAP and RTU framing on top of goburrow's packagers, the RTU CRC, and the
// transports plugged into goburrow's NewClient2(packager, transporter): TCP
// with backoff reconnects (one stream per device, or one TCPPort shared by
// the units behind a TCP→RTU gateway), UDP over one shared socket with transaction-id
// matching, RTU on a serial line and RTU over a TCP stream.
//
// It never schedules polls, decodes register values into tags, retries a
// request or keeps statistics beyond the cumulative Counters of each
// connection; it imports no project package.
//
// Concurrency: the methods of one per-device connection (TCPConn, UDPConn,
// RTUConn) are called from ONE goroutine, the device's or the bus's poller;
// Counters may be read from any goroutine. A UDPSocket is shared by many
// UDPConns used concurrently; its Run is the one reader goroutine. An RTUPort
// takes its own lock around every request, so units of one port may also be
// polled from several goroutines (they are then serialised on the line). A
// TCPPort and its TCPUnitConns are used from one goroutine (the endpoint's bus).
// Constructors start no goroutine.
package modbus
