package stats

import "sync/atomic"

// Acquisition holds the acquisition counters that belong to no one device.
// edge (its UDP socket) writes it; web reads it. The zero value is ready.
type Acquisition struct {
	// UDPUnknownSource counts datagrams on the Modbus UDP socket from an
	// address and port that is no configured device.
	UDPUnknownSource atomic.Uint64
}

// UDPUnknown is the counter for the UDP socket to add to; nil for a nil
// record.
func (a *Acquisition) UDPUnknown() *atomic.Uint64 {
	if a == nil {
		return nil
	}
	return &a.UDPUnknownSource
}
