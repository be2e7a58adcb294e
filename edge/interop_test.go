package edge

import (
	"strconv"
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
