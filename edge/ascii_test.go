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
// same buses as RTU: the values are pymodbus's (holding a = 1000+a), and
// no reply is dropped as malformed.
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
	waitFor(t, 30*time.Second, "5 answers from each ASCII device", func() bool {
		return s.devices[0].stats.Responses.Load() >= 5 && s.devices[1].stats.Responses.Load() >= 5
	})
	stop()
	// Every answer decodes to pymodbus's value (a poll that ends late is
	// not a wrong value; a loaded machine may make one).
	good := map[string]int{}
	for _, smp := range ring.Since(0, nil).Samples {
		if smp.Quality == ringstore.Good {
			if smp.Value != 1010 {
				t.Errorf("%s: %+v", smp.Device, smp)
			}
			good[smp.Device]++
		}
	}
	for _, d := range s.devices {
		if sn := d.stats.Snapshot(); good[d.cfg.Name] < 5 || sn.Dropped != 0 {
			t.Errorf("%s: %d good samples, %+v", d.cfg.Name, good[d.cfg.Name], sn)
		}
	}
}
