package conf

import (
	"bytes"
	"strings"
	"testing"
)

const mbDevs = `[[device]]
name = "meter-3"
transport = "rtu"
address = "/dev/ttyUSB0"
unit = 3
tags = [ { name = "p", address = 0 }, { name = "s", address = 1, type = "string", length = 2 } ]
[[device]]
name = "meter-7"
transport = "rtu"
address = "/dev/ttyUSB0"
unit = 7
tags = [ { name = "p", address = 0 } ]
[[device]]
name = "plc"
transport = "tcp"
address = "10.0.0.5"
unit = 1
tags = [ { name = "a", address = 0 }, { name = "b", address = 1, type = "float32" } ]
[[device]]
name = "logger-01"
transport = "udp"
address = "10.0.0.9"
tags = [ { name = "t", address = 0 }, { name = "h", address = 1 } ]
[[device]]
name = "logger-02"
transport = "udp"
address = "10.0.0.10"
tags = [ { name = "t", address = 0 }, { name = "h", address = 1 } ]
`

func TestModbusServerSection(t *testing.T) {
	cfg, err := Parse("x.toml", []byte(`[[modbus_server]]
listen = "0.0.0.0:502"
allowed_networks = ["10.0.0.0/8"]
writes = true
units = { 5 = "meter-3" }
endpoints = ["10.0.0.5"]
[modbus_server.mirror]
unit = 100
format = "int16"
multiplier = 10
quality_address = 1000
map = [ { device = "logger-*", tags = ["t", "h"] }, { device = "plc", tag = "b", format = "float32", address = 200 }, { device = "plc", tag = "b", format = "raw" } ]
`+mbDevs))
	if err != nil {
		t.Fatal(err)
	}
	if len(cfg.ModbusServers) != 1 {
		t.Fatalf("%d servers", len(cfg.ModbusServers))
	}
	ms := cfg.ModbusServers[0]
	if !ms.Writes || ms.MaxConnections != DefaultModbusMaxConnections || ms.MaxInFlight != DefaultModbusMaxInFlight || len(ms.AllowedNetworks) != 1 {
		t.Errorf("server: %+v", ms)
	}
	if len(ms.Units) != 2 || ms.Units[0] != (PassUnit{Unit: 1, Device: "plc", Via: `endpoints "10.0.0.5"`}) || ms.Units[1] != (PassUnit{Unit: 5, Device: "meter-3", Via: "units"}) {
		t.Errorf("units: %+v", ms.Units)
	}
	m := ms.Mirror
	want := []MirrorSlot{
		{0, "logger-01", "t", "int16", 10, 0}, {1, "logger-01", "h", "int16", 10, 0},
		{2, "logger-02", "t", "int16", 10, 0}, {3, "logger-02", "h", "int16", 10, 0},
		{200, "plc", "b", "float32", 10, 0}, {202, "plc", "b", "raw", 10, 2},
	}
	if m == nil || m.Unit != 100 || m.QualityAddress != 1000 || m.OnBad != "exception" || len(m.Slots) != len(want) {
		t.Fatalf("mirror: %+v", m)
	}
	for i := range want {
		if m.Slots[i] != want[i] {
			t.Errorf("slot %d: %+v, want %+v", i, m.Slots[i], want[i])
		}
	}
	var b bytes.Buffer
	cfg.WriteModbusServers(&b)
	for _, s := range []string{"modbus_server 0.0.0.0:502: writes on", "5     meter-3  3", "200..201  plc", "202..203  plc", "mirror unit 100 (6 slots"} {
		if !strings.Contains(b.String(), s) {
			t.Errorf("check output lacks %q:\n%s", s, b.String())
		}
	}
}

func TestModbusServerErrors(t *testing.T) {
	for _, c := range []struct{ body, want string }{
		{"[[modbus_server]]\nunits = { 5 = \"meter-3\" }\n", "needs listen"},
		{"[[modbus_server]]\nlisten = \":502\"\n", "maps no unit"},
		{"[[modbus_server]]\nlisten = \":502\"\nunits = { 5 = \"nope\" }\n", `no device "nope"`},
		{"[[modbus_server]]\nlisten = \":502\"\nunits = { 0 = \"meter-3\" }\n", "unit id 1..247"},
		{"[[modbus_server]]\nlisten = \":502\"\nunits = { 5 = \"logger-01\" }\n", "udp device is not shared"},
		{"[[modbus_server]]\nlisten = \":502\"\nunits = { 3 = \"meter-7\" }\nendpoints = [\"/dev/ttyUSB0\"]\n", "unit 3 is mapped twice"},
		{"[[modbus_server]]\nlisten = \":502\"\nendpoints = [\"/dev/nope\"]\n", `no device has address "/dev/nope"`},
		{"[[modbus_server]]\nlisten = \":502\"\nunits = { 5 = \"meter-3\" }\n[modbus_server.mirror]\nunit = 5\nmap = [ { device = \"plc\" } ]\n", "unit 5 is also mapped"},
		{"[[modbus_server]]\nlisten = \":502\"\n[modbus_server.mirror]\nunit = 9\nmap = [ { device = \"x-*\" } ]\n", `no device matches "x-*"`},
		{"[[modbus_server]]\nlisten = \":502\"\n[modbus_server.mirror]\nunit = 9\nmap = [ { device = \"meter-3\", tags = [\"s\"] } ]\n", "is a string tag"},
		{"[[modbus_server]]\nlisten = \":502\"\n[modbus_server.mirror]\nunit = 9\nmap = [ { device = \"plc\" }, { device = \"plc\", tag = \"a\", address = 1 } ]\n", "register 2 is both plc/b and plc/a"},
		{"[[modbus_server]]\nlisten = \":502\"\n[modbus_server.mirror]\nunit = 9\nquality_address = 1\nmap = [ { device = \"plc\" } ]\n", "register 1 is both plc/a and the quality of plc/a"},
		{"[[modbus_server]]\nlisten = \":502\"\n[modbus_server.mirror]\nunit = 9\nformat = \"int8\"\nmap = [ { device = \"plc\" } ]\n", `format "int8"`},
		{"[[modbus_server]]\nlisten = \":502\"\nwrite = true\nunits = { 5 = \"meter-3\" }\n", `unknown key "write" (did you mean "writes"?)`},
	} {
		_, err := Parse("x.toml", []byte(c.body+mbDevs))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: %v, want %q", c.body, err, c.want)
		}
	}
}
