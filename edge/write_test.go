package edge

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"edgegw/edge/modbus"
	"edgegw/internal/testenv"
	"edgegw/lab/sim"
)

func fptr(v float64) *float64 { return &v }

// tctx bounds a test's writes: a write that is never served fails the test
// instead of hanging it.
func tctx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// runWritable runs s and waits until it takes writes.
func runWritable(t *testing.T, s *Scheduler) (stop func()) {
	t.Helper()
	stop = runSched(t, s)
	waitFor(t, 5*time.Second, "the scheduler to take writes", func() bool {
		s.wr.mu.RLock()
		defer s.wr.mu.RUnlock()
		return s.wr.running
	})
	return stop
}

// writeTags covers every way a write goes on the wire.
func writeTags() []Tag {
	return []Tag{
		{Name: "setpoint", Register: Holding, Address: 10, Type: Int16, Scale: 0.1, Writable: true, Min: fptr(5), Max: fptr(90)},
		{Name: "count", Register: Holding, Address: 11, Type: Int16, Writable: true},
		{Name: "f32", Register: Holding, Address: 20, Type: Float32, Order: CDAB, Writable: true},
		{Name: "u32", Register: Holding, Address: 30, Type: Uint32, Writable: true},
		{Name: "i64", Register: Holding, Address: 32, Type: Int64, Order: DCBA, Offset: -1000, Writable: true},
		{Name: "bit3", Register: Holding, Address: 40, Type: Bool, Bit: 3, Writable: true},
		{Name: "bit4", Register: Holding, Address: 40, Type: Bool, Bit: 4, Writable: true},
		{Name: "pump", Register: Coil, Address: 5, Type: Bool, Writable: true},
		{Name: "ro", Register: Holding, Address: 50, Type: Uint16},
		{Name: "rh", Register: Input, Address: 1, Type: Uint16, Writable: true},
		{Name: "half", Register: Holding, Address: 60, Type: Float16, Scale: 1, Writable: true},
		{Name: "byte", Register: Holding, Address: 61, Type: Uint8Low, Scale: 1, Writable: true},
	}
}

func wantKind(t *testing.T, err error, kind string) *WriteError {
	t.Helper()
	var we *WriteError
	if !errors.As(err, &we) {
		t.Fatalf("error %v (%T): want a *WriteError of kind %q", err, err, kind)
	}
	if we.Kind != kind || we.WriteErrorKind() != kind {
		t.Fatalf("kind %q (%v), want %q", we.Kind, err, kind)
	}
	if !strings.HasPrefix(err.Error(), "edge: write ") {
		t.Errorf("message %q", err)
	}
	return we
}

// Allowed writes over Modbus TCP, each confirmed by the scheduler's read-back
// and by an independent look into the simulated logger's bank.
func TestWriteTCPAllowed(t *testing.T) {
	f := startFleet(t, sim.Config{Devices: 1, Transport: "tcp"})
	l := f.Logger(0)
	l.SetHolding(40, 0x00f0)
	var logs testenv.Buffer
	s, err := New(Config{Logger: slog.New(slog.NewTextHandler(&logs, nil)),
		Devices: []DeviceConfig{devCfg("plc", TransportTCP, f.Addr(0), 50*time.Millisecond, time.Second, writeTags())}})
	if err != nil {
		t.Fatal(err)
	}
	runWritable(t, s)
	ctx := tctx(t)
	cases := []struct {
		tag   string
		v     float64
		addr  uint16
		words []uint16 // bank after the write
	}{
		{"setpoint", 21.7, 10, []uint16{217}},
		{"setpoint", 5, 10, []uint16{50}},
		{"count", -2, 11, []uint16{0xfffe}},
		{"f32", 21.5, 20, []uint16{0x0000, 0x41ac}},
		{"u32", 0x12345678, 30, []uint16{0x1234, 0x5678}},
		{"i64", 0, 32, []uint16{0xe803, 0, 0, 0}}, // raw 1000, DCBA
		{"bit3", 1, 40, []uint16{0x00f8}},
		{"bit4", 0, 40, []uint16{0x00e8}},
		{"bit3", 0, 40, []uint16{0x00e0}},
		{"half", 21.5, 60, []uint16{0x4d60}},
		{"half", -2, 60, []uint16{0xc000}},
	}
	for _, c := range cases {
		res, err := s.Write(ctx, WriteRequest{Device: "plc", Tag: c.tag, Value: c.v, Origin: "test"})
		if err != nil {
			t.Fatalf("%s = %v: %v", c.tag, c.v, err)
		}
		if res.Written != c.v || math.Abs(res.ReadBack-c.v) > 1e-9 || res.Duration <= 0 || res.Device != "plc" || res.Tag != c.tag {
			t.Errorf("%s = %v: result %+v", c.tag, c.v, res)
		}
		if got := l.Holding(c.addr, len(c.words)); fmt.Sprint(got) != fmt.Sprint(c.words) {
			t.Errorf("%s = %v: bank %#04x, want %#04x", c.tag, c.v, got, c.words)
		}
	}
	for _, v := range []float64{1, 0, 1} {
		if _, err := s.Write(ctx, WriteRequest{Device: "plc", Tag: "pump", Value: v, Origin: "test"}); err != nil {
			t.Fatal(err)
		}
		if got := l.Coils(5, 1)[0]; got != (v == 1) {
			t.Errorf("pump = %v: coil %v", v, got)
		}
	}
	if _, err := s.Write(ctx, WriteRequest{Device: "plc", Tag: "ro", Value: 1, Origin: "http 10.0.0.5"}); err == nil {
		t.Fatal("read-only tag written")
	}
	out := logs.String()
	for _, want := range []string{
		`level=INFO msg=write device=plc origin=test tag=setpoint value=21.7 result=ok read_back=21.7 duration=`,
		`level=INFO msg=write origin="http 10.0.0.5" device=plc tag=ro value=1 result="not writable" duration=0s err=`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("log lacks %q:\n%s", want, out)
		}
	}
}

// Refused writes never reach the wire and say why.
func TestWriteRefused(t *testing.T) {
	f := startFleet(t, sim.Config{Devices: 1, Transport: "tcp"})
	s, err := New(Config{Devices: []DeviceConfig{devCfg("plc", TransportTCP, f.Addr(0), time.Hour, time.Second, writeTags())}})
	if err != nil {
		t.Fatal(err)
	}
	runWritable(t, s)
	waitFor(t, 5*time.Second, "the first poll", func() bool { return s.devices[0].stats.Polls.Load() == 1 })
	before := f.Logger(0).Counters().Requests
	cases := []struct {
		dev, tag string
		v        float64
		kind     string
		msg      string
	}{
		{"nope", "setpoint", 1, WriteUnknownDevice, "no such device"},
		{"plc", "nope", 1, WriteUnknownTag, "no such tag"},
		{"plc", "ro", 1, WriteNotWritable, "not marked writable"},
		{"plc", "rh", 1, WriteNotWritable, "input registers are read-only"},
		{"plc", "setpoint", 95, WriteOutOfRange, "above max 90"},
		{"plc", "setpoint", 4.9, WriteOutOfRange, "below min 5"},
		{"plc", "setpoint", 21.75, WriteOutOfRange, "not a whole number"},
		{"plc", "count", 1.5, WriteOutOfRange, "not a whole number: wrong type for int16"},
		{"plc", "count", 40000, WriteOutOfRange, "outside"},
		{"plc", "u32", -1, WriteOutOfRange, "outside"},
		{"plc", "i64", math.Ldexp(1, 63), WriteOutOfRange, "does not fit int64"},
		{"plc", "f32", 1e39, WriteOutOfRange, "float32"},
		{"plc", "f32", math.NaN(), WriteOutOfRange, "not a finite number"},
		{"plc", "bit3", 2, WriteOutOfRange, "0 or 1"},
		{"plc", "pump", 0.5, WriteOutOfRange, "0 or 1"},
		{"plc", "half", 70000, WriteOutOfRange, "does not fit a float16"},
		{"plc", "byte", 1, WriteNotWritable, "a uint8_low tag cannot be written"},
	}
	for _, c := range cases {
		_, err := s.Write(tctx(t), WriteRequest{Device: c.dev, Tag: c.tag, Value: c.v, Origin: "test"})
		we := wantKind(t, err, c.kind)
		if !strings.Contains(we.Msg, c.msg) || !strings.Contains(we.Msg, fmt.Sprintf("%q/%q", c.dev, c.tag)) {
			t.Errorf("%s/%s = %v: message %q lacks %q", c.dev, c.tag, c.v, we.Msg, c.msg)
		}
	}
	if n := f.Logger(0).Counters().Requests; n != before {
		t.Errorf("refused writes sent %d requests", n-before)
	}
}

// Writes outside Run are "stopped"; a full queue is "busy" at once; a
// caller that gives up before the bus starts its write gets ctx's error and
// the write never happens.
func TestWriteStoppedBusyCancelled(t *testing.T) {
	f := startFleet(t, sim.Config{Devices: 1, Transport: "tcp"})
	s, err := New(Config{Devices: []DeviceConfig{devCfg("plc", TransportTCP, f.Addr(0), time.Hour, time.Second, writeTags())}})
	if err != nil {
		t.Fatal(err)
	}
	req := WriteRequest{Device: "plc", Tag: "count", Value: 7, Origin: "test"}
	_, err = s.Write(tctx(t), req)
	wantKind(t, err, WriteStopped)

	// Let writes in with no bus goroutine to take them: the queue fills.
	s.startWrites()
	ctx, cancel := context.WithCancel(context.Background())
	errs := make(chan error, WriteQueue)
	for range WriteQueue {
		go func() { _, err := s.Write(ctx, req); errs <- err }()
	}
	waitFor(t, 5*time.Second, "a full queue", func() bool { return len(s.buses[0].wr.queue) == WriteQueue })
	_, err = s.Write(tctx(t), req)
	wantKind(t, err, WriteBusy)
	cancel()
	for range WriteQueue {
		if err := testenv.Recv(t, errs, 10*time.Second, "a cancelled write to return"); !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "not started") {
			t.Errorf("cancelled write: %v", err)
		}
	}
	s.stopWrites() // drains the cancelled jobs without doing them
	if n := len(s.buses[0].wr.queue); n != 0 {
		t.Errorf("%d jobs left in the queue", n)
	}
	if n := f.Logger(0).Counters().Requests; n != 0 {
		t.Errorf("cancelled writes sent %d requests", n)
	}

	// Queued when Run ends: answered "stopped", not left hanging.
	s.startWrites()
	done := make(chan error, 1)
	go func() { _, err := s.Write(tctx(t), req); done <- err }()
	waitFor(t, 5*time.Second, "a queued write", func() bool { return len(s.buses[0].wr.queue) == 1 })
	s.stopWrites()
	wantKind(t, testenv.Recv(t, done, 10*time.Second, "the write queued when writes stopped to return"), WriteStopped)

	stop := runWritable(t, s)
	if _, err := s.Write(tctx(t), req); err != nil {
		t.Fatalf("write while running: %v", err)
	}
	stop()
	_, err = s.Write(tctx(t), req)
	wantKind(t, err, WriteStopped)
}

// udpAndTCPAt runs a UDP logger and a TCP logger on the same address and
// port (two banks: the test sees which one a request went to).
func udpAndTCPAt(t *testing.T) (udp, tcp *sim.Logger, addr string) {
	t.Helper()
	fu := startFleet(t, sim.Config{Devices: 1, Transport: "udp"})
	ap := netip.MustParseAddrPort(fu.Addr(0))
	ft, err := sim.NewFleet(sim.Config{Devices: 1, Transport: "tcp", Port: int(ap.Port())})
	if err != nil {
		t.Skipf("tcp port %d taken on %v: %v", ap.Port(), ap.Addr(), err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- ft.Run(ctx) }()
	t.Cleanup(func() { cancel(); testenv.Closed(t, done, stopLimit, "the tcp simulator to stop") })
	if ft.Addr(0) != fu.Addr(0) {
		t.Fatalf("tcp %s, udp %s", ft.Addr(0), fu.Addr(0))
	}
	return fu.Logger(0), ft.Logger(0), fu.Addr(0)
}

// A device polled over UDP writes over TCP to the same host:port and reads
// back over UDP (the poll transport): with two different banks behind the
// two transports the read-back disagrees, which is reported as a mismatch
// with both values; with equal banks the write is confirmed.
func TestWriteUDPDeviceWritesOverTCP(t *testing.T) {
	lu, lt, addr := udpAndTCPAt(t)
	lu.SetHolding(10, 100)
	dc := devCfg("u", TransportUDP, addr, time.Hour, 500*time.Millisecond, writeTags())
	s, err := New(Config{Devices: []DeviceConfig{dc}, UDPListen: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	baseFD := openFDs(t)
	stop := runWritable(t, s)
	udpBefore := lu.Counters().Requests
	res, err := s.Write(tctx(t), WriteRequest{Device: "u", Tag: "setpoint", Value: 21.7, Origin: "test"})
	we := wantKind(t, err, WriteMismatch)
	if !strings.Contains(we.Msg, "wrote 21.7, read back 10") || res.ReadBack != 10 || res.Written != 21.7 {
		t.Errorf("mismatch: %v, result %+v", err, res)
	}
	if got := lt.Holding(10, 1)[0]; got != 217 {
		t.Errorf("tcp bank %d, want 217: the write did not go over tcp", got)
	}
	if got := lu.Holding(10, 1)[0]; got != 100 {
		t.Errorf("udp bank %d changed", got)
	}
	if lt.Counters().Requests != 1 || lu.Counters().Requests-udpBefore < 1 {
		t.Errorf("requests: tcp %d (want the write), udp %d more (want the read-back)", lt.Counters().Requests, lu.Counters().Requests-udpBefore)
	}
	lu.SetHolding(10, 300)
	if res, err := s.Write(tctx(t), WriteRequest{Device: "u", Tag: "setpoint", Value: 30, Origin: "test"}); err != nil || res.ReadBack != 30 {
		t.Fatalf("confirmed write: %+v %v", res, err)
	}
	if lt.Holding(10, 1)[0] != 300 || lt.Counters().Requests != 2 {
		t.Errorf("second write: tcp bank %d, %d tcp requests (one connection reused)", lt.Holding(10, 1)[0], lt.Counters().Requests)
	}
	// Run's end closes the write connection (and the sim's end of it follows).
	// Checked at once: a leaked connection would also be closed later by
	// its finalizer. The sim's end may lag by one descriptor.
	stop()
	if n := openFDs(t); n > baseFD+1 {
		t.Errorf("%d descriptors open after Run, %d before: the write connection was not closed", n, baseFD)
	}
	waitFor(t, 5*time.Second, "descriptors back to baseline", func() bool { return openFDs(t) <= baseFD })
}

// With write_transport = "udp" the write goes over the UDP socket.
func TestWriteUDPDeviceWritesOverUDP(t *testing.T) {
	lu, lt, addr := udpAndTCPAt(t)
	dc := devCfg("u", TransportUDP, addr, time.Hour, 500*time.Millisecond, writeTags())
	dc.WriteTransport = TransportUDP
	s, err := New(Config{Devices: []DeviceConfig{dc}, UDPListen: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	runWritable(t, s)
	for _, v := range []float64{12.3, 45.6} {
		res, err := s.Write(tctx(t), WriteRequest{Device: "u", Tag: "setpoint", Value: v, Origin: "test"})
		if err != nil || res.ReadBack != v {
			t.Fatalf("write %v: %+v %v", v, res, err)
		}
		if got := lu.Holding(10, 1)[0]; got != uint16(math.Round(v*10)) {
			t.Errorf("udp bank %d", got)
		}
	}
	if n := lt.Counters().Requests; n != 0 {
		t.Errorf("%d requests over tcp", n)
	}
}

// A device error is reported as such, with the cause unwrappable.
func TestWriteDeviceError(t *testing.T) {
	f := startFleet(t, sim.Config{Devices: 1, Transport: "tcp"})
	s, err := New(Config{Devices: []DeviceConfig{devCfg("plc", TransportTCP, f.Addr(0), time.Hour, 100*time.Millisecond, writeTags())}})
	if err != nil {
		t.Fatal(err)
	}
	runWritable(t, s)
	f.Logger(0).SetFaults(sim.Faults{Exception: 1})
	_, err = s.Write(tctx(t), WriteRequest{Device: "plc", Tag: "count", Value: 3, Origin: "test"})
	wantKind(t, err, WriteDevice)
	if code, ok := modbus.IsException(err); !ok || code != 4 {
		t.Errorf("cause: %v", err)
	}
	f.Logger(0).SetFaults(sim.Faults{DropResponse: 1})
	_, err = s.Write(tctx(t), WriteRequest{Device: "plc", Tag: "count", Value: 3, Origin: "test"})
	wantKind(t, err, WriteDevice)
	if !errors.Is(err, modbus.ErrTimeout) {
		t.Errorf("cause: %v", err)
	}
}

// 200 writes from several goroutines to two units on one RTU line while
// both are polled at a short interval: every write is confirmed, no frame
// error or timeout anywhere, every poll valid (writes are serialized with
// polls by the bus goroutine).
func TestWriteSerializedWithPollingOnRTU(t *testing.T) {
	ptyA, ptyB := testenv.PTYPair(t)
	bus := startRTUBus(t, sim.RTUConfig{Path: ptyB, Baud: 115200, Units: []uint8{1, 2}})
	tags := []Tag{
		{Name: "a", Register: Holding, Address: 0, Type: Uint16, Writable: true},
		{Name: "b", Register: Holding, Address: 2, Type: Float32, Writable: true},
		{Name: "t", Register: Holding, Address: 100, Type: Int16, Scale: 0.1},
	}
	var devs []DeviceConfig
	for u := uint8(1); u <= 2; u++ {
		dc := devCfg(fmt.Sprintf("unit%d", u), TransportRTU, ptyA, 60*time.Millisecond, 200*time.Millisecond, tags)
		dc.Unit = u
		dc.Serial = modbus.SerialConfig{Baud: 115200}
		devs = append(devs, dc)
	}
	ring := newRing(t, 1000)
	s, err := New(Config{Sink: ring, Devices: devs})
	if err != nil {
		t.Fatal(err)
	}
	stop := runWritable(t, s)
	waitFor(t, 5*time.Second, "first polls", func() bool {
		return s.devices[0].stats.GoodPolls.Load() > 0 && s.devices[1].stats.GoodPolls.Load() > 0
	})
	const writers, each = 4, 50
	var wg sync.WaitGroup
	errs := make(chan error, writers*each)
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				dev := fmt.Sprintf("unit%d", 1+(w+i)%2)
				tag, v := "a", float64(w*1000+i)
				if w%2 == 1 {
					tag, v = "b", float64(w)+float64(i)/4
				}
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				res, err := s.Write(ctx, WriteRequest{Device: dev, Tag: tag, Value: v, Origin: fmt.Sprintf("writer %d", w)})
				cancel()
				if err != nil {
					errs <- err
					continue
				}
				if res.ReadBack != v {
					errs <- fmt.Errorf("%s/%s = %v read back %v", dev, tag, v, res.ReadBack)
				}
			}
		}()
	}
	testenv.Wait(t, 2*time.Minute, "the writers to finish", wg.Wait)
	close(errs)
	// A collision on the line is garbage or a bad CRC at the bus, or an
	// exception (all checked); a write or read-back that timed out (200 ms)
	// is a loaded machine, and so is a frame error after a timeout (the late
	// reply taken for the next one's): logged and bounded, most writes must
	// go through.
	var timedOut, spoilt int
	var fe *modbus.FrameError
	for err := range errs {
		switch {
		case errors.Is(err, modbus.ErrTimeout):
			timedOut++
			t.Log(err)
		case errors.As(err, &fe):
			spoilt++
			t.Log(err)
		default:
			t.Error(err)
		}
	}
	if 4*(timedOut+spoilt) > writers*each {
		t.Errorf("%d of %d writes timed out, %d spoilt", timedOut, writers*each, spoilt)
	}
	timedOut += spoilt // below: a write may be missing
	// a few more polls after the writes, then stop and check the record
	p0, p1 := s.devices[0].stats.Polls.Load(), s.devices[1].stats.Polls.Load()
	waitFor(t, 5*time.Second, "polls after the writes", func() bool {
		return s.devices[0].stats.Polls.Load() > p0+2 && s.devices[1].stats.Polls.Load() > p1+2
	})
	stop()
	for _, d := range s.devices {
		sn := d.stats.Snapshot()
		t.Logf("%s: polls %d good %d requests %d timeouts %d errors %d overruns %d", d.cfg.Name, sn.Polls, sn.GoodPolls, sn.Requests, sn.Timeouts, sn.Errors, sn.Overruns)
		// A collision on the line shows as garbage or a bad CRC at the bus
		// (checked below), or as an exception; a timeout is a reply later
		// than 200 ms, which a loaded machine causes, and that late reply
		// may then spoil the next exchange (a frame error: at most one per
		// timeout); windows skipped because the machine was busy
		// (overruns) are scheduling. Those are only logged.
		if sn.Errors > sn.Timeouts+uint64(timedOut) || sn.Exceptions != 0 {
			t.Errorf("%s: timeouts %d errors %d exceptions %d", d.cfg.Name, sn.Timeouts, sn.Errors, sn.Exceptions)
		}
	}
	if bc := bus.Counters(); bc.BadCRC != 0 || bc.Garbage != 0 {
		t.Errorf("line: %+v", bc)
	}
	// Tag "a" is written by writers 0 and 2; the last of their writes to
	// unit u is i = 48 (u = 1) or i = 49 (u = 2) (when a write timed out,
	// that one may be missing: then any value of theirs).
	for u := uint8(1); u <= 2; u++ {
		got := bus.Logger(u).Holding(0, 1)[0]
		i := uint16(47 + u)
		if timedOut == 0 && got != i && got != 2000+i {
			t.Errorf("unit %d: a = %d, want %d or %d", u, got, i, 2000+i)
		}
		if w := got / 1000; (w != 0 && w != 2) || got%1000 >= each {
			t.Errorf("unit %d: a = %d, not a value written", u, got)
		}
	}
}
