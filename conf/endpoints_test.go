package conf

import (
	"strings"
	"testing"
	"time"
)

const twoUnits = `[[device]]
name = "u1"
transport = "tcp"
address = "10.0.0.5"
unit = 1
tags = [ { name = "t", address = 0 } ]
[[device]]
name = "u2"
transport = "tcp"
address = "10.0.0.5:502"
unit = 2
tags = [ { name = "t", address = 0 } ]
`

func TestEndpoint(t *testing.T) {
	c, err := Parse("e.toml", []byte(twoUnits+"[[endpoint]]\naddress = \"10.0.0.5\"\nmax_connections = 2\npause = \"20ms\"\n"))
	if err != nil {
		t.Fatal(err)
	}
	if e := c.EndpointOf("10.0.0.5:502"); e.MaxConnections != 2 || e.Pause != 20*time.Millisecond || e.Line != 13 {
		t.Errorf("endpoint %+v", e)
	}
	if e := c.EndpointOf("10.0.0.6:502"); e.MaxConnections != 1 || e.Pause != 0 {
		t.Errorf("default endpoint %+v", e)
	}
}

func TestEndpointErrors(t *testing.T) {
	for _, tc := range []struct{ text, want string }{
		{"[[endpoint]]\nmax_connections = 2\n", "endpoint has no address"},
		{"[[endpoint]]\naddress = \"10.0.0.9\"\n", "endpoint 10.0.0.9:502: no tcp, rtuovertcp, asciiovertcp, rtu or ascii device has this address"},
		{"[[endpoint]]\naddress = \"10.0.0.5\"\nmax_connections = 17\n", "max_connections 17 outside 1..16"},
		{"[[endpoint]]\naddress = \"10.0.0.5\"\npause = \"-1s\"\n", "pause -1s: must be >= 0"},
		{"[[endpoint]]\naddress = \"10.0.0.5\"\n[[endpoint]]\naddress = \"10.0.0.5:502\"\n", "endpoint 10.0.0.5:502 given twice (first at line 13)"},
		{"[[endpoint]]\naddress = \"10.0.0.5\"\nmax_conections = 2\n", `unknown key "max_conections"`},
		{"[[device]]\nname = \"m\"\ntransport = \"rtu\"\naddress = \"/dev/ttyS1\"\ntags = [ { name = \"t\", address = 0 } ]\n" +
			"[[endpoint]]\naddress = \"/dev/ttyS1\"\nmax_connections = 2\n", "endpoint /dev/ttyS1 is a serial line: max_connections must be 1"},
	} {
		_, err := Parse("e.toml", []byte(twoUnits+tc.text))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: error %v, want %q", tc.text, err, tc.want)
		}
	}
}
