package sim

import (
	"bytes"
	"testing"
)

// CRC examples: Modbus over Serial Line v1.02 §6.2.2 ("02 07" → CRC 0x1241,
// sent 41 12) and the ubiquitous read of 10 holding registers of unit 1.
func TestCRC16(t *testing.T) {
	for _, tc := range []struct {
		in   []byte
		want []byte
	}{
		{[]byte{0x02, 0x07}, []byte{0x41, 0x12}},
		{[]byte{0x01, 0x03, 0x00, 0x00, 0x00, 0x0A}, []byte{0xC5, 0xCD}},
		{[]byte{0x11, 0x03, 0x00, 0x6B, 0x00, 0x03}, []byte{0x76, 0x87}},
	} {
		got := appendRTU(nil, tc.in[0], tc.in[1:])
		want := append(append([]byte{}, tc.in...), tc.want...)
		if !bytes.Equal(got, want) {
			t.Errorf("appendRTU(% X) = % X, want % X", tc.in, got, want)
		}
		if !rtuCRCOK(got) {
			t.Errorf("rtuCRCOK(% X) = false", got)
		}
		got[len(got)-1] ^= 1
		if rtuCRCOK(got) {
			t.Errorf("rtuCRCOK(% X) = true after corruption", got)
		}
	}
}

func TestRTURequestLen(t *testing.T) {
	for _, tc := range []struct {
		in   []byte
		want int
	}{
		{[]byte{}, 0},
		{[]byte{0x01}, 0},
		{[]byte{0x01, 0x03}, 8},
		{[]byte{0x01, 0x05, 0x00}, 8},
		{[]byte{0x01, 0x10, 0x00, 0x01, 0x00, 0x02}, 0},
		{[]byte{0x01, 0x10, 0x00, 0x01, 0x00, 0x02, 0x04}, 13},
		{[]byte{0x01, 0x0F, 0x00, 0x13, 0x00, 0x0A, 0x02}, 11},
		{[]byte{0x01, 0x2B}, -1},
	} {
		if got := rtuRequestLen(tc.in); got != tc.want {
			t.Errorf("rtuRequestLen(% X) = %d, want %d", tc.in, got, tc.want)
		}
	}
}

// MBAP: Modbus Messaging on TCP/IP Implementation Guide v1.0b §3.1.3.
func TestMBAP(t *testing.T) {
	req := []byte{0x00, 0x01, 0x00, 0x00, 0x00, 0x06, 0x11, 0x03, 0x00, 0x6B, 0x00, 0x03}
	pdu, ok := parseMBAP(req)
	if !ok || !bytes.Equal(pdu, []byte{0x03, 0x00, 0x6B, 0x00, 0x03}) {
		t.Fatalf("parseMBAP = % X, %v", pdu, ok)
	}
	resp := appendMBAP(nil, req, 0, []byte{0x03, 0x06, 0x02, 0x2B, 0x00, 0x00, 0x00, 0x64})
	want := []byte{0x00, 0x01, 0x00, 0x00, 0x00, 0x09, 0x11, 0x03, 0x06, 0x02, 0x2B, 0x00, 0x00, 0x00, 0x64}
	if !bytes.Equal(resp, want) {
		t.Fatalf("appendMBAP = % X, want % X", resp, want)
	}
	if got := appendMBAP(nil, []byte{0xFF, 0xFF, 0, 0, 0, 2, 1}, 1, []byte{0x83, 0x02}); !bytes.Equal(got, []byte{0, 0, 0, 0, 0, 3, 1, 0x83, 0x02}) {
		t.Fatalf("tid wrap: % X", got)
	}
	for _, bad := range [][]byte{
		{0x00, 0x01, 0x00, 0x00, 0x00, 0x06, 0x11, 0x03, 0x00, 0x6B, 0x00},       // short of length
		{0x00, 0x01, 0x00, 0x01, 0x00, 0x06, 0x11, 0x03, 0x00, 0x6B, 0x00, 0x03}, // protocol 1
		{0x00, 0x01, 0x00, 0x00, 0x00, 0x01, 0x11},                               // no PDU
		make([]byte, maxMBAPLen+1),
	} {
		if _, ok := parseMBAP(bad); ok {
			t.Errorf("parseMBAP(% X) accepted", bad)
		}
	}
}
