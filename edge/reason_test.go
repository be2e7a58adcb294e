package edge

import (
	"encoding/binary"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"edgegw/stats"
)

// recordOf is the live record of the device called name, as Devices
// publishes it (the test fails when there is none).
func recordOf(t *testing.T, s *Scheduler, name string) *stats.Device {
	t.Helper()
	for _, e := range s.Devices() {
		if e.Info.Name == name {
			return e.Stats
		}
	}
	t.Fatalf("no device %q", name)
	return nil
}

// reasonsWhile polls d's reason until cond holds (or fails the test after
// limit) and returns every distinct reason seen on the way.
func reasonsWhile(t *testing.T, d *stats.Device, limit time.Duration, what string, cond func(seen map[string]bool) bool) map[string]bool {
	t.Helper()
	seen := map[string]bool{}
	waitFor(t, limit, what, func() bool {
		if r := d.Reason(); r != "" {
			seen[r] = true
		}
		return cond(seen)
	})
	return seen
}

func anyHas(seen map[string]bool, sub string) bool {
	for r := range seen {
		if strings.Contains(r, sub) {
			return true
		}
	}
	return false
}

// A TCP device whose address refuses connections: while the dial backs
// off, the reason still says what the dial got ("connection refused"),
// with the time to the next try, never only "reconnect backoff".
func TestReasonKeepsRefusedDialThroughBackoff(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now: every dial is refused
	s, err := New(Config{Sink: newRing(t, 1000), Devices: []DeviceConfig{
		devCfg("refused", TransportTCP, addr, 50*time.Millisecond, 40*time.Millisecond, thTags())}})
	if err != nil {
		t.Fatal(err)
	}
	runSched(t, s)
	d := recordOf(t, s, "refused")
	seen := reasonsWhile(t, d, 20*time.Second, "3 polls and a reason given while backing off", func(seen map[string]bool) bool {
		return d.Polls.Load() >= 3 && anyHas(seen, "next ") // "(next try in …)"; before: "reconnect backoff: next dial in …"
	})
	for r := range seen {
		if !strings.Contains(r, "connection refused") || !strings.Contains(r, "dial tcp "+addr) {
			t.Errorf("reason %q: want the dial's error (%s: connection refused)", r, addr)
		}
	}
	t.Logf("reasons seen: %q", keys(seen))
}

// A fake TCP device that answers every request with an MBAP header of
// length 65535: the reason is the frame error, also while the redial backs
// off after it.
func TestReasonKeepsFrameErrorThroughBackoff(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	// One goroutine per connection; the listener's close ends the accept
	// loop, and each connection is closed by its peer (the scheduler closes
	// it after the frame error) or at cleanup.
	open := make(chan net.Conn, 1000)
	var wg sync.WaitGroup
	answer := func(c net.Conn) {
		defer wg.Done()
		var req [12]byte // MBAP header + FC 3 read: 7 + 5 bytes
		for {
			if _, err := io.ReadFull(c, req[:]); err != nil {
				break
			}
			reply := make([]byte, 7+5)
			copy(reply, req[:2])                          // the transaction id echoed
			binary.BigEndian.PutUint16(reply[4:], 0xFFFF) // length 65535: no such frame
			reply[6], reply[7], reply[8] = req[6], 3, 4
			if _, err := c.Write(reply); err != nil {
				break
			}
		}
		c.Close()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for c, err := ln.Accept(); err == nil; c, err = ln.Accept() {
			select {
			case open <- c: // kept for cleanup
			default:
				c.Close() // more than the test can make: refused
				continue
			}
			wg.Add(1)
			go answer(c)
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		for len(open) > 0 {
			(<-open).Close() // not a wait: len says one is there
		}
		wg.Wait()
	})
	s, err := New(Config{Sink: newRing(t, 1000), Devices: []DeviceConfig{
		devCfg("garbled", TransportTCP, ln.Addr().String(), 50*time.Millisecond, 40*time.Millisecond, thTags())}})
	if err != nil {
		t.Fatal(err)
	}
	stop := runSched(t, s)
	d := recordOf(t, s, "garbled")
	seen := reasonsWhile(t, d, 20*time.Second, "3 polls and a reason given while backing off", func(seen map[string]bool) bool {
		return d.Polls.Load() >= 3 && anyHas(seen, "next ") // "(next try in …)"; before: "reconnect backoff: next dial in …"
	})
	stop()
	for r := range seen {
		if !strings.Contains(r, "mbap length 65535") {
			t.Errorf("reason %q: want the frame error (mbap length 65535)", r)
		}
	}
	if d.GoodPolls.Load() != 0 {
		t.Errorf("%d good polls from a device that sends no valid frame", d.GoodPolls.Load())
	}
	t.Logf("reasons seen: %q", keys(seen))
}

func keys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}
