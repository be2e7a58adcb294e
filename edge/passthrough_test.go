package edge

import (
	"context"
	"errors"
	"testing"
	"time"
)

// Request PDUs from the spec (Modbus Application Protocol V1.1b3, 6.1-6.12)
// and what Pass answers without touching a bus.
func TestCheckPassPDU(t *testing.T) {
	for _, c := range []struct {
		pdu  []byte
		want byte
	}{
		{[]byte{0x03, 0x00, 0x6B, 0x00, 0x03}, 0},                               // 6.3: read holding 108, 3 registers
		{[]byte{0x01, 0x00, 0x13, 0x00, 0x13}, 0},                               // 6.1: read coils 20-38
		{[]byte{0x04, 0x00, 0x08, 0x00, 0x01}, 0},                               // 6.4: read input register 9
		{[]byte{0x05, 0x00, 0xAC, 0xFF, 0x00}, 0},                               // 6.5: coil 173 on
		{[]byte{0x06, 0x00, 0x01, 0x00, 0x03}, 0},                               // 6.6: register 2 = 3
		{[]byte{0x10, 0x00, 0x01, 0x00, 0x02, 0x04, 0x00, 0x0A, 0x01, 0x02}, 0}, // 6.12
		{[]byte{0x03, 0x00, 0x00, 0x00, 0x7E}, 3},                               // 126 registers
		{[]byte{0x03, 0x00, 0x00, 0x00, 0x00}, 3},                               // 0 registers
		{[]byte{0x03, 0xFF, 0xFF, 0x00, 0x02}, 3},                               // past 65535
		{[]byte{0x01, 0x00, 0x00, 0x07, 0xD1}, 3},                               // 2001 coils
		{[]byte{0x05, 0x00, 0xAC, 0x12, 0x34}, 3},                               // coil value neither 0 nor FF00
		{[]byte{0x10, 0x00, 0x01, 0x00, 0x02, 0x03, 0, 0, 0}, 3},                // byte count != 2*qty
		{[]byte{0x03, 0x00}, 3},                                                 // short
		{[]byte{0x0F, 0x00, 0x13, 0x00, 0x0A, 0x02, 0xCD, 0x01}, 1},             // FC15: not passed
		{[]byte{0x2B, 0x0E, 0x01, 0x00}, 1},                                     // FC43
		{nil, 1},
	} {
		if got := checkPassPDU(c.pdu); got != c.want {
			t.Errorf("% x: exception %d, want %d", c.pdu, got, c.want)
		}
	}
}

// Pass refuses what it cannot queue: an unknown device, a UDP device, a
// scheduler that does not run; a request out of range is answered here.
func TestPassRefusals(t *testing.T) {
	ring := newRing(t, 100)
	// Never dialled: the scheduler does not run.
	s, err := New(Config{Sink: ring, Devices: []DeviceConfig{
		devCfg("plc", TransportTCP, "plc.invalid:502", time.Second, 100*time.Millisecond, thTags()),
		devCfg("logger", TransportUDP, "logger.invalid:502", time.Second, 100*time.Millisecond, thTags()),
	}})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	kind := func(err error) string {
		var pe *PassError
		if errors.As(err, &pe) {
			return pe.Kind
		}
		return ""
	}
	read := []byte{3, 0, 0, 0, 2}
	if _, err := s.Pass(ctx, PassRequest{Device: "nope", PDU: read}); kind(err) != PassUnknownDevice {
		t.Errorf("unknown device: %v", err)
	}
	if _, err := s.Pass(ctx, PassRequest{Device: "logger", PDU: read}); kind(err) != PassNotShared {
		t.Errorf("udp device: %v", err)
	}
	if _, err := s.Pass(ctx, PassRequest{Device: "plc", PDU: read}); kind(err) != PassStopped {
		t.Errorf("not running: %v", err)
	}
	r, err := s.Pass(ctx, PassRequest{Device: "plc", PDU: []byte{3, 0, 0, 0, 200}})
	if err != nil || string(r.PDU) != "\x83\x03" {
		t.Errorf("200 registers: % x %v, want exception 3", r.PDU, err)
	}
}
