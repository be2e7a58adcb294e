package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"edgegw/internal/testenv"
	"edgegw/lab/sim"
)

// mirrorHead is a gateway with two [[modbus_server]] mirrors of 48 loggers
// × 2 tags as 96 int16 registers (value × 10) from register 0: unit 100
// fails a read over a tag without a good value with exception 0x04; unit
// 101 reads -32768 there, with quality registers from 1000.
const mirrorHead = `[http]
listen = "127.0.0.1:0"
[[modbus_server]]
listen = "127.0.0.1:0"
[modbus_server.mirror]
unit = 100
format = "int16"
multiplier = 10
map = [ { device = "logger-*", tags = ["temperature", "humidity"] } ]
[[modbus_server]]
listen = "127.0.0.1:0"
[modbus_server.mirror]
unit = 101
format = "int16"
multiplier = 10
on_bad = "value"
bad_value = -32768
quality_address = 1000
map = [ { device = "logger-*", tags = ["temperature", "humidity"] } ]
`

type mirrorPoll struct {
	Seq  uint64 `json:"seq"`
	Tags []struct {
		Device  string   `json:"device"`
		Tag     string   `json:"tag"`
		Value   *float64 `json:"value"`
		Quality string   `json:"quality"`
	} `json:"tags"`
}

type mbStatus struct {
	Modbus []struct {
		Listen   string            `json:"listen"`
		Mirror   uint64            `json:"mirror"`
		Requests uint64            `json:"requests"`
		Exc      map[string]uint64 `json:"exceptions"`
	} `json:"modbus_servers"`
}

// mbpollRead runs mbpoll once: qty holding registers from ref (0-based) of
// unit at addr; it returns the values (signed 16-bit) or mbpoll's output.
func mbpollRead(t *testing.T, mbpoll, addr string, unit, ref, qty int) ([]int, string) {
	t.Helper()
	host, port, _ := strings.Cut(addr, ":")
	out, _ := exec.Command(mbpoll, "-m", "tcp", "-p", port, "-a", strconv.Itoa(unit), "-0", "-r", strconv.Itoa(ref),
		"-c", strconv.Itoa(qty), "-t", "4", "-1", "-o", "2", host).CombinedOutput()
	var vals []int
	for _, m := range regexp.MustCompile(`(?m)^\[(\d+)\]:\s+(-?\d+)`).FindAllStringSubmatch(string(out), -1) {
		v, _ := strconv.Atoi(m[2])
		vals = append(vals, int(int16(uint16(v)))) // mbpoll may print a register unsigned
	}
	return vals, string(out)
}

// The mirror: mbpoll reads 48 loggers × 2 tags as 96 registers from one
// unit in one request, and they equal /api/shortPolling's values (×10),
// read while no poll came in between. A logger that is down fails the
// read with 0x04 where the config says so, and reads -32768 with its
// quality registers saying "timeout" where it says on_bad = "value".
// check prints the map.
func TestModbusMirrorServesTheFleet(t *testing.T) {
	mbpoll := testenv.Need(t, "mbpoll")
	fleet := runFleet(t, sim.Config{Devices: 48, Transport: "udp"})
	addrs := make([]string, fleet.Len())
	for i := range addrs {
		addrs[i] = fleet.Addr(i)
	}
	gw, page := runFleetGateway(t, bin, mirrorHead, addrs, time.Second, 200*time.Millisecond)
	defer gw.Stop(os.Interrupt, 10*time.Second)

	var st mbStatus
	if err := getJSON(t, page+"api/status", &st); err != nil || len(st.Modbus) != 2 {
		t.Fatalf("/api/status: %v %+v", err, st)
	}
	strict, lenient := st.Modbus[0].Listen, st.Modbus[1].Listen

	good := func(sp *mirrorPoll) bool {
		n := 0
		for _, tg := range sp.Tags {
			if tg.Quality == "good" {
				n++
			}
		}
		return n == 96
	}
	var sp mirrorPoll
	waitFor(t, 20*time.Second, "all 96 tags good", func() bool { return getJSON(t, page+"api/shortPolling", &sp) == nil && good(&sp) })

	// Values: a read between two polls (the same seq before and after).
	matched, reads := false, uint64(0)
	for try := 0; try < 20 && !matched; try++ {
		var before, after mirrorPoll
		if err := getJSON(t, page+"api/shortPolling", &before); err != nil {
			t.Fatal(err)
		}
		vals, out := mbpollRead(t, mbpoll, strict, 100, 0, 96)
		reads++
		if err := getJSON(t, page+"api/shortPolling", &after); err != nil {
			t.Fatal(err)
		}
		if len(vals) != 96 {
			t.Fatalf("mbpoll read %d registers:\n%s", len(vals), out)
		}
		if before.Seq != after.Seq {
			continue // a poll came in between
		}
		want := map[string]int{}
		for _, tg := range before.Tags {
			want[tg.Device+"/"+tg.Tag] = int(roundHalf(*tg.Value * 10))
		}
		for i := 0; i < 48; i++ {
			for k, tag := range []string{"temperature", "humidity"} {
				key := fmt.Sprintf("logger-%02d/%s", i+1, tag)
				if got := vals[2*i+k]; got != want[key] {
					t.Errorf("register %d (%s) = %d, /api/shortPolling says %d", 2*i+k, key, got, want[key])
				}
			}
		}
		matched = true
		t.Logf("try %d: 96 registers in one mbpoll request equal /api/shortPolling at seq %d (logger-01: %d, %d)", try+1, before.Seq, vals[0], vals[1])
	}
	if !matched {
		t.Fatal("no mbpoll read between two polls in 20 tries")
	}
	before := st.Modbus[0].Mirror
	if err := getJSON(t, page+"api/status", &st); err != nil {
		t.Fatal(err)
	}
	if st.Modbus[0].Mirror-before != reads {
		t.Errorf("mirror requests %d → %d for %d mbpoll reads: want one request per read", before, st.Modbus[0].Mirror, reads)
	}

	// logger-06 goes down: its registers (10, 11) fail or read bad, the rest read on.
	fleet.Logger(5).Stop()
	waitFor(t, 20*time.Second, "logger-06 not good", func() bool {
		if getJSON(t, page+"api/shortPolling", &sp) != nil {
			return false
		}
		for _, tg := range sp.Tags {
			if tg.Device == "logger-06" && tg.Quality == "good" {
				return false
			}
		}
		return true
	})
	if vals, out := mbpollRead(t, mbpoll, strict, 100, 0, 96); len(vals) != 0 || !strings.Contains(strings.ToLower(out), "failure") {
		t.Errorf("strict mirror with logger-06 down: %d values, want the read to fail with 0x04:\n%s", len(vals), out)
	}
	if vals, out := mbpollRead(t, mbpoll, strict, 100, 12, 84); len(vals) != 84 {
		t.Errorf("strict mirror, registers 12..95 (not logger-06's): %d values:\n%s", len(vals), out)
	}
	vals, out := mbpollRead(t, mbpoll, lenient, 101, 0, 96)
	if len(vals) != 96 || vals[10] != -32768 || vals[11] != -32768 || vals[12] == -32768 {
		t.Errorf("lenient mirror with logger-06 down: %v\n%s", vals, out)
	}
	q, out := mbpollRead(t, mbpoll, lenient, 101, 1000, 96)
	if len(q) != 96 || q[10] != 1 || q[11] != 1 || q[0] != 0 || q[95] != 0 {
		t.Errorf("quality registers with logger-06 down: %v (want 1 = timeout at 10, 11; 0 elsewhere)\n%s", q, out)
	}
	if err := getJSON(t, page+"api/status", &st); err != nil || st.Modbus[0].Exc["0x04"] == 0 {
		t.Errorf("/api/status: exception 0x04 not counted: %v %+v", err, st.Modbus[0])
	}

	// check prints the map.
	cfg := filepath.Join(t.TempDir(), "edgegw.toml")
	body := strings.Replace(mirrorHead, "[http]\nlisten = \"127.0.0.1:0\"\n", "", 1) + "[[profile]]\nname = \"th\"\ntags = [ { name = \"temperature\", address = 0, type = \"int16\", scale = 0.1 }, { name = \"humidity\", address = 1, scale = 0.1 } ]\n"
	for i := range addrs {
		body += fmt.Sprintf("[[device]]\nname = \"logger-%02d\"\ntransport = \"udp\"\naddress = \"127.0.0.1:%d\"\nprofile = \"th\"\n", i+1, 5020+i)
	}
	if err := os.WriteFile(cfg, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	chk, err := exec.Command(bin, "check", "-config", cfg).CombinedOutput()
	if err != nil {
		t.Fatalf("check: %v\n%s", err, chk)
	}
	for _, want := range []string{"mirror unit 100 (96 slots", "quality registers at 1000", "95        logger-48  humidity"} {
		if !strings.Contains(string(chk), want) {
			t.Errorf("check output lacks %q:\n%s", want, chk)
		}
	}
}

func roundHalf(v float64) float64 {
	if v < 0 {
		return -roundHalf(-v)
	}
	return float64(int64(v + 0.5))
}

// Pass-through in the gateway binary: mbpoll reads a pymodbus TCP slave's
// registers through unit 5 (device plc), writes one (writes = true), reads
// it back, and the write is in the gateway's log with mbpoll's address.
func TestModbusPassThroughInTheGateway(t *testing.T) {
	mbpoll := testenv.Need(t, "mbpoll")
	port := testenv.PymodbusRegisters(t, []uint16{11, 22, 33, 44})
	cfg := fmt.Sprintf(`[http]
listen = "127.0.0.1:0"
[[modbus_server]]
listen = "127.0.0.1:0"
writes = true
units = { 5 = "plc" }
[[device]]
name = "plc"
transport = "tcp"
address = "127.0.0.1:%d"
interval = "500ms"
tags = [ { name = "a", address = 0 } ]
`, port)
	gw, page := runConfig(t, bin, filepath.Join(t.TempDir(), "edgegw.toml"), cfg)
	defer gw.Stop(os.Interrupt, 10*time.Second)
	var st mbStatus
	if err := getJSON(t, page+"api/status", &st); err != nil || len(st.Modbus) != 1 {
		t.Fatalf("/api/status: %v %+v", err, st)
	}
	addr := st.Modbus[0].Listen
	// Until the scheduler runs (it starts after "edgegw running"), unit 5 answers 0x0A.
	var vals []int
	var out string
	waitFor(t, 20*time.Second, "a read through unit 5", func() bool {
		vals, out = mbpollRead(t, mbpoll, addr, 5, 0, 4)
		return len(vals) == 4
	})
	if fmt.Sprint(vals) != "[11 22 33 44]" {
		t.Fatalf("read through unit 5: %v\n%s", vals, out)
	}
	host, p, _ := strings.Cut(addr, ":")
	wout, err := exec.Command(mbpoll, "-m", "tcp", "-p", p, "-a", "5", "-0", "-r", "2", "-t", "4", "-1", "-o", "2", host, "1234").CombinedOutput()
	if err != nil {
		t.Fatalf("mbpoll write: %v\n%s", err, wout)
	}
	if vals, out := mbpollRead(t, mbpoll, addr, 5, 0, 4); fmt.Sprint(vals) != "[11 22 1234 44]" {
		t.Errorf("read back through unit 5: %v\n%s", vals, out)
	}
	line := gw.WaitLine("pass-through write", 10*time.Second)
	if !strings.Contains(line, "client=\"modbus 127.0.0.1:") || !strings.Contains(line, "device=plc") || !strings.Contains(line, "result=ok") {
		t.Errorf("write log line: %s", line)
	}
	if vals, out := mbpollRead(t, mbpoll, addr, 6, 0, 1); len(vals) != 0 {
		t.Errorf("unit 6 (unmapped) answered: %v\n%s", vals, out)
	}
}
