package testenv

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
)

// pymodbusSlave is an independent Modbus implementation (pymodbus 3.0): TCP
// and UDP servers in one process plus an RTU serial server on a pty.
// Holding register a holds 1000+a, input register a 2000+a, coil a is
// a%3==0, discrete input a is a%2==1 (addresses 0..99, zero_mode).
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

// Pymodbus starts pymodbus as an independent Modbus slave: TCP and UDP on
// 127.0.0.1 and RTU (19200 baud) on the serial path tty (one end of a
// PTYPair). Data: holding register a = 1000+a, input register a = 2000+a,
// coil a = a%3==0, discrete input a = a%2==1, for a in 0..99. It returns
// the TCP and UDP ports once the servers accept.
func Pymodbus(t testing.TB, tty string) (tcpPort, udpPort int) {
	t.Helper()
	py := Python(t)
	script := filepath.Join(t.TempDir(), "slave.py")
	if err := os.WriteFile(script, []byte(pymodbusSlave), 0o600); err != nil {
		t.Fatal(err)
	}
	// pymodbus 3.0 cannot report a port it chose: pick free ones, retry on a clash.
	for attempt := 0; attempt < 5; attempt++ {
		tcpPort, udpPort = FreePort(t), FreePort(t)
		cmd := exec.Command(py, script, strconv.Itoa(tcpPort), strconv.Itoa(udpPort), tty)
		sc := Start(t, cmd)
		if pymodbusReady(t, sc) {
			return tcpPort, udpPort
		}
	}
	t.Fatal("testenv: pymodbus could not bind")
	return 0, 0
}
