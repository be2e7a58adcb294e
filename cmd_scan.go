package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"edgegw/edge"
	"edgegw/edge/modbus"
	"edgegw/tagtype"
)

// scanQuiet is the silence a serial bus keeps after a request that got no
// answer (edge/modbus's minimum quiet time): part of each probe's cost.
const scanQuiet = 20 * time.Millisecond

// scanHit is a unit that answered during a scan.
type scanHit struct {
	dc     edge.DeviceConfig // transport, address and serial settings it answered under
	unit   uint8
	answer string // what it answered, in words
	exc    bool   // it answered with an exception
}

// cmdScan finds the units that answer on a serial line (under each serial
// setting asked for) or behind a TCP gateway, identifies them and prints a
// [[device]] for each.
func cmdScan(args []string, out io.Writer) error {
	fs := flag.NewFlagSet("scan", flag.ContinueOnError)
	tf := addTransportFlags(fs, 100*time.Millisecond)
	*tf.transport = "rtu"
	fs.Lookup("transport").DefValue = "rtu"
	bauds := fs.String("baud", "9600", "serial: baud rates to try, comma-separated")
	parities := fs.String("parity", "N", "serial: parities to try, comma-separated (N, E, O)")
	unitsFlag := fs.String("units", "1-247", "unit ids to try: 1-247, or a list such as 1,2,10-20")
	register := fs.String("register", "holding:0", "what to read from each unit: holding|input|coil|discrete:ADDRESS")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: edgegw scan -transport T -address A [-baud 9600,19200 -parity N,E] [-units 1-247] [-register holding:0] [-timeout 100ms]")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 0 {
		fs.Usage()
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	units, err := parseUnits(*unitsFlag)
	if err != nil {
		return err
	}
	if (*tf.transport == edge.TransportRTU || *tf.transport == edge.TransportASCII) && slices.Contains(units, 0) {
		return errors.New("-units: unit 0 is the serial broadcast address, which never answers: start at 1")
	}
	reg, addr, err := parseProbeRegister(*register)
	if err != nil {
		return err
	}
	// The settings to try: every baud × parity on a serial line, one otherwise.
	var settings []edge.DeviceConfig
	serial := *tf.transport == edge.TransportRTU || *tf.transport == edge.TransportASCII
	if serial {
		for _, b := range strings.Split(*bauds, ",") {
			baud, err := strconv.Atoi(strings.TrimSpace(b))
			if err != nil || baud <= 0 {
				return fmt.Errorf("-baud %q: want rates such as 9600,19200", *bauds)
			}
			for _, p := range strings.Split(*parities, ",") {
				p = strings.ToUpper(strings.TrimSpace(p))
				if p != "N" && p != "E" && p != "O" {
					return fmt.Errorf("-parity %q: want N, E or O, comma-separated", *parities)
				}
				dc, err := tf.device(baud, p)
				if err != nil {
					return err
				}
				settings = append(settings, dc)
			}
		}
	} else {
		dc, err := tf.device(0, "")
		if err != nil {
			return err
		}
		settings = append(settings, dc)
	}
	timeout := *tf.timeout
	perProbe := timeout
	if serial {
		perProbe += scanQuiet
	}
	bound := time.Duration(len(units)*len(settings)) * perProbe
	fmt.Fprintf(out, "scanning %s: %d units × %d settings, %v timeout: at most %v, then identification of those found\n",
		settings[0].Transport+" "+settings[0].Address, len(units), len(settings), timeout, bound.Round(100*time.Millisecond))
	progress := isTerminal(os.Stdout) && out == io.Writer(os.Stdout)
	deadline := time.Now().Add(bound + 10*time.Second) // the bound, plus room for opening ports and a loaded machine
	var hits []scanHit
	for si, dc := range settings {
		bus, err := edge.OpenProbeBus(dc, nil)
		if err != nil {
			return err
		}
		found, noise := 0, 0
		for ui, u := range units {
			if time.Now().After(deadline) {
				bus.Close()
				return fmt.Errorf("scan stopped: over its bound of %v", bound+10*time.Second)
			}
			if progress {
				fmt.Fprintf(out, "\r  %s: unit %d (%d/%d, setting %d/%d), %d found so far ", settingName(dc), u, ui+1, len(units), si+1, len(settings), len(hits))
			}
			data, rtt, err := bus.Unit(u, timeout).Read(reg, addr, 1)
			var fe *modbus.FrameError
			hit := scanHit{dc: dc, unit: u}
			switch _, exc := modbus.IsException(err); {
			case err == nil:
				hit.answer = fmt.Sprintf("%s %d = %s, round trip %s", reg, addr, probeValue(reg, data), fmtRTT(rtt))
			case exc:
				hit.exc, hit.answer = true, fmt.Sprintf("%s %d: %s, round trip %s", reg, addr, plainError(err, timeout), fmtRTT(rtt))
			case errors.As(err, &fe):
				noise++
			case errors.Is(err, modbus.ErrTimeout):
			default: // the line or the gateway itself fails: no unit will answer
				bus.Close()
				if progress {
					fmt.Fprint(out, "\r\033[K")
				}
				return fmt.Errorf("%s: %s", settingName(dc), plainError(err, timeout))
			}
			if hit.answer == "" {
				continue
			}
			if progress {
				fmt.Fprint(out, "\r\033[K")
			}
			fmt.Fprintf(out, "  unit %-3d %s  answers: %s\n", u, settingName(dc), hit.answer)
			hits = append(hits, hit)
			found++
		}
		bus.Close()
		if progress {
			fmt.Fprint(out, "\r\033[K")
		}
		summary := fmt.Sprintf("%s: %d of %d units answer", settingName(dc), found, len(units))
		if noise > 0 {
			summary += fmt.Sprintf("; %d garbled replies (bytes on the line that are no valid frame: another baud rate, parity or framing?)", noise)
		}
		fmt.Fprintln(out, summary)
	}
	if len(hits) == 0 {
		return errors.New("no unit answered: check the wiring (A/B swapped?), the termination, the address, and try other baud rates, parities or -transport ascii")
	}
	fmt.Fprintf(out, "\n%d found. Identification (function 43/14 basic objects, function 17):\n", len(hits))
	for _, h := range hits {
		identify(out, h, max(timeout, 500*time.Millisecond))
	}
	fmt.Fprintln(out, "\n# [[device]] snippets (check with edgegw check; add the tags from the device's manual):")
	lines := map[string]string{} // serial path → settings of the first device found on it
	for _, h := range hits {
		if s, ok := lines[h.dc.Address]; ok && s != settingName(h.dc) {
			fmt.Fprintf(out, "# note: unit %d answered at %s, but another unit at %s: one line has one setting in a config\n", h.unit, settingName(h.dc), s)
		} else if !ok {
			lines[h.dc.Address] = settingName(h.dc)
		}
		fmt.Fprint(out, deviceSnippet(h, reg, addr))
	}
	return nil
}

// identify prints what unit h says it is.
func identify(out io.Writer, h scanHit, timeout time.Duration) {
	bus, err := edge.OpenProbeBus(h.dc, nil)
	if err != nil {
		fmt.Fprintf(out, "  unit %d: %v\n", h.unit, err)
		return
	}
	defer bus.Close()
	p := bus.Unit(h.unit, timeout)
	fmt.Fprintf(out, "  unit %d (%s):\n", h.unit, settingName(h.dc))
	id, err := p.DeviceIdentification()
	if err != nil {
		fmt.Fprintf(out, "    device identification: not supported (%s)\n", plainError(err, timeout))
	} else {
		fmt.Fprintf(out, "    vendor %q, product code %q, revision %q (conformity level %#02x)\n",
			id.Objects[modbus.ObjVendorName], id.Objects[modbus.ObjProductCode], id.Objects[modbus.ObjMajorMinorRevision], id.Conformity)
	}
	sid, err := p.ServerID()
	if err != nil {
		fmt.Fprintf(out, "    server id: not supported (%s)\n", plainError(err, timeout))
	} else {
		fmt.Fprintf(out, "    server id: % X (%q)\n", sid, printableText(sid))
	}
}

// deviceSnippet is a [[device]] for h that edgegw check accepts.
func deviceSnippet(h scanHit, reg edge.Register, addr uint16) string {
	var b strings.Builder
	fmt.Fprintf(&b, "\n[[device]]\nname = \"unit-%d\"\ntransport = %q\naddress = %q\nunit = %d\n", h.unit, h.dc.Transport, h.dc.Address, h.unit)
	if s := h.dc.Serial; h.dc.Transport == edge.TransportRTU || h.dc.Transport == edge.TransportASCII {
		fmt.Fprintf(&b, "serial = { baud = %d, parity = %q, data_bits = %d, stop_bits = %d }\n", s.Baud, s.Parity, max(s.DataBits, 8), max(s.StopBits, 1))
	}
	if h.exc {
		fmt.Fprintf(&b, "# %s %d answered with an exception: take the registers from the device's manual\n", reg, addr)
	}
	fmt.Fprintf(&b, "tags = [ { name = \"%s-%d\", register = %q, address = %d } ]\n", reg, addr, reg.String(), addr)
	return b.String()
}

func settingName(dc edge.DeviceConfig) string {
	if dc.Transport == edge.TransportRTU || dc.Transport == edge.TransportASCII {
		return serialShort(dc.Serial)
	}
	return dc.Transport + " " + dc.Address
}

func probeValue(reg edge.Register, data []byte) string {
	if reg == edge.Coil || reg == edge.Discrete {
		if edge.BitAt(data, 0) {
			return "1"
		}
		return "0"
	}
	return fmt.Sprintf("0x%02X%02X (%d)", data[0], data[1], int(data[0])<<8|int(data[1]))
}

func printableText(b []byte) string {
	var s strings.Builder
	for _, c := range b {
		if c >= 0x20 && c < 0x7F {
			s.WriteByte(c)
		} else {
			s.WriteByte('.')
		}
	}
	return s.String()
}

// parseUnits reads "1-247" or "1,2,10-20" (each unit once, in order given).
func parseUnits(s string) ([]uint8, error) {
	var out []uint8
	seen := map[int]bool{}
	for _, part := range strings.Split(s, ",") {
		lo, hi, isRange := strings.Cut(strings.TrimSpace(part), "-")
		a, err1 := strconv.Atoi(lo)
		b := a
		var err2 error
		if isRange {
			b, err2 = strconv.Atoi(hi)
		}
		if err1 != nil || err2 != nil || a < 0 || b > 247 || a > b {
			return nil, fmt.Errorf("-units %q: want ids 0..247 such as 1-247 or 1,2,10-20", s)
		}
		for u := a; u <= b; u++ {
			if !seen[u] {
				seen[u] = true
				out = append(out, uint8(u))
			}
		}
	}
	return out, nil
}

// parseProbeRegister reads "holding:0".
func parseProbeRegister(s string) (edge.Register, uint16, error) {
	name, a, _ := strings.Cut(s, ":")
	reg, err := tagtype.ParseRegister(name)
	if err != nil {
		return 0, 0, fmt.Errorf("-register %q: want holding|input|coil|discrete:ADDRESS", s)
	}
	addr, err := strconv.ParseUint(a, 0, 16)
	if err != nil {
		return 0, 0, fmt.Errorf("-register %q: address not in 0..65535", s)
	}
	return reg, uint16(addr), nil
}

// isTerminal reports whether f is a character device (a terminal).
func isTerminal(f *os.File) bool {
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}
