package conf

import (
	"errors"
	"strconv"
	"strings"
	"testing"
)

// Device prelude used by many cases (4 lines).
const dev = `[[device]]
name = "d"
transport = "tcp"
address = "10.0.0.1"
`

const devTags = dev + `tags = [ { name = "t", address = 0 } ]
`

// errorCases: one case per validation. In each text, a comment starting with
// "#!" marks the line of an expected error; "#!!" marks two on that line. The
// expected messages are listed in line order and checked exactly, as
// "conf: e.toml:<marked line>: " + msg.
var errorCases = []struct {
	name string
	text string
	msgs []string
}{
	// TOML itself.
	{"syntax", dev + "unit = 1 2 #!\n", []string{"syntax: "}},
	{"syntax missing value", dev + "unit = #!\n", []string{"syntax: "}},
	{"syntax later line", "[http]\nlisten = \":8080\"\n[[device] #!\n", []string{"syntax: "}},
	{"duplicate key", dev + "name = \"x\" #!\n", []string{"syntax: "}},
	{"unknown top-level key", "foo = 1 #!\n", []string{`unknown key "foo"`}},
	{"unknown section", "\n[edge] #!\nx = 1\n", []string{`unknown key "edge"`}},
	{"unknown http key", "[http]\nlisten = \":8080\"\nlistn = \"x\" #!\n", []string{`unknown key "http.listn"`}},
	{"unknown key with suggestion", "[http]\nlistn = \":8080\" #!\n", []string{`unknown key "http.listn" (did you mean "http.listen"?)`}},
	{"unknown device key with suggestion", dev + "tags = [ { name = \"t\", address = 0 } ]\nintervall = \"1s\" #!\n", []string{`device "d": unknown key "intervall" (did you mean "interval"?)`}},
	{"unknown nested upstream key", "[upstream.websocket]\nurl = \"ws://h/x\"\nuri = \"x\" #!\n", []string{`unknown key "upstream.websocket.uri"`}},
	{"unknown upstream section", "[upstream.kafka] #!\nx = 1\n", []string{`unknown key "upstream.kafka"`}},
	{"unknown device key", devTags + "adress = \"x\" #!\n", []string{`device "d": unknown key "adress"`}},
	{"unknown tag key inline", dev + "tags = [\n  { name = \"t\", address = 0 },\n  { name = \"u\", adress = 1 }, #!!\n]\n",
		[]string{`device "d": tag "u": address is required`, `device "d": tag "u": unknown key "adress" (did you mean "address"?)`}},
	{"unknown tag key in table", dev + "[[device.tags]]\nname = \"t\"\naddress = 0\nsacle = 2 #!\n", []string{`device "d": tag "t": unknown key "sacle" (did you mean "scale"?)`}},
	{"unknown serial key", "[[device]]\nname = \"s\"\ntransport = \"rtu\"\naddress = \"/dev/ttyS1\"\ntags = [ { name = \"t\", address = 0 } ]\n[device.serial]\nbaud = 9600\nparty = \"N\" #!\n",
		[]string{`device "s": unknown key "serial.party" (did you mean "serial.parity"?)`}},
	{"wrong type ring", "[ring]\nsize = \"200\" #!\n", []string{`ring.size: want an integer, got a string ("200")`}},
	{"wrong type unit", devTags + "unit = \"1\" #!\n", []string{`device "d": unit: want an integer, got a string ("1")`}},
	{"wrong type tag address", dev + "tags = [ { name = \"t\", address = \"0\" } ] #!\n", []string{`device "d": tag "t": address: want an integer, got a string ("0")`}},
	{"wrong type bool", devTags + "[upstream.mqtt]\nper_tag_topics = \"yes\" #!\n", []string{`upstream.mqtt.per_tag_topics: want a boolean, got a string ("yes")`}},
	{"wrong type tags", dev + "tags = 5 #!\n", []string{`device "d": tags: want an array of tables, got an integer (5)`}},
	{"wrong type section", "http = 5 #!\n", []string{`http: want a table, got an integer (5)`}},

	// Names and duplicates.
	{"duplicate device", devTags + "[[device]]\nname = \"d\" #!\ntransport = \"tcp\"\naddress = \"10.0.0.2\"\ntags = [ { name = \"t\", address = 0 } ]\n",
		[]string{`device "d": duplicate device name (first at line 1)`}},
	{"duplicate tag", dev + "tags = [\n  { name = \"t\", address = 0 },\n  { name = \"t\", address = 1 }, #!\n]\n",
		[]string{`device "d": tag "t": duplicate tag name (first at line 6)`}},
	{"duplicate profile and own tag", "[[profile]]\nname = \"p\"\ntags = [ { name = \"temp\", address = 0 } ]\n" + dev + "profile = \"p\"\ntags = [ { name = \"temp\", address = 5 } ] #!\n",
		[]string{`device "d": tag "temp": duplicate tag name (first in profile "p" at line 3)`}},
	{"duplicate profile", "[[profile]]\nname = \"p\"\ntags = [ { name = \"a\", address = 0 } ]\n[[profile]]\nname = \"p\" #!\ntags = [ { name = \"a\", address = 0 } ]\n",
		[]string{`profile "p": duplicate profile name (first at line 2)`}},
	{"unknown profile", dev + "profile = \"nope\" #!\n", []string{`device "d": unknown profile "nope"`}},
	{"no tags", "[[device]] #!\nname = \"d\"\ntransport = \"tcp\"\naddress = \"10.0.0.1\"\n", []string{`device "d": device has no tags: give a profile or tags`}},
	{"profile without tags", "[[profile]] #!\nname = \"p\"\n", []string{`profile "p": profile has no tags`}},
	{"device name charset", "[[device]]\nname = \"logger 7\" #!\ntransport = \"tcp\"\naddress = \"h\"\ntags = [ { name = \"t\", address = 0 } ]\n",
		[]string{`device "logger 7": device name "logger 7": ` + nameRule}},
	{"device without name", "[[device]] #!\ntransport = \"tcp\"\naddress = \"h\"\ntags = [ { name = \"t\", address = 0 } ]\n", []string{`device has no name`}},
	{"empty device name", "[[device]]\nname = \"\" #!\ntransport = \"tcp\"\naddress = \"h\"\ntags = [ { name = \"t\", address = 0 } ]\n", []string{`device name "": ` + nameRule}},
	{"tag name charset", dev + "tags = [ { name = \"a/b\", address = 0 } ] #!\n", []string{`device "d": tag "a/b": tag name "a/b": ` + nameRule}},
	{"tag without name", dev + "tags = [ { address = 0 } ] #!\n", []string{`device "d": tag has no name`}},
	{"profile name charset", "[[profile]]\nname = \"th logger\" #!\ntags = [ { name = \"a\", address = 0 } ]\n", []string{`profile "th logger": profile name "th logger": ` + nameRule}},
	{"gateway id charset", "[gateway]\nid = \"gw 1\" #!\n", []string{`gateway.id "gw 1": ` + nameRule}},

	// Device fields.
	{"bad transport", "[[device]]\nname = \"d\"\ntransport = \"tpc\" #!\naddress = \"h\"\ntags = [ { name = \"t\", address = 0 } ]\n", []string{`device "d": transport "tpc": want tcp, udp, rtu, rtuovertcp, ascii or asciiovertcp`}},
	{"missing transport", "[[device]] #!\nname = \"d\"\naddress = \"h\"\ntags = [ { name = \"t\", address = 0 } ]\n", []string{`device "d": transport is required: tcp, udp, rtu, rtuovertcp, ascii or asciiovertcp`}},
	{"missing address", "[[device]] #!\nname = \"d\"\ntransport = \"udp\"\ntags = [ { name = \"t\", address = 0 } ]\n", []string{`device "d": address is required`}},
	{"bad port", "[[device]]\nname = \"d\"\ntransport = \"udp\"\naddress = \"10.0.0.1:70000\" #!\ntags = [ { name = \"t\", address = 0 } ]\n", []string{`device "d": address "10.0.0.1:70000": port "70000": want a number 1..65535`}},
	{"bad host", "[[device]]\nname = \"d\"\ntransport = \"tcp\"\naddress = \"a b:502\" #!\ntags = [ { name = \"t\", address = 0 } ]\n", []string{`device "d": address "a b:502": host "a b" is not an IP address or host name`}},
	{"rtu address not a path", "[[device]]\nname = \"d\"\ntransport = \"rtu\"\naddress = \"10.0.0.1:502\" #!\ntags = [ { name = \"t\", address = 0 } ]\n", []string{`device "d": address "10.0.0.1:502": an rtu device needs a serial device path such as "/dev/ttyS1"`}},
	{"unit > 247", devTags + "unit = 300 #!\n", []string{`device "d": unit 300 outside 0..247`}},
	{"rtu unit 0", "[[device]]\nname = \"d\"\ntransport = \"rtu\"\naddress = \"/dev/ttyS1\"\nunit = 0 #!\ntags = [ { name = \"t\", address = 0 } ]\n", []string{`device "d": unit 0 is the serial broadcast address (no reply): want 1..247`}},
	{"bad duration", devTags + "interval = \"1x\" #!\n", []string{`device "d": interval: bad duration "1x" (write e.g. "200ms", "1s", "1m30s")`}},
	{"duration without unit", devTags + "timeout = \"200\" #!\n", []string{`device "d": timeout: bad duration "200": missing unit (write "200ms" or "200s")`}},
	{"duration as integer", devTags + "timeout = 200 #!\n", []string{`device "d": timeout: bad duration 200: write a string with a unit, e.g. "200ms" or "200s"`}},
	{"interval zero", devTags + "interval = \"0s\" #!\n", []string{`device "d": interval 0s: must be > 0`}},
	{"timeout negative", devTags + "timeout = \"-1s\" #!\n", []string{`device "d": timeout -1s: must be > 0`}},
	{"interval shorter than timeout", devTags + "interval = \"100ms\" #!\ntimeout = \"200ms\"\n", []string{`device "d": interval 100ms is shorter than timeout 200ms`}},
	{"retries negative", devTags + "retries = -1 #!\n", []string{`device "d": retries -1 outside 0..100`}},
	{"device max_registers", devTags + "max_registers = 126 #!\n", []string{`device "d": max_registers 126 outside 1..125`}},
	{"poll max_registers", "[poll]\nmax_registers = 0 #!\n", []string{`poll.max_registers 0 outside 1..125`}},
	{"max_registers below tag words", dev + "max_registers = 2\ntags = [ { name = \"f\", address = 0, type = \"float64\" } ] #!\n", []string{`device "d": tag "f": float64 needs 4 registers but max_registers is 2`}},
	{"write_transport on tcp", devTags + "write_transport = \"udp\" #!\n", []string{`device "d": write_transport applies only to udp devices (a tcp device writes over tcp)`}},
	{"bad write_transport", "[[device]]\nname = \"d\"\ntransport = \"udp\"\naddress = \"h\"\ntags = [ { name = \"t\", address = 0 } ]\nwrite_transport = \"rtu\" #!\n", []string{`device "d": write_transport "rtu": want tcp or udp`}},
	{"same endpoint", devTags + "[[device]]\nname = \"e\"\ntransport = \"tcp\"\naddress = \"10.0.0.1:502\" #!\ntags = [ { name = \"t\", address = 0 } ]\n",
		[]string{`device "e": same tcp address 10.0.0.1:502 and unit 1 as device "d" (line 1)`}},

	// Serial.
	{"bad parity", "[[device]]\nname = \"s\"\ntransport = \"rtu\"\naddress = \"/dev/ttyS1\"\nserial = { parity = \"X\" } #!\ntags = [ { name = \"t\", address = 0 } ]\n", []string{`device "s": serial.parity "X": want N, E or O`}},
	{"serial on tcp", devTags + "serial = { baud = 9600 } #!\n", []string{`device "d": serial settings apply only to rtu and ascii devices`}},
	{"serial conflict", "[[device]]\nname = \"a\"\ntransport = \"rtu\"\naddress = \"/dev/ttyS1\"\ntags = [ { name = \"t\", address = 0 } ]\n" +
		"[[device]]\nname = \"b\"\ntransport = \"rtu\"\naddress = \"/dev/ttyS1\"\nunit = 2\nserial = { baud = 19200, parity = \"E\" } #!\ntags = [ { name = \"t\", address = 0 } ]\n",
		[]string{`device "b": serial settings 19200 8E1 on /dev/ttyS1 differ from device "a" (line 1): 9600 8N1`}},
	{"bad stop bits", "[[device]]\nname = \"s\"\ntransport = \"rtu\"\naddress = \"/dev/ttyS1\"\ntags = [ { name = \"t\", address = 0 } ]\n[device.serial]\nstop_bits = 3 #!\n", []string{`device "s": serial.stop_bits 3 outside 1..2`}},

	// Tags.
	{"bad register", dev + "tags = [ { name = \"t\", register = \"holdin\", address = 0 } ] #!\n", []string{`device "d": tag "t": register "holdin": want holding, input, coil or discrete`}},
	{"bad type", dev + "tags = [ { name = \"t\", address = 0, type = \"float8\" } ] #!\n", []string{`device "d": tag "t": type "float8": want int16, uint16, int32, uint32, float32, int64, uint64, float64, bool, string, int8_high, int8_low, uint8_high, uint8_low or float16`}},
	{"bad order", dev + "tags = [ { name = \"t\", address = 0, type = \"int32\", order = \"ACBD\" } ] #!\n", []string{`device "d": tag "t": order "ACBD": want ABCD, CDAB, BADC or DCBA`}},
	{"coil not bool", dev + "tags = [ { name = \"t\", register = \"coil\", address = 0, type = \"int16\" } ] #!\n", []string{`device "d": tag "t": type int16 on a coil: coil tags are bool`}},
	{"bool needs bit", dev + "tags = [ { name = \"t\", address = 0, type = \"bool\" } ] #!\n", []string{`device "d": tag "t": bool on a holding register needs bit = 0..15`}},
	{"bit without bool", dev + "tags = [ { name = \"t\", address = 0, bit = 3 } ] #!\n", []string{`device "d": tag "t": bit applies only to a bool in a holding or input register`}},
	{"bit on coil", dev + "tags = [ { name = \"t\", register = \"coil\", address = 0, bit = 3 } ] #!\n", []string{`device "d": tag "t": bit applies only to a bool in a holding or input register`}},
	{"bit out of range", dev + "tags = [ { name = \"t\", register = \"input\", address = 0, type = \"bool\", bit = 16 } ] #!\n", []string{`device "d": tag "t": bit 16 outside 0..15`}},
	{"order on 16-bit", dev + "tags = [ { name = \"t\", address = 0, type = \"int16\", order = \"CDAB\" } ] #!\n", []string{`device "d": tag "t": order CDAB on a 16-bit int16: want ABCD or BADC (there is no word to swap)`}},
	{"order on bool", dev + "tags = [ { name = \"t\", address = 0, type = \"bool\", bit = 1, order = \"BADC\" } ] #!\n", []string{`device "d": tag "t": order BADC does not apply to bool (bit counts from the least significant bit)`}},
	{"address > 65535", dev + "tags = [ { name = \"humidity\", address = 70000 } ] #!\n", []string{`device "d": tag "humidity": address 70000 > 65535`}},
	{"address < 0", dev + "tags = [ { name = \"t\", address = -1 } ] #!\n", []string{`device "d": tag "t": address -1 < 0`}},
	{"address + words", dev + "[[device.tags]]\nname = \"t\"\naddress = 65535 #!\ntype = \"float32\"\n", []string{`device "d": tag "t": address 65535 + 2 registers of float32 - 1 > 65535`}},
	{"missing address", dev + "tags = [ { name = \"t\" } ] #!\n", []string{`device "d": tag "t": address is required`}},
	{"string without length", dev + "tags = [ { name = \"sn\", address = 0, type = \"string\" } ] #!\n", []string{`device "d": tag "sn": string needs length = 1..125 (registers, two characters each)`}},
	{"length on a number", dev + "tags = [ { name = \"t\", address = 0, length = 4 } ] #!\n", []string{`device "d": tag "t": length applies only to a string tag`}},
	{"string length range", dev + "tags = [ { name = \"sn\", address = 0, type = \"string\", length = 126 } ] #!\n", []string{`device "d": tag "sn": length 126 outside 1..125`}},
	{"string order", dev + "tags = [ { name = \"sn\", address = 0, type = \"string\", length = 4, order = \"CDAB\" } ] #!\n", []string{`device "d": tag "sn": order CDAB on a string: want ABCD (high byte first) or BADC (bytes swapped in each register)`}},
	{"string scale and writable", dev + "tags = [ { name = \"sn\", address = 0, type = \"string\", length = 4, scale = 2, writable = true } ] #!!\n",
		[]string{`device "d": tag "sn": scale does not apply to a string tag`, `device "d": tag "sn": writable does not apply to a string tag`}},
	{"string on a coil", dev + "tags = [ { name = \"sn\", register = \"coil\", address = 0, type = \"string\", length = 2 } ] #!\n", []string{`device "d": tag "sn": type string on a coil: coil tags are bool`}},
	{"string beyond 65535", dev + "tags = [ { name = \"sn\", address = 65530, type = \"string\", length = 8 } ] #!\n", []string{`device "d": tag "sn": address 65530 + 8 registers of string - 1 > 65535`}},
	{"string_register_location on a number", dev + "tags = [ { name = \"t\", address = 0, string_register_location = \"lower\" } ] #!\n", []string{`device "d": tag "t": string_register_location applies only to a string tag`}},
	{"bad string_register_location", dev + "tags = [ { name = \"sn\", address = 0, type = \"string\", length = 2, string_register_location = \"middle\" } ] #!\n", []string{`device "d": tag "sn": string_register_location "middle": want both, lower or upper`}},
	{"string lower swapped", dev + "tags = [ { name = \"sn\", address = 0, type = \"string\", length = 2, string_register_location = \"lower\", order = \"BADC\" } ] #!\n", []string{`device "d": tag "sn": order BADC on a string of one character a register (lower): want ABCD`}},
	{"order on an 8-bit type", dev + "tags = [ { name = \"t\", address = 0, type = \"int8_high\", order = \"BADC\" } ] #!\n", []string{`device "d": tag "t": order BADC on int8_high: want ABCD (the byte is named from the register's value as read)`}},
	{"writable 8-bit", dev + "tags = [ { name = \"t\", address = 0, type = \"uint8l\", writable = true } ] #!\n", []string{`device "d": tag "t": writable: a uint8_low cannot be written (the write would overwrite the other byte of the register)`}},
	{"float16 on a coil", dev + "tags = [ { name = \"t\", register = \"coil\", address = 0, type = \"float16\" } ] #!\n", []string{`device "d": tag "t": type float16 on a coil: coil tags are bool`}},
	{"scale zero", dev + "tags = [ { name = \"t\", address = 0, scale = 0 } ] #!\n", []string{`device "d": tag "t": scale = 0 would make every value 0`}},
	{"scale on bool", dev + "tags = [ { name = \"t\", register = \"coil\", address = 0, scale = 2 } ] #!\n", []string{`device "d": tag "t": scale does not apply to bool`}},
	{"negative deadband", dev + "tags = [ { name = \"t\", address = 0, deadband = -0.5 } ] #!\n", []string{`device "d": tag "t": deadband -0.5 < 0`}},
	{"negative deadband_percent", dev + "tags = [ { name = \"t\", address = 0, deadband_percent = -1 } ] #!\n", []string{`device "d": tag "t": deadband_percent -1 < 0`}},
	{"deadband_percent on bool", dev + "tags = [ { name = \"t\", register = \"coil\", address = 0, deadband_percent = 1 } ] #!\n", []string{`device "d": tag "t": deadband_percent does not apply to bool`}},
	{"max_silence without a deadband", dev + "tags = [ { name = \"t\", address = 0, max_silence = \"5s\" } ] #!\n",
		[]string{`device "d": tag "t": max_silence applies with a deadband or deadband_percent (without one every poll is kept)`}},
	{"negative max_silence", dev + "tags = [ { name = \"t\", address = 0, deadband = 1, max_silence = \"-5s\" } ] #!\n", []string{`device "d": tag "t": max_silence -5s: must be >= 0`}},
	{"max_silence on a string", dev + "tags = [ { name = \"t\", address = 0, type = \"string\", length = 2, max_silence = \"5s\" } ] #!\n", []string{`device "d": tag "t": max_silence does not apply to a string tag`}},
	{"tag interval zero", dev + "tags = [ { name = \"t\", address = 0, interval = \"0s\" } ] #!\n", []string{`device "d": tag "t": interval 0s: must be > 0`}},
	{"tag interval not a multiple", dev + "interval = \"1s\"\ntags = [ { name = \"t\", address = 0 },\n { name = \"u\", address = 1, interval = \"1500ms\" } ] #!\n",
		[]string{`device "d": tag "u": interval 1.5s is not a multiple of the device's interval 1s`}},
	{"tag interval faster than the device", dev + "interval = \"1s\"\ntags = [ { name = \"t\", address = 0 },\n { name = \"u\", address = 1, interval = \"500ms\" } ] #!\n",
		[]string{`device "d": tag "u": interval 500ms is not a multiple of the device's interval 1s`}},
	{"no tag at the device interval", dev + "interval = \"1s\" #!\ntags = [ { name = \"t\", address = 0, interval = \"10s\" } ]\n",
		[]string{`device "d": no tag is polled at the device's interval 1s: set it to the fastest tag's`}},
	{"profile tag interval against the device", "[[profile]]\nname = \"p\"\ntags = [ { name = \"e\", address = 0, interval = \"90s\" }, { name = \"f\", address = 1 } ] #!\n" + dev + "profile = \"p\"\ninterval = \"1m\"\n",
		[]string{`device "d": tag "e": interval 1m30s is not a multiple of the device's interval 1m0s`}},
	{"min > max", dev + "tags = [ { name = \"t\", address = 0, writable = true, min = 10, max = 5.5 } ] #!\n", []string{`device "d": tag "t": min 10 > max 5.5`}},
	{"writable input", dev + "tags = [ { name = \"t\", register = \"input\", address = 0, writable = true } ] #!\n", []string{`device "d": tag "t": writable: input registers are read-only`}},
	{"writable discrete", dev + "tags = [ { name = \"t\", register = \"discrete\", address = 0, writable = true } ] #!\n", []string{`device "d": tag "t": writable: discrete registers are read-only`}},
	{"tag not a table", dev + "tags = [ 5 ] #!\n", []string{`device "d": tags[0]: want a table, got an integer (5)`}},
	{"profile tag error", "[[profile]]\nname = \"p\"\n[[profile.tags]]\nname = \"t\"\naddress = 0\ntype = \"int8\" #!\n", []string{`profile "p": tag "t": type "int8": want int16, uint16, int32, uint32, float32, int64, uint64, float64, bool, string, int8_high, int8_low, uint8_high, uint8_low or float16`}},

	// Sections.
	{"bad ts_unit", "[upstream]\nts_unit = \"s\" #!\n", []string{`upstream.ts_unit "s": want us or ms`}},
	{"bad mqtt mode", "[upstream.mqtt]\nbroker = \"tcp://127.0.0.1:1883\"\nmode = \"sometimes\" #!\n", []string{`upstream.mqtt.mode "sometimes": want fallback, always or off`}},
	{"mqtt mode without broker", "[upstream.mqtt]\nmode = \"always\" #!\n", []string{`upstream.mqtt.mode "always" needs a broker`}},
	{"qos 3", "[upstream.mqtt]\nbroker = \"tcp://127.0.0.1:1883\"\nqos = 3 #!\n", []string{`upstream.mqtt.qos 3 outside 0..2`}},
	{"bad broker", "[upstream.mqtt]\nbroker = \"http://h:1883\" #!\n", []string{`upstream.mqtt.broker "http://h:1883": scheme "http": want tcp, ssl, tls, mqtt, mqtts, ws or wss`}},
	{"topic wildcard", "[upstream.mqtt]\ntopic_prefix = \"a/+/b\" #!\n", []string{`upstream.mqtt.topic_prefix "a/+/b": wildcards + and # are not allowed in a topic`}},
	{"bad websocket url", "[upstream.websocket]\nurl = \"https://collector\" #!\n", []string{`upstream.websocket.url "https://collector": scheme "https": want ws or wss`}},
	{"url and urls", "[upstream.websocket]\nurl = \"ws://a/x\"\nurls = [\"ws://b/x\"] #!\n",
		[]string{`upstream.websocket.url and upstream.websocket.urls are both set: use upstream.websocket.urls alone (url = "ws://a/x" is urls = ["ws://a/x"])`}},
	{"bad url in urls", "[upstream.websocket]\nurls = [\"ws://a/x\", \"http://b/x\"] #!\n", []string{`upstream.websocket.urls[1] "http://b/x": scheme "http": want ws or wss`}},
	{"url twice in urls", "[upstream.websocket]\nurls = [\"ws://a/x\", \"ws://a/x\"] #!\n", []string{`upstream.websocket.urls[1] "ws://a/x": listed twice`}},
	{"empty urls", "[upstream.websocket]\nurls = [] #!\n", []string{`upstream.websocket.urls is empty`}},
	{"broker and brokers", "[upstream.mqtt]\nbroker = \"tcp://a:1883\"\nbrokers = [\"tcp://b:1883\"] #!\n",
		[]string{`upstream.mqtt.broker and upstream.mqtt.brokers are both set: use upstream.mqtt.brokers alone (broker = "tcp://a:1883" is brokers = ["tcp://a:1883"])`}},
	{"bad primary_retry", "[upstream.websocket]\nurls = [\"ws://a/x\"]\nprimary_retry = \"0s\" #!\n", []string{`upstream.websocket.primary_retry 0s: must be > 0`}},
	{"bad buffer size", "[buffer]\nmax_bytes = \"64 MB-ish\" #!\n", []string{`buffer.max_bytes: bad size "64 MB-ish": unknown unit: write an integer of bytes or e.g. "512KiB", "64MiB", "1GB"`}},
	{"negative buffer size", "[buffer]\nmax_bytes = -5 #!\n", []string{`buffer.max_bytes -5: must be > 0`}},
	{"buffer size overflow", "[buffer]\nmax_bytes = \"99999999999TiB\" #!\n", []string{`buffer.max_bytes: bad size "99999999999TiB": too large`}},
	{"bad fsync", "[buffer]\nfsync = \"sometimes\" #!\n", []string{`buffer.fsync "sometimes": want batched, always or never`}},
	{"bad http listen", "[http]\nlisten = \"8080\" #!\n", []string{`http.listen "8080": want host:port such as "127.0.0.1:8080" or ":8080"`}},
	{"bad http listen port", "[http]\nlisten = \":http-alt\" #!\n", []string{`http.listen ":http-alt": port "http-alt": want a number 0..65535`}},
	{"bad udp listen", "[poll]\nudp_listen = \"::\" #!\n", []string{`poll.udp_listen "::": want host:port such as "127.0.0.1:8080" or ":8080"`}},
	{"bad tcp mode", "[poll]\ntcp_mode = \"both\" #!\n", []string{`poll.tcp_mode "both": want parallel or serial`}},
	{"tls cert without key", "[http]\ntls_cert_file = \"/c\" #!\n", []string{`http.tls_cert_file is set but http.tls_key_file is not: give both or neither`}},
	{"basic auth user without hash", "[http]\nbasic_auth_user = \"op\" #!\n", []string{`http.basic_auth_user is set but http.basic_auth_hash_file is not: give both or neither`}},
	{"protect_metrics not a bool", "[http]\nprotect_metrics = \"yes\" #!\n", []string{`http.protect_metrics: want a boolean, got a string ("yes")`}},
	{"bad origin", "[http]\nallowed_origins = [\"scada.example\"] #!\n", []string{`http.allowed_origins "scada.example": want an origin such as "https://scada.example:8443"`}},
	{"bad trusted proxy", "[http]\ntrusted_proxies = [\"10.0.0.0/33\"] #!\n", []string{`http.trusted_proxies "10.0.0.0/33": want a network such as "10.0.0.0/8" or an address`}},
	{"bad allowed network", "[http]\nallowed_networks = [\"192.168.1.0/24\", \"lan\"] #!\n", []string{`http.allowed_networks "lan": want a network such as "10.0.0.0/8" or an address`}},
	{"allowed network not a string", "[http]\nallowed_networks = [10] #!\n", []string{`http.allowed_networks[0]: want a string, got an integer (10)`}},
	{"limits negative rate", "[http.limits]\npoll_rate = -5 #!\n", []string{`http.limits.poll_rate -5: want a rate per second in 0..1000000 (0: default) or -1 (no limit)`}},
	{"limits rate too high", "[http.limits]\nread_rate = 2e6 #!\n", []string{`http.limits.read_rate 2e+06: want a rate per second in 0..1000000 (0: default) or -1 (no limit)`}},
	{"limits rate not a number", "[http.limits]\nconnect_rate = \"fast\" #!\n", []string{`http.limits.connect_rate: want a number, got a string ("fast")`}},
	{"limits negative burst", "[http.limits]\nwrite_burst = -1 #!\n", []string{`http.limits.write_burst -1 outside 0..1000000`}},
	{"limits connections", "[http.limits]\nconnections_per_client = -2 #!\n", []string{`http.limits.connections_per_client -2 outside -1..1000000`}},
	{"limits unknown key", "[http.limits]\npoll_rates = 5 #!\n", []string{`unknown key "http.limits.poll_rates" (did you mean "http.limits.poll_rate"?)`}},
	{"ring too big", "[ring]\nsize = 100000000 #!\n", []string{`ring.size 100000000 outside 1..10000000`}},
	{"ring max_bytes too small", "[ring]\nmax_bytes = \"1KiB\" #!\n", []string{`ring.max_bytes 1024: outside 65536..1073741824 (64KiB..1GiB)`}},
	{"ring max_bytes zero", "[ring]\nmax_bytes = 0 #!\n", []string{`ring.max_bytes 0: must be > 0`}},
	{"history keep below a bucket", "[history]\nkeep = \"5m\" #!\n", []string{`history.keep 5m0s: must be at least one bucket (10m)`}},
	{"history raw window zero", "[history]\nraw_window = \"0s\" #!\n", []string{`history.raw_window 0s: must be > 0`}},
	{"history max_ram zero", "[history]\nmax_ram = 0 #!\n", []string{`history.max_ram 0: must be > 0`}},
	{"non-finite scale", dev + "tags = [ { name = \"t\", address = 0, scale = nan } ] #!\n", []string{`device "d": tag "t": scale: NaN is not a finite number`}},

	// Several at once, reported in line order.
	{"all problems", "[ring]\nsize = 0 #!\n[[device]]\nname = \"d\"\ntransport = \"udp\"\naddress = \"h\"\nunit = 999 #!\ntags = [\n  { name = \"a\", address = 70000 }, #!\n  { name = \"b\", register = \"input\", writable = true, address = 1 }, #!\n]\n[buffer]\nfsync = \"x\" #!\n",
		[]string{`ring.size 0 outside 1..10000000`, `device "d": unit 999 outside 0..247`, `device "d": tag "a": address 70000 > 65535`,
			`device "d": tag "b": writable: input registers are read-only`, `buffer.fsync "x": want batched, always or never`}},
	// TOML 1.1 multi-line inline tables keep exact lines.
	{"multi-line inline table", dev + "tags = [\n  {\n    name = \"t\",\n    address = 0,\n    bit = 1, #!\n  },\n]\n", []string{`device "d": tag "t": bit applies only to a bool in a holding or input register`}},
	{"multi-line string before", "[gateway]\ndata_dir = \"\"\"\n[[device]]\nx = 1\n\"\"\"\nbogus = 1 #!\n", []string{`unknown key "gateway.bogus"`}},
}

func markedLines(text string) []int {
	var out []int
	for i, l := range strings.Split(text, "\n") {
		if j := strings.Index(l, "#!"); j >= 0 {
			n := len(l[j+1:]) - len(strings.TrimLeft(l[j+1:], "!"))
			for k := 0; k < n; k++ {
				out = append(out, i+1)
			}
		}
	}
	return out
}

func TestErrors(t *testing.T) {
	for _, tc := range errorCases {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := Parse("e.toml", []byte(tc.text))
			if err == nil {
				t.Fatalf("no error; config %+v", cfg)
			}
			if cfg != nil {
				t.Errorf("config returned with errors")
			}
			var es Errors
			if !errors.As(err, &es) {
				t.Fatalf("error is %T, not Errors", err)
			}
			lines := markedLines(tc.text)
			if len(lines) != len(tc.msgs) {
				t.Fatalf("test case: %d markers for %d messages", len(lines), len(tc.msgs))
			}
			if len(es) != len(tc.msgs) {
				t.Fatalf("got %d errors, want %d:\n%v", len(es), len(tc.msgs), err)
			}
			for i, e := range es {
				want := "conf: e.toml:" + strconv.Itoa(lines[i]) + ": " + tc.msgs[i]
				got := e.Error()
				if strings.HasPrefix(tc.msgs[i], "syntax: ") && tc.msgs[i] == "syntax: " {
					if !strings.HasPrefix(got, want) {
						t.Errorf("got  %s\nwant %s...", got, want)
					}
					continue
				}
				if got != want {
					t.Errorf("got  %s\nwant %s", got, want)
				}
				if e.File != "e.toml" || e.Line != lines[i] {
					t.Errorf("File/Line = %q/%d", e.File, e.Line)
				}
			}
			if strings.Count(err.Error(), "\n") != len(es)-1 {
				t.Errorf("Errors.Error() is not one line per problem:\n%s", err)
			}
			var one *Error
			if !errors.As(err, &one) || one != es[0] {
				t.Errorf("errors.As(*Error) does not find the first problem")
			}
		})
	}
}

// Fields of Error carry the device and tag names on their own.
func TestErrorFields(t *testing.T) {
	_, err := Parse("f.toml", []byte(dev+"tags = [ { name = \"humidity\", address = 70000 } ]\n"))
	var es Errors
	if !errors.As(err, &es) || len(es) != 1 {
		t.Fatalf("%v", err)
	}
	e := es[0]
	if e.File != "f.toml" || e.Line != 5 || e.Device != "d" || e.Tag != "humidity" || e.Msg != "address 70000 > 65535" || e.Profile != "" {
		t.Errorf("%+v", *e)
	}
	if s := (&Error{Msg: "x"}).Error(); s != "conf: x" {
		t.Errorf("no file: %q", s)
	}
	if s := (&Error{Line: 3, Msg: "x"}).Error(); s != "conf: line 3: x" {
		t.Errorf("no file: %q", s)
	}
	if s := (&Error{File: "f", Msg: "x"}).Error(); s != "conf: f: x" {
		t.Errorf("no line: %q", s)
	}
}

// Things that look suspicious but are valid.
func TestValidEdgeCases(t *testing.T) {
	for name, text := range map[string]string{
		"two bools on different bits":        dev + "tags = [\n { name = \"a\", address = 0, type = \"bool\", bit = 0 },\n { name = \"b\", address = 0, type = \"bool\", bit = 15 },\n]\n",
		"same address in two register kinds": dev + "tags = [\n { name = \"a\", address = 0 },\n { name = \"b\", register = \"input\", address = 0 },\n { name = \"c\", register = \"coil\", address = 0 },\n { name = \"e\", register = \"discrete\", address = 0 },\n]\n",
		"adjacent float32":                   dev + "tags = [\n { name = \"a\", address = 0, type = \"float32\" },\n { name = \"b\", address = 2, type = \"float32\" },\n]\n",
		"last register":                      dev + "tags = [ { name = \"a\", address = 65532, type = \"float64\", order = \"DCBA\" } ]\n",
		"16-bit byte swap":                   dev + "tags = [ { name = \"a\", address = 1, type = \"int16\", order = \"BADC\" } ]\n",
		"same address on two units":          dev + "tags = [ { name = \"a\", address = 0 } ]\n[[device]]\nname = \"e\"\ntransport = \"tcp\"\naddress = \"10.0.0.1:502\"\nunit = 2\ntags = [ { name = \"a\", address = 0 } ]\n",
		"same address tcp and udp":           dev + "tags = [ { name = \"a\", address = 0 } ]\n[[device]]\nname = \"e\"\ntransport = \"udp\"\naddress = \"10.0.0.1\"\ntags = [ { name = \"a\", address = 0 } ]\n",
		"same serial bus, same settings":     "[[device]]\nname = \"a\"\ntransport = \"rtu\"\naddress = \"/dev/ttyS1\"\nserial = { baud = 19200 }\ntags = [ { name = \"t\", address = 0 } ]\n[[device]]\nname = \"b\"\ntransport = \"rtu\"\naddress = \"/dev/ttyS1\"\nunit = 2\nserial = { baud = 19200 }\ntags = [ { name = \"t\", address = 0 } ]\n",
		"profile shared by devices":          "[[profile]]\nname = \"p\"\ntags = [ { name = \"x\", address = 0 } ]\n" + dev + "profile = \"p\"\n[[device]]\nname = \"e\"\ntransport = \"tcp\"\naddress = \"10.0.0.2\"\nprofile = \"p\"\ntags = [ { name = \"y\", address = 1 } ]\n",
		"integer scale, float min":           dev + "tags = [ { name = \"a\", address = 0, scale = 10, min = -1.5, max = 3, writable = true } ]\n",
		"interval equals timeout":            devTags + "interval = \"500ms\"\ntimeout = \"500ms\"\n",
		"sizes":                              "[buffer]\nmax_bytes = 1048576\n[http]\nmax_request_bytes = \"1 MB\"\n[poll]\nudp_buffer_bytes = \"8mib\"\n",
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := Parse("ok.toml", []byte(text)); err != nil {
				t.Fatal(err)
			}
		})
	}
}
