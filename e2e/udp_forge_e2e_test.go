package e2e

import (
	"encoding/binary"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"edgegw/internal/testenv"
	"edgegw/lab/sim"
	"edgegw/ringstore"
)

// The forged-reply fault end to end: logger d0 goes away and a forger takes
// its address; on every request it sends replies with a forged value (999.9)
// under guessed transaction ids — the next ones a sequential scheme would
// use after the request count /api/devices shows, then a spray of random
// ones — and a stranger sends replies from an address that is no device.
// No forged value is ever a good sample, d1 keeps polling, the forged
// datagrams are counted on d0 and the stranger's as unknown source.
func TestForgedUDPRepliesE2E(t *testing.T) {
	fleet := runFleet(t, sim.Config{Devices: 2, Transport: "udp"})
	for i := range 2 {
		fleet.Logger(i).SetHolding(0, 215)
	}
	var b strings.Builder
	b.WriteString("[gateway]\nid = \"forge\"\n[http]\nlisten = \"127.0.0.1:0\"\n[poll]\nudp_listen = \"127.0.0.1:0\"\n")
	b.WriteString("[[profile]]\nname = \"th\"\ntags = [ { name = \"temperature\", address = 0, type = \"int16\", scale = 0.1 } ]\n")
	for i := range 2 {
		fmt.Fprintf(&b, "[[device]]\nname = \"d%d\"\ntransport = \"udp\"\naddress = %q\nprofile = \"th\"\ninterval = \"100ms\"\ntimeout = \"50ms\"\n", i, fleet.Addr(i))
	}
	path := filepath.Join(t.TempDir(), "edgegw.toml")
	if err := os.WriteFile(path, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	gw, page := runGateway(t, path)
	ws := collectWS(t, page)
	count := func(dev string, good bool) int {
		all, _ := ws.all()
		n := 0
		for _, s := range all {
			if s.Device == dev && (s.Quality == ringstore.Good) == good {
				n++
			}
		}
		return n
	}
	waitFor(t, 10*time.Second, "good samples of d0", func() bool { return count("d0", true) >= 10 })

	// what /api/devices shows of d0
	var requests atomic.Uint64
	readRequests := func() {
		var v struct {
			Devices []struct {
				Name     string `json:"name"`
				Requests uint64 `json:"requests"`
			} `json:"devices"`
		}
		if err := getJSON(t, page+"api/devices", &v); err != nil {
			t.Error(err)
			return
		}
		for _, d := range v.Devices {
			if d.Name == "d0" {
				requests.Store(d.Requests)
			}
		}
	}
	readRequests()

	fleet.Logger(0).Stop()
	forger, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.MustParseAddrPort(fleet.Addr(0))))
	if err != nil {
		t.Fatal(err)
	}
	stranger, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 1, 250)})
	if err != nil {
		t.Fatal(err)
	}
	defer stranger.Close()
	var wg sync.WaitGroup
	var seen atomic.Int64
	wg.Add(1)
	go func() {
		defer wg.Done()
		var in [512]byte
		for {
			n, src, err := forger.ReadFromUDPAddrPort(in[:])
			if err != nil {
				return
			}
			if n < 12 {
				continue
			}
			seen.Add(1)
			// the request's own id is never used: only its arrival
			reply := []byte{0, 0, 0, 0, 0, 5, in[6], 3, 2, 0, 0}
			binary.BigEndian.PutUint16(reply[9:], 9999)
			send := func(c *net.UDPConn, tid uint16) {
				binary.BigEndian.PutUint16(reply, tid)
				_, _ = c.WriteToUDPAddrPort(reply, src)
			}
			r := requests.Load()
			for i := range uint64(8) {
				send(forger, uint16(r+1+i))
			}
			for range 200 {
				send(forger, uint16(rand.N(65535)+1))
			}
			send(stranger, uint16(r+1))
		}
	}()
	d1Before := count("d1", true)
	deadline := time.Now().Add(3 * time.Second)
	waitFor(t, 30*time.Second, "3 s of forging and 20 more good samples of d1", func() bool {
		readRequests()
		return time.Now().After(deadline) && count("d1", true) >= d1Before+20
	})
	forger.Close()
	testenv.Wait(t, 10*time.Second, "the forger's reader to end", wg.Wait)

	all, _ := ws.all()
	var forgedGood, d0Bad int
	for _, s := range all {
		if s.Quality == ringstore.Good && s.Value > 999 {
			forgedGood++
		}
		if s.Device == "d0" && s.Quality != ringstore.Good {
			d0Bad++
		}
	}
	metrics := func() string {
		resp, err := http.Get(page + "metrics")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return string(body)
	}
	m := metrics()
	t.Logf("%d requests reached the forger; %d bad samples of d0", seen.Load(), d0Bad)
	if forgedGood != 0 {
		t.Errorf("%d forged values taken as good samples", forgedGood)
	}
	// d0 answers nothing good, so it is demoted (polled less often): a few
	// requests reach the forger, each with 209 guesses.
	if seen.Load() < 3 || d0Bad < 3 {
		t.Errorf("the attack did not run: %d requests at the forger, %d bad samples of d0", seen.Load(), d0Bad)
	}
	for _, want := range []string{`edgegw_device_dropped_frames_total{device="d0"} `, `edgegw_udp_unknown_source_total `} {
		i := strings.Index(m, want)
		if i < 0 || strings.HasPrefix(m[i+len(want):], "0\n") {
			t.Errorf("/metrics: %s missing or 0", want)
		}
	}
	if code := gw.Stop(os.Interrupt, 15*time.Second); code != 0 {
		t.Errorf("gateway exited %d", code)
	}
}
