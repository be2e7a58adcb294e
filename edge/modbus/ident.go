package modbus

import (
	"fmt"

	gb "github.com/goburrow/modbus"
)

// Functions goburrow's client lacks, sent through the same packager and
// transporter as its reads (device.call).
const (
	FuncReportServerID = 0x11 // 17: Report Server ID (serial line only in the standard; many TCP devices answer it)
	FuncEncapsulated   = 0x2B // 43: Encapsulated Interface Transport
	MEIDeviceID        = 0x0E // 43/14: Read Device Identification
)

// Device identification object ids (Modbus Application Protocol V1.1b3,
// 6.21): the basic category, which every device that answers 43/14 has.
const (
	ObjVendorName         = 0x00
	ObjProductCode        = 0x01
	ObjMajorMinorRevision = 0x02
)

// DeviceID is what Read Device Identification returned.
type DeviceID struct {
	Conformity byte            // the device's conformity level (0x01 basic, 0x02 regular, 0x03 extended; 0x8x: also per object)
	Objects    map[byte]string // object id → value
}

// maxIDRequests bounds the requests of one identification (a device
// saying "more follows" for ever).
const maxIDRequests = 8

// call sends one request PDU through the device's packager and transporter,
// as goburrow's client does for its own functions, and returns the reply
// PDU's data (after the function code). An exception is a *ModbusError.
// The errors name the device like the Read* methods' do.
func (d *device) call(op string, fc byte, data []byte) ([]byte, error) {
	adu, err := d.pk.Encode(&gb.ProtocolDataUnit{FunctionCode: fc, Data: data})
	if err == nil {
		var resp []byte
		if resp, err = d.tr.Send(adu); err == nil {
			if err = d.pk.Verify(adu, resp); err == nil {
				var pdu *gb.ProtocolDataUnit
				if pdu, err = d.pk.Decode(resp); err == nil {
					if pdu.FunctionCode == fc|0x80 && len(pdu.Data) == 1 {
						err = &gb.ModbusError{FunctionCode: pdu.FunctionCode, ExceptionCode: pdu.Data[0]}
					} else {
						d.tr.succeeded()
						return pdu.Data, nil
					}
				}
			}
		}
	}
	if _, ok := IsException(err); ok {
		d.tr.succeeded()
	} else {
		d.tr.fail(err)
	}
	return nil, fmt.Errorf("modbus: %s %s unit %d: %s: %w", d.kind, d.addr, d.unit, op, err)
}

// ReportServerID sends function 17 and returns the reply's data: the
// server id and run indicator, in a layout of the device's own.
func (d *device) ReportServerID() ([]byte, error) {
	b, err := d.call("report server id", FuncReportServerID, nil)
	if err != nil {
		return nil, err
	}
	return b[1:], nil // the byte count, checked by checkPDU
}

// ReadDeviceIdentification reads the basic device identification objects
// (function 43, MEI 14, read code 1: vendor name, product code, revision),
// asking again from the next object while the device says more follows
// (at most maxIDRequests requests).
func (d *device) ReadDeviceIdentification() (DeviceID, error) {
	id := DeviceID{Objects: map[byte]string{}}
	next := byte(ObjVendorName)
	for i := 0; i < maxIDRequests; i++ {
		b, err := d.call("read device identification", FuncEncapsulated, []byte{MEIDeviceID, 1, next})
		if err != nil {
			return id, err
		}
		more, nxt, err := parseDeviceID(b, &id)
		if err != nil {
			d.tr.fail(err)
			return id, fmt.Errorf("modbus: %s %s unit %d: read device identification: %w", d.kind, d.addr, d.unit, err)
		}
		if !more {
			return id, nil
		}
		next = nxt
	}
	return id, nil
}

// parseDeviceID decodes the data of a 43/14 reply into id:
//
//	MEI type 0x0E, read code, conformity level, more follows (0x00 or 0xFF),
//	next object id, number of objects k, k × (object id, length l, l bytes)
func parseDeviceID(b []byte, id *DeviceID) (more bool, next byte, err error) {
	if len(b) < 6 || b[0] != MEIDeviceID {
		return false, 0, frameErr("device identification reply % x", b)
	}
	id.Conformity = b[2]
	more, next = b[3] == 0xFF, b[4]
	k, pos := int(b[5]), 6
	for ; k > 0; k-- {
		if pos+2 > len(b) || pos+2+int(b[pos+1]) > len(b) {
			return false, 0, frameErr("device identification object %d cut short", k)
		}
		id.Objects[b[pos]] = string(b[pos+2 : pos+2+int(b[pos+1])])
		pos += 2 + int(b[pos+1])
	}
	if pos != len(b) {
		return false, 0, frameErr("device identification reply: %d bytes after the objects", len(b)-pos)
	}
	return more, next, nil
}
