package edge

import (
	"math"
	"strconv"
	"strings"
	"testing"
	"time"

	"edgegw/edge/modbus"
	"edgegw/internal/testenv"
	"edgegw/ringstore"
)

// The gateway polls an independent Modbus slave (pymodbus) over TCP, UDP
// and RTU and gets the right decoded values.
func TestGatewayPollsPymodbus(t *testing.T) {
	ptyA, ptyB := testenv.PTYPair(t)
	tcpPort, udpPort := testenv.Pymodbus(t, ptyB) // holding a = 1000+a, input a = 2000+a, coil a%3==0, discrete a%2==1
	tags := []Tag{
		{Name: "h10", Register: Holding, Address: 10, Type: Uint16},
		{Name: "h10_u32", Register: Holding, Address: 10, Type: Uint32},
		{Name: "h12_cdab", Register: Holding, Address: 12, Type: Uint32, Order: CDAB},
		{Name: "i5", Register: Input, Address: 5, Type: Int16, Scale: 0.1, Offset: -100},
		{Name: "c3", Register: Coil, Address: 3, Type: Bool},
		{Name: "c4", Register: Coil, Address: 4, Type: Bool},
		{Name: "d5", Register: Discrete, Address: 5, Type: Bool},
	}
	want := map[string]float64{
		"h10": 1010, "h10_u32": 1010<<16 | 1011, "h12_cdab": 1013<<16 | 1012,
		"i5": 2005*0.1 - 100, "c3": 1, "c4": 0, "d5": 1,
	}
	rtu := devCfg("rtu", TransportRTU, ptyA, 200*time.Millisecond, 150*time.Millisecond, tags)
	rtu.Serial = modbus.SerialConfig{Baud: 19200}
	devs := []DeviceConfig{
		devCfg("tcp", TransportTCP, "127.0.0.1:"+strconv.Itoa(tcpPort), 200*time.Millisecond, 150*time.Millisecond, tags),
		devCfg("udp", TransportUDP, "127.0.0.1:"+strconv.Itoa(udpPort), 200*time.Millisecond, 150*time.Millisecond, tags),
		rtu,
	}
	ring := newRing(t, 1000)
	s, err := New(Config{Sink: ring, Devices: devs, UDPListen: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	runSched(t, s)
	waitFor(t, 10*time.Second, "a good poll of each device", func() bool {
		for _, d := range s.devices {
			if d.stats.GoodPolls.Load() == 0 {
				return false
			}
		}
		return true
	})
	for _, d := range devs {
		got := latest(ring, d.Name)
		for name, w := range want {
			if g := got[name]; g.Quality != ringstore.Good || g.Value != w {
				t.Errorf("%s %s: got %v (%v), want %v", d.Name, name, g.Value, g.Quality, w)
			}
		}
	}
}

// Strings, overlapping tags and the number encodings against pymodbus: one
// read for a status word, its bits, a uint32 and its halves, two strings, a
// float32 and a NaN, and the JSON each sample gives.
func TestStringsAndOverlapsAgainstPymodbus(t *testing.T) {
	text := func(s string, swap bool) []uint16 {
		var out []uint16
		for i := 0; i < len(s); i += 2 {
			hi, lo := s[i], s[i+1]
			if swap {
				hi, lo = lo, hi
			}
			out = append(out, uint16(hi)<<8|uint16(lo))
		}
		return out
	}
	f := math.Float32bits(123.456)
	regs := []uint16{0x0005, 0xB2D0, 0x5E00}                      // status; 3000000000
	regs = append(regs, text("SN-4711\x00  \x00\x00", false)...)  // 3..8
	regs = append(regs, text("Hi!!", true)...)                    // 9..10 BADC
	regs = append(regs, uint16(f>>16), uint16(f), 0x7FC0, 0x0000) // 11..12 float32, 13..14 NaN
	regs = append(regs, 0xFF41)                                   // 15: not UTF-8
	port := testenv.PymodbusRegisters(t, regs)
	tags := []Tag{
		{Name: "status", Address: 0, Type: Uint16},
		{Name: "alarm", Address: 0, Type: Bool, Bit: 0},
		{Name: "door", Address: 0, Type: Bool, Bit: 1},
		{Name: "pump", Address: 0, Type: Bool, Bit: 2},
		{Name: "energy", Address: 1, Type: Uint32},
		{Name: "energy_hi", Address: 1, Type: Uint16},
		{Name: "energy_lo", Address: 2, Type: Uint16},
		{Name: "serial", Address: 3, Type: String, Length: 6},
		{Name: "name", Address: 9, Type: String, Length: 2, Order: BADC},
		{Name: "temp", Address: 11, Type: Float32},
		{Name: "broken", Address: 13, Type: Float32},
		{Name: "garbled", Address: 15, Type: String, Length: 1},
		{Name: "counter", Register: Input, Address: 1, Type: Uint32, Order: ABCD},
	}
	want := map[string]string{
		"status": `5,"quality":"good"`, "alarm": `true,"quality":"good"`, "door": `false,"quality":"good"`,
		"pump": `true,"quality":"good"`, "energy": `3000000000,"quality":"good"`, "energy_hi": `45776,"quality":"good"`,
		"energy_lo": `24064,"quality":"good"`, "serial": `"SN-4711","quality":"good"`, "name": `"Hi!!","quality":"good"`,
		"temp": `123.456,"quality":"good"`, "broken": `null,"quality":"error"`, "garbled": "\"\uFFFDA\",\"quality\":\"good\"",
		"counter": `3000000000,"quality":"good"`,
	}
	ring := newRing(t, 1000)
	s, err := New(Config{Sink: ring, Devices: []DeviceConfig{
		devCfg("py", TransportTCP, "127.0.0.1:"+strconv.Itoa(port), 200*time.Millisecond, 150*time.Millisecond, tags)}})
	if err != nil {
		t.Fatal(err)
	}
	if plan := s.Plan()["py"]; len(plan) != 2 || plan[0].Quantity != 16 || len(plan[0].Tags) != 12 {
		t.Fatalf("plan %v: want one holding read of 16 registers for 12 tags and one input read", plan)
	}
	runSched(t, s)
	waitFor(t, 10*time.Second, "two polls answered", func() bool { return s.devices[0].stats.Responses.Load() >= 4 })
	got := latest(ring, "py")
	for name, w := range want {
		g, ok := got[name]
		if !ok {
			t.Errorf("%s: no sample", name)
			continue
		}
		j := string(g.AppendJSON(nil))
		if !strings.Contains(j, `"tag":"`+name+`","value":`+w+`,`) {
			t.Errorf("%s: %s, want value %s", name, j, w)
		}
	}
}
