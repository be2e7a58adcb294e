package conf

import (
	"fmt"
	"strings"
	"time"

	"edgegw/tagtype"
)

// profiles reads every [[profile]]; errors name the profile.
func (d *decoder) profiles(ts []*table) []Profile {
	var out []Profile
	first := map[string]int{}
	for _, t := range ts {
		p := Profile{Line: t.line("")}
		name, ok := t.str("name")
		p.Name = name
		t.at.profile = name
		switch {
		case !ok:
			t.errf("", "profile has no name")
		case !validName(name):
			t.errf("name", "profile name %q: %s", name, nameRule)
		}
		if l, dup := first[name]; dup && ok {
			t.errf("name", "duplicate profile name (first at line %d)", l)
		} else if ok {
			first[name] = t.line("name")
		}
		for _, tt := range t.tables("tags") {
			tag, ok := d.tag(tt, t.at, name)
			p.Tags = append(p.Tags, tag)
			p.valid = append(p.valid, ok)
		}
		if len(p.Tags) == 0 {
			t.errf("", "profile has no tags")
		}
		d.checkTagSet(t, p.Tags, p.valid, func(a, b Tag) bool { return true })
		t.done()
		out = append(out, p)
	}
	return out
}

// tag reads one tag entry; ok is false when it had any problem.
func (d *decoder) tag(t *table, at where, profile string) (Tag, bool) {
	before := len(d.errs)
	t.at = at
	tag := Tag{Profile: profile, Line: t.line(""), Bit: -1, Scale: DefaultScale, Order: DefaultOrder}
	name, ok := t.str("name")
	switch {
	case !ok:
		t.errf("", "tag has no name")
	case !validName(name):
		t.at.tag = name
		t.errf("name", "tag name %q: %s", name, nameRule)
	}
	tag.Name = name
	t.at.tag = name

	tag.Register = t.oneOf("register", DefaultRegister, RegisterHolding, RegisterInput, RegisterCoil, RegisterDiscrete)
	reg, _ := tagtype.ParseRegister(tag.Register)
	bitSpace := reg.Bits()
	defType := DefaultRegisterType
	if bitSpace {
		defType = DefaultBitType
	}
	typ, _ := tagtype.Parse(defType)
	if s, ok := t.str("type"); ok {
		if p, err := tagtype.Parse(s); err != nil {
			t.errf("type", "type %q: want %s", s, orList(tagtype.Names()))
		} else {
			typ = p
		}
	}
	tag.Type = typ.String() // an alias becomes the type's name
	isString := typ == tagtype.String
	if t.has("length") || isString {
		tag.Length = int(t.intIn("length", 0, 1, LimitMaxRegisters))
		switch {
		case !isString:
			t.errf("length", "length applies only to a string tag")
		case !t.has("length"):
			t.errf("type", "string needs length = 1..%d (registers, two characters each)", LimitMaxRegisters)
			tag.Length = 0
		}
	}
	loc := tagtype.Both
	if s, ok := t.str("string_register_location"); ok {
		l, err := tagtype.ParseLocation(s)
		switch {
		case !isString:
			t.errf("string_register_location", "string_register_location applies only to a string tag")
		case err != nil:
			t.errf("string_register_location", "string_register_location %q: want both, lower or upper", s)
		default:
			loc = l
		}
	}
	if isString {
		tag.StringLocation = loc.String()
	}

	span := tagtype.Span(typ, reg, tag.Length)
	addr, hasAddr := t.integer("address")
	switch {
	case !hasAddr && !t.has("address"):
		t.errf("", "address is required")
	case hasAddr && addr < 0:
		t.errf("address", "address %d < 0", addr)
	case hasAddr && addr > 65535:
		t.errf("address", "address %d > 65535", addr)
	case hasAddr && addr+int64(span)-1 > 65535:
		t.errf("address", "address %d + %d registers of %s - 1 > 65535", addr, span, tag.Type)
	default:
		tag.Address = uint16(addr)
	}

	if isString {
		for _, k := range []string{"scale", "offset", "deadband", "deadband_percent", "max_silence", "writable", "min", "max"} {
			if t.has(k) {
				t.get(k)
				t.errf(k, "%s does not apply to a string tag", k)
			}
		}
	}
	isBool := typ == tagtype.Bool
	if !typ.Allows(reg) {
		t.errf("type", "type %s on a %s: %s tags are bool", tag.Type, tag.Register, tag.Register)
	}
	if b, ok := t.integer("bit"); ok {
		switch {
		case !isBool || bitSpace:
			t.errf("bit", "bit applies only to a bool in a holding or input register")
		case b < 0 || b > 15:
			t.errf("bit", "bit %d outside 0..15", b)
		default:
			tag.Bit = int(b)
		}
	} else if isBool && !bitSpace && !t.has("bit") {
		t.errf("type", "bool on a %s register needs bit = 0..15", tag.Register)
	}

	if o, ok := t.str("order"); ok {
		ord, err := tagtype.ParseOrder(o)
		switch {
		case err != nil:
			t.errf("order", "order %q: want ABCD, CDAB, BADC or DCBA", o)
		case isString && loc != tagtype.Both && ord != tagtype.ABCD:
			t.errf("order", "order %s on a string of one character a register (%s): want ABCD", o, loc)
		case typ.AllowsOrder(ord):
			tag.Order = o
		case isString:
			t.errf("order", "order %s on a string: want ABCD (high byte first) or BADC (bytes swapped in each register)", o)
		case isBool:
			t.errf("order", "order %s does not apply to bool (bit counts from the least significant bit)", o)
		case typ.Words() == 1 && !typ.AllowsOrder(tagtype.BADC):
			t.errf("order", "order %s on %s: want ABCD (the byte is named from the register's value as read)", o, tag.Type)
		default:
			t.errf("order", "order %s on a 16-bit %s: want ABCD or BADC (there is no word to swap)", o, tag.Type)
		}
	}

	if s, ok := t.float("scale"); ok {
		switch {
		case isBool:
			t.errf("scale", "scale does not apply to bool")
		case s == 0:
			t.errf("scale", "scale = 0 would make every value 0")
		default:
			tag.Scale = s
		}
	}
	if o, ok := t.float("offset"); ok {
		if isBool {
			t.errf("offset", "offset does not apply to bool")
		}
		tag.Offset = o
	}
	band := func(key string) float64 { // deadband, deadband_percent: >= 0, not on bool
		v, ok := t.float(key)
		switch {
		case !ok:
		case isBool:
			t.errf(key, "%s does not apply to bool", key)
		case v < 0:
			t.errf(key, "%s %g < 0", key, v)
		default:
			return v
		}
		return 0
	}
	tag.Deadband, tag.DeadbandPercent = band("deadband"), band("deadband_percent")
	if t.has("max_silence") {
		tag.MaxSilence = t.positive("max_silence", 0, true)
		if tag.MaxSilence > 0 && tag.Deadband == 0 && tag.DeadbandPercent == 0 && !isString {
			t.errf("max_silence", "max_silence applies with a deadband or deadband_percent (without one every poll is kept)")
		}
	}
	tag.Interval = t.positive("interval", 0, false)
	tag.Unit, _ = t.str("unit")
	tag.Writable = t.boolean("writable", false)
	switch {
	case tag.Writable && !reg.Writable():
		t.errf("writable", "writable: %s registers are read-only", tag.Register)
	case tag.Writable && !isString && !typ.Writable():
		t.errf("writable", "writable: a %s cannot be written (the write would overwrite the other byte of the register)", tag.Type)
	}
	if v, ok := t.float("min"); ok {
		tag.Min = &v
	}
	if v, ok := t.float("max"); ok {
		tag.Max = &v
	}
	if tag.Min != nil && tag.Max != nil && *tag.Min > *tag.Max {
		t.errf("min", "min %g > max %g", *tag.Min, *tag.Max)
	}
	t.done()
	return tag, len(d.errs) == before
}

// checkTagSet reports duplicate tag names.
// consider(a, b) says whether the pair is this caller's to report (a device
// does not re-report two tags of its profile).
func (d *decoder) checkTagSet(t *table, tags []Tag, valid []bool, consider func(a, b Tag) bool) {
	errAt := func(tag Tag, format string, args ...any) {
		d.errs = append(d.errs, &Error{File: d.file, Line: tag.Line, Profile: t.at.profile,
			Device: t.at.device, Tag: tag.Name, Msg: fmt.Sprintf(format, args...)})
	}
	seen := map[string]Tag{}
	for _, tag := range tags {
		if tag.Name == "" {
			continue
		}
		if prev, dup := seen[tag.Name]; dup {
			if consider(prev, tag) {
				errAt(tag, "duplicate tag name (first %s)", tagOrigin(prev))
			}
			continue
		}
		seen[tag.Name] = tag
	}

	// Overlapping tags are fine: a status word and bool tags on its bits, a
	// uint32 and its two halves; edge reads the registers once for all.
}

func tagOrigin(t Tag) string {
	if t.Profile != "" {
		return fmt.Sprintf("in profile %q at line %d", t.Profile, t.Line)
	}
	return fmt.Sprintf("at line %d", t.Line)
}

// devices reads every [[device]] and checks them against each other.
func (d *decoder) devices(ts []*table, profiles []Profile, poll Poll) []Device {
	byProfile := map[string]*Profile{}
	for i := range profiles {
		if _, dup := byProfile[profiles[i].Name]; !dup {
			byProfile[profiles[i].Name] = &profiles[i]
		}
	}
	var out []Device
	names := map[string]int{}
	type endpoint struct {
		transport, address string
		unit               uint8
	}
	endpoints := map[endpoint]*Device{}
	buses := map[string]*Device{}
	for _, t := range ts {
		dev, ok := d.device(t, byProfile, poll)
		if dev.Name != "" {
			if l, dup := names[dev.Name]; dup {
				t.errf("name", "duplicate device name (first at line %d)", l)
			} else {
				names[dev.Name] = dev.Line
			}
		}
		out = append(out, dev)
		if !ok.endpoint {
			continue
		}
		ep := endpoint{dev.Transport, dev.Address, dev.Unit}
		if prev, dup := endpoints[ep]; dup {
			t.errf("address", "same %s address %s and unit %d as device %q (line %d)",
				dev.Transport, dev.Address, dev.Unit, prev.Name, prev.Line)
		} else {
			endpoints[ep] = &out[len(out)-1]
		}
		if SerialLine(dev.Transport) && ok.serial {
			if prev, seen := buses[dev.Address]; seen && prev.Transport != dev.Transport {
				t.errf("transport", "%s on %s, but device %q (line %d) is %s there: a serial line has one framing",
					dev.Transport, dev.Address, prev.Name, prev.Line, prev.Transport)
			} else if seen && prev.Serial != dev.Serial {
				t.errf("serial", "serial settings %s on %s differ from device %q (line %d): %s",
					serialString(dev.Serial), dev.Address, prev.Name, prev.Line, serialString(prev.Serial))
			} else if !seen {
				buses[dev.Address] = &out[len(out)-1]
			}
		}
	}
	return out
}

func serialString(s Serial) string {
	out := fmt.Sprintf("%d %d%s%d", s.Baud, s.DataBits, s.Parity, s.StopBits)
	if s.RS485 {
		out += fmt.Sprintf(" rs485 (rts %v/%v)", s.RS485DelayRTSBeforeSend, s.RS485DelayRTSAfterSend)
	}
	return out
}

// deviceOK says which parts of a device are sound enough for cross-checks.
type deviceOK struct{ endpoint, serial bool }

func (d *decoder) device(t *table, profiles map[string]*Profile, poll Poll) (Device, deviceOK) {
	var ok deviceOK
	dev := Device{Line: t.line("")}
	name, hasName := t.str("name")
	switch {
	case !hasName:
		t.errf("", "device has no name")
	case !validName(name):
		t.at.device = name
		t.errf("name", "device name %q: %s", name, nameRule)
	}
	dev.Name = name
	t.at.device = name

	tr, hasTr := t.str("transport")
	switch {
	case !hasTr && !t.has("transport"):
		t.errf("", "transport is required: tcp, udp, rtu, rtuovertcp, ascii or asciiovertcp")
	case hasTr && tr != TransportTCP && tr != TransportUDP && tr != TransportRTU && tr != TransportRTUOverTCP &&
		tr != TransportASCII && tr != TransportASCIIOverTCP:
		t.errf("transport", "transport %q: want tcp, udp, rtu, rtuovertcp, ascii or asciiovertcp", tr)
		hasTr = false
	}
	if hasTr {
		dev.Transport = tr
	}

	addr, hasAddr := t.str("address")
	addrOK := false
	switch {
	case !hasAddr && !t.has("address"):
		t.errf("", "address is required")
	case !hasAddr || !hasTr:
	case SerialLine(tr):
		if !strings.HasPrefix(addr, "/") {
			t.errf("address", "address %q: an %s device needs a serial device path such as \"/dev/ttyS1\"", addr, tr)
		} else {
			dev.Address, addrOK = addr, true
		}
	default:
		if a, err := netAddress(addr); err != nil {
			t.errf("address", "address %q: %v", addr, err)
		} else {
			dev.Address, addrOK = a, true
		}
	}

	unitBefore := len(d.errs)
	unit := t.intIn("unit", DefaultUnit, 0, MaxUnit)
	if unit == 0 && SerialLine(tr) {
		t.errf("unit", "unit 0 is the serial broadcast address (no reply): want 1..%d", MaxUnit)
	}
	dev.Unit = uint8(unit)
	unitOK := len(d.errs) == unitBefore

	timingBefore := len(d.errs)
	dev.Interval = t.positive("interval", DefaultInterval, false)
	dev.Retries = int(t.intIn("retries", DefaultRetries, 0, 100))
	if t.has("timeout") {
		dev.Timeout = t.positive("timeout", defaultTimeout(tr), false)
		if len(d.errs) == timingBefore && dev.Interval < dev.Timeout {
			t.errf("interval", "interval %v is shorter than timeout %v", dev.Interval, dev.Timeout)
		}
	} else {
		dev.Timeout, dev.TimeoutDerived = derivedTimeout(tr, dev.Interval, dev.Retries), true
	}
	dev.MaxGap = int(t.intIn("max_gap", int64(poll.MaxGap), 0, LimitMaxRegisters))
	dev.MaxRegisters = int(t.intIn("max_registers", int64(poll.MaxRegisters), 1, LimitMaxRegisters))

	dev.WriteTransport = tr
	if tr == TransportUDP {
		dev.WriteTransport = DefaultWriteTransport
	}
	if t.has("write_transport") {
		if tr == TransportUDP || !hasTr {
			dev.WriteTransport = t.oneOf("write_transport", dev.WriteTransport, TransportTCP, TransportUDP)
		} else {
			t.get("write_transport")
			t.errf("write_transport", "write_transport applies only to udp devices (a %s device writes over %s)", tr, tr)
		}
	}

	serialBefore := len(d.errs)
	st := t.sub("serial")
	if len(st.m) > 0 && hasTr && !SerialLine(tr) {
		t.errf("serial", "serial settings apply only to rtu and ascii devices")
	}
	s := d.serial(st)
	if SerialLine(tr) {
		dev.Serial = s
	}
	ok.serial = len(d.errs) == serialBefore

	// Tags: the profile's first, then the device's own.
	var valid []bool
	if p, has := t.str("profile"); has {
		dev.Profile = p
		if prof, found := profiles[p]; found {
			dev.Tags = append(dev.Tags, prof.Tags...)
			valid = append(valid, prof.valid...) // the profile reports its own problems
		} else {
			t.errf("profile", "unknown profile %q", p)
		}
	}
	tagsBefore := len(d.errs)
	for _, tt := range t.tables("tags") {
		tag, tagOK := d.tag(tt, t.at, "")
		dev.Tags = append(dev.Tags, tag)
		valid = append(valid, tagOK)
	}
	if len(dev.Tags) == 0 && !t.has("profile") && len(d.errs) == tagsBefore {
		t.errf("", "device has no tags: give a profile or tags")
	}
	for i, tag := range dev.Tags {
		if valid[i] && tag.Words() > dev.MaxRegisters {
			d.errs = append(d.errs, &Error{File: d.file, Line: tag.Line, Device: dev.Name, Tag: tag.Name,
				Msg: fmt.Sprintf("%s needs %d registers but max_registers is %d", tag.Type, tag.Words(), dev.MaxRegisters)})
		}
	}
	d.checkTagSet(t, dev.Tags, valid, func(a, b Tag) bool { return a.Profile == "" || b.Profile == "" })
	if len(d.errs) == timingBefore {
		d.checkRates(t, &dev)
	}
	t.done()
	ok.endpoint = addrOK && unitOK
	return dev, ok
}

// checkRates refuses a tag interval that is not a multiple of its device's,
// a device none of whose tags is polled at its own interval, and more rates
// than edge keeps apart.
func (d *decoder) checkRates(t *table, dev *Device) {
	rates := map[time.Duration]bool{}
	base := false
	for _, tag := range dev.Tags {
		iv := tag.Interval
		if iv == 0 || iv == dev.Interval {
			base = true
			continue
		}
		if iv < dev.Interval || iv%dev.Interval != 0 {
			d.errs = append(d.errs, &Error{File: d.file, Line: tag.Line, Device: dev.Name, Tag: tag.Name,
				Msg: fmt.Sprintf("interval %v is not a multiple of the device's interval %v", iv, dev.Interval)})
			continue
		}
		rates[iv] = true
	}
	switch {
	case len(dev.Tags) > 0 && !base:
		t.errf("interval", "no tag is polled at the device's interval %v: set it to the fastest tag's", dev.Interval)
	case len(rates)+1 > LimitRates:
		t.errf("interval", "%d poll rates among the tags, more than %d", len(rates)+1, LimitRates)
	}
}

func (d *decoder) serial(t *table) Serial {
	s := Serial{
		Baud:     int(t.intIn("baud", DefaultBaud, 1, 4_000_000)),
		DataBits: int(t.intIn("data_bits", DefaultDataBits, 5, 8)),
		Parity:   t.oneOf("parity", DefaultParity, "N", "E", "O"),
		StopBits: int(t.intIn("stop_bits", DefaultStopBits, 1, 2)),
		RS485:    t.boolean("rs485", false),
	}
	s.RS485DelayRTSBeforeSend = t.positive("rs485_delay_rts_before_send", 0, true)
	s.RS485DelayRTSAfterSend = t.positive("rs485_delay_rts_after_send", 0, true)
	t.done()
	return s
}
