package modbus

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"edgegw/internal/testenv"
	"edgegw/lab/sim"
)

// startSocketCfg is startSocket with a config (NoBatch).
func startSocketCfg(t testing.TB, noBatch bool) *UDPSocket {
	t.Helper()
	s, err := NewUDPSocket(UDPConfig{Listen: "127.0.0.1:0", NoBatch: noBatch})
	if err != nil {
		t.Fatal(err)
	}
	if want := batchSupported && !noBatch; s.batch.Load() != want {
		t.Fatalf("batch %v, want %v", s.batch.Load(), want)
	}
	t.Cleanup(func() { s.Close() }) // after Run has returned (cleanups run last first)
	testenv.RunUntilEnd(t, stopLimit, "the udp socket's Run", s.Run)
	return s
}

func startSimFleet(t testing.TB, cfg sim.Config) *sim.Fleet {
	t.Helper()
	f, err := sim.NewFleet(cfg)
	return testenv.Running(t, stopLimit, "the simulated fleet", f, err)
}

// roundResult is what one path (batched or not) saw over a run of rounds.
type roundResult struct {
	good, timeouts, untrusted int
	dev                       Counters // summed over devices
	sock                      Counters
}

// runFleetRounds polls every logger of f in rounds of one SendRound each
// (two requests per logger: register 50, its id, and 51, a per-logger
// constant), with a stranger spraying well-formed replies at the socket.
// Every good reply must carry its own logger's values.
func runFleetRounds(t *testing.T, f *sim.Fleet, noBatch bool, rounds int, deadline time.Duration) roundResult {
	s := startSocketCfg(t, noBatch)
	n := f.Len()
	conns := make([]*UDPConn, n)
	reqs := make([]*Request, 0, 2*n)
	for i := range n {
		c, err := s.Device(f.Addr(i), 1, time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		conns[i] = c
		reqs = append(reqs, &Request{Conn: c, Func: 3, Addr: 50, Qty: 1}, &Request{Conn: c, Func: 3, Addr: 51, Qty: 1})
	}
	stranger, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 1, 250)})
	if err != nil {
		t.Fatal(err)
	}
	defer stranger.Close()
	forged := mbap(hx("0001 0000 0006 01 03 0032 0001"), hx("03 02 DEAD"))
	var res roundResult
	for round := range rounds {
		for k := range 4 { // a foreign endpoint, ids all over the place
			binary.BigEndian.PutUint16(forged, uint16(round*4+k))
			_, _ = stranger.WriteToUDPAddrPort(forged, s.LocalAddr())
		}
		s.SendRound(reqs, time.Now().Add(deadline))
		for j, r := range reqs {
			i := j / 2
			var fe *FrameError
			switch {
			case r.Err == nil:
				want := uint16(1000 + i)
				if j%2 == 1 {
					want = uint16(7000 + i)
				}
				if len(r.Data) != 2 || binary.BigEndian.Uint16(r.Data) != want {
					t.Fatalf("round %d: logger %d reg %d: got % x, want %d", round, i, r.Addr, r.Data, want)
				}
				res.good++
			case errors.Is(r.Err, ErrTimeout):
				res.timeouts++
			case errors.As(r.Err, &fe) && fe == errUntrusted:
				res.untrusted++
			default:
				t.Fatalf("round %d: logger %d: %v", round, i, r.Err)
			}
		}
	}
	for _, c := range conns {
		cn := c.Counters()
		res.dev.Late += cn.Late
		res.dev.Duplicates += cn.Duplicates
		res.dev.Dropped += cn.Dropped
		res.dev.Untrusted += cn.Untrusted
	}
	waitFor(t, 2*time.Second, "the stranger's datagrams counted", func() bool {
		return s.Counters().UnknownSource >= uint64(4*rounds)
	})
	res.sock = s.Counters()
	if want := batchSupported && !noBatch; s.batch.Load() != want {
		t.Errorf("batch %v after the rounds, want %v (fell back?)", s.batch.Load(), want)
	}
	return res
}

// TestUDPRoundFleet: the 48-logger UDP fleet, replies reordered by jitter,
// duplicated, sent under a wrong id or from another port, and a stranger
// spraying replies: rounds through the batched path and through the
// one-datagram-per-syscall fallback give only their own device's values,
// count every stray, and answer (nearly) everything they should.
func TestUDPRoundFleet(t *testing.T) {
	const rounds = 30
	for _, noBatch := range []bool{false, true} {
		t.Run(fmt.Sprintf("nobatch=%v", noBatch), func(t *testing.T) {
			f := startSimFleet(t, sim.Config{Devices: 48, Transport: "udp", Seed: 11, Faults: sim.Faults{
				Jitter: 10 * time.Millisecond, Duplicate: 0.1, WrongTID: 0.03, OtherPort: 0.03,
			}})
			for i := range 48 {
				f.Logger(i).SetHolding(50, uint16(1000+i), uint16(7000+i))
			}
			res := runFleetRounds(t, f, noBatch, rounds, 200*time.Millisecond)
			total := rounds * 96
			t.Logf("%d requests: %d good, %d timeouts, %d untrusted; devices %+v; socket %+v", total, res.good, res.timeouts, res.untrusted, res.dev, res.sock)
			// A wrong id or another port loses that reply (a timeout, or
			// untrusted when the wrong id came while another request
			// of the logger waited): about 6% of requests here.
			if res.good < total*85/100 || res.good+res.timeouts+res.untrusted != total {
				t.Errorf("%d good of %d", res.good, total)
			}
			if res.dev.Duplicates == 0 || res.dev.Dropped == 0 || res.sock.UnknownSource < 4*rounds {
				t.Errorf("strays not counted: devices %+v socket %+v", res.dev, res.sock)
			}
		})
	}
}

// TestUDPRoundClean: without faults, the batched and the fallback path
// give exactly the same results: every request answered with its values.
func TestUDPRoundClean(t *testing.T) {
	f := startSimFleet(t, sim.Config{Devices: 48, Transport: "udp", Seed: 5})
	for i := range 48 {
		f.Logger(i).SetHolding(50, uint16(1000+i), uint16(7000+i))
	}
	for _, noBatch := range []bool{false, true} {
		res := runFleetRounds(t, f, noBatch, 20, 5*time.Second)
		if res.good != 20*96 || res.dev != (Counters{}) {
			t.Errorf("nobatch=%v: %d good of %d, devices %+v", noBatch, res.good, 20*96, res.dev)
		}
	}
}

// TestUDPRoundWrap: rounds of 64 requests to one device, >70,000 in all,
// so ids come round again; the device answers each round in reverse order
// and, every 20th round, holds back the reply to the round's first request
// until the next round has arrived. No late reply is delivered, every reply
// is the one asked for, no id is 0, pending twice or reused among the
// recent ones.
func TestUDPRoundWrap(t *testing.T) {
	const per, rounds = 64, 1100
	for _, noBatch := range []bool{false, true} {
		t.Run(fmt.Sprintf("nobatch=%v", noBatch), func(t *testing.T) {
			var mu sync.Mutex
			var batch [][]byte
			var held []byte
			var heldTo netip.AddrPort
			var bad string
			var last [recentN]uint16 // the previous round's ids (recentN == per), then this round's
			seen, batches := 0, 0
			r := startUDPResponder(t, "127.0.0.1:0", func(r *udpResponder, src netip.AddrPort, req []byte) {
				mu.Lock()
				defer mu.Unlock()
				tid := binary.BigEndian.Uint16(req)
				for _, l := range last {
					if l == tid && bad == "" {
						bad = fmt.Sprintf("tid %d reused among the last %d", tid, len(last))
					}
				}
				if tid == 0 {
					bad = "tid 0"
				}
				last[seen%len(last)] = tid
				seen++
				a := binary.BigEndian.Uint16(req[8:])
				batch = append(batch, mbap(req, []byte{3, 2, byte(a >> 8), byte(a)}))
				if len(batch) < per {
					return
				}
				if held != nil { // an earlier round's first reply: late now
					_, _ = r.conn.WriteToUDPAddrPort(held, heldTo)
					held = nil
				}
				first := 1
				if batches%20 == 0 {
					held, heldTo = batch[0], src
				} else {
					first = 0
				}
				for i := len(batch) - 1; i >= first; i-- {
					_, _ = r.conn.WriteToUDPAddrPort(batch[i], src)
				}
				batch = nil
				batches++
			})
			s := startSocketCfg(t, noBatch)
			c, err := s.Device(r.addr, 1, time.Second)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			reqs := make([]*Request, per)
			for i := range reqs {
				reqs[i] = &Request{Conn: c, Func: 3, Qty: 1}
			}
			// A round with a held reply ends at its deadline; the others end
			// when their last reply is in (their deadline is never reached).
			var good, timeouts, extra int
			for round := range rounds {
				for i, q := range reqs {
					q.Addr = uint16(round*per + i)
				}
				hold := round%20 == 0
				deadline := 5 * time.Second
				if hold {
					deadline = 100 * time.Millisecond
				}
				s.SendRound(reqs, time.Now().Add(deadline))
				for i, q := range reqs {
					switch {
					case q.Err == nil && binary.BigEndian.Uint16(q.Data) == q.Addr:
						good++
					case q.Err == nil:
						t.Fatalf("round %d request %d (addr %d): got the reply for %d", round, i, q.Addr, binary.BigEndian.Uint16(q.Data))
					case errors.Is(q.Err, ErrTimeout) && i == 0 && hold:
						timeouts++
					case errors.Is(q.Err, ErrTimeout) && hold:
						extra++ // a reply slower than 100 ms on a busy machine
					default:
						t.Fatalf("round %d request %d: %v (counters %+v)", round, i, q.Err, c.Counters())
					}
				}
			}
			const holds = (rounds + 19) / 20
			waitFor(t, 2*time.Second, "the late replies counted", func() bool { return c.Counters().Late == uint64(holds+extra) })
			mu.Lock()
			defer mu.Unlock()
			if bad != "" {
				t.Error(bad)
			}
			cn := c.Counters()
			t.Logf("%d requests: %d good, %d timeouts (%d held, %d slow), counters %+v", per*rounds, good, timeouts+extra, holds, extra, cn)
			if timeouts != holds || extra > holds*per/10 || good != per*rounds-holds-extra || cn.Dropped != 0 || cn.Duplicates != 0 {
				t.Errorf("%d good, %d+%d timeouts, counters %+v", good, timeouts, extra, cn)
			}
		})
	}
}

// TestRoundPerRequestDeadlines: a Round wakes its goroutine when a batch is
// complete, not when every request in flight is; a request of another
// batch stays in flight until its own deadline, then fails with ErrTimeout,
// and its reply, when it comes, counts as late. A request to a closed
// device fails at once.
func TestRoundPerRequestDeadlines(t *testing.T) {
	for _, noBatch := range []bool{false, true} {
		t.Run(fmt.Sprintf("nobatch=%v", noBatch), func(t *testing.T) {
			s := startSocketCfg(t, noBatch)
			fast, err := s.Device(testenv.FastModbusUDP(t, "127.0.1.1"), 1, time.Second)
			if err != nil {
				t.Fatal(err)
			}
			defer fast.Close()
			held := make(chan []byte, 1)
			var heldTo netip.AddrPort
			slowR := startUDPResponder(t, "127.0.1.2:0", func(r *udpResponder, src netip.AddrPort, req []byte) {
				heldTo = src
				held <- mbap(req, []byte{3, 4, 0, 1, 0, 2})
			})
			slow, err := s.Device(slowR.addr, 1, time.Second)
			if err != nil {
				t.Fatal(err)
			}
			defer slow.Close()
			closed, err := s.Device(slowR.addr, 2, time.Second)
			if err != nil {
				t.Fatal(err)
			}
			closed.Close()

			rd := s.NewRound()
			now := time.Now()
			a := &Request{Conn: fast, Func: 3, Addr: 7, Qty: 2, Deadline: now.Add(10 * time.Second)}
			b := &Request{Conn: slow, Func: 3, Addr: 0, Qty: 2, Deadline: now.Add(10 * time.Second)}
			c := &Request{Conn: closed, Func: 3, Addr: 0, Qty: 2, Deadline: now.Add(10 * time.Second)}
			if n := rd.Send([]*Request{b}); n != 1 {
				t.Fatalf("slow batch: %d sent", n)
			}
			if n := rd.Send([]*Request{a, c}); n != 1 {
				t.Fatalf("fast batch: %d sent, want 1 (the closed device's fails)", n)
			}
			if !rd.Done(c, time.Now()) || !errors.Is(c.Err, net.ErrClosed) {
				t.Fatalf("closed device: %v", c.Err)
			}
			select {
			case <-rd.Ready():
			case <-time.After(5 * time.Second):
				t.Fatal("no wake-up for the completed batch")
			}
			// The round-trip ends when the reply was read, not when Done is
			// asked: a round's replies are handled together.
			asked := time.Now().Add(time.Hour)
			if !rd.Done(a, asked) {
				t.Fatal("fast request not done after its batch completed")
			}
			checkRead2(t, a)
			if a.Replied.Before(now) || !a.Replied.Before(asked.Add(-time.Hour+time.Second)) {
				t.Fatalf("Replied %v: want between the send (%v) and now", a.Replied, now)
			}
			if !c.Replied.IsZero() {
				t.Fatalf("a request that failed has Replied %v", c.Replied)
			}
			if rd.Done(b, time.Now()) {
				t.Fatalf("slow request done before its deadline: %v", b.Err)
			}
			rep := testenv.Recv(t, held, 10*time.Second, "the slow device's request") // the slow device got its request; its reply comes after the deadline
			if !rd.Done(b, b.Deadline) || !errors.Is(b.Err, ErrTimeout) {
				t.Fatalf("slow request at its deadline: %v", b.Err)
			}
			if _, err := slowR.conn.WriteToUDPAddrPort(rep, heldTo); err != nil {
				t.Fatal(err)
			}
			waitFor(t, 5*time.Second, "the late reply counted", func() bool { return slow.Counters().Late == 1 })
			// The requests can go again.
			a.Addr, a.Deadline = 9, time.Now().Add(10*time.Second)
			rd.Send([]*Request{a})
			waitFor(t, 5*time.Second, "the second fast reply", func() bool { return rd.Done(a, time.Now()) })
			checkRead2(t, a)
		})
	}
}
