package edge

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"edgegw/internal/testenv"
	"edgegw/lab/sim"
	"edgegw/ringstore"
)

// The UDP round (one goroutine, batched sends) against 48 loggers on
// 127.0.1.1–48 that reorder replies (jitter), send duplicates, wrong
// transaction ids and replies from another port, with sendmmsg/recvmmsg
// and with one syscall per datagram (the fallback where the batch calls
// are missing or refused): in both, every good sample carries its own
// device's value, strays are counted and never delivered, every request
// is accounted for, and polls get their answers.
func TestUDPRoundBatchAndFallback(t *testing.T) {
	f := startFleet(t, sim.Config{Devices: 48, Transport: "udp", Seed: 11, Faults: sim.Faults{
		Jitter: 50 * time.Millisecond, Duplicate: 0.05, WrongTID: 0.02, OtherPort: 0.05,
	}})
	names := map[string]float64{}
	for i := 0; i < 48; i++ {
		f.Logger(i).SetHolding(50, uint16(2000+i))
		names[fmt.Sprintf("logger-%02d", i+1)] = float64(2000 + i)
	}
	tags := []Tag{{Name: "id", Register: Holding, Address: 50, Type: Uint16}}
	for _, noBatch := range []bool{false, true} {
		t.Run(fmt.Sprintf("nobatch=%v", noBatch), func(t *testing.T) {
			ring := newRing(t, 100000)
			lg := &attrLog{msg: "modbus: udp socket open", key: "batch"}
			s, err := New(Config{Sink: ring, Devices: udpFleetDevices(f, 100*time.Millisecond, 40*time.Millisecond, tags),
				UDPListen: "127.0.0.1:0", UDPNoBatch: noBatch, Logger: slog.New(lg)})
			if err != nil {
				t.Fatal(err)
			}
			stop := runSched(t, s)
			waitFor(t, 60*time.Second, "30 polls of every device, and strays of every kind", func() bool {
				var late, dup, drop uint64
				for _, d := range s.devices {
					if d.stats.Polls.Load() < 30 {
						return false
					}
					late += d.stats.Late.Load()
					dup += d.stats.Duplicates.Load()
					drop += d.stats.Dropped.Load()
				}
				return late > 0 && dup > 0 && drop > 0
			})
			stop()
			if batch, want := lg.since(0), fmt.Sprint(!noBatch); len(batch) != 1 || batch[0].String() != want {
				t.Errorf("socket opened with batch %v, want [%s]", batch, want)
			}
			var polls, answered, requests, outcomes, late uint64
			for _, d := range s.devices {
				sn := d.stats.Snapshot()
				polls += sn.Polls
				answered += sn.Responses
				requests += sn.Requests
				late += sn.Late
				outcomes += sn.Responses + sn.Timeouts + sn.Errors + sn.Exceptions
			}
			if requests != outcomes {
				t.Errorf("requests %d != responses + timeouts + errors + exceptions %d", requests, outcomes)
			}
			// Wrong ids make the requests then waiting on that logger
			// untrusted: those polls fail, by design. Most must not. A
			// reply that came after its request gave up (the jitter, or a
			// loaded machine) is counted late: not a failure of matching.
			if lost := polls - min(polls, answered+late); lost > polls/5 {
				t.Errorf("%d of %d polls answered, %d replies late: %d lost otherwise", answered, polls, late, lost)
			}
			good := checkOwnValues(t, ring, names)
			if good == 0 {
				t.Fatal("no good sample")
			}
			t.Logf("polls %d answered %d requests %d, %d good samples checked", polls, answered, requests, good)
		})
	}
}

// More than 65,536 requests to one address, so that its random
// transaction ids come round again: 32 devices (units 1–32) behind one
// logger share its id space, each reading 4 registers one at a time, with
// replies reordered, duplicated and sent from another port. Every good
// sample is its own register's value for its own unit's read.
func TestUDPRoundTransactionIDWrap(t *testing.T) {
	f := startFleet(t, sim.Config{Devices: 1, Transport: "udp", Seed: 5, Faults: sim.Faults{
		Jitter: 2 * time.Millisecond, Duplicate: 0.02, OtherPort: 0.02,
	}})
	l := f.Logger(0)
	var tags []Tag
	want := map[string]float64{}
	for k := 0; k < 4; k++ {
		a := uint16(300 + 10*k)
		l.SetHolding(a, 4000+a)
		name := fmt.Sprintf("r%d", a)
		tags = append(tags, Tag{Name: name, Register: Holding, Address: a, Type: Uint16})
		want[name] = float64(4000 + a)
	}
	var devs []DeviceConfig
	for u := 1; u <= 32; u++ {
		dc := devCfg(fmt.Sprintf("unit-%02d", u), TransportUDP, f.Addr(0), 40*time.Millisecond, 15*time.Millisecond, tags)
		dc.Unit, dc.MaxGap, dc.MaxRegs = uint8(u), 0, 1
		devs = append(devs, dc)
	}
	ring := newRing(t, 1000)
	s, err := New(Config{Sink: ring, Devices: devs, UDPListen: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var bad string
	var good int
	s.cfg.Sink = sinkFunc(func(batch []ringstore.Sample) {
		mu.Lock()
		defer mu.Unlock()
		for _, smp := range batch {
			if smp.Quality != ringstore.Good {
				continue
			}
			good++
			if smp.Value != want[smp.Tag] && bad == "" {
				bad = fmt.Sprintf("%s/%s = %v, want %v", smp.Device, smp.Tag, smp.Value, want[smp.Tag])
			}
		}
	})
	stop := runSched(t, s)
	waitFor(t, 5*time.Minute, "70,000 requests at the logger", func() bool { return l.Counters().Requests > 70000 })
	stop()
	mu.Lock()
	defer mu.Unlock()
	if bad != "" {
		t.Fatal(bad)
	}
	var requests, answered, dups, late uint64
	for _, d := range s.devices {
		sn := d.stats.Snapshot()
		requests += sn.Requests
		answered += sn.Responses
		dups += sn.Duplicates
		late += sn.Late
	}
	t.Logf("%d requests, %d answered, %d late, %d duplicates counted, %d good samples", requests, answered, late, dups, good)
	// A reply after its 15 ms timeout (a loaded machine) is counted late,
	// not lost: nine in ten of the others must be answered.
	if lost := requests - min(requests, answered+late); requests < 65536 || lost > requests/10 || dups == 0 || good == 0 {
		t.Errorf("%d requests, %d answered, %d late (%d lost otherwise), %d duplicates, %d good samples", requests, answered, late, lost, dups, good)
	}
}

type sinkFunc func([]ringstore.Sample)

func (f sinkFunc) Append(b []ringstore.Sample) (uint64, uint64, error) { f(b); return 0, 0, nil }

// A poll of a 2-register read — encode, send, receive, match, decode,
// append to the ring — allocates nothing in steady state: over TCP (the
// bus goroutine's poll, through Do) and over UDP (a round of 8 devices,
// each turn of the round's event loop as run does it).
func TestZeroAllocsPerPoll(t *testing.T) {
	ring := newRing(t, 1000)
	var devs []DeviceConfig
	for i := range 8 {
		devs = append(devs, devCfg(fmt.Sprintf("u%d", i), TransportUDP, testenv.FastModbusUDP(t, fmt.Sprintf("127.0.1.%d", i+1)), time.Second, time.Second, thTags()))
	}
	// The TCP device has a tag at two intervals, over both registers: every
	// other poll decodes it too (the same read: the logger answers 0+2 only).
	rated := append(thTags(), Tag{Name: "raw", Register: Holding, Address: 0, Type: Uint32, Interval: 2 * time.Second})
	devs = append(devs, devCfg("t", TransportTCP, testenv.FastModbusTCP(t), time.Second, time.Second, rated))
	s, err := New(Config{Sink: ring, Devices: devs, UDPListen: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	rs := &runState{s: s, ctx: ctx, epoch: time.Now(), ports: map[string]*portRef{}, failed: map[string]*openFailure{}, buses: map[*bus]*busRunner{},
		clock: newClock(), udpB: map[*bus]bool{}}
	defer func() {
		cancel()
		testenv.Wait(t, stopLimit, "the run's goroutines to exit", rs.wg.Wait)
		for _, d := range s.devices {
			rs.detach(d)
		}
		rs.udp.Close()
	}()
	rs.attachAll(s.devices)
	for _, d := range s.devices {
		if d.conn == nil {
			t.Fatalf("%s: not open", d.cfg.Name)
		}
	}
	r := newUDPRound(rs)
	var tb *bus
	for _, b := range s.buses {
		if b.udp {
			r.buses = append(r.buses, b)
		} else {
			tb = b
		}
	}
	wake := time.NewTimer(time.Hour)
	defer wake.Stop()
	check := func(d *device) {
		if d.values[0] != 0.1 || d.values[1] != 0.2 || d.quality[0] != ringstore.Good || d.quality[1] != ringstore.Good { // registers 0, 1 = 1, 2; scale 0.1
			t.Fatalf("%s: %v %v (%v)", d.cfg.Name, d.values, d.quality, d.req.Err)
		}
	}
	udpRound := func() {
		now := time.Now()
		for _, b := range r.buses {
			b.devices[0].next = now
		}
		r.startDue(now)
		r.flush()
		for len(r.fly) > 0 {
			wake.Reset(5 * time.Second)
			select {
			case <-r.rd.Ready():
			case <-wake.C:
				t.Fatal("round: no reply in 5 s")
			}
			r.collect(time.Now())
			r.flush()
		}
		for _, b := range r.buses {
			check(b.devices[0])
		}
	}
	td := tb.devices[0]
	k := 0
	tcpPoll := func() {
		td.next = time.Now().Add(time.Duration(k) * td.cfg.Interval) // window k: both tags, then temperature alone
		k++
		tb.pollOne(td, ring)
		check(td)
		if raw := td.values[2]; raw != 1<<16|2 {
			t.Fatalf("raw: %v", raw)
		}
	}
	for _, c := range []struct {
		name string
		poll func()
	}{{"udp round of 8", udpRound}, {"tcp poll", tcpPoll}} {
		for range 50 { // warm up: buffers, free lists, the stream, the ring's index
			c.poll()
		}
		if n := testing.AllocsPerRun(300, c.poll); n != 0 {
			t.Errorf("%s: %v allocations per poll, want 0", c.name, n)
		}
	}
	// The count sees allocations: a read through goburrow's client makes some.
	n := testing.AllocsPerRun(50, func() {
		if _, err := r.buses[0].devices[0].conn.ReadHoldingRegisters(0, 2); err != nil {
			t.Fatal(err)
		}
	})
	if n == 0 {
		t.Error("the Read* path shows 0 allocations: the count measures nothing")
	}
}
