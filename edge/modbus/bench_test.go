package modbus

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"edgegw/internal/testenv"
)

// TestHelperUDPDevices is the child process of the benchmarks: n fast UDP
// devices on 127.0.1.1…n, their addresses on stdout, until stdin closes.
// Out of process, the devices' CPU is not in the benchmark's cpu-ns/op.
func TestHelperUDPDevices(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv("EDGEGW_MODBUS_HELPER_DEVICES"))
	if n == 0 {
		t.Skip("only run by the benchmarks")
	}
	for i := range n {
		fmt.Println(testenv.FastModbusUDP(t, fmt.Sprintf("127.0.1.%d", i+1)))
	}
	fmt.Println("ready")
	_, _ = io.Copy(io.Discard, os.Stdin)
}

// externalUDPDevices starts n fast UDP devices in a child process.
func externalUDPDevices(b *testing.B, n int) []string {
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperUDPDevices$")
	cmd.Env = append(os.Environ(), "EDGEGW_MODBUS_HELPER_DEVICES="+strconv.Itoa(n))
	in, err := cmd.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		in.Close()
		testenv.Wait(b, stopLimit, "the pymodbus slave to exit", func() { _ = cmd.Wait() })
	})
	var addrs []string
	sc := bufio.NewScanner(out)
	for sc.Scan() && sc.Text() != "ready" {
		addrs = append(addrs, sc.Text())
	}
	if len(addrs) != n {
		b.Fatalf("helper gave %d addresses: %v (%v)", len(addrs), addrs, sc.Err())
	}
	go func() { _, _ = io.Copy(io.Discard, out) }()
	return addrs
}

// cpuTime is the process's user+system CPU time so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// reportCPU adds the process's CPU per op (the devices run in another
// process in BenchmarkUDPFleet48, in this one in BenchmarkRead2).
func reportCPU(b *testing.B, start time.Duration) {
	b.ReportMetric(float64(cpuTime()-start)/float64(b.N), "cpu-ns/op")
}

// BenchmarkUDPFleet48: one op is one poll of 48 devices (a 2-register read
// each, the devices in a child process) on one socket; cpu-ns/op is this
// process's CPU per poll of the 48. per-request: the Read* path (goburrow client),
// one goroutine per device as the scheduler runs it today; do: the same
// goroutines with Request/Do; round-fallback: one SendRound, one syscall
// per datagram; round-batch: one SendRound with sendmmsg/recvmmsg.
func BenchmarkUDPFleet48(b *testing.B) {
	const n = 48
	addrs := externalUDPDevices(b, n)
	setup := func(b *testing.B, noBatch bool) (*UDPSocket, []*Request) {
		s := startSocketCfg(b, noBatch)
		reqs := make([]*Request, n)
		for i := range reqs {
			c, err := s.Device(addrs[i], 1, time.Second)
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { c.Close() })
			reqs[i] = &Request{Conn: c, Func: 3, Addr: uint16(i), Qty: 2}
		}
		return s, reqs
	}
	goroutines := func(b *testing.B, poll func(r *Request)) {
		_, reqs := setup(b, false)
		var wg sync.WaitGroup
		start := make([]chan struct{}, n)
		done := make(chan struct{}, n)
		for i, r := range reqs {
			start[i] = make(chan struct{}, 1)
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range start[i] {
					poll(r)
					done <- struct{}{}
				}
			}()
		}
		b.ReportAllocs()
		stuck := time.NewTimer(stopLimit) // the whole loop's deadline: no timer per poll
		defer stuck.Stop()
		cpu := cpuTime()
		for b.Loop() {
			for _, c := range start {
				c <- struct{}{}
			}
			for range n {
				select {
				case <-done:
				case <-stuck.C:
					b.Fatalf("polls not done within %v", stopLimit)
				}
			}
		}
		reportCPU(b, cpu)
		for _, c := range start {
			close(c)
		}
		testenv.Wait(b, stopLimit, "the pollers to stop", wg.Wait)
		for _, r := range reqs {
			checkRead2(b, r)
		}
	}
	b.Run("path=per-request", func(b *testing.B) {
		goroutines(b, func(r *Request) {
			r.Data, r.Err = r.Conn.ReadHoldingRegisters(r.Addr, r.Qty)
		})
	})
	b.Run("path=do", func(b *testing.B) { goroutines(b, func(r *Request) { r.Conn.Do(r) }) })
	for _, noBatch := range []bool{true, false} {
		name := "path=round-batch"
		if noBatch {
			name = "path=round-fallback"
		}
		b.Run(name, func(b *testing.B) {
			s, reqs := setup(b, noBatch)
			b.ReportAllocs()
			cpu := cpuTime()
			for b.Loop() {
				s.SendRound(reqs, time.Now().Add(time.Second))
			}
			reportCPU(b, cpu)
			for _, r := range reqs {
				checkRead2(b, r)
			}
		})
	}
}

// BenchmarkRead2: one 2-register read from one device, through the Read*
// path (goburrow's client on our transports) and through Request/Do.
func BenchmarkRead2(b *testing.B) {
	s := startSocket(b)
	uc, err := s.Device(testenv.FastModbusUDP(b, "127.0.0.1"), 1, time.Second)
	if err != nil {
		b.Fatal(err)
	}
	defer uc.Close()
	tc := NewTCP(TCPConfig{Address: testenv.FastModbusTCP(b), Unit: 1})
	defer tc.Close()
	for _, c := range []struct {
		name string
		p    poller
		do   func(r *Request)
	}{{"udp", uc, uc.Do}, {"tcp", tc, tc.Do}} {
		b.Run("transport="+c.name+"/path=read", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := c.p.ReadHoldingRegisters(7, 2); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run("transport="+c.name+"/path=do", func(b *testing.B) {
			r := &Request{Func: 3, Addr: 7, Qty: 2}
			b.ReportAllocs()
			for b.Loop() {
				c.do(r)
				if r.Err != nil {
					b.Fatal(r.Err)
				}
			}
		})
	}
}
