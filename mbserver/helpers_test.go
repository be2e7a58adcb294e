package mbserver_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"edgegw/edge"
	"edgegw/edge/modbus"
	"edgegw/internal/testenv"
	"edgegw/mbserver"
	"edgegw/ringstore"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const stopLimit = 10 * time.Second

// passer is main's adapter, for the tests: mbserver never imports edge.
type passer struct{ s *edge.Scheduler }

func (p passer) Pass(ctx context.Context, device string, pdu []byte, origin string) ([]byte, time.Duration, int, error) {
	r, err := p.s.Pass(ctx, edge.PassRequest{Device: device, PDU: pdu, Origin: origin})
	return r.PDU, r.Waited, r.Polls, err
}

// rtuSlaves is pymodbus (an independent implementation) as two RTU slaves
// on one serial line: unit u's holding and input register a hold 100*u+a
// (a in 0..19, writable); other units get no answer (ignore_missing_slaves).
const rtuSlaves = `
import asyncio, sys
from pymodbus.server import StartAsyncSerialServer
from pymodbus.datastore import ModbusSequentialDataBlock, ModbusSlaveContext, ModbusServerContext
from pymodbus.transaction import ModbusRtuFramer

def store(u):
    return ModbusSlaveContext(hr=ModbusSequentialDataBlock(0, [100*u + a for a in range(20)]),
        ir=ModbusSequentialDataBlock(0, [100*u + a for a in range(20)]),
        co=ModbusSequentialDataBlock(0, [False]*20), di=ModbusSequentialDataBlock(0, [False]*20), zero_mode=True)

async def main():
    ctx = ModbusServerContext(slaves={1: store(1), 2: store(2)}, single=False)
    ser = await StartAsyncSerialServer(context=ctx, framer=ModbusRtuFramer, port=sys.argv[1], baudrate=19200,
        ignore_missing_slaves=True, defer_start=True)
    await ser.start()
    print("READY", flush=True)
    await asyncio.Event().wait()

asyncio.run(main())
`

// startSlaves runs rtuSlaves on one end of a pty pair and returns the other end.
func startSlaves(t *testing.T) string {
	t.Helper()
	a, b := testenv.PTYPair(t)
	script := filepath.Join(t.TempDir(), "slaves.py")
	if err := os.WriteFile(script, []byte(rtuSlaves), 0o600); err != nil {
		t.Fatal(err)
	}
	sc := testenv.Start(t, exec.Command(testenv.Python(t), script, b))
	testenv.WaitLine(t, sc, "READY", 20*time.Second) // and drains the pipe from then on
	return a
}

func int16Tags() []edge.Tag {
	return []edge.Tag{
		{Name: "r0", Register: edge.Holding, Address: 0, Type: edge.Int16, Scale: 1},
		{Name: "r1", Register: edge.Holding, Address: 1, Type: edge.Int16, Scale: 1},
	}
}

// rtuDevices: meter-1 and meter-2 (units 1 and 2, answered) and dead-3
// (unit 3, silent) on the serial line path.
func rtuDevices(path string, interval, timeout time.Duration) []edge.DeviceConfig {
	var out []edge.DeviceConfig
	for _, d := range []struct {
		name string
		unit uint8
	}{{"meter-1", 1}, {"meter-2", 2}, {"dead-3", 3}} {
		out = append(out, edge.DeviceConfig{Name: d.name, Transport: edge.TransportRTU, Address: path, Unit: d.unit,
			Interval: interval, Timeout: timeout, Retries: 0, Serial: modbus.SerialConfig{Baud: 19200}, Tags: int16Tags()})
	}
	return out
}

// withControl adds control-1: unit 1 on a line of its own (a second slave
// process), polled like the others and never passed through to.
func withControl(t *testing.T, devs []edge.DeviceConfig) []edge.DeviceConfig {
	t.Helper()
	c := devs[0]
	c.Name, c.Address = "control-1", startSlaves(t)
	return append(devs, c)
}

func newRing(t *testing.T) *ringstore.Ring {
	t.Helper()
	seq, err := ringstore.OpenSequence(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return ringstore.NewRing(10000, seq)
}

// runSched runs the scheduler until the test ends.
func runSched(t *testing.T, devs []edge.DeviceConfig, ring *ringstore.Ring) *edge.Scheduler {
	t.Helper()
	s, err := edge.New(edge.Config{Devices: devs, Sink: ring})
	if err != nil {
		t.Fatal(err)
	}
	testenv.RunUntilEnd(t, stopLimit, "the scheduler", s.Run)
	return s
}

// waitPolled waits for the first two devices' third good poll: the
// scheduler runs (before, a pass-through request is answered 0x0A).
func waitPolled(t *testing.T, s *edge.Scheduler) {
	t.Helper()
	testenv.WaitFor(t, 20*time.Second, "both live units polled", func() bool {
		for _, e := range s.Devices()[:2] {
			if e.Stats.GoodPolls.Load() < 3 {
				return false
			}
		}
		return true
	})
}

// runServer starts a Modbus server on 127.0.0.1:0 and returns its address.
func runServer(t *testing.T, cfg mbserver.Config) (*mbserver.Server, string) {
	t.Helper()
	cfg.Listen = "127.0.0.1:0"
	srv, err := mbserver.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	addr, err := srv.Listen()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := testenv.Recv(t, done, stopLimit, "the modbus server to stop"); err != nil {
			t.Error(err)
		}
	})
	return srv, addr.String()
}

// client is a minimal Modbus TCP master of the test's own (one request at a time).
type client struct {
	c   net.Conn
	tid uint16
}

func dial(t *testing.T, addr string) *client {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return &client{c: c}
}

// do sends pdu to unit and returns the reply PDU.
func (c *client) do(unit byte, pdu []byte) ([]byte, error) {
	c.tid++
	req := binary.BigEndian.AppendUint16(nil, c.tid)
	req = append(req, 0, 0)
	req = binary.BigEndian.AppendUint16(req, uint16(1+len(pdu)))
	req = append(append(req, unit), pdu...)
	_ = c.c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.c.Write(req); err != nil {
		return nil, err
	}
	var hdr [7]byte
	if _, err := io.ReadFull(c.c, hdr[:]); err != nil {
		return nil, err
	}
	if binary.BigEndian.Uint16(hdr[:]) != c.tid || hdr[6] != unit {
		return nil, fmt.Errorf("reply header % x for tid %d unit %d", hdr, c.tid, unit)
	}
	out := make([]byte, int(binary.BigEndian.Uint16(hdr[4:]))-1)
	_, err := io.ReadFull(c.c, out)
	return out, err
}

func readPDU(fc byte, addr, qty uint16) []byte {
	p := []byte{fc}
	p = binary.BigEndian.AppendUint16(p, addr)
	return binary.BigEndian.AppendUint16(p, qty)
}

// regs decodes a read reply, or says which exception it is.
func regs(reply []byte, err error) ([]uint16, error) {
	if err != nil {
		return nil, err
	}
	if len(reply) == 2 && reply[0]&0x80 != 0 {
		return nil, exceptionError(reply[1])
	}
	if len(reply) < 2 || int(reply[1]) != len(reply)-2 {
		return nil, fmt.Errorf("malformed reply % x", reply)
	}
	out := make([]uint16, (len(reply)-2)/2)
	for i := range out {
		out[i] = binary.BigEndian.Uint16(reply[2+2*i:])
	}
	return out, nil
}

type exceptionError byte

func (e exceptionError) Error() string { return "exception 0x" + strconv.FormatUint(uint64(e), 16) }

func isException(err error, code byte) bool {
	var e exceptionError
	return errors.As(err, &e) && byte(e) == code
}

// period is the length of the timed tests: 60 s with EDGEGW_FULL=1.
func period(short time.Duration) time.Duration {
	if os.Getenv("EDGEGW_FULL") == "1" {
		return 60 * time.Second
	}
	return short
}

func fields(line string) map[string]string {
	out := map[string]string{}
	for _, f := range strings.Fields(line) {
		if k, v, ok := strings.Cut(f, "="); ok {
			out[k] = v
		}
	}
	return out
}
