package modbus

import (
	"encoding/binary"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"edgegw/internal/testenv"
)

// pymodbusSlave is an independent implementation (pymodbus 3.0): TCP and
// UDP servers in one process plus an RTU serial server on a pty. Holding
// register a holds 1000+a, input register a 2000+a, coil a is a%3==0,
// discrete input a is a%2==1 (addresses 0..99, zero_mode).
const pymodbusSlave = `
import asyncio, sys
from pymodbus.server import StartAsyncTcpServer, StartAsyncUdpServer, StartAsyncSerialServer
from pymodbus.datastore import ModbusSequentialDataBlock, ModbusSlaveContext, ModbusServerContext
from pymodbus.transaction import ModbusRtuFramer

def ctx():
    store = ModbusSlaveContext(
        di=ModbusSequentialDataBlock(0, [i % 2 == 1 for i in range(100)]),
        co=ModbusSequentialDataBlock(0, [i % 3 == 0 for i in range(100)]),
        hr=ModbusSequentialDataBlock(0, [1000 + i for i in range(100)]),
        ir=ModbusSequentialDataBlock(0, [2000 + i for i in range(100)]),
        zero_mode=True)
    return ModbusServerContext(slaves=store, single=True)

async def main():
    tcp_port, udp_port, tty = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    tcp = await StartAsyncTcpServer(context=ctx(), address=("127.0.0.1", tcp_port), defer_start=True)
    udp = await StartAsyncUdpServer(context=ctx(), address=("127.0.0.1", udp_port), defer_start=True)
    ser = await StartAsyncSerialServer(context=ctx(), framer=ModbusRtuFramer, port=tty, baudrate=19200, defer_start=True)
    await ser.start()
    t1 = asyncio.create_task(tcp.serve_forever())
    t2 = asyncio.create_task(udp.serve_forever())
    while not (tcp.serving.done() and udp.serving.done()):
        done, _ = await asyncio.wait([t1, t2], timeout=0.05)
        for t in done:
            t.result()
            sys.exit("server ended")
    print("READY", tcp_port, udp_port, flush=True)
    await asyncio.gather(t1, t2)

asyncio.run(main())
`

func TestInteropPymodbus(t *testing.T) {
	py := testenv.Python(t)
	ptyA, ptyB := testenv.PTYPair(t)
	script := filepath.Join(t.TempDir(), "slave.py")
	if err := os.WriteFile(script, []byte(pymodbusSlave), 0o600); err != nil {
		t.Fatal(err)
	}
	var tcpPort, udpPort int
	for attempt := 0; ; attempt++ {
		tcpPort, udpPort = testenv.FreePort(t), testenv.FreePort(t)
		cmd := exec.Command(py, script, strconv.Itoa(tcpPort), strconv.Itoa(udpPort), ptyB)
		sc := testenv.Start(t, cmd)
		ready := make(chan bool, 1)
		go func() {
			for sc.Scan() {
				if strings.HasPrefix(sc.Text(), "READY") {
					ready <- true
					for sc.Scan() {
					}
					return
				}
				t.Log("pymodbus: ", sc.Text())
			}
			ready <- false
		}()
		select {
		case ok := <-ready:
			if ok {
				goto started
			}
		case <-time.After(20 * time.Second):
			t.Fatal("pymodbus did not start")
		}
		if attempt == 4 {
			t.Fatal("pymodbus could not bind")
		}
	}
started:
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
