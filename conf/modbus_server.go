package conf

import (
	"fmt"
	"io"
	"net"
	"net/netip"
	"path"
	"sort"
	"strconv"
	"time"
)

// ModbusServer is one [[modbus_server]]: a Modbus TCP server on the
// gateway that passes requests through to its buses and mirrors its latest
// values (package mbserver). Off unless the section is there. Keys and
// defaults: defaults.go.
type ModbusServer struct {
	Listen          string
	AllowedNetworks []netip.Prefix // empty = every client
	MaxConnections  int
	MaxInFlight     int // pass-through requests in flight per client address
	IdleTimeout     time.Duration
	Writes          bool
	Units           []PassUnit    // sorted by TCP unit id
	Mirror          *ModbusMirror // nil: no [modbus_server.mirror]
}

// PassUnit maps a TCP unit id to a configured device (its bus and its own unit id).
type PassUnit struct {
	Unit   uint8  // the unit id the TCP client asks for
	Device string // the device it reaches
	Via    string // "units" or "endpoints \"<address>\""
}

// ModbusMirror is the virtual unit of [modbus_server.mirror].
type ModbusMirror struct {
	Unit           uint8
	OnBad          string // "exception" (0x04) or "value" (BadValue / NaN)
	BadValue       int
	QualityAddress int // -1: no quality registers
	Slots          []MirrorSlot
}

// MirrorSlot is one tag's value in the mirror's registers.
type MirrorSlot struct {
	Address    uint16
	Device     string
	Tag        string
	Format     string // float32 | int16 | uint16 | raw
	Multiplier float64
	RawWords   int // raw: the tag's registers (Tag.Words)
}

// Words is the number of registers of the slot.
func (s MirrorSlot) Words() int {
	switch s.Format {
	case "float32":
		return 2
	case "raw":
		return s.RawWords
	}
	return 1
}

// Modbus server defaults.
const (
	DefaultModbusMaxConnections = 16
	DefaultModbusMaxInFlight    = 4
	DefaultModbusIdleTimeout    = 60 * time.Second
	DefaultMirrorFormat         = "float32"
)

func (d *decoder) modbusServers(ts []*table, devices []Device) []ModbusServer {
	var out []ModbusServer
	byName := map[string]*Device{}
	for i := range devices {
		byName[devices[i].Name] = &devices[i]
	}
	listens := map[string]bool{}
	for _, t := range ts {
		var ms ModbusServer
		if v, ok := t.str("listen"); !ok {
			t.errf("listen", "modbus_server needs listen (\"0.0.0.0:502\")")
		} else if _, port, err := net.SplitHostPort(v); err != nil {
			t.errf("listen", "listen %q: want host:port", v)
		} else if listens[v] && port != "0" {
			t.errf("listen", "listen %q: two modbus_server sections", v)
		} else {
			listens[v], ms.Listen = true, v
		}
		ms.AllowedNetworks = t.prefixes("allowed_networks")
		ms.MaxConnections = int(t.intIn("max_connections", DefaultModbusMaxConnections, 1, 4096))
		ms.MaxInFlight = int(t.intIn("max_in_flight", DefaultModbusMaxInFlight, 1, 1024))
		ms.IdleTimeout = t.positive("idle_timeout", DefaultModbusIdleTimeout, false)
		ms.Writes = t.boolean("writes", false)
		taken := map[uint8]string{}
		add := func(key string, u uint8, dev *Device, via string) {
			switch {
			case dev.Transport == TransportUDP:
				t.errf(key, "%s: device %q: a udp device is not shared (pass-through serves tcp, rtu and rtuovertcp)", via, dev.Name)
			case taken[u] != "":
				t.errf(key, "%s: unit %d is mapped twice (%s and device %q)", via, u, taken[u], dev.Name)
			default:
				taken[u] = "device " + strconv.Quote(dev.Name)
				ms.Units = append(ms.Units, PassUnit{Unit: u, Device: dev.Name, Via: via})
			}
		}
		if v, ok := t.get("units"); ok {
			m, isMap := v.(map[string]any)
			if !isMap {
				t.wrongType("units", "a table such as { 5 = \"meter-3\" }", v)
			}
			keys := make([]string, 0, len(m))
			for k := range m {
				keys = append(keys, k)
			}
			sort.Strings(keys)
			for _, k := range keys {
				u, err := strconv.Atoi(k)
				name, isStr := m[k].(string)
				switch {
				case err != nil || u < 1 || u > 247:
					t.errf("units", "units: key %q: want a unit id 1..247", k)
				case !isStr:
					t.errf("units", "units.%s: want a device name", k)
				case byName[name] == nil:
					t.errf("units", "units.%s: no device %q", k, name)
				default:
					add("units", uint8(u), byName[name], "units")
				}
			}
		}
		for _, ep := range t.strs("endpoints") {
			n := 0
			for i := range devices {
				dv := &devices[i]
				if dv.Address == ep || dv.Address == ep+":502" {
					n++
					add("endpoints", dv.Unit, dv, "endpoints "+strconv.Quote(ep))
				}
			}
			if n == 0 {
				t.errf("endpoints", "endpoints: no device has address %q", ep)
			}
		}
		sort.Slice(ms.Units, func(i, j int) bool { return ms.Units[i].Unit < ms.Units[j].Unit })
		if t.has("mirror") {
			ms.Mirror = d.mirror(t.sub("mirror"), byName, devices, taken)
		}
		if len(ms.Units) == 0 && ms.Mirror == nil {
			t.errf("", "modbus_server maps no unit: give units, endpoints or [modbus_server.mirror]")
		}
		t.done()
		out = append(out, ms)
	}
	return out
}

func (d *decoder) mirror(t *table, byName map[string]*Device, devices []Device, taken map[uint8]string) *ModbusMirror {
	m := &ModbusMirror{QualityAddress: -1}
	u := t.intIn("unit", 0, 1, 247)
	if !t.has("unit") {
		t.errf("unit", "mirror needs unit (1..247)")
	} else if taken[uint8(u)] != "" {
		t.errf("unit", "mirror: unit %d is also mapped to %s", u, taken[uint8(u)])
	}
	m.Unit = uint8(u)
	format := t.oneOf("format", DefaultMirrorFormat, "float32", "int16", "uint16", "raw")
	mult := 1.0
	if v, ok := t.float("multiplier"); ok {
		if v == 0 {
			t.errf("multiplier", "mirror: multiplier 0")
		} else {
			mult = v
		}
	}
	m.OnBad = t.oneOf("on_bad", "exception", "exception", "value")
	m.BadValue = int(t.intIn("bad_value", -32768, -32768, 65535))
	m.QualityAddress = int(t.intIn("quality_address", -1, -1, 65535))
	next := 0
	for i, e := range t.tables("map") {
		pat, ok := e.str("device")
		if !ok {
			e.errf("", "mirror.map[%d]: needs device (a name or a pattern such as \"logger-*\")", i)
		}
		tags := e.strs("tags")
		if e.has("tag") {
			tg, _ := e.str("tag")
			tags = append(tags, tg)
		}
		if e.has("address") {
			next = int(e.intIn("address", 0, 0, 65535))
		}
		f := e.oneOf("format", format, "float32", "int16", "uint16", "raw")
		ml := mult
		if v, ok := e.float("multiplier"); ok && v != 0 {
			ml = v
		}
		matched := 0
		for _, dv := range devices {
			if ok, _ := path.Match(pat, dv.Name); !ok {
				continue
			}
			matched++
			names := tags
			if len(names) == 0 {
				for _, tg := range dv.Tags {
					if tg.Type != "string" {
						names = append(names, tg.Name)
					}
				}
			}
			for _, tn := range names {
				var tag *Tag
				for k := range dv.Tags {
					if dv.Tags[k].Name == tn {
						tag = &dv.Tags[k]
					}
				}
				switch {
				case tag == nil:
					e.errf("tags", "mirror.map[%d]: device %q has no tag %q", i, dv.Name, tn)
					continue
				case tag.Type == "string":
					e.errf("tags", "mirror.map[%d]: %s/%s is a string tag", i, dv.Name, tn)
					continue
				case f == "raw" && (tag.Type == "bool" || tag.Words() == 0):
					e.errf("format", "mirror.map[%d]: %s/%s: a %s %s has no registers of its own to mirror raw", i, dv.Name, tn, tag.Register, tag.Type)
					continue
				}
				s := MirrorSlot{Address: uint16(next), Device: dv.Name, Tag: tn, Format: f, Multiplier: ml}
				if f == "raw" {
					s.RawWords = tag.Words()
				}
				if next+s.Words() > 65536 {
					e.errf("", "mirror.map[%d]: the map runs past register 65535", i)
					break
				}
				m.Slots = append(m.Slots, s)
				next += s.Words()
			}
		}
		if _, err := path.Match(pat, ""); err != nil {
			e.errf("device", "mirror.map[%d]: device pattern %q: %v", i, pat, err)
		} else if matched == 0 && ok {
			e.errf("device", "mirror.map[%d]: no device matches %q", i, pat)
		}
		e.done()
	}
	if len(m.Slots) == 0 && !t.has("map") {
		t.errf("map", "mirror needs map = [{ device = \"logger-*\", tags = [...] }]")
	}
	// Overlaps: every register belongs to one slot (or one quality register).
	owner := map[int]string{}
	claim := func(a int, what string) {
		if o, dup := owner[a]; dup {
			t.errf("map", "mirror: register %d is both %s and %s", a, o, what)
		}
		owner[a] = what
	}
	for i, s := range m.Slots {
		for w := 0; w < s.Words(); w++ {
			claim(int(s.Address)+w, s.Device+"/"+s.Tag)
		}
		if m.QualityAddress >= 0 {
			if m.QualityAddress+i > 65535 {
				t.errf("quality_address", "mirror: quality registers run past 65535")
				break
			}
			claim(m.QualityAddress+i, "the quality of "+s.Device+"/"+s.Tag)
		}
	}
	t.done()
	_ = byName
	return m
}

// WriteModbusServers writes the unit map and the mirror's register map of
// every [[modbus_server]] (for `edgegw check`), nothing when there is none.
//
//	modbus_server 0.0.0.0:502: writes off, max_connections 16, max_in_flight 4
//	    UNIT  DEVICE    VIA
//	    5     meter-3   units
//	    mirror unit 100 (on_bad exception, quality registers at 1000)
//	    REGISTER  DEVICE     TAG          FORMAT  MULTIPLIER  QUALITY
//	    0         logger-01  temperature  int16   10          1000
func (c *Config) WriteModbusServers(w io.Writer) {
	for _, ms := range c.ModbusServers {
		wr := "off"
		if ms.Writes {
			wr = "on"
		}
		fmt.Fprintf(w, "\nmodbus_server %s: writes %s, max_connections %d, max_in_flight %d, allowed_networks %s\n",
			ms.Listen, wr, ms.MaxConnections, ms.MaxInFlight, prefixList(ms.AllowedNetworks))
		if len(ms.Units) > 0 {
			head := []string{"UNIT", "DEVICE", "DEVICE_UNIT", "VIA"}
			unit := map[string]uint8{}
			for _, d := range c.Devices {
				unit[d.Name] = d.Unit
			}
			rows := [][]string{head}
			for _, u := range ms.Units {
				rows = append(rows, []string{strconv.Itoa(int(u.Unit)), u.Device, strconv.Itoa(int(unit[u.Device])), u.Via})
			}
			writeRows(w, rows)
		}
		if m := ms.Mirror; m != nil {
			q := "no quality registers"
			if m.QualityAddress >= 0 {
				q = "quality registers at " + strconv.Itoa(m.QualityAddress)
			}
			fmt.Fprintf(w, "    mirror unit %d (%d slots, on_bad %s, %s)\n", m.Unit, len(m.Slots), m.OnBad, q)
			rows := [][]string{{"REGISTER", "DEVICE", "TAG", "FORMAT", "MULTIPLIER", "QUALITY"}}
			for i, s := range m.Slots {
				reg := strconv.Itoa(int(s.Address))
				if s.Words() > 1 {
					reg += ".." + strconv.Itoa(int(s.Address)+s.Words()-1)
				}
				qa := "-"
				if m.QualityAddress >= 0 {
					qa = strconv.Itoa(m.QualityAddress + i)
				}
				mult := "-"
				if s.Format == "int16" || s.Format == "uint16" {
					mult = strconv.FormatFloat(s.Multiplier, 'g', -1, 64)
				}
				rows = append(rows, []string{reg, s.Device, s.Tag, s.Format, mult, qa})
			}
			writeRows(w, rows)
		}
	}
}

func writeRows(w io.Writer, rows [][]string) {
	var wd []int
	for _, r := range rows {
		wd = widths(wd, r)
	}
	for _, r := range rows {
		writeRow(w, "    ", wd, r)
	}
}

func prefixList(ps []netip.Prefix) string {
	if len(ps) == 0 {
		return "any"
	}
	s := ""
	for i, p := range ps {
		if i > 0 {
			s += ","
		}
		s += p.String()
	}
	return s
}
