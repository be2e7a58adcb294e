package conf

import (
	"strings"
	"time"
)

// Endpoint is one [[endpoint]] table: settings of a Modbus TCP or
// RTU-over-TCP host:port (or a serial line) shared by every device on it.
// A device whose address has no [[endpoint]] gets the defaults.
type Endpoint struct {
	Address        string        // as the devices give it, normalised (port 502 added)
	MaxConnections int           // connections (each polled by its own bus) for its devices, 1..MaxEndpointConnections
	Pause          time.Duration // silence between two requests on one connection, >= 0
	Line           int           // line of the [[endpoint]] header
}

// Endpoint defaults and bounds.
const (
	DefaultMaxConnections  = 1
	MaxEndpointConnections = 16
)

// endpoints reads every [[endpoint]] and checks it against the devices:
// each names the address of some tcp, rtuovertcp or rtu device, once.
func (d *decoder) endpoints(ts []*table, devices []Device) []Endpoint {
	var out []Endpoint
	first := map[string]int{}
	for _, t := range ts {
		e := Endpoint{Line: t.line(""), MaxConnections: DefaultMaxConnections}
		addr, ok := t.str("address")
		switch {
		case !ok && !t.has("address"):
			t.errf("", "endpoint has no address")
		case !ok:
		case strings.HasPrefix(addr, "/"):
			e.Address = addr
		default:
			a, err := netAddress(addr)
			if err != nil {
				t.errf("address", "endpoint address %q: %v", addr, err)
			} else {
				e.Address = a
			}
		}
		e.MaxConnections = int(t.intIn("max_connections", DefaultMaxConnections, 1, MaxEndpointConnections))
		e.Pause = t.positive("pause", 0, true)
		if e.Address != "" {
			if l, dup := first[e.Address]; dup {
				t.errf("address", "endpoint %s given twice (first at line %d)", e.Address, l)
			}
			first[e.Address] = e.Line
			var used, serial bool
			for _, dev := range devices {
				if dev.Address != e.Address {
					continue
				}
				switch dev.Transport {
				case TransportTCP, TransportRTUOverTCP, TransportASCIIOverTCP:
					used = true
				case TransportRTU, TransportASCII:
					used, serial = true, true
				}
			}
			switch {
			case !used:
				t.errf("address", "endpoint %s: no tcp, rtuovertcp, asciiovertcp, rtu or ascii device has this address", e.Address)
			case serial && e.MaxConnections > 1:
				t.errf("max_connections", "endpoint %s is a serial line: max_connections must be 1", e.Address)
			}
		}
		t.done()
		out = append(out, e)
	}
	return out
}

// EndpointOf returns the settings of the endpoint at address: its
// [[endpoint]], or the defaults.
func (c *Config) EndpointOf(address string) Endpoint {
	for _, e := range c.Endpoints {
		if e.Address == address {
			return e
		}
	}
	return Endpoint{Address: address, MaxConnections: DefaultMaxConnections}
}
