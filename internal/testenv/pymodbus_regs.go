package testenv

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// pymodbusRegs is a pymodbus TCP slave whose holding and input registers
// (from 0, zero_mode) are given on the command line.
const pymodbusRegs = `
import asyncio, sys
from pymodbus.server import StartAsyncTcpServer
from pymodbus.datastore import ModbusSequentialDataBlock, ModbusSlaveContext, ModbusServerContext

async def main():
    port = int(sys.argv[1])
    regs = [int(x) for x in sys.argv[2].split(",")]
    store = ModbusSlaveContext(hr=ModbusSequentialDataBlock(0, regs), ir=ModbusSequentialDataBlock(0, regs),
        co=ModbusSequentialDataBlock(0, [False]), di=ModbusSequentialDataBlock(0, [False]), zero_mode=True)
    srv = await StartAsyncTcpServer(context=ModbusServerContext(slaves=store, single=True),
        address=("127.0.0.1", port), defer_start=True)
    task = asyncio.create_task(srv.serve_forever())
    while not srv.serving.done():
        done, _ = await asyncio.wait([task], timeout=0.05)
        for t in done:
            t.result()
            sys.exit("server ended")
    print("READY", port, flush=True)
    await task

asyncio.run(main())
`

// PymodbusRegisters starts pymodbus (an independent implementation) as a
// Modbus TCP slave on 127.0.0.1 whose holding and input registers 0..
// hold regs, and returns its port once it accepts.
func PymodbusRegisters(t testing.TB, regs []uint16) (tcpPort int) {
	t.Helper()
	py := Python(t)
	script := filepath.Join(t.TempDir(), "regs.py")
	if err := os.WriteFile(script, []byte(pymodbusRegs), 0o600); err != nil {
		t.Fatal(err)
	}
	list := make([]string, len(regs))
	for i, r := range regs {
		list[i] = strconv.Itoa(int(r))
	}
	for attempt := 0; attempt < 5; attempt++ { // pymodbus 3.0 cannot report a port it chose
		tcpPort = FreePort(t)
		sc := Start(t, exec.Command(py, script, strconv.Itoa(tcpPort), strings.Join(list, ",")))
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
				return tcpPort
			}
		case <-time.After(20 * time.Second):
			t.Fatal("testenv: pymodbus did not start")
		}
	}
	t.Fatal("testenv: pymodbus could not bind")
	return 0
}
