package conf

import (
	"bytes"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestWriteTable(t *testing.T) {
	cfg, err := Load(examplePath)
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	cfg.WriteTable(&b)
	out := b.String()
	if testing.Verbose() {
		t.Logf("\n%s", out)
	}
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	if want := `../build/edgegw.example.toml: gateway "gw-01", 49 devices, 99 tags, 1 profiles`; lines[0] != want {
		t.Errorf("summary %q", lines[0])
	}
	// 2 summary lines + 2 headers + 49 devices + 99 tags.
	if len(lines) != 2+2+49+99 {
		t.Errorf("%d lines", len(lines))
	}
	mustHave := []string{
		"logger-01   udp        192.168.1.101:502  1     1s        200ms         1        th-logger",
		"logger-02   udp        192.168.1.102:502  1     1s        200ms (auto)  1        th-logger",
		"    temperature  holding   0        int16    ABCD   0.1    °C    -",
		"    setpoint     holding   10..11   float32  CDAB   1      °C    yes [5..90]",
		"    burner_on    holding   20.3     bool     ABCD   -      -     -",
		"boiler-plc  tcp        192.168.1.20:502   1     1s        500ms         1        -",
	}
	for _, m := range mustHave {
		if !strings.Contains(out, m+"\n") {
			t.Errorf("missing row %q", m)
		}
	}
	// Fixed width: every device row starts its columns at the same rune offsets.
	header := lines[2]
	col := utf8.RuneCountInString(header[:strings.Index(header, "ADDRESS")])
	for _, l := range lines[3:] {
		if strings.HasPrefix(l, "    ") {
			continue
		}
		if r := []rune(l); len(r) <= col || r[col-1] != ' ' || r[col] == ' ' {
			t.Errorf("misaligned device row %q", l)
		}
	}
}

func TestWriteTableRTU(t *testing.T) {
	cfg, err := Parse("r.toml", []byte("[[device]]\nname = \"m\"\ntransport = \"rtu\"\naddress = \"/dev/ttyS1\"\ninterval = \"1m\"\nserial = { baud = 19200, parity = \"E\", rs485 = true }\ntags = [ { name = \"e\", register = \"input\", address = 0, type = \"uint32\", offset = -5 } ]\n"))
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	cfg.WriteTable(&b)
	for _, m := range []string{"m       rtu        /dev/ttyS1 19200/8E1/rs485  1     1m        1s (auto)  1        -", "    e    input     0..1     uint32  ABCD   1-5    -     -"} {
		if !strings.Contains(b.String(), m+"\n") {
			t.Errorf("missing %q in\n%s", m, b.String())
		}
	}
}
