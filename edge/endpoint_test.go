package edge

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"edgegw/internal/testenv"
)

// gatewayProxy is a Modbus TCP→RTU gateway as seen from the network:
// pymodbus (an independent implementation) serves units 1, 2 and 3 behind a
// small asyncio front that counts the connections it accepts, serves one
// request at a time per connection, timestamps each request once it has
// read it and each reply before it writes it (so a gap from a reply to the
// next request can only look longer than it was on the wire), and
// lets a unit die (its requests get no reply) on "DEAD n" from stdin.
const gatewayProxy = `
import asyncio, sys, threading, time
from pymodbus.server import StartAsyncTcpServer
from pymodbus.datastore import ModbusSequentialDataBlock, ModbusSlaveContext, ModbusServerContext

dead = set()
def control():
    for line in sys.stdin:
        w = line.split()
        if len(w) == 2 and w[0] == "DEAD":
            dead.add(int(w[1]))
            print("OK", line.strip(), flush=True)
threading.Thread(target=control, daemon=True).start()

def store(u):
    return ModbusSlaveContext(hr=ModbusSequentialDataBlock(0, [100 * u + i for i in range(10)]), zero_mode=True)

conns = 0
async def handle(reader, writer):
    global conns
    conns += 1
    c = conns
    print("CONN", c, flush=True)
    br, bw = await asyncio.open_connection("127.0.0.1", backend)
    try:
        while True:
            hdr = await reader.readexactly(7)
            body = await reader.readexactly(int.from_bytes(hdr[4:6], "big") - 1)
            unit = hdr[6]
            print("REQ", c, unit, "%.6f" % time.monotonic(), flush=True)
            if unit in dead:
                continue
            bw.write(hdr + body)
            await bw.drain()
            rh = await br.readexactly(7)
            rb = await br.readexactly(int.from_bytes(rh[4:6], "big") - 1)
            # Stamped before it is written: a proxy descheduled around the
            # write can only make the reply look earlier, the gap longer.
            print("RESP", c, unit, "%.6f" % time.monotonic(), flush=True)
            writer.write(rh + rb)
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        print("CLOSE", c, flush=True)
        writer.close()
        bw.close()

async def main():
    global backend
    backend = int(sys.argv[1])
    ctx = ModbusServerContext(slaves={1: store(1), 2: store(2), 3: store(3)}, single=False)
    srv = await StartAsyncTcpServer(context=ctx, address=("127.0.0.1", backend), defer_start=True)
    t = asyncio.create_task(srv.serve_forever())
    while not srv.serving.done():  # as testenv's slaves: a backend that cannot bind ends the script
        done, _ = await asyncio.wait([t], timeout=0.05)
        for d in done:
            d.result()
            sys.exit("backend ended")
    front = await asyncio.start_server(handle, "127.0.0.1", 0)
    print("READY", front.sockets[0].getsockname()[1], flush=True)
    await asyncio.gather(t, front.serve_forever())

asyncio.run(main())
`

// wireEvent is one line of the proxy: a request or reply on connection conn.
type wireEvent struct {
	kind string // REQ or RESP
	conn int
	unit int
	at   float64 // seconds, the proxy's monotonic clock
}

type proxy struct {
	addr  string
	stdin *os.File
	mu    sync.Mutex
	conns int // accepted
	open  int // accepted and not yet closed
	ev    []wireEvent
	acked chan string
}

func (p *proxy) connections() int { p.mu.Lock(); defer p.mu.Unlock(); return p.conns }

func (p *proxy) openConns() int { p.mu.Lock(); defer p.mu.Unlock(); return p.open }

func (p *proxy) events() []wireEvent {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]wireEvent(nil), p.ev...)
}

func (p *proxy) kill(t *testing.T, unit int) {
	t.Helper()
	if _, err := fmt.Fprintf(p.stdin, "DEAD %d\n", unit); err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.acked:
	case <-time.After(10 * time.Second):
		t.Fatal("proxy did not take the command")
	}
}

func startGatewayProxy(t *testing.T) *proxy {
	t.Helper()
	py := testenv.Python(t)
	script := filepath.Join(t.TempDir(), "gateway.py")
	if err := os.WriteFile(script, []byte(gatewayProxy), 0o600); err != nil {
		t.Fatal(err)
	}
	for attempt := 0; attempt < 5; attempt++ {
		cmd := exec.Command(py, script, strconv.Itoa(testenv.FreePort(t)))
		in, err := cmd.StdinPipe()
		if err != nil {
			t.Fatal(err)
		}
		p := &proxy{stdin: in.(*os.File), acked: make(chan string, 4)}
		sc := testenv.Start(t, cmd)
		ready := make(chan string, 1)
		go p.read(sc, ready)
		select {
		case addr := <-ready:
			if addr != "" {
				p.addr = addr
				return p
			}
		case <-time.After(20 * time.Second):
			t.Fatal("gateway proxy did not start")
		}
	}
	t.Fatal("gateway proxy could not bind")
	return nil
}

func (p *proxy) read(sc *bufio.Scanner, ready chan<- string) {
	started := false
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		switch {
		case len(f) == 2 && f[0] == "READY":
			started = true
			ready <- "127.0.0.1:" + f[1]
		case len(f) == 2 && f[0] == "CONN":
			p.mu.Lock()
			p.conns++
			p.open++
			p.mu.Unlock()
		case len(f) == 2 && f[0] == "CLOSE":
			p.mu.Lock()
			p.open--
			p.mu.Unlock()
		case len(f) == 4 && (f[0] == "REQ" || f[0] == "RESP"):
			c, _ := strconv.Atoi(f[1])
			u, _ := strconv.Atoi(f[2])
			at, _ := strconv.ParseFloat(f[3], 64)
			p.mu.Lock()
			p.ev = append(p.ev, wireEvent{kind: f[0], conn: c, unit: u, at: at})
			p.mu.Unlock()
		case len(f) > 0 && f[0] == "OK":
			p.acked <- sc.Text()
		}
	}
	if !started {
		ready <- ""
	}
}

// endpointDevices is three units behind one host:port.
func endpointDevices(addr string, maxConns int, pause time.Duration) []DeviceConfig {
	var devs []DeviceConfig
	for u := uint8(1); u <= 3; u++ {
		dc := devCfg(fmt.Sprintf("unit-%d", u), TransportTCP, addr, 100*time.Millisecond, 80*time.Millisecond,
			[]Tag{{Name: "v", Register: Holding, Address: 0, Type: Uint16, Scale: 1}})
		dc.Unit, dc.Retries, dc.MaxConnections, dc.Pause = u, 0, maxConns, pause
		devs = append(devs, dc)
	}
	return devs
}

// schedulerLoss fails the test when one of devs lost more than a third of
// its windows between two snapshots to the scheduler (overruns, skips: a
// cycle of its bus or round longer than the interval), and logs the
// windows lost by each device itself (timeouts, late replies). A loaded
// machine costs windows at random, a few in a row at worst; a bus whose
// cycle does not fit the interval by design (units stacked behind a dead
// unit's timeouts, pauses longer than the cycle, a reopen done inline)
// loses one in every cycle or more.
func schedulerLoss(t *testing.T, when string, devs []*device, before []lostSnap) {
	t.Helper()
	for i, d := range devs {
		now := takeLost(d)
		windows := now.windows - before[i].windows
		byDev, bySched := now.byDevice-before[i].byDevice, now.bySched-before[i].bySched
		t.Logf("%s %s: %d windows, lost %d by the unit, %d by the scheduler", d.cfg.Name, when, windows, byDev, bySched)
		if bySched > 2+windows/3 {
			t.Errorf("%s %s: %d of %d windows lost to the scheduler (%+v)", d.cfg.Name, when, bySched, windows, d.stats.Snapshot())
		}
	}
}

// lostSnap is one device's window counters at a moment.
type lostSnap struct{ windows, byDevice, bySched uint64 }

func takeLost(d *device) lostSnap {
	sn := d.stats.Snapshot()
	byDev, bySched := lostWindows(d)
	return lostSnap{sn.Polls + sn.Overruns + sn.Skipped, byDev, bySched}
}

func takeLostAll(devs []*device) []lostSnap {
	out := make([]lostSnap, len(devs))
	for i, d := range devs {
		out[i] = takeLost(d)
	}
	return out
}

// Three units behind one Modbus TCP gateway share one connection and one
// bus: exactly one connection, every unit on schedule at 100 ms; one unit
// dies → it is demoted, the other two keep their schedule, still on the
// one connection. With max_connections = 3 each unit has its own
// connection (the behaviour before endpoints were shared).
func TestEndpointSharesOneConnection(t *testing.T) {
	p := startGatewayProxy(t)
	ring := newRing(t, 10000)
	s, err := New(Config{Sink: ring, Devices: endpointDevices(p.addr, 0, 0)})
	if err != nil {
		t.Fatal(err)
	}
	if len(s.buses) != 1 {
		t.Fatalf("%d buses for one endpoint", len(s.buses))
	}
	from := time.Now()
	start := takeLostAll(s.devices)
	stop := runSched(t, s)
	waitFor(t, 20*time.Second, "30 polls of each unit", func() bool {
		return s.devices[0].stats.Polls.Load() >= 30 && s.devices[1].stats.Polls.Load() >= 30 && s.devices[2].stats.Polls.Load() >= 30
	})
	schedulerLoss(t, "on the shared connection", s.devices, start)
	for _, d := range s.devices {
		if v := latest(ring, d.cfg.Name)["v"]; v.Value != float64(100*int(d.cfg.Unit)) {
			t.Errorf("%s read %v, want %d (another unit's reply?)", d.cfg.Name, v.Value, 100*d.cfg.Unit)
		}
	}
	if n := p.connections(); n != 1 {
		t.Errorf("%d connections to the endpoint, want 1", n)
	}
	t.Logf("three units, one endpoint: %d connection(s)", p.connections())

	p.kill(t, 3)
	before := takeLostAll(s.devices[:2])
	polls := s.devices[0].stats.Polls.Load()
	waitFor(t, 30*time.Second, "unit 3 demoted and 30 more polls of units 1 and 2", func() bool {
		return s.devices[2].stats.Demoted.Load() && s.devices[0].stats.Polls.Load() >= polls+30 && s.devices[1].stats.Polls.Load() >= polls+30
	})
	to := time.Now()
	stop()
	schedulerLoss(t, "while unit 3 was dead", s.devices[:2], before)
	for _, d := range s.devices[:2] {
		checkSchedule(t, ring, d, "v", from, to)
	}
	if n := p.connections(); n != 1 {
		t.Errorf("%d connections after a unit died, want 1 (a dead unit is not a dead gateway)", n)
	}

	// max_connections = 3: a connection per unit, as each device had before.
	s3, err := New(Config{Sink: ring, Devices: endpointDevices(p.addr, 3, 0)})
	if err != nil {
		t.Fatal(err)
	}
	conns := p.connections()
	stop3 := runSched(t, s3)
	waitFor(t, 20*time.Second, "polls with three connections", func() bool {
		return s3.devices[0].stats.GoodPolls.Load() >= 5 && s3.devices[1].stats.GoodPolls.Load() >= 5
	})
	stop3()
	// (a connection of its own is closed and redialled after a timeout: at least 3)
	if n := p.connections() - conns; n < 3 || len(s3.buses) != 3 {
		t.Errorf("max_connections 3: %d connections, %d buses; want 3 and 3", n, len(s3.buses))
	}
	t.Logf("max_connections = 3: %d connections", p.connections()-conns)
}

// pause is kept on the wire: at the gateway, every request on the
// connection comes at least pause after the previous reply went out; the
// three units still keep their schedule.
func TestEndpointPauseOnTheWire(t *testing.T) {
	p := startGatewayProxy(t)
	const pause = 10 * time.Millisecond
	ring := newRing(t, 10000)
	s, err := New(Config{Sink: ring, Devices: endpointDevices(p.addr, 1, pause)})
	if err != nil {
		t.Fatal(err)
	}
	from := time.Now()
	start := takeLostAll(s.devices)
	stop := runSched(t, s)
	waitFor(t, 20*time.Second, "30 polls of each unit", func() bool {
		return s.devices[0].stats.Polls.Load() >= 30 && s.devices[1].stats.Polls.Load() >= 30 && s.devices[2].stats.Polls.Load() >= 30
	})
	to := time.Now()
	stop()
	ev := p.events()
	var gaps, short int
	minGap := time.Hour
	for i := 1; i < len(ev); i++ {
		if ev[i].kind != "REQ" || ev[i-1].kind != "RESP" || ev[i].conn != ev[i-1].conn {
			continue
		}
		gap := time.Duration((ev[i].at - ev[i-1].at) * float64(time.Second))
		minGap = min(minGap, gap)
		gaps++
		if gap < pause {
			short++
		}
	}
	if gaps < 50 {
		t.Fatalf("only %d request-after-reply pairs seen", gaps)
	}
	var timeouts uint64
	for _, d := range s.devices {
		timeouts += d.stats.Timeouts.Load()
	}
	// The proxy stamps the reply before writing it, hence before the gateway
	// has read it and started its pause, and stamps the next request after
	// reading it: the gap it sees can only be longer than the gateway's
	// pause, never shorter, however late either process is scheduled. But
	// for a reply that came after its request timed out (a loaded machine):
	// the shared stream stays, the pause runs from the timeout, and the
	// next request may already wait when the late reply is written. So at
	// most one short gap per timeout, and never most of them (a gateway
	// without the pause: nearly every gap well under 1 ms).
	if short > int(timeouts) || 2*short >= gaps {
		t.Errorf("%d of %d gaps between a reply and the next request < pause %v (shortest %v), %d timeouts", short, gaps, pause, minGap, timeouts)
	}
	t.Logf("pause %v: shortest gap on the wire %v over %d requests; %d shorter after %d timeouts", pause, minGap, gaps, short, timeouts)
	// The pause takes 3 × 10 ms of each 100 ms cycle: the cycle fits; a
	// reply slowed by the shared machine may cost its window and the next
	// (an overrun), a pause that stacked up would cost every cycle.
	schedulerLoss(t, "with the pause", s.devices, start)
	for _, d := range s.devices {
		checkSchedule(t, ring, d, "v", from, to)
	}
	if n := p.connections(); n != 1 {
		t.Errorf("%d connections, want 1", n)
	}
}

// A reload that adds units at the address of a device that had it to
// itself moves that device onto the shared connection: its statistics stay,
// its own connection closes, one connection is left open.
func TestEndpointReloadMovesDeviceOntoSharedConnection(t *testing.T) {
	p := startGatewayProxy(t)
	devs := endpointDevices(p.addr, 0, 0)
	s, err := New(Config{Sink: newRing(t, 10000), Devices: devs[:1]})
	if err != nil {
		t.Fatal(err)
	}
	runSched(t, s)
	first := s.devices[0]
	waitFor(t, 10*time.Second, "unit 1 polled", func() bool { return first.stats.GoodPolls.Load() >= 5 })
	if _, err := s.Reload(context.Background(), devs); err != nil {
		t.Fatal(err)
	}
	s.mu.RLock()
	same, nbus := s.devices[0] == first, len(s.buses)
	s.mu.RUnlock()
	if !same || nbus != 1 {
		t.Fatalf("unit 1 replaced (%v) or %d buses", !same, nbus)
	}
	polls := first.stats.GoodPolls.Load()
	waitFor(t, 20*time.Second, "every unit polled after the reload", func() bool {
		s.mu.RLock()
		defer s.mu.RUnlock()
		return first.stats.GoodPolls.Load() >= polls+10 && s.devices[1].stats.GoodPolls.Load() >= 10 && s.devices[2].stats.GoodPolls.Load() >= 10
	})
	if n := p.openConns(); n != 1 {
		t.Errorf("%d connections open after the reload, want 1 (%d accepted)", n, p.connections())
	}
}
