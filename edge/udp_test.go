package edge

import (
	"fmt"
	"testing"
	"time"

	"edgegw/lab/sim"
	"edgegw/ringstore"
)

func udpFleetDevices(f *sim.Fleet, iv, timeout time.Duration, tags []Tag) []DeviceConfig {
	var devs []DeviceConfig
	for i := 0; i < f.Len(); i++ {
		devs = append(devs, devCfg(fmt.Sprintf("logger-%02d", i+1), TransportUDP, f.Addr(i), iv, timeout, tags))
	}
	return devs
}

// 48 UDP loggers on 127.0.1.1–48 polled over the one socket with random
// delays that reorder replies, late replies, duplicates, wrong transaction
// ids and replies from another port: every good sample carries its own
// device's value, and the strays are counted, never delivered.
func TestUDP48LoggersNoCrossTalk(t *testing.T) {
	f := startFleet(t, sim.Config{Devices: 48, Transport: "udp", Seed: 7, Faults: sim.Faults{
		Jitter: 40 * time.Millisecond, Duplicate: 0.1, WrongTID: 0.05, OtherPort: 0.05,
	}})
	for i := 0; i < 48; i++ {
		f.Logger(i).SetHolding(50, uint16(1000+i))
	}
	tags := []Tag{{Name: "id", Register: Holding, Address: 50, Type: Uint16}}
	ring := newRing(t, 100000)
	s, err := New(Config{Sink: ring, Devices: udpFleetDevices(f, 100*time.Millisecond, 30*time.Millisecond, tags), UDPListen: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	stop := runSched(t, s)
	t0, logged := time.Now(), false
	waitFor(t, 30*time.Second, "late, duplicate and dropped replies on some device", func() bool {
		var late, dup, drop, good uint64
		for _, d := range s.devices {
			late += d.stats.Late.Load()
			dup += d.stats.Duplicates.Load()
			drop += d.stats.Dropped.Load()
			good += d.stats.GoodPolls.Load()
		}
		if time.Since(t0) > 5*time.Second && !logged {
			logged = true
			t.Logf("late %d dup %d drop %d good %d", late, dup, drop, good)
		}
		return late > 10 && dup > 10 && drop > 10 && good > 480
	})
	stop()
	names := map[string]float64{}
	for i := 0; i < 48; i++ {
		names[fmt.Sprintf("logger-%02d", i+1)] = float64(1000 + i)
	}
	t.Logf("%d good samples checked", checkOwnValues(t, ring, names))
}

// checkOwnValues asserts that every good sample in ring carries its own
// device's value (want, by device name), and that the ring has not
// overflowed (then some were not seen); it returns how many it checked.
func checkOwnValues(t *testing.T, ring *ringstore.Ring, want map[string]float64) (good int) {
	t.Helper()
	res := ring.Since(0, nil)
	if res.Reset {
		t.Fatal("ring overflowed")
	}
	for _, smp := range res.Samples {
		if smp.Quality != ringstore.Good {
			continue
		}
		good++
		if smp.Value != want[smp.Device] {
			t.Fatalf("cross-talk: %s got %v", smp.Device, smp.Value)
		}
	}
	return good
}

// 1% of requests and 1% of responses lost: no stall, no overrun pile-up,
// losses counted, and with one retry inside the interval a poll goes
// unanswered only when both its requests are lost or the machine left no
// time for the retry in the window (its first timeout noticed late). The
// losses are counted
// apart by whom they were lost to: the wire (the simulator's own count of
// the requests and replies it dropped) and the machine (a timeout the
// simulator did not cause: its reply came after the gateway gave up, a
// loaded machine under -race). Answered, not valid: a poll that ends after
// its window is late, not lost; at most one overrun per poll (polls never
// pile up).
func TestUDPLossWithOneRetry(t *testing.T) {
	f := startFleet(t, sim.Config{Devices: 48, Transport: "udp", Seed: 3, Faults: sim.Faults{DropRequest: 0.01, DropResponse: 0.01}})
	ring := newRing(t, 1000)
	// 200 polls × 48 devices: about 190 polls (0.02 × 9600) lose a request
	// or its reply, about 4 of them both (0.02² × 9600), 20 allowed
	// (Poisson(4) above 20: below 1e-7); without the retry all 190 go
	// unanswered. On a loaded machine a timeout the machine caused (its
	// reply came late) may cost its poll, and so may a window the poll
	// started late in or ran over (an overrun: no time left for the retry).
	s, err := New(Config{Sink: ring, Devices: udpFleetDevices(f, 100*time.Millisecond, 30*time.Millisecond, thTags()), UDPListen: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	stop := runSched(t, s)
	waitFor(t, 90*time.Second, "200 polls of every device", func() bool {
		for _, d := range s.devices {
			if d.stats.Polls.Load() < 200 {
				return false
			}
		}
		return true
	})
	stop()
	var dropped uint64 // requests and replies the simulator dropped
	for i := range f.Len() {
		dropped += f.Logger(i).Counters().Dropped
	}
	var polls, good, sched, timeouts, overruns, requests, answered uint64
	for _, d := range s.devices {
		sn := d.stats.Snapshot()
		polls += sn.Polls
		good += sn.GoodPolls
		sched += sn.Polls + sn.Overruns + sn.Skipped
		timeouts += sn.Timeouts
		overruns += sn.Overruns
		requests += sn.Requests
		answered += sn.Responses // one read per poll: a poll's answer ends it
		if sn.GoodPolls < sn.Polls {
			t.Logf("%s: polls %d good %d requests %d timeouts %d errors %d late %d", d.cfg.Name, sn.Polls, sn.GoodPolls, sn.Requests, sn.Timeouts, sn.Errors, sn.Late)
		}
	}
	valid := float64(good) / float64(sched)
	rate := float64(answered) / float64(polls)
	// A dropped request in flight when the gateway stopped is no timeout:
	// one per device at most.
	byMachine := uint64(0)
	if timeouts > dropped {
		byMachine = timeouts - dropped
	}
	t.Logf("polls %d answered %d requests %d timeouts %d (simulator dropped %d, late on this machine %d) overruns %d valid %.4f%%",
		polls, answered, requests, timeouts, dropped, byMachine, overruns, 100*valid)
	if timeouts == 0 || timeouts+uint64(f.Len()) < dropped {
		t.Errorf("%d timeouts counted for %d requests or replies dropped: losses not counted", timeouts, dropped)
	}
	if answered > polls || requests != answered+timeouts {
		t.Errorf("counts do not add up: requests %d = answered %d + timeouts %d? (polls %d)", requests, answered, timeouts, polls)
	}
	if unanswered := polls - answered; unanswered > 20+byMachine+overruns {
		t.Errorf("%d polls unanswered (%.4f%% answered): more than 20 double losses + %d timeouts of this machine + %d overruns: no retry?",
			unanswered, 100*rate, byMachine, overruns)
	}
	if overruns > polls {
		t.Errorf("%d overruns in %d polls: losses piled up", overruns, polls)
	}
}
