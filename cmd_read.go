package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unicode"

	"edgegw/edge"
	"edgegw/edge/modbus"
	"edgegw/tagtype"
)

// transportFlags are the flags of a [[device]]'s transport, shared by read
// and scan.
type transportFlags struct {
	transport, address *string
	timeout            *time.Duration
	dataBits, stopBits *int
}

func addTransportFlags(fs *flag.FlagSet, timeout time.Duration) *transportFlags {
	return &transportFlags{
		transport: fs.String("transport", "tcp", "tcp, udp, rtu, rtuovertcp, ascii or asciiovertcp"),
		address:   fs.String("address", "", "host:port (tcp, udp, rtuovertcp, asciiovertcp) or serial device path (rtu, ascii) (required)"),
		timeout:   fs.Duration("timeout", timeout, "reply timeout"),
		dataBits:  fs.Int("databits", 8, "serial: data bits"),
		stopBits:  fs.Int("stopbits", 1, "serial: stop bits"),
	}
}

// device is the edge device the flags describe, at baud and parity.
func (f *transportFlags) device(baud int, parity string) (edge.DeviceConfig, error) {
	dc := edge.DeviceConfig{Transport: *f.transport, Address: *f.address, Timeout: *f.timeout}
	switch dc.Transport {
	case edge.TransportTCP, edge.TransportUDP, edge.TransportRTUOverTCP, edge.TransportASCIIOverTCP:
		if dc.Address != "" && !strings.Contains(dc.Address, ":") {
			dc.Address += ":502"
		}
	case edge.TransportRTU, edge.TransportASCII:
		dc.Serial = modbus.SerialConfig{Baud: baud, Parity: parity, DataBits: *f.dataBits, StopBits: *f.stopBits}
	default:
		return dc, fmt.Errorf("-transport %q: want tcp, udp, rtu, rtuovertcp, ascii or asciiovertcp", dc.Transport)
	}
	if dc.Address == "" {
		return dc, errors.New("-address is required")
	}
	if dc.Timeout <= 0 {
		return dc, errors.New("-timeout must be > 0")
	}
	return dc, nil
}

// where names the device for people: "rtu /dev/ttyUSB0 19200 8E1 unit 3".
func where(dc edge.DeviceConfig, unit uint8) string {
	s := dc.Transport + " " + dc.Address
	if dc.Transport == edge.TransportRTU || dc.Transport == edge.TransportASCII {
		s += " " + serialShort(dc.Serial)
	}
	return fmt.Sprintf("%s unit %d", s, unit)
}

func serialShort(s modbus.SerialConfig) string {
	return fmt.Sprintf("%d %d%s%d", s.Baud, max(s.DataBits, 8), strings.ToUpper(s.Parity), max(s.StopBits, 1))
}

// exceptionNames are the exception codes of the Modbus Application
// Protocol (7), with what they mean on site.
var exceptionNames = map[byte]string{
	1:  "illegal function: the device does not have this function (or this register table)",
	2:  "illegal data address: the device has no such register, or not this many from here",
	3:  "illegal data value: the device refuses this count or value",
	4:  "server device failure: the device failed while answering",
	5:  "acknowledge: the device is busy with a long command",
	6:  "server device busy: try again later",
	8:  "memory parity error",
	10: "gateway path unavailable: the gateway has no route to this unit",
	11: "gateway target device failed to respond: the gateway got no answer from this unit",
}

// plainError says what a failed request means, in words a person on site
// reads: an exception by name, a timeout as no reply, anything else as is.
func plainError(err error, timeout time.Duration) string {
	if code, ok := modbus.IsException(err); ok {
		name := exceptionNames[code]
		if name == "" {
			name = "unknown exception"
		}
		return fmt.Sprintf("exception %d (%s)", code, name)
	}
	if errors.Is(err, modbus.ErrTimeout) {
		return fmt.Sprintf("no reply within %v (timeout): check the unit id, the address, the wiring and, on a serial line, baud rate and parity", timeout)
	}
	var fe *modbus.FrameError
	if errors.As(err, &fe) {
		return fmt.Sprintf("a reply came but was not valid Modbus (%v): another device answering, noise, or wrong framing (rtu vs ascii)", err)
	}
	if errors.Is(err, syscall.ECONNREFUSED) {
		return fmt.Sprintf("connection refused: nothing listens at that address and port (%v)", err)
	}
	return err.Error()
}

// cmdRead does one read of one device and prints every interpretation of
// what came back: the byte-order helper for commissioning.
func cmdRead(args []string, out io.Writer) error {
	fs := flag.NewFlagSet("read", flag.ContinueOnError)
	tf := addTransportFlags(fs, time.Second)
	unit := fs.Uint("unit", 1, "unit id (slave address)")
	baud := fs.Int("baud", 9600, "serial: baud rate")
	parity := fs.String("parity", "N", "serial: parity N, E or O")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: edgegw read -transport T -address A [-unit N] [flags] holding|input|coil|discrete START COUNT")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 3 {
		fs.Usage()
		return errors.New("want holding|input|coil|discrete START COUNT")
	}
	reg, err := tagtype.ParseRegister(fs.Arg(0))
	if err != nil {
		return err
	}
	start, err := strconv.ParseUint(fs.Arg(1), 0, 16)
	if err != nil {
		return fmt.Errorf("START %q: want 0..65535", fs.Arg(1))
	}
	max := uint64(125)
	if reg == edge.Coil || reg == edge.Discrete {
		max = 2000
	}
	count, err := strconv.ParseUint(fs.Arg(2), 0, 16)
	if err != nil || count < 1 || count > max || start+count > 65536 {
		return fmt.Errorf("COUNT %q: want 1..%d, START+COUNT <= 65536", fs.Arg(2), max)
	}
	if *unit > 247 {
		return fmt.Errorf("-unit %d: want 0..247", *unit)
	}
	dc, err := tf.device(*baud, *parity)
	if err != nil {
		return err
	}
	bus, err := edge.OpenProbeBus(dc, nil)
	if err != nil {
		return err
	}
	defer bus.Close()
	u := uint8(*unit)
	data, rtt, err := bus.Unit(u, 0).Read(reg, uint16(start), uint16(count))
	fmt.Fprintf(out, "%s %d+%d from %s: ", reg, start, count, where(dc, u))
	if err != nil {
		fmt.Fprintf(out, "failed after %s\n", fmtRTT(rtt))
		return fmt.Errorf("%s", plainError(err, dc.Timeout))
	}
	fmt.Fprintf(out, "round trip %s\n\n", fmtRTT(rtt))
	if reg == edge.Coil || reg == edge.Discrete {
		printBits(out, uint16(start), int(count), data)
	} else {
		printRegisters(out, uint16(start), data)
	}
	return nil
}

func fmtRTT(d time.Duration) string {
	return strconv.FormatFloat(float64(d.Microseconds())/1000, 'f', 1, 64) + " ms"
}

// printBits prints coils or discrete inputs, 8 a line.
func printBits(out io.Writer, start uint16, n int, data []byte) {
	fmt.Fprintln(out, "ADDRESS  BITS (address, address+1, …)")
	for i := 0; i < n; i += 8 {
		var b strings.Builder
		for j := i; j < min(i+8, n); j++ {
			if edge.BitAt(data, j) {
				b.WriteString(" 1")
			} else {
				b.WriteString(" 0")
			}
		}
		fmt.Fprintf(out, "%-7d %s\n", int(start)+i, b.String())
	}
}

var orders = []edge.Order{edge.ABCD, edge.CDAB, edge.BADC, edge.DCBA}

// printRegisters prints the registers raw and as every type and order.
func printRegisters(out io.Writer, start uint16, data []byte) {
	n := len(data) / 2
	fmt.Fprintf(out, "%-8s %-6s %6s %6s  %s\n", "REGISTER", "HEX", "UINT16", "INT16", "TEXT")
	for i := 0; i < n; i++ {
		r := data[2*i : 2*i+2]
		u, _ := edge.DecodeRegisters(edge.Uint16, edge.ABCD, 0, r)
		s, _ := edge.DecodeRegisters(edge.Int16, edge.ABCD, 0, r)
		fmt.Fprintf(out, "%-8d 0x%02X%02X %6.0f %6.0f  %s\n", int(start)+i, r[0], r[1], u, s, printable(r))
	}
	if n >= 2 {
		fmt.Fprintf(out, "\n32-bit values (each pair of registers, in the four byte orders):\n")
		fmt.Fprintf(out, "%-11s %-5s %-10s %11s %12s %s\n", "REGISTERS", "ORDER", "HEX", "UINT32", "INT32", "FLOAT32")
		for i := 0; i+2 <= n; i++ {
			printWide(out, start, i, 2, data[2*i:2*i+4], edge.Uint32, edge.Int32, edge.Float32)
		}
	}
	if n >= 4 {
		fmt.Fprintf(out, "\n64-bit values (each four registers, in the four byte orders):\n")
		fmt.Fprintf(out, "%-11s %-5s %-18s %20s %21s %s\n", "REGISTERS", "ORDER", "HEX", "UINT64", "INT64", "FLOAT64")
		for i := 0; i+4 <= n; i++ {
			printWide(out, start, i, 4, data[2*i:2*i+8], edge.Uint64, edge.Int64, edge.Float64)
		}
	}
	for _, o := range []edge.Order{edge.ABCD, edge.BADC} {
		if s, err := edge.DecodeString(o, edge.Both, data); err == nil {
			fmt.Fprintf(out, "\nstring (%s: two characters a register, %s): %q", o, map[edge.Order]string{edge.ABCD: "high byte first", edge.BADC: "low byte first"}[o], s)
		}
	}
	fmt.Fprintln(out)
}

// printWide prints the value of words registers at offset i in each order.
func printWide(out io.Writer, start uint16, i, words int, regs []byte, ut, st, ft edge.Type) {
	bits := 32
	hexW, uW, sW := 10, 11, 12
	if words == 4 {
		bits, hexW, uW, sW = 64, 18, 20, 21
	}
	label := fmt.Sprintf("%d-%d", int(start)+i, int(start)+i+words-1)
	for k, o := range orders {
		norm := edge.Normalize(regs, o)
		u, _ := edge.DecodeRegisters(ut, o, 0, regs)
		s, _ := edge.DecodeRegisters(st, o, 0, regs)
		f, _ := edge.DecodeRegisters(ft, o, 0, regs)
		uStr, sStr := strconv.FormatFloat(u, 'f', 0, 64), strconv.FormatFloat(s, 'f', 0, 64)
		if words == 4 { // float64 cannot hold every 64-bit integer: decode them exactly
			var x uint64
			for _, b := range norm {
				x = x<<8 | uint64(b)
			}
			uStr, sStr = strconv.FormatUint(x, 10), strconv.FormatInt(int64(x), 10)
		}
		if k > 0 {
			label = ""
		}
		fmt.Fprintf(out, "%-11s %-5s 0x%-*X %*s %*s %s\n", label, o, hexW-2, norm, uW, uStr, sW, sStr, fmtFloat(f, bits))
	}
}

// fmtFloat prints the shortest decimal that reads back as the same float32
// or float64.
func fmtFloat(f float64, bits int) string {
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return strconv.FormatFloat(f, 'g', -1, 64)
	}
	return strconv.FormatFloat(f, 'g', -1, bits)
}

// printable shows a register's two bytes as text, '.' where not printable.
func printable(r []byte) string {
	var b [2]byte
	for i, c := range r {
		if c < 0x80 && unicode.IsPrint(rune(c)) {
			b[i] = c
		} else {
			b[i] = '.'
		}
	}
	return string(b[:])
}
