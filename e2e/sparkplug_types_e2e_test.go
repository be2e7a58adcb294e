package e2e

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"edgegw/internal/testenv"
)

// pymodbusReadBack reads coil 0 and holding registers 0..n-1 of a pymodbus
// slave with pymodbus's own client: {"coil": bool, "hr": [...]}; with more
// arguments (address, then register values) it first writes them.
const pymodbusReadBack = `
import json, sys
from pymodbus.client import ModbusTcpClient
c = ModbusTcpClient("127.0.0.1", port=int(sys.argv[1]))
if not c.connect():
    sys.exit("no connection")
if len(sys.argv) > 3:
    w = c.write_registers(int(sys.argv[3]), [int(x) for x in sys.argv[4:]])
    if w.isError():
        sys.exit("write failed: %s" % w)
co = c.read_coils(0, 1)
hr = c.read_holding_registers(0, int(sys.argv[2]))
if co.isError() or hr.isError():
    sys.exit("read failed: %s %s" % (co, hr))
print(json.dumps({"coil": bool(co.bits[0]), "hr": hr.registers}))
c.close()
`

// Every tag type as a Sparkplug 3.0 datatype, seen by Eclipse Tahu's
// decoder, from a pymodbus slave: the DBIRTH gives each tag its datatype
// and value (a string, the 8-bit halves, a half, every integer width, a
// coil); one DCMD writes a coil, an int16 and a float32 and is refused for
// a value outside a uint16 and for a string tag; pymodbus's own client
// reads the coil and registers back.
func TestSparkplugEveryTagType(t *testing.T) {
	needTahu(t)
	py := testenv.Python(t)
	var regs [28]uint16
	put64 := func(at int, v uint64) {
		for i := 0; i < 4; i++ {
			regs[at+i] = uint16(v >> (48 - 16*i))
		}
	}
	big := int64(-1234567890123)
	put64(0, uint64(big))                                     // 0..3 int64
	copy(regs[4:8], []uint16{0x534e, 0x2d34, 0x3731, 0x3100}) // 4..7 "SN-4711" NUL
	regs[8] = 0xfe41                                          // int8_high -2, uint8_low 65 ('A')
	regs[9] = 0x4d60                                          // float16 21.5
	regs[10] = 42                                             // int16 setpoint
	// 11..12 float32, 0 until written
	regs[13], regs[14] = 'A'<<8|0x7f, 'B'<<8 // "AB", one character a register, high byte
	regs[15], regs[16] = uint16(2000000000>>16), uint16(2000000000&0xffff)
	put64(17, 1<<40)                    // uint64
	regs[21], regs[22] = 0xffff, 0xfffb // int32 -5
	regs[23] = 65535                    // uint16 count
	put64(24, math.Float64bits(2.25))   // float64
	port := testenv.PymodbusRegisters(t, regs[:])
	mosq := testenv.StartMosquitto(t)
	host := startTahuHost(t, mosq.Addr, "")

	dir := t.TempDir()
	cfg := filepath.Join(dir, "edgegw.toml")
	body := fmt.Sprintf(`[gateway]
id = "e2e"
data_dir = %q
[http]
listen = "127.0.0.1:0"
[upstream.mqtt]
broker = "tcp://%s"
mode = "off"
[upstream.sparkplug]
group_id = "plant"
writes = true
[[device]]
name = "py"
transport = "tcp"
address = "127.0.0.1:%d"
interval = "200ms"
tags = [
  { name = "big", address = 0, type = "int64" },
  { name = "serial", address = 4, type = "string", length = 4 },
  { name = "hi", address = 8, type = "int8_high" },
  { name = "lo", address = 8, type = "uint8_low" },
  { name = "half", address = 9, type = "float16" },
  { name = "setpoint", address = 10, type = "int16", writable = true },
  { name = "f", address = 11, type = "float32", writable = true },
  { name = "up", address = 13, type = "string", length = 2, string_register_location = "upper" },
  { name = "u32", address = 15, type = "uint32" },
  { name = "u64", address = 17, type = "uint64" },
  { name = "i32", address = 21, type = "int32" },
  { name = "count", address = 23, type = "uint16", writable = true },
  { name = "d", address = 24, type = "float64" },
  { name = "pump", register = "coil", address = 0, writable = true },
]
`, filepath.Join(dir, "data"), mosq.Addr, port)
	if err := os.WriteFile(cfg, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	if v := checkVerdict(t, cfg); !v.ok {
		t.Fatalf("check refuses every tag type with sparkplug: %s", v)
	}
	runGateway(t, cfg)

	want := map[string]struct{ typ, value string }{
		"big": {"Int64", "-1234567890123"}, "serial": {"String", `"SN-4711"`}, "hi": {"Int8", "-2"}, "lo": {"UInt8", "65"},
		"half": {"Float", "21.5"}, "setpoint": {"Int16", "42"}, "f": {"Float", "0"}, "up": {"String", `"AB"`},
		"u32": {"UInt32", "2000000000"}, "u64": {"UInt64", "1099511627776"}, "i32": {"Int32", "-5"},
		"count": {"UInt16", "65535"}, "d": {"Double", "2.25"}, "pump": {"Boolean", "false"},
	}
	k := host.wait(30*time.Second, "DBIRTH of py with every value", func(m *spMsg) bool {
		if m.typ() != "DBIRTH" || m.device() != "py" {
			return false
		}
		for _, mt := range m.Payload.Metrics {
			if string(mt.Value) == "null" || len(mt.Value) == 0 {
				return false // a birth before the first poll: nulls
			}
		}
		return true
	})
	birth := host.all()[k]
	if len(birth.Payload.Metrics) != len(want) {
		t.Errorf("DBIRTH: %d metrics, want %d", len(birth.Payload.Metrics), len(want))
	}
	for name, w := range want {
		mt := birth.metric(name)
		if mt == nil || mt.Type != w.typ || string(mt.Value) != w.value {
			t.Errorf("DBIRTH %s = %+v, want %s %s", name, mt, w.typ, w.value)
		}
	}
	if t.Failed() {
		t.FailNow()
	}
	pumpAlias := *birth.metric("pump").Alias

	// One DCMD, carried out in order: two refusals, then three writes.
	before := host.count()
	host.send(map[string]any{"op": "publish", "topic": "spBv1.0/plant/DCMD/e2e/py",
		"payload": map[string]any{"timestamp": time.Now().UnixMilli(), "metrics": []any{
			map[string]any{"name": "count", "type": "UInt16", "value": 70000},
			map[string]any{"name": "serial", "type": "String", "value": "forged"},
			map[string]any{"name": "setpoint", "type": "Int16", "value": -7},
			map[string]any{"name": "f", "type": "Float", "value": 2.5},
			map[string]any{"name": "pump", "type": "Boolean", "value": true},
		}}})
	var back struct {
		Coil bool
		HR   []uint16
	}
	script := filepath.Join(dir, "readback.py")
	if err := os.WriteFile(script, []byte(pymodbusReadBack), 0o600); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 20*time.Second, "pymodbus reads the coil set by the DCMD", func() bool {
		out, err := exec.Command(py, script, strconv.Itoa(port), strconv.Itoa(len(regs))).Output()
		if err != nil {
			t.Fatalf("pymodbus read-back: %v", err)
		}
		if err := json.Unmarshal(out, &back); err != nil {
			t.Fatalf("pymodbus read-back %q: %v", out, err)
		}
		return back.Coil
	})
	f := math.Float32bits(2.5)
	if back.HR[10] != uint16(0xfff9) || back.HR[11] != uint16(f>>16) || back.HR[12] != uint16(f) {
		t.Errorf("after the DCMD: setpoint %#04x, f %#04x %#04x; want 0xfff9 (-7), %#04x %#04x (2.5)",
			back.HR[10], back.HR[11], back.HR[12], f>>16, f&0xffff)
	}
	if back.HR[23] != 65535 || back.HR[4] != regs[4] {
		t.Errorf("refused DCMD metrics wrote: count %d, serial %#04x", back.HR[23], back.HR[4])
	}
	// The coil's new state reaches the host as DDATA under the pump's alias.
	hasData := func(alias uint64, value string) func(m *spMsg) bool {
		return func(m *spMsg) bool {
			for _, mt := range m.Payload.Metrics {
				if m.typ() == "DDATA" && mt.Alias != nil && *mt.Alias == alias && string(mt.Value) == value {
					return true
				}
			}
			return false
		}
	}
	host.waitFrom(before, 20*time.Second, "DDATA with pump true", hasData(pumpAlias, "true"))

	// New text and a new byte, written by pymodbus's client: DDATA carries
	// the String and the Int8 (and the UInt8 beside it) under their aliases.
	before = host.count()
	if out, err := exec.Command(py, script, strconv.Itoa(port), "1", "4",
		strconv.Itoa('S'<<8|'N'), strconv.Itoa('-'<<8|'9'), "0", "0", strconv.Itoa(0x8007)).CombinedOutput(); err != nil {
		t.Fatalf("pymodbus write: %v %s", err, out)
	}
	host.waitFrom(before, 20*time.Second, `DDATA with serial "SN-9"`, hasData(*birth.metric("serial").Alias, `"SN-9"`))
	host.waitFrom(before, 20*time.Second, "DDATA with hi -128", hasData(*birth.metric("hi").Alias, "-128"))
	host.waitFrom(before, 20*time.Second, "DDATA with lo 7", hasData(*birth.metric("lo").Alias, "7"))
}
