package testenv

import (
	"bufio"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// pymodbusSerial is a pymodbus serial (or TCP) server with the framer,
// line settings, units and identity given as JSON on the command line.
// Every unit has the data of pymodbusSlave (holding a = 1000+a, …).
const pymodbusSerial = `
import asyncio, sys, json
from pymodbus.server import StartAsyncSerialServer, StartAsyncTcpServer
from pymodbus.datastore import ModbusSequentialDataBlock, ModbusSlaveContext, ModbusServerContext
from pymodbus.device import ModbusDeviceIdentification
from pymodbus.transaction import ModbusRtuFramer, ModbusAsciiFramer

cfg = json.loads(sys.argv[1])

def store():
    return ModbusSlaveContext(
        di=ModbusSequentialDataBlock(0, [i % 2 == 1 for i in range(100)]),
        co=ModbusSequentialDataBlock(0, [i % 3 == 0 for i in range(100)]),
        hr=ModbusSequentialDataBlock(0, [1000 + i for i in range(100)]),
        ir=ModbusSequentialDataBlock(0, [2000 + i for i in range(100)]),
        zero_mode=True)

ctx = ModbusServerContext(slaves={u: store() for u in cfg["units"]}, single=False)
ident = None
if cfg.get("vendor"):
    ident = ModbusDeviceIdentification(info_name={"VendorName": cfg["vendor"],
        "ProductCode": cfg["product"], "MajorMinorRevision": cfg["revision"]})
framer = ModbusAsciiFramer if cfg["framer"] == "ascii" else ModbusRtuFramer

async def main():
    if cfg.get("tcp"):
        srv = await StartAsyncTcpServer(context=ctx, identity=ident, framer=framer,
            address=("127.0.0.1", cfg["tcp"]), defer_start=True)
        task = asyncio.create_task(srv.serve_forever())
        while not srv.serving.done():
            done, _ = await asyncio.wait([task], timeout=0.05)
            for t in done:
                t.result()
                sys.exit("server ended")
        print("READY", flush=True)
        await task
        return
    srv = await StartAsyncSerialServer(context=ctx, identity=ident, framer=framer, port=cfg["tty"],
        baudrate=cfg["baud"], parity=cfg["parity"], bytesize=8, stopbits=1, defer_start=True)
    await srv.start()
    print("READY", flush=True)
    await asyncio.Event().wait()

asyncio.run(main())
`

// SerialSlave configures PymodbusSerial.
type SerialSlave struct {
	Framer string  // "rtu" or "ascii"
	TTY    string  // the serial path (one end of a PTYPair); "" with TCP
	TCP    int     // a TCP port instead of a serial line (FreePort)
	Baud   int     // 19200 if 0
	Parity string  // "N" if ""
	Units  []uint8 // the units that answer; 1 if empty
	// Vendor, Product, Revision: the device identification (function 43/14,
	// and function 17's server id) of every unit; none if Vendor is "".
	Vendor, Product, Revision string
}

// PymodbusSerial starts pymodbus (an independent implementation) as the
// Modbus serial slaves of cfg, RTU or ASCII framed, on a serial line or a
// TCP port, and returns once it serves. Data of every unit as in Pymodbus.
func PymodbusSerial(t testing.TB, cfg SerialSlave) {
	t.Helper()
	py := Python(t)
	if cfg.Baud == 0 {
		cfg.Baud = 19200
	}
	if cfg.Parity == "" {
		cfg.Parity = "N"
	}
	if len(cfg.Units) == 0 {
		cfg.Units = []uint8{1}
	}
	units := make([]int, len(cfg.Units))
	for i, u := range cfg.Units {
		units[i] = int(u)
	}
	arg, err := json.Marshal(map[string]any{"framer": cfg.Framer, "tty": cfg.TTY, "tcp": cfg.TCP, "baud": cfg.Baud,
		"parity": cfg.Parity, "units": units, "vendor": cfg.Vendor, "product": cfg.Product, "revision": cfg.Revision})
	if err != nil {
		t.Fatal(err)
	}
	script := filepath.Join(t.TempDir(), "slaves.py")
	if err := os.WriteFile(script, []byte(pymodbusSerial), 0o600); err != nil {
		t.Fatal(err)
	}
	sc := Start(t, exec.Command(py, script, string(arg)))
	if !pymodbusReady(t, sc) {
		t.Fatal("testenv: pymodbus serial server ended before serving")
	}
}

// pymodbusReady reads the script's output until its READY line (true) or
// its end (false: it could not bind, or failed); it fails the test after
// 20 s without either. Lines before READY go to the test log; the rest
// of the output is read and dropped.
func pymodbusReady(t testing.TB, sc *bufio.Scanner) bool {
	t.Helper()
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
		return ok
	case <-time.After(20 * time.Second):
		t.Fatal("testenv: pymodbus did not start")
	}
	return false
}
