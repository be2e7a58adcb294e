package testenv

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// pymodbusSeq is a pymodbus TCP slave whose holding and input registers
// (from 0, zero_mode) are given on the command line, holding register 0 taking the values
// of a sequence, one per read that covers it (the last one kept once the
// sequence ends). It prints one line per read: "R <address> <count>
// <register 0 served>".
const pymodbusSeq = `
import asyncio, sys
from pymodbus.server import StartAsyncTcpServer
from pymodbus.datastore import ModbusSequentialDataBlock, ModbusSlaveContext, ModbusServerContext

class Logged(ModbusSequentialDataBlock):
    def __init__(self, regs, seq):
        super().__init__(0, regs)
        self.seq, self.i = seq, 0
    def getValues(self, address, count=1):
        if self.seq and address <= 0 < address + count:
            self.values[0] = self.seq[min(self.i, len(self.seq) - 1)]
            self.i += 1
        out = super().getValues(address, count)
        print("R", address, count, self.values[0], flush=True)
        return out

async def main():
    port = int(sys.argv[1])
    regs = [int(x) for x in sys.argv[2].split(",")]
    seq = [int(x) for x in sys.argv[3].split(",") if x]
    store = ModbusSlaveContext(hr=Logged(regs, seq), ir=ModbusSequentialDataBlock(0, regs),
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

// PyRead is one read of holding registers served by PymodbusSequence.
type PyRead struct {
	Address, Count int
	Reg0           uint16 // register 0 as served by this read (or as it stands, when not covered)
}

// PySeq is a running PymodbusSequence slave.
type PySeq struct {
	Port  int
	mu    sync.Mutex
	reads []PyRead
}

// Reads returns the reads of holding registers served so far, in order.
func (p *PySeq) Reads() []PyRead {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]PyRead(nil), p.reads...)
}

// PymodbusSequence starts pymodbus (an independent implementation) as a
// Modbus TCP slave on 127.0.0.1 whose holding registers 0.. hold regs,
// except that register 0 takes the values of seq in turn, one per read
// that covers it, keeping the last (seq empty: regs[0] throughout). Every
// read of holding registers is recorded (Reads), with the value of
// register 0 it served.
func PymodbusSequence(t testing.TB, regs, seq []uint16) *PySeq {
	t.Helper()
	py := Python(t)
	script := filepath.Join(t.TempDir(), "seq.py")
	if err := os.WriteFile(script, []byte(pymodbusSeq), 0o600); err != nil {
		t.Fatal(err)
	}
	join := func(vs []uint16) string {
		s := make([]string, len(vs))
		for i, v := range vs {
			s[i] = strconv.Itoa(int(v))
		}
		return strings.Join(s, ",")
	}
	for attempt := 0; attempt < 5; attempt++ { // pymodbus 3.0 cannot report a port it chose
		p := &PySeq{Port: FreePort(t)}
		sc := Start(t, exec.Command(py, script, strconv.Itoa(p.Port), join(regs), join(seq)))
		ready := make(chan bool, 1)
		go func() {
			for sc.Scan() {
				line := sc.Text()
				var r PyRead
				if n, _ := fmt.Sscanf(line, "R %d %d %d", &r.Address, &r.Count, &r.Reg0); n == 3 {
					p.mu.Lock()
					p.reads = append(p.reads, r)
					p.mu.Unlock()
					continue
				}
				if strings.HasPrefix(line, "READY") {
					ready <- true
					continue
				}
				t.Log("pymodbus: ", line)
			}
			ready <- false
		}()
		select {
		case ok := <-ready:
			if ok {
				return p
			}
		case <-time.After(20 * time.Second):
			t.Fatal("testenv: pymodbus did not start")
		}
	}
	t.Fatal("testenv: pymodbus could not bind")
	return nil
}
