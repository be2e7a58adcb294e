package modbus

import (
	"encoding/binary"
	"strconv"
	"testing"
	"time"

	"edgegw/internal/testenv"
)

func TestInteropPymodbus(t *testing.T) {
	ptyA, ptyB := testenv.PTYPair(t)
	tcpPort, udpPort := testenv.Pymodbus(t, ptyB) // data pattern: see testenv.Pymodbus
	check := func(name string, c poller) {
		t.Helper()
		b, err := c.ReadHoldingRegisters(10, 3)
		if err != nil || u16s(b)[0] != 1010 || u16s(b)[2] != 1012 {
			t.Errorf("%s holding: %v %v", name, u16s(b), err)
		}
		b, err = c.ReadInputRegisters(5, 1)
		if err != nil || u16s(b)[0] != 2005 {
			t.Errorf("%s input: %v %v", name, b, err)
		}
		b, err = c.ReadCoils(0, 10) // 1001001001 LSB first
		if err != nil || len(b) != 2 || b[0] != 0b01001001 || b[1] != 0b10 {
			t.Errorf("%s coils: %08b %v", name, b, err)
		}
		b, err = c.ReadDiscreteInputs(0, 8)
		if err != nil || len(b) != 1 || b[0] != 0b10101010 {
			t.Errorf("%s discrete: %08b %v", name, b, err)
		}
		if err := c.WriteSingleRegister(20, 4242); err != nil {
			t.Errorf("%s write: %v", name, err)
		}
		if err := c.WriteMultipleRegisters(30, []byte{0x12, 0x34, 0x56, 0x78}); err != nil {
			t.Errorf("%s write multiple: %v", name, err)
		}
		if err := c.WriteSingleCoil(1, true); err != nil {
			t.Errorf("%s write coil: %v", name, err)
		}
		b, err = c.ReadHoldingRegisters(20, 12)
		if err != nil || u16s(b)[0] != 4242 || binary.BigEndian.Uint32(b[20:]) != 0x12345678 {
			t.Errorf("%s read back: %v %v", name, u16s(b), err)
		}
		b, err = c.ReadCoils(1, 1)
		if err != nil || b[0] != 1 {
			t.Errorf("%s coil read back: %v %v", name, b, err)
		}
		if _, err := c.ReadHoldingRegisters(99, 5); err == nil {
			t.Errorf("%s: read beyond the data block succeeded", name)
		} else if _, ok := IsException(err); !ok {
			t.Errorf("%s: beyond the block: %v, want an exception", name, err)
		}
	}
	tc := NewTCP(TCPConfig{Address: "127.0.0.1:" + strconv.Itoa(tcpPort), Unit: 1})
	defer tc.Close()
	check("tcp", tc)

	s := startSocket(t)
	uc, err := s.Device("127.0.0.1:"+strconv.Itoa(udpPort), 1, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer uc.Close()
	check("udp", uc)

	p, err := OpenRTU(SerialConfig{Path: ptyA, Baud: 19200, Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	check("rtu", p.Unit(1, 0))
}
