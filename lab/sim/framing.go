package sim

import "encoding/binary"

// Modbus exception codes used by the engine.
const (
	ExcIllegalFunction    = 0x01
	ExcIllegalAddress     = 0x02
	ExcIllegalValue       = 0x03
	ExcServerDeviceFailed = 0x04
)

// MBAP header (Modbus TCP and UDP), 7 bytes, big endian, then the PDU:
//
//	0..1 transaction id  (echoed by the server)
//	2..3 protocol id     (0 = Modbus)
//	4..5 length          (number of bytes that follow: unit id + PDU)
//	6    unit id
//	7..  PDU: function code, data
const (
	mbapHeaderLen = 7
	maxPDULen     = 253
	maxMBAPLen    = mbapHeaderLen + maxPDULen
)

// parseMBAP checks one complete MBAP ADU (a datagram) and returns its PDU.
func parseMBAP(adu []byte) (pdu []byte, ok bool) {
	if len(adu) < mbapHeaderLen+1 || len(adu) > maxMBAPLen {
		return nil, false
	}
	if binary.BigEndian.Uint16(adu[2:]) != 0 {
		return nil, false
	}
	if int(binary.BigEndian.Uint16(adu[4:])) != len(adu)-6 {
		return nil, false
	}
	return adu[mbapHeaderLen:], true
}

// appendMBAP appends the MBAP header for a response to req (tid+tidDelta,
// protocol 0, length of unit+pdu, the request's unit id) and then pdu.
func appendMBAP(dst, req []byte, tidDelta uint16, pdu []byte) []byte {
	tid := binary.BigEndian.Uint16(req[0:]) + tidDelta
	dst = binary.BigEndian.AppendUint16(dst, tid)
	dst = append(dst, 0, 0)
	dst = binary.BigEndian.AppendUint16(dst, uint16(len(pdu)+1))
	dst = append(dst, req[6])
	return append(dst, pdu...)
}

// RTU ADU (serial line), sent with a silent interval of 3.5 characters
// before and after:
//
//	0    unit (slave) address, 0 = broadcast
//	1..  PDU: function code, data
//	n-2  CRC-16/MODBUS (poly 0xA001 reflected, init 0xFFFF), low byte first
//	n-1  CRC high byte

// crc16 is CRC-16/MODBUS.
func crc16(b []byte) uint16 {
	crc := uint16(0xFFFF)
	for _, c := range b {
		crc ^= uint16(c)
		for i := 0; i < 8; i++ {
			if crc&1 != 0 {
				crc = crc>>1 ^ 0xA001
			} else {
				crc >>= 1
			}
		}
	}
	return crc
}

// appendRTU appends unit, pdu and the CRC (low byte first).
func appendRTU(dst []byte, unit byte, pdu []byte) []byte {
	start := len(dst)
	dst = append(dst, unit)
	dst = append(dst, pdu...)
	crc := crc16(dst[start:])
	return append(dst, byte(crc), byte(crc>>8))
}

// rtuCRCOK reports whether frame (unit, PDU, CRC) carries a valid CRC.
func rtuCRCOK(frame []byte) bool {
	if len(frame) < 4 {
		return false
	}
	n := len(frame) - 2
	crc := crc16(frame[:n])
	return frame[n] == byte(crc) && frame[n+1] == byte(crc>>8)
}

// rtuRequestLen is the length of the request frame at the start of buf,
// decided from the function code as a master sends it: 8 bytes for 1..6
// (unit, fc, address, quantity or value, CRC), 9+n for 15 and 16 (unit, fc,
// address, quantity, byte count n, n bytes, CRC). It returns 0 when more
// bytes are needed to tell, and -1 for a function code whose request length
// is unknown (the frame then ends at the next silence).
func rtuRequestLen(buf []byte) int {
	if len(buf) < 2 {
		return 0
	}
	switch buf[1] {
	case 1, 2, 3, 4, 5, 6:
		return 8
	case 15, 16:
		if len(buf) < 7 {
			return 0
		}
		return 9 + int(buf[6])
	}
	return -1
}
