package conf

import (
	"strings"
	"testing"
	"time"
)

func TestASCIITransports(t *testing.T) {
	cfg, err := Parse("ascii.toml", []byte(`
[[device]]
name = "a1"
transport = "ascii"
address = "/dev/ttyS2"
unit = 3
serial = { baud = 19200, parity = "E" }
tags = [ { name = "v", address = 3 } ]

[[device]]
name = "a2"
transport = "asciiovertcp"
address = "10.0.0.9"
tags = [ { name = "v", address = 3 } ]
`))
	if err != nil {
		t.Fatal(err)
	}
	a1, a2 := cfg.Devices[0], cfg.Devices[1]
	if a1.Transport != TransportASCII || a1.Serial != (Serial{Baud: 19200, DataBits: 8, Parity: "E", StopBits: 1}) ||
		a1.WriteTransport != TransportASCII || a1.Timeout != 500*time.Millisecond {
		t.Errorf("ascii: %+v", a1)
	}
	if a2.Transport != TransportASCIIOverTCP || a2.Address != "10.0.0.9:502" || a2.Serial != (Serial{}) {
		t.Errorf("asciiovertcp: %+v", a2)
	}
	for _, c := range []struct{ file, want string }{
		{`transport = "ascii"` + "\n" + `address = "10.0.0.1"`, `an ascii device needs a serial device path`},
		{`transport = "ascii"` + "\n" + `address = "/dev/ttyS2"` + "\n" + `unit = 0`, `unit 0 is the serial broadcast address`},
		{`transport = "asciiovertcp"` + "\n" + `address = "10.0.0.1"` + "\n" + `serial = { baud = 9600 }`, `serial settings apply only to rtu and ascii devices`},
		{`transport = "ascii2"` + "\n" + `address = "/dev/ttyS2"`, `want tcp, udp, rtu, rtuovertcp, ascii or asciiovertcp`},
	} {
		_, err := Parse("bad.toml", []byte("[[device]]\nname = \"d\"\n"+c.file+"\ntags = [ { name = \"v\", address = 3 } ]\n"))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: %v, want %q", c.file, err, c.want)
		}
	}
	// One serial line, one framing.
	_, err = Parse("mixed.toml", []byte(`
[[device]]
name = "r"
transport = "rtu"
address = "/dev/ttyS2"
tags = [ { name = "v", address = 3 } ]

[[device]]
name = "a"
transport = "ascii"
address = "/dev/ttyS2"
unit = 2
tags = [ { name = "v", address = 3 } ]
`))
	if err == nil || !strings.Contains(err.Error(), "a serial line has one framing") {
		t.Errorf("rtu and ascii on one line: %v", err)
	}
}
