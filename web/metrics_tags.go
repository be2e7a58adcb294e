package web

import (
	"math"
	"os"
	"runtime"
	"runtime/metrics"
	"strconv"
	"syscall"
	"time"

	"edgegw/ringstore"
	"edgegw/stats"
)

// The plant and the process in /metrics (appended by appendMetrics):
//
//	# TYPE edgegw_tag_value gauge
//	edgegw_tag_value{device="logger-01",tag="temperature",unit="°C"} 21.5
//	# TYPE edgegw_tag_good gauge
//	edgegw_tag_good{device="logger-01",tag="temperature"} 1
//	# TYPE edgegw_tag_sample_age_seconds gauge
//	edgegw_tag_sample_age_seconds{device="logger-01",tag="temperature"} 0.42
//	# TYPE edgegw_tag_info gauge
//	edgegw_tag_info{device="plc",tag="serial",value="SN-4711"} 1
//	process_cpu_seconds_total 12.5   (and the other process_* and go_* figures)
//
// edgegw_tag_value is the latest good value of every numeric tag (bool as
// 0/1); a tag whose latest sample is not good has no value series, so
// Prometheus marks it stale instead of charting a made-up number, and
// edgegw_tag_good says 0. String tags give edgegw_tag_info (the text as a
// label, value 1) while good. Written by hand like the rest: client_golang's
// registry, process and Go collectors add about 2.1 MB to the armv7 binary
// (measured), the figures below take a few hundred bytes of code.

// processStart is when this package was initialised: within milliseconds
// of the process start, without parsing /proc/self/stat against CLK_TCK.
var processStart = time.Now()

// appendTagMetrics writes the tag families from the ring's latest samples;
// units come from devs (sorted by name, as s.devices returns them).
func (s *Server) appendTagMetrics(p *promWriter, devs []deviceSnap, now time.Time) {
	snap := s.cfg.Ring.Snapshot()
	if snap == nil {
		return
	}
	latest := snap.Latest
	nowUS := now.UnixMicro()
	unit := stats.UnitIndex(len(devs), func(i int) *stats.Info { return &devs[i].info })
	numeric := func(x *ringstore.Sample) bool { return x.Kind != ringstore.KindString }

	p.family("edgegw_tag_value", "gauge", "Latest good value of each numeric tag (bool 0/1), scaled, in its unit; absent while the tag is not good.")
	for i := range latest {
		x := &latest[i]
		if numeric(x) && x.EffectiveQuality() == ringstore.Good {
			v := x.Value
			if x.Kind == ringstore.KindFloat32 {
				v = float32Decimal(v)
			}
			p.sample("edgegw_tag_value", v, "device", x.Device, "tag", x.Tag, "unit", unit(x.Device, x.Tag))
		}
	}
	p.family("edgegw_tag_good", "gauge", "1 when the tag's latest sample has quality good; 0 for timeout, error or stale.")
	for i := range latest {
		x := &latest[i]
		p.sample("edgegw_tag_good", b2f(x.EffectiveQuality() == ringstore.Good), "device", x.Device, "tag", x.Tag)
	}
	p.family("edgegw_tag_sample_age_seconds", "gauge", "Seconds since the tag's latest sample was acquired.")
	for i := range latest {
		x := &latest[i]
		p.sample("edgegw_tag_sample_age_seconds", float64(max(nowUS-x.TS, 0))/1e6, "device", x.Device, "tag", x.Tag)
	}
	p.family("edgegw_tag_info", "gauge", "Latest good text of each string tag as the value label; always 1.")
	for i := range latest {
		x := &latest[i]
		if !numeric(x) && x.EffectiveQuality() == ringstore.Good && x.Text != nil {
			p.sample("edgegw_tag_info", 1, "device", x.Device, "tag", x.Tag, "value", *x.Text)
		}
	}
}

// float32Decimal is the float64 of a float32 value's shortest decimal, so a
// float32 register holding 123.456 is charted as 123.456, as in the JSON,
// not 123.45600128173828.
func float32Decimal(v float64) float64 {
	if math.IsInf(float64(float32(v)), 0) {
		return v
	}
	var buf [32]byte
	f, err := strconv.ParseFloat(string(strconv.AppendFloat(buf[:0], v, 'g', -1, 32)), 64)
	if err != nil {
		return v
	}
	return f
}

// runtimeSamples are read with runtime/metrics: no stop-the-world, unlike
// runtime.ReadMemStats.
var runtimeSamples = []struct{ key, name, typ, help string }{
	{"/sched/goroutines:goroutines", "go_goroutines", "gauge", "Number of goroutines that currently exist."},
	{"/sched/threads/total:threads", "go_threads", "gauge", "Number of OS threads created."},
	{"/sched/gomaxprocs:threads", "go_sched_gomaxprocs_threads", "gauge", "GOMAXPROCS."},
	{"/memory/classes/heap/objects:bytes", "go_memstats_heap_alloc_bytes", "gauge", "Bytes of allocated heap objects."},
	{"/memory/classes/total:bytes", "go_memstats_sys_bytes", "gauge", "Bytes of memory obtained from the OS."},
	{"/gc/heap/goal:bytes", "go_gc_heap_goal_bytes", "gauge", "Heap size target for the end of the GC cycle."},
	{"/gc/cycles/total:gc-cycles", "go_gc_cycles_total", "counter", "Completed GC cycles."},
	{"/cpu/classes/gc/total:cpu-seconds", "go_gc_cpu_seconds_total", "counter", "Estimated CPU time spent in the garbage collector."},
}

// appendProcessMetrics writes the standard process_* figures (as
// client_golang's process collector names them) and the Go runtime basics.
func appendProcessMetrics(p *promWriter) {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) == nil {
		p.family("process_cpu_seconds_total", "counter", "Total user and system CPU time spent in seconds.")
		p.sample("process_cpu_seconds_total", tv(ru.Utime)+tv(ru.Stime))
	}
	if rss, vsz, ok := statm(); ok {
		p.family("process_resident_memory_bytes", "gauge", "Resident memory size in bytes.")
		p.sample("process_resident_memory_bytes", rss)
		p.family("process_virtual_memory_bytes", "gauge", "Virtual memory size in bytes.")
		p.sample("process_virtual_memory_bytes", vsz)
	}
	if n, ok := openFDs(); ok {
		p.family("process_open_fds", "gauge", "Number of open file descriptors.")
		p.sample("process_open_fds", float64(n))
	}
	var lim syscall.Rlimit
	if syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim) == nil {
		p.family("process_max_fds", "gauge", "Maximum number of open file descriptors.")
		p.sample("process_max_fds", float64(lim.Cur))
	}
	p.family("process_start_time_seconds", "gauge", "Start time of the process since unix epoch in seconds.")
	p.sample("process_start_time_seconds", float64(processStart.UnixMicro())/1e6)

	p.family("go_info", "gauge", "Information about the Go environment.")
	p.sample("go_info", 1, "version", runtime.Version())
	ms := make([]metrics.Sample, len(runtimeSamples))
	for i := range runtimeSamples {
		ms[i].Name = runtimeSamples[i].key
	}
	metrics.Read(ms)
	for i, r := range runtimeSamples {
		var v float64
		switch ms[i].Value.Kind() {
		case metrics.KindUint64:
			v = float64(ms[i].Value.Uint64())
		case metrics.KindFloat64:
			v = ms[i].Value.Float64()
		default:
			continue // not in this Go version
		}
		p.family(r.name, r.typ, r.help)
		p.sample(r.name, v)
	}
}

func tv(t syscall.Timeval) float64 { return float64(t.Sec) + float64(t.Usec)/1e6 }

// statm reads resident and virtual size from /proc/self/statm (in pages).
func statm() (rss, vsz float64, ok bool) {
	b, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		return 0, 0, false
	}
	var f [2]uint64
	n := 0
	for i := 0; i < len(b) && n < 2; {
		j := i
		for j < len(b) && b[j] >= '0' && b[j] <= '9' {
			j++
		}
		if j == i {
			return 0, 0, false
		}
		f[n], err = strconv.ParseUint(string(b[i:j]), 10, 64)
		if err != nil {
			return 0, 0, false
		}
		n++
		i = j + 1
	}
	if n < 2 {
		return 0, 0, false
	}
	page := float64(os.Getpagesize())
	return float64(f[1]) * page, float64(f[0]) * page, true
}

// openFDs counts the entries of /proc/self/fd (less the one reading it).
func openFDs() (int, bool) {
	d, err := os.Open("/proc/self/fd")
	if err != nil {
		return 0, false
	}
	defer d.Close()
	names, err := d.Readdirnames(-1)
	if err != nil {
		return 0, false
	}
	return len(names) - 1, true
}
