package edge

import (
	"strconv"
	"testing"
	"time"

	"edgegw/edge/modbus"
	"edgegw/internal/testenv"
	"edgegw/ringstore"
)

// The scheduler polls Modbus ASCII devices, on a serial line (a pty pair,
// pymodbus's ASCII framer on the other end) and over TCP, through the
// same buses as RTU: the values are pymodbus's (holding a = 1000+a).
func TestASCIIDevicesPymodbus(t *testing.T) {
	a, b := testenv.PTYPair(t)
	testenv.PymodbusSerial(t, testenv.SerialSlave{Framer: "ascii", TTY: b, Units: []uint8{3}})
	port := testenv.FreePort(t)
	testenv.PymodbusSerial(t, testenv.SerialSlave{Framer: "ascii", TCP: port, Units: []uint8{4}})
	tags := []Tag{{Name: "r10", Register: Holding, Address: 10, Type: Uint16, Scale: 1}}
	ser := devCfg("ascii-serial", TransportASCII, a, 200*time.Millisecond, time.Second, tags)
	ser.Unit, ser.Serial = 3, modbus.SerialConfig{Baud: 19200}
	tcp := devCfg("ascii-tcp", TransportASCIIOverTCP, "127.0.0.1:"+strconv.Itoa(port), 200*time.Millisecond, time.Second, tags)
	tcp.Unit = 4
	ring := newRing(t, 1000)
	s, err := New(Config{Sink: ring, Devices: []DeviceConfig{ser, tcp}})
	if err != nil {
		t.Fatal(err)
	}
	stop := runSched(t, s)
	defer stop()
	waitFor(t, 30*time.Second, "both ASCII devices polled good 5 times", func() bool {
		return s.devices[0].stats.GoodPolls.Load() >= 5 && s.devices[1].stats.GoodPolls.Load() >= 5
	})
	stop()
	for _, name := range []string{"ascii-serial", "ascii-tcp"} {
		if smp := latest(ring, name)["r10"]; smp.Quality != ringstore.Good || smp.Value != 1010 {
			t.Errorf("%s: %+v", name, smp)
		}
	}
}
