package conf

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"edgegw/tagtype"
)

// WriteTable writes the resolved device/tag table (for `edgegw check`): a
// summary line, the two column headers, then one row per device followed by
// its tags, indented.
// Columns are fixed-width across the whole table. Write errors are ignored
// (w is a terminal or a buffer); the caller may check its own writer.
//
//	DEVICE      TRANSPORT  ADDRESS            UNIT  INTERVAL  TIMEOUT  RETRIES  PROFILE
//	    TAG          REGISTER  ADDRESS  TYPE   ORDER  SCALE  UNIT  WRITABLE
//	logger-01   udp        192.168.1.101:502  1     1s        200ms    1        th-logger
//	    temperature  holding   0        int16  ABCD   0.1    °C    -
//
// A tag's ADDRESS shows its span (10..11) and bit (20.3); SCALE shows the
// offset when there is one (0.1+5); WRITABLE shows min/max ([5..90]); a
// TIMEOUT the file does not set is derived from the interval: "50ms (auto)".
func (c *Config) WriteTable(w io.Writer) {
	tags := 0
	for _, d := range c.Devices {
		tags += len(d.Tags)
	}
	fmt.Fprintf(w, "%s: gateway %q, %d devices, %d tags, %d profiles\n\n",
		orDash(c.File), c.Gateway.ID, len(c.Devices), tags, len(c.Profiles))

	devHead := []string{"DEVICE", "TRANSPORT", "ADDRESS", "UNIT", "INTERVAL", "TIMEOUT", "RETRIES", "PROFILE"}
	tagHead := []string{"TAG", "REGISTER", "ADDRESS", "TYPE", "ORDER", "SCALE", "UNIT", "WRITABLE"}
	devRows := make([][]string, len(c.Devices))
	tagRows := make([][][]string, len(c.Devices))
	devW, tagW := widths(nil, devHead), widths(nil, tagHead)
	for i, d := range c.Devices {
		addr := d.Address
		if SerialLine(d.Transport) {
			addr += " " + serialShort(d.Serial)
		}
		timeout := dur(d.Timeout)
		if d.TimeoutDerived {
			timeout += " (auto)"
		}
		devRows[i] = []string{d.Name, d.Transport, addr, strconv.Itoa(int(d.Unit)),
			dur(d.Interval), timeout, strconv.Itoa(d.Retries), orDash(d.Profile)}
		devW = widths(devW, devRows[i])
		for _, t := range d.Tags {
			row := []string{t.Name, t.Register, tagAddress(t), t.Type, t.Order,
				tagScale(t), orDash(t.Unit), tagWritable(t)}
			tagRows[i] = append(tagRows[i], row)
			tagW = widths(tagW, row)
		}
	}
	writeRow(w, "", devW, devHead)
	writeRow(w, "    ", tagW, tagHead)
	for i := range c.Devices {
		writeRow(w, "", devW, devRows[i])
		for _, row := range tagRows[i] {
			writeRow(w, "    ", tagW, row)
		}
	}
}

func widths(w []int, row []string) []int {
	if w == nil {
		w = make([]int, len(row))
	}
	for i, cell := range row {
		if n := utf8.RuneCountInString(cell); n > w[i] {
			w[i] = n
		}
	}
	return w
}

func writeRow(w io.Writer, indent string, width []int, row []string) {
	var b strings.Builder
	b.WriteString(indent)
	for i, cell := range row {
		b.WriteString(cell)
		if i < len(row)-1 {
			b.WriteString(strings.Repeat(" ", width[i]-utf8.RuneCountInString(cell)+2))
		}
	}
	b.WriteByte('\n')
	io.WriteString(w, b.String())
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func dur(d time.Duration) string {
	s := d.String()
	// "1m0s" → "1m", "2h0m0s" → "2h": shorter, still a valid duration.
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

func serialShort(s Serial) string {
	out := fmt.Sprintf("%d/%d%s%d", s.Baud, s.DataBits, s.Parity, s.StopBits)
	if s.RS485 {
		out += "/rs485"
	}
	return out
}

func tagAddress(t Tag) string {
	s := strconv.Itoa(int(t.Address))
	if n := t.Span(); n > 1 {
		s += ".." + strconv.Itoa(int(t.Address)+n-1)
	}
	if t.Bit >= 0 {
		s += "." + strconv.Itoa(t.Bit)
	}
	return s
}

func tagScale(t Tag) string {
	if typ, _ := tagtype.Parse(t.Type); typ.Kind() != tagtype.Number {
		return "-"
	}
	s := strconv.FormatFloat(t.Scale, 'g', -1, 64)
	if t.Offset != 0 {
		s += fmt.Sprintf("%+g", t.Offset)
	}
	return s
}

func tagWritable(t Tag) string {
	if !t.Writable {
		return "-"
	}
	s := "yes"
	if t.Min != nil || t.Max != nil {
		lo, hi := "", ""
		if t.Min != nil {
			lo = strconv.FormatFloat(*t.Min, 'g', -1, 64)
		}
		if t.Max != nil {
			hi = strconv.FormatFloat(*t.Max, 'g', -1, 64)
		}
		s += " [" + lo + ".." + hi + "]"
	}
	return s
}
