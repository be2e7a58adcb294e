// Package sim owns simulated Modbus loggers, the slave side that goburrow
// lacks: a sparse register bank with a temperature/humidity logger model,
// the request engine (function codes 1, 2, 3, 4, 5, 6, 15, 16), MBAP and
// RTU framing, TCP, UDP, RTU (serial) and RTU-over-TCP servers, fault injection and
// per-logger counters. Fleet runs N loggers on 127.0.1.N; RTUBus serves
// several units on one serial line. Over TCP and UDP a logger answers any
// unit id (echoed); over RTU only its own, and broadcast writes (unit 0)
// silently.
//
// It never polls devices, never imports edge or edge/modbus (its framing is
// its own, so a bug shared with the client cannot hide), and never talks to
// anything but the sockets and serial path it is given.
//
// Concurrency: constructors bind sockets (or open the serial port) and start
// no goroutine. Fleet.Run and RTUBus.Run own every goroutine: one accept loop
// per TCP (or RTU-over-TCP) logger plus one per connection, one reader per UDP socket, one
// reader per serial bus, and time.AfterFunc timers only for delayed UDP
// replies; Run returns after all of them exited. Logger methods (SetFaults,
// Stop, Start, Restart, Counters, Set*/Get*) are safe for concurrent use.
package sim
