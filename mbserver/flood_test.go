package mbserver_test

import (
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"edgegw/internal/testenv"
	"edgegw/mbserver"
	"edgegw/stats"
)

func openFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skip("no /proc/self/fd")
	}
	return len(ents)
}

// 50 Modbus TCP clients send 100 requests each in a burst at one RTU line
// polled at 200 ms: 40 from addresses of their own (the bus's queue of
// edge.PassQueue fills: refused with 0x06), 10 from one address (its
// max_in_flight bound refuses with 0x06 too). Every request is answered
// with the slave's values or 0x06; refusals are counted; the polls keep
// their windows; when the clients go, no connection, goroutine or file
// descriptor is left.
func TestPassThroughFloodIsBounded(t *testing.T) {
	testenv.Need(t, "socat")
	const interval = 200 * time.Millisecond
	line := startSlaves(t)
	ring := newRing(t)
	s := runSched(t, withControl(t, rtuDevices(line, interval, 40*time.Millisecond)), ring)
	st := new(stats.ModbusServer)
	_, addr := runServer(t, mbserver.Config{Passer: passer{s}, Units: map[uint8]string{5: "meter-1", 7: "meter-2"}, Stats: st, MaxConns: 64})
	waitPolled(t, s)
	fds := openFDs(t)
	before := snapshots(s.Devices())

	const clients, each = 50, 100
	type result struct{ ok, busy, timeout, other int }
	results := make(chan result, clients)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := 0; i < clients; i++ {
		src := net.IPv4(127, 0, 3, byte(10+i))
		if i >= 40 {
			src = net.IPv4(127, 0, 3, 200) // ten clients of one address
		}
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: src}, Timeout: 5 * time.Second}
		conn, err := d.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		c := &client{c: conn}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer conn.Close()
			<-start
			var r result
			for k := 0; k < each; k++ {
				unit, base := byte(5), uint16(100)
				if k%2 == 1 {
					unit, base = 7, 200
				}
				got, err := regs(c.do(unit, readPDU(3, 0, 2)))
				switch {
				case err == nil && len(got) == 2 && got[0] == base && got[1] == base+1:
					r.ok++
				case isException(err, 0x06):
					r.busy++
				case isException(err, 0x0b):
					r.timeout++ // a live unit that missed its timeout on a stalled machine
				default:
					r.other++
					if r.other == 1 {
						t.Logf("client %v: request %d: %v %v", src, k, got, err)
					}
				}
			}
			results <- r
		}()
	}
	t0 := time.Now()
	close(start)
	testenv.Wait(t, 120*time.Second, "the 50 clients to finish", wg.Wait)
	took := time.Since(t0)
	after := snapshots(s.Devices())
	var sum result
	for i := 0; i < clients; i++ {
		r := testenv.Recv(t, results, time.Second, "a client's result")
		sum.ok, sum.busy, sum.timeout, sum.other = sum.ok+r.ok, sum.busy+r.busy, sum.timeout+r.timeout, sum.other+r.other
	}
	sn := st.Snapshot()
	t.Logf("%d requests in %v: %d answered with the slave's values, %d busy (0x06), %d device timeouts (0x0b), %d other; server: requests %d, pass-through %d, busy %d, exceptions %v",
		clients*each, took.Round(time.Millisecond), sum.ok, sum.busy, sum.timeout, sum.other, sn.Requests, sn.PassRequests, sn.Busy, sn.Exceptions)
	if sum.ok+sum.busy+sum.timeout+sum.other != clients*each || sn.Requests != clients*each {
		t.Errorf("%d answers, server counted %d requests, want %d", sum.ok+sum.busy+sum.timeout+sum.other, sn.Requests, clients*each)
	}
	if sum.busy == 0 || uint64(sum.busy) != sn.Busy || sn.Exceptions[0x06] != sn.Busy {
		t.Errorf("refusals: clients saw %d, server counted %d busy and %d 0x06", sum.busy, sn.Busy, sn.Exceptions[0x06])
	}
	// A live unit's timeout on a stalled machine is a 0x0B the server
	// counts; how many depends on the load, so the bound is the count.
	if sum.other != 0 || uint64(sum.timeout) != sn.Exceptions[0x0b] {
		t.Errorf("%d answers neither the values, 0x06 nor 0x0b; clients saw %d 0x0b, the server counted %d", sum.other, sum.timeout, sn.Exceptions[0x0b])
	}
	if sum.ok == 0 {
		t.Error("no request passed")
	}
	checkWindows(t, before, after, []string{"meter-1", "meter-2"}, "control-1", "dead-3")
	p99 := time.Duration(sn.Wait.Quantile(0.99)) * time.Microsecond
	t.Logf("wait p99 under the flood %v; waited 0/1/2/3+ polls %v", p99, sn.WaitPolls)

	testenv.WaitFor(t, 10*time.Second, "every connection closed", func() bool { return st.Connections.Load() == 0 })
	testenv.WaitFor(t, 10*time.Second, "the descriptors back to their number before the clients", func() bool { return openFDs(t) <= fds })
	if err := s.Healthy(time.Minute); err != nil {
		t.Error(err)
	}
}
