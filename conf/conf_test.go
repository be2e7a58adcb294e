package conf

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const examplePath = "../build/edgegw.example.toml"

func TestExampleFile(t *testing.T) {
	cfg, err := Load(examplePath)
	if err != nil {
		t.Fatalf("example does not load:\n%v", err)
	}
	if len(cfg.Devices) < 49 {
		t.Fatalf("devices = %d, want >= 49", len(cfg.Devices))
	}
	if cfg.File != examplePath || cfg.Gateway.ID != "gw-01" {
		t.Errorf("file %q id %q", cfg.File, cfg.Gateway.ID)
	}
	for i := 0; i < 48; i++ {
		d := cfg.Devices[i]
		wantAddr := "192.168.1." + strconv.Itoa(101+i) + ":502"
		if d.Transport != TransportUDP || d.Address != wantAddr || d.Unit != 1 || d.Profile != "th-logger" ||
			d.Interval != time.Second || d.Timeout != 200*time.Millisecond || d.Retries != 1 ||
			d.WriteTransport != TransportTCP || d.MaxGap != 8 || d.MaxRegisters != 125 || len(d.Tags) != 2 {
			t.Fatalf("device %d: %+v", i, d)
		}
		if d.Serial != (Serial{}) {
			t.Errorf("udp device has serial settings %+v", d.Serial)
		}
	}
	temp := cfg.Devices[47].Tags[0]
	if temp.Name != "temperature" || temp.Register != RegisterHolding || temp.Address != 0 || temp.Type != "int16" ||
		temp.Scale != 0.1 || temp.Unit != "°C" || temp.Order != "ABCD" || temp.Bit != -1 || temp.Profile != "th-logger" || temp.Words() != 1 {
		t.Errorf("temperature = %+v", temp)
	}
	hum := cfg.Devices[0].Tags[1]
	if hum.Name != "humidity" || hum.Address != 1 || hum.Type != "uint16" || hum.Scale != 0.1 || hum.Unit != "%RH" {
		t.Errorf("humidity = %+v", hum)
	}
	plc := cfg.Devices[48]
	if plc.Name != "boiler-plc" || plc.Transport != TransportTCP || plc.Address != "192.168.1.20:502" ||
		plc.Timeout != 500*time.Millisecond || plc.WriteTransport != TransportTCP || len(plc.Tags) != 3 {
		t.Fatalf("plc = %+v", plc)
	}
	sp := plc.Tags[0]
	if sp.Name != "setpoint" || sp.Type != "float32" || sp.Order != "CDAB" || !sp.Writable ||
		sp.Min == nil || *sp.Min != 5 || sp.Max == nil || *sp.Max != 90 || sp.Words() != 2 || sp.Scale != 1 {
		t.Errorf("setpoint = %+v", sp)
	}
	if b := plc.Tags[2]; b.Type != "bool" || b.Bit != 3 || b.Words() != 1 || b.Address != 20 {
		t.Errorf("burner_on = %+v", b)
	}
	// Lines point at the headers.
	lines := strings.Split(readFile(t, examplePath), "\n")
	if l := cfg.Devices[48].Line; l < 1 || strings.TrimSpace(lines[l-1]) != "[[device]]" || !strings.Contains(lines[l], "boiler-plc") {
		t.Errorf("plc line %d: %q", l, lines[l-1])
	}
	if l := sp.Line; l < 1 || !strings.HasPrefix(lines[l-1], "[[device.tags]]") || !strings.Contains(lines[l], "setpoint") {
		t.Errorf("setpoint line %d", l)
	}
	if l := temp.Line; l < 1 || !strings.Contains(lines[l-1], `name = "temperature"`) {
		t.Errorf("temperature line %d", l)
	}
	ws, mq := cfg.Upstream.WebSocket, cfg.Upstream.MQTT
	if ws.URL != "wss://collector.example/ingest" || ws.FallbackAfter != 10*time.Second || ws.BatchMax != 500 || ws.BatchWait != 200*time.Millisecond {
		t.Errorf("websocket = %+v", ws)
	}
	if len(ws.URLs) != 1 || ws.URLs[0] != ws.URL || ws.PrimaryRetry != 5*time.Minute || !ws.Compression {
		t.Errorf("websocket urls = %+v", ws)
	}
	if len(mq.Brokers) != 1 || mq.Brokers[0] != mq.Broker {
		t.Errorf("mqtt brokers = %+v", mq)
	}
	if mq.Mode != MQTTFallback || mq.QoS != 1 || mq.TopicPrefix != "edgegw/gw-01" || mq.ClientID != "edgegw-gw-01" || !mq.PerTagTopics || mq.WriteCommands {
		t.Errorf("mqtt = %+v", mq)
	}
	if cfg.Buffer != (Buffer{MaxBytes: 64 << 20, Fsync: FsyncBatched, FsyncInterval: time.Second}) {
		t.Errorf("buffer = %+v", cfg.Buffer)
	}
	if cfg.HTTP.Listen != "0.0.0.0:8080" || cfg.HTTP.MaxRequestBytes != 64<<10 || cfg.HTTP.LongPollTimeout != 30*time.Second {
		t.Errorf("http = %+v", cfg.HTTP)
	}
}

// The commented-out RTU example must be valid once uncommented.
func TestExampleRTUBlock(t *testing.T) {
	text := readFile(t, examplePath)
	var out []string
	for _, l := range strings.Split(text, "\n") {
		if strings.HasPrefix(l, "# [[device]]") || strings.HasPrefix(l, "# name = \"meter") ||
			strings.HasPrefix(l, "# transport = \"rtu\"") || strings.HasPrefix(l, "# address = \"/dev") ||
			strings.HasPrefix(l, "# unit = ") || strings.HasPrefix(l, "# timeout = ") || strings.HasPrefix(l, "# interval = ") ||
			strings.HasPrefix(l, "# serial = ") || strings.HasPrefix(l, "# tags = ") {
			l = strings.TrimPrefix(l, "# ")
		}
		out = append(out, l)
	}
	cfg, err := Parse("rtu.toml", []byte(strings.Join(out, "\n")))
	if err != nil {
		t.Fatal(err)
	}
	var rtu []Device
	for _, d := range cfg.Devices {
		if d.Transport == TransportRTU {
			rtu = append(rtu, d)
		}
	}
	if len(rtu) != 2 {
		t.Fatalf("rtu devices = %d", len(rtu))
	}
	want := Serial{Baud: 19200, DataBits: 8, Parity: "E", StopBits: 1}
	for _, d := range rtu {
		if d.Serial != want || d.Address != "/dev/ttyS1" || d.WriteTransport != TransportRTU || d.Interval != 2*time.Second || d.Timeout != time.Second {
			t.Errorf("%s: %+v", d.Name, d)
		}
	}
}

// The smallest valid file resolves every default.
func TestDefaults(t *testing.T) {
	cfg, err := Parse("min.toml", []byte(`
[[device]]
name = "d1"
transport = "tcp"
address = "10.0.0.1"
tags = [ { name = "v", address = 3 } ]

[[device]]
name = "d2"
transport = "rtu"
address = "/dev/ttyUSB0"
tags = [ { name = "c", register = "coil", address = 0 } ]
`))
	if err != nil {
		t.Fatal(err)
	}
	host := hostID()
	want := &Config{
		File:    "min.toml",
		Gateway: Gateway{ID: host},
		HTTP: HTTP{Listen: DefaultHTTPListen, LongPollTimeout: 30 * time.Second, MaxClients: 5000, MaxRequestBytes: 64 << 10,
			ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 120 * time.Second,
			HealthzUpstreamMaxDown: 10 * time.Minute},
		Ring: Ring{Size: 0, MaxBytes: DefaultRingMax}, // main sizes it from the poll rate, within 8 MiB
		Poll: Poll{TCPMode: "parallel", MaxGap: 8, MaxRegisters: 125, MaxBits: 2000, UDPListen: ":0", UDPBufferBytes: 4 << 20},
		Devices: []Device{
			{Name: "d1", Transport: "tcp", Address: "10.0.0.1:502", Unit: 1, Interval: time.Second, Timeout: 500 * time.Millisecond, TimeoutDerived: true,
				Retries: 1, MaxGap: 8, MaxRegisters: 125, WriteTransport: "tcp", Line: 2,
				Tags: []Tag{{Name: "v", Register: "holding", Address: 3, Type: "uint16", Order: "ABCD", Bit: -1, Scale: 1, Line: 6}}},
			{Name: "d2", Transport: "rtu", Address: "/dev/ttyUSB0", Unit: 1, Interval: time.Second, Timeout: 500 * time.Millisecond, TimeoutDerived: true,
				Retries: 1, MaxGap: 8, MaxRegisters: 125, WriteTransport: "rtu", Line: 8,
				Serial: Serial{Baud: 9600, DataBits: 8, Parity: "N", StopBits: 1},
				Tags:   []Tag{{Name: "c", Register: "coil", Address: 0, Type: "bool", Order: "ABCD", Bit: -1, Scale: 1, Line: 12}}},
		},
		Upstream: Upstream{
			WebSocket: WebSocket{FallbackAfter: 10 * time.Second, BatchMax: 500, BatchWait: 200 * time.Millisecond, PrimaryRetry: 5 * time.Minute, Compression: true},
			MQTT:      MQTT{TopicPrefix: "edgegw/" + host, Mode: MQTTOff, QoS: 1, ClientID: "edgegw-" + host, PerTagTopics: true},
			TSUnit:    "us",
		},
		Buffer:  Buffer{MaxBytes: 64 << 20, Fsync: "batched", FsyncInterval: time.Second},
		History: History{RawWindow: 10 * time.Minute, FineKeep: 6 * time.Hour, Keep: 7 * 24 * time.Hour, MaxRAM: 4 << 20},
	}
	if !reflect.DeepEqual(cfg, want) {
		t.Errorf("got  %+v\nwant %+v", cfg, want)
	}
	if cfg.Devices[1].Tags[0].Words() != 0 || cfg.Devices[1].Tags[0].Span() != 1 {
		t.Errorf("coil words/span")
	}
}

// [http] trusted_proxies, allowed_networks and [http.limits]: what the file
// says, CIDRs masked and unmapped, bare addresses as single hosts, -1 kept
// (no limit), absent keys 0 (the server's default).
func TestHTTPLimits(t *testing.T) {
	cfg, err := Parse("l.toml", []byte(`
[http]
trusted_proxies = ["10.1.2.3/8", "192.0.2.7", "::ffff:172.16.0.0/108"]
allowed_networks = ["2001:db8::/32", "127.0.0.1"]
[http.limits]
poll_rate = 2500
poll_burst = 5000
read_rate = 0.5
connect_rate = -1
auth_burst = 2
connections_per_client = -1
`))
	if err != nil {
		t.Fatal(err)
	}
	pf := netip.MustParsePrefix
	h := cfg.HTTP
	if want := []netip.Prefix{pf("10.0.0.0/8"), pf("192.0.2.7/32"), pf("172.16.0.0/12")}; !reflect.DeepEqual(h.TrustedProxies, want) {
		t.Errorf("trusted_proxies %v, want %v", h.TrustedProxies, want)
	}
	if want := []netip.Prefix{pf("2001:db8::/32"), pf("127.0.0.1/32")}; !reflect.DeepEqual(h.AllowedNetworks, want) {
		t.Errorf("allowed_networks %v, want %v", h.AllowedNetworks, want)
	}
	want := Limits{PollRate: 2500, PollBurst: 5000, ReadRate: 0.5, ConnectRate: -1, AuthBurst: 2, ConnectionsPerClient: -1}
	if h.Limits != want {
		t.Errorf("limits %+v, want %+v", h.Limits, want)
	}
}

// Present keys mean what they say, even when zero or false.
func TestExplicitZeroes(t *testing.T) {
	cfg, err := Parse("z.toml", []byte(`
[upstream.mqtt]
broker = "tcp://127.0.0.1:1883"
qos = 0
per_tag_topics = false
[poll]
max_gap = 0
[[device]]
name = "d"
transport = "udp"
address = "[::1]"
unit = 0
retries = 0
write_transport = "udp"
[[device.tags]]
name = "t"
address = 0
offset = 0
`))
	if err != nil {
		t.Fatal(err)
	}
	d := cfg.Devices[0]
	if cfg.Upstream.MQTT.QoS != 0 || cfg.Upstream.MQTT.PerTagTopics || cfg.Upstream.MQTT.Mode != MQTTFallback ||
		d.Unit != 0 || d.Retries != 0 || d.MaxGap != 0 || d.WriteTransport != "udp" || d.Address != "[::1]:502" {
		t.Errorf("%+v %+v", cfg.Upstream.MQTT, d)
	}
}

// A device without timeout gets interval/(retries+1), at most the
// transport's default; an explicit one is kept (and must fit the interval).
func TestDerivedTimeout(t *testing.T) {
	cases := []struct {
		transport, extra string
		want             time.Duration
		derived          bool
	}{
		{"tcp", `interval = "100ms"`, 50 * time.Millisecond, true},
		{"tcp", `interval = "100ms"` + "\nretries = 0", 100 * time.Millisecond, true},
		{"udp", `interval = "100ms"` + "\nretries = 3", 25 * time.Millisecond, true},
		{"tcp", `interval = "10s"`, 500 * time.Millisecond, true},
		{"udp", `interval = "10s"`, 200 * time.Millisecond, true},
		{"rtu", `interval = "10s"`, time.Second, true},
		{"rtu", `interval = "1s"`, 500 * time.Millisecond, true},
		{"tcp", `interval = "100ms"` + "\ntimeout = \"80ms\"", 80 * time.Millisecond, false},
		{"tcp", `interval = "10s"` + "\ntimeout = \"3s\"", 3 * time.Second, false},
	}
	for _, c := range cases {
		addr := "10.0.0.1"
		if c.transport == "rtu" {
			addr = "/dev/ttyS1"
		}
		text := "[[device]]\nname = \"d\"\ntransport = \"" + c.transport + "\"\naddress = \"" + addr + "\"\n" + c.extra + "\ntags = [ { name = \"t\", address = 0 } ]\n"
		cfg, err := Parse("t.toml", []byte(text))
		if err != nil {
			t.Fatalf("%s: %v", text, err)
		}
		if d := cfg.Devices[0]; d.Timeout != c.want || d.TimeoutDerived != c.derived {
			t.Errorf("%s %s: timeout %v derived %v, want %v %v", c.transport, c.extra, d.Timeout, d.TimeoutDerived, c.want, c.derived)
		}
	}
}

// Several tags on the same registers are one config, not an error; strings
// have a length in registers.
func TestOverlappingTagsAndStrings(t *testing.T) {
	cfg, err := Parse("o.toml", []byte(`
[[device]]
name = "d"
transport = "tcp"
address = "10.0.0.1"
tags = [
  { name = "status", address = 0 },
  { name = "alarm", address = 0, type = "bool", bit = 0 },
  { name = "alarm_again", address = 0, type = "bool", bit = 0 },
  { name = "energy", address = 1, type = "uint32" },
  { name = "energy_hi", address = 1 },
  { name = "energy_lo", address = 2 },
  { name = "serial", address = 10, type = "string", length = 8 },
  { name = "name_swapped", address = 10, type = "string", length = 4, order = "BADC" },
  { name = "c1", register = "coil", address = 3 },
  { name = "c1b", register = "coil", address = 3 },
]
`))
	if err != nil {
		t.Fatal(err)
	}
	tags := cfg.Devices[0].Tags
	if len(tags) != 10 {
		t.Fatalf("%d tags", len(tags))
	}
	if s := tags[6]; s.Type != "string" || s.Length != 8 || s.Words() != 8 || s.Span() != 8 || s.Order != "ABCD" {
		t.Errorf("string tag %+v", s)
	}
	if s := tags[7]; s.Length != 4 || s.Order != "BADC" {
		t.Errorf("swapped string tag %+v", s)
	}
	var b bytes.Buffer
	cfg.WriteTable(&b)
	if !strings.Contains(b.String(), "    serial        holding   10..17   string  ABCD   -      -     -\n") {
		t.Errorf("table:\n%s", b.String())
	}
}

func TestLoadMissingFile(t *testing.T) {
	p := filepath.Join(t.TempDir(), "nope.toml")
	_, err := Load(p)
	if !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("err = %v, want fs.ErrNotExist", err)
	}
	if want := "conf: " + p + ": cannot open: no such file or directory"; err.Error() != want {
		t.Errorf("got %q want %q", err, want)
	}
}

func readFile(t testing.TB, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestDefaultsTableInREADME: the README's table of keys and defaults is
// the doc comment of defaults.go, line for line, so the two cannot drift.
func TestDefaultsTableInREADME(t *testing.T) {
	src, err := os.ReadFile("defaults.go")
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for _, l := range strings.Split(string(src), "\n") {
		if strings.HasPrefix(l, "//\tkey ") || len(want) > 0 && strings.HasPrefix(l, "//\t") {
			want = append(want, strings.TrimPrefix(l, "//\t"))
		} else if len(want) > 0 {
			break
		}
	}
	readme, err := os.ReadFile(filepath.Join("..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	r := string(readme)
	i := strings.Index(r, "\n"+want[0]+"\n")
	if len(want) < 10 || i < 0 {
		t.Fatalf("README has no table starting %q (defaults.go: %d lines)", want[0], len(want))
	}
	got := strings.Split(r[i+1:], "\n")[:len(want)]
	for k := range want {
		if got[k] != want[k] {
			t.Fatalf("README table line %d:\n  %q\ndefaults.go says:\n  %q", k+1, got[k], want[k])
		}
	}
	if next := strings.Split(r[i+1:], "\n")[len(want)]; next != "```" {
		t.Errorf("README table goes on after defaults.go's last line: %q", next)
	}
}

// The types beyond the sixteen-bit ones parse, aliases become the type's
// name, and a string tag gets its register location.
func TestNewTagTypes(t *testing.T) {
	cfg, err := Parse("types.toml", []byte(`
[[device]]
name = "d"
transport = "tcp"
address = "10.0.0.1"
tags = [
  { name = "hi", address = 0, type = "int8_high" },
  { name = "lo", address = 0, type = "uint8l" },
  { name = "half", address = 1, type = "float16", order = "BADC", writable = true },
  { name = "sn", address = 2, type = "string", length = 4, string_register_location = "upper" },
  { name = "name", address = 6, type = "string", length = 2 },
]
`))
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]Tag{}
	for _, tag := range cfg.Devices[0].Tags {
		got[tag.Name] = tag
	}
	for name, want := range map[string]string{"hi": "int8_high 1", "lo": "uint8_low 1", "half": "float16 1", "sn": "string 4 upper", "name": "string 2 both"} {
		tag := got[name]
		s := fmt.Sprintf("%s %d", tag.Type, tag.Span())
		if tag.StringLocation != "" {
			s += " " + tag.StringLocation
		}
		if s != want {
			t.Errorf("%s: %q, want %q", name, s, want)
		}
	}
}

// urls and brokers: lists in order, url/broker the first of them; keys of
// the failover and compression.
func TestUpstreamLists(t *testing.T) {
	text := devTags + `[upstream.websocket]
urls = ["wss://a/ingest", "wss://b/ingest"]
primary_retry = "30s"
compression = false
[upstream.mqtt]
brokers = ["tcp://m1:1883", "ssl://m2:8883"]
`
	cfg, err := Parse("l.toml", []byte(text))
	if err != nil {
		t.Fatal(err)
	}
	ws, mq := cfg.Upstream.WebSocket, cfg.Upstream.MQTT
	if len(ws.URLs) != 2 || ws.URLs[1] != "wss://b/ingest" || ws.URL != "wss://a/ingest" || ws.PrimaryRetry != 30*time.Second || ws.Compression {
		t.Errorf("websocket %+v", ws)
	}
	if len(mq.Brokers) != 2 || mq.Brokers[1] != "ssl://m2:8883" || mq.Broker != "tcp://m1:1883" || mq.Mode != MQTTFallback {
		t.Errorf("mqtt %+v", mq)
	}
}
