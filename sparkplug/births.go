package sparkplug

// Births, DDATA, device liveness (DDEATH and rebirth) and NDATA.

import (
	"context"
	"time"

	"edgegw/ringstore"
	"edgegw/stats"
)

// firstValues returns the latest values once every tag has one, or after
// two intervals of the slowest device (at most 5 s), so that the first
// DBIRTHs carry values rather than nulls.
func (s *sess) firstValues(ctx context.Context) *ringstore.Snapshot {
	var limit time.Duration
	want := 0
	for _, d := range s.n.devs {
		limit = max(limit, 2*d.Interval)
		want += len(d.tags)
	}
	deadline := time.NewTimer(min(limit, 5*time.Second))
	defer deadline.Stop()
	for {
		wake := s.n.cfg.Queue.Wait()
		snap := s.n.cfg.Latest()
		have := 0
		for i := range snap.Latest {
			if s.n.tags[aliasKey{snap.Latest[i].Device, snap.Latest[i].Tag}] != nil {
				have++
			}
		}
		if have >= want {
			return snap
		}
		select {
		case <-ctx.Done():
			return snap
		case <-deadline.C:
			return snap
		case <-wake:
		}
	}
}

// nodeMetrics are the NBIRTH metrics after bdSeq and Rebirth.
func (s *sess) nodeMetrics() []Metric {
	n := s.n
	up := stats.UpstreamSnapshot{Path: stats.PathOff}
	if n.cfg.Upstream != nil {
		up = n.cfg.Upstream.Snapshot()
	}
	backlog := n.cfg.Queue.Stats()
	str := func(name string, alias uint64, v string) Metric {
		return Metric{Name: name, HasName: true, Alias: alias, HasAlias: true, Datatype: TypeString, Value: Value{Kind: KindString, S: v}}
	}
	u64 := func(name string, alias uint64, v uint64) Metric {
		return Metric{Name: name, HasName: true, Alias: alias, HasAlias: true, Datatype: TypeUInt64, Value: Value{Kind: KindLong, U: v}}
	}
	return []Metric{
		str(MetricVersion, aliasVersion, n.cfg.Version),
		u64(MetricUptime, aliasUptime, uint64(time.Since(n.start)/time.Second)),
		str(MetricUpstream, aliasUpstream, up.Path),
		u64(MetricQueueDepth, aliasQueueDepth, uint64(max(up.QueueSamples, 0))),
		u64(MetricBacklog, aliasBacklog, uint64(max(backlog.Samples, 0))),
		u64(MetricCmdsRefused, aliasCmdsRefused, n.refused.Load()),
		{Name: MetricWritesOn, HasName: true, Alias: aliasWritesEnabled, HasAlias: true, Datatype: TypeBoolean, Value: Value{Kind: KindBool, B: n.cfg.Writes && n.cfg.Writer != nil}},
	}
}

// births publishes NBIRTH (seq 0) and a DBIRTH per device with the
// current values. At the start of a session every device is born (the
// replay may hold its samples); a rebirth leaves dead devices dead.
func (s *sess) births(snap *ringstore.Snapshot, all bool) {
	n := s.n
	s.seq = 0
	ts := nowMS()
	ms := []Metric{
		{Name: MetricBdSeq, HasName: true, Timestamp: ts, HasTimestamp: true, Datatype: TypeInt64, Value: Value{Kind: KindLong, U: s.bdSeq}},
		{Name: MetricRebirth, HasName: true, Alias: aliasRebirth, HasAlias: true, Timestamp: ts, HasTimestamp: true, Datatype: TypeBoolean, Value: Value{Kind: KindBool}},
	}
	nm := s.nodeMetrics()
	s.nodeLast = map[uint64]Value{}
	for i := range nm {
		nm[i].Timestamp, nm[i].HasTimestamp = ts, true
		s.nodeLast[nm[i].Alias] = nm[i].Value
	}
	s.publish(n.Topic("NBIRTH", ""), &Payload{Metrics: append(ms, nm...)}, 0)
	latest := map[aliasKey]*ringstore.Sample{}
	for i := range snap.Latest {
		x := &snap.Latest[i]
		latest[aliasKey{x.Device, x.Tag}] = x
	}
	if all {
		clear(s.dead)
	}
	for i := range n.devs {
		if !s.dead[n.devs[i].Name] {
			s.dbirth(&n.devs[i], latest)
		}
	}
	s.log.Info("sparkplug: births published", "devices", len(n.devs))
}

func (s *sess) dbirth(d *devInfo, latest map[aliasKey]*ringstore.Sample) {
	ms := make([]Metric, 0, len(d.tags))
	now := nowMS()
	for _, t := range d.tags {
		m := Metric{Name: t.Name, HasName: true, Alias: t.alias, HasAlias: true, Timestamp: now, HasTimestamp: true, Datatype: t.datatype}
		q, code := ringstore.Error, int32(QualityBad) // not read yet
		if x := latest[aliasKey{d.Name, t.Name}]; x != nil {
			q, code = x.Quality, qualityCode(x.Quality)
			m.Timestamp = uint64(x.TS / 1000)
			if q == ringstore.Good {
				m.Value = sampleValue(t.datatype, x)
			}
			s.last[t.alias] = lastVal{v: x.Value, s: sampleText(x), q: q}
		} else {
			delete(s.last, t.alias)
		}
		m.IsNull = q != ringstore.Good
		if t.Unit != "" {
			m.Props = append(m.Props, Property{Key: "engUnit", Type: TypeString, Value: Value{Kind: KindString, S: t.Unit}})
		}
		if t.Min != nil {
			m.Props = append(m.Props, Property{Key: "engLow", Type: TypeDouble, Value: Value{Kind: KindDouble, F64: *t.Min}})
		}
		if t.Max != nil {
			m.Props = append(m.Props, Property{Key: "engHigh", Type: TypeDouble, Value: Value{Kind: KindDouble, F64: *t.Max}})
		}
		m.Props = append(m.Props,
			Property{Key: "Quality", Type: TypeInt32, Value: Value{Kind: KindInt, U: uint64(uint32(code))}},
			Property{Key: "writable", Type: TypeBoolean, Value: Value{Kind: KindBool, B: t.Writable}})
		ms = append(ms, m)
	}
	s.publish(s.n.Topic("DBIRTH", d.Name), &Payload{Metrics: ms}, 0)
}

// data publishes the samples (queue order) as DDATA, one message per poll
// of one device, and returns the last seq handled. Historical samples
// (seq <= liveMark: stored while no host or no broker was there) are all
// sent, flagged is_historical; live ones only when value or quality
// changed. A timeout or error is is_null with a Quality property.
func (s *sess) data(buf []ringstore.Sample) uint64 {
	n := s.n
	var last uint64
	for i := 0; i < len(buf); {
		j := i + 1
		for j < len(buf) && buf[j].Device == buf[i].Device && buf[j].TS == buf[i].TS {
			j++
		}
		poll := buf[i:j]
		last = poll[len(poll)-1].Seq
		i = j
		di, ok := n.byName[poll[0].Device]
		if !ok {
			n.unknown.Add(uint64(len(poll)))
			s.ackOnly(last)
			continue
		}
		d := &n.devs[di]
		historical := last <= s.liveMark
		if !historical && s.dead[d.Name] {
			if !s.alive(d) {
				s.ackOnly(last) // still dead: its samples are nulls, the DDEATH said it
				continue
			}
			s.rebirthDevice(d)
		}
		var ms []Metric
		for k := range poll {
			x := &poll[k]
			t := n.tags[aliasKey{x.Device, x.Tag}]
			if t == nil {
				n.unknown.Add(1)
				continue
			}
			prev, seen := s.last[t.alias]
			if !historical && seen && prev.q == x.Quality && (x.Quality != ringstore.Good || prev.v == x.Value && prev.s == sampleText(x)) {
				continue
			}
			m := Metric{Alias: t.alias, HasAlias: true, Timestamp: uint64(x.TS / 1000), HasTimestamp: true,
				IsHistorical: historical, IsNull: x.Quality != ringstore.Good}
			if !m.IsNull {
				m.Value = sampleValue(t.datatype, x)
			}
			if !seen || prev.q != x.Quality {
				m.Props = []Property{{Key: "Quality", Type: TypeInt32, Value: Value{Kind: KindInt, U: uint64(uint32(qualityCode(x.Quality)))}}}
			}
			if !historical {
				s.last[t.alias] = lastVal{v: x.Value, s: sampleText(x), q: x.Quality}
			}
			ms = append(ms, m)
		}
		if len(ms) == 0 {
			s.ackOnly(last) // nothing changed
			continue
		}
		s.publish(n.Topic("DDATA", d.Name), &Payload{Metrics: ms}, last)
	}
	return last
}

// ackOnly acknowledges samples that need no message, in order with the
// messages before them.
func (s *sess) ackOnly(last uint64) {
	s.inflight = append(s.inflight, pub{tok: doneToken{}, last: last})
}

func (s *sess) rebirthDevice(d *devInfo) {
	delete(s.dead, d.Name)
	latest := map[aliasKey]*ringstore.Sample{}
	snap := s.n.cfg.Latest()
	for i := range snap.Latest {
		if x := &snap.Latest[i]; x.Device == d.Name {
			latest[aliasKey{x.Device, x.Tag}] = x
		}
	}
	s.log.Info("sparkplug: device back: DBIRTH", "device", d.Name)
	s.dbirth(d, latest)
}

// alive reads the device's health record: dead once demoted (3 polls
// without an answer) or without a good poll for 3 intervals. The records
// are looked up by refreshHealth.
func (s *sess) alive(d *devInfo) bool {
	st := s.health[d.Name]
	if st == nil {
		return true
	}
	if st.Demoted.Load() {
		return false
	}
	iv := d.Interval
	if iv <= 0 {
		iv = time.Second
	}
	if st.Polls.Load() > 0 {
		lg := st.LastGoodUS.Load()
		if lg == 0 || time.Since(time.UnixMicro(lg)) > 3*iv {
			return false
		}
	}
	return true
}

// refreshHealth looks up the devices' health records (a reload may have
// replaced them).
func (s *sess) refreshHealth() {
	if s.n.cfg.Stats == nil {
		return
	}
	clear(s.health)
	for _, e := range s.n.cfg.Stats() {
		if _, ok := s.n.byName[e.Info.Name]; ok && e.Stats != nil {
			s.health[e.Info.Name] = e.Stats
		}
	}
}

// checkDevices publishes DDEATH for devices gone down and DBIRTH for
// devices back up.
func (s *sess) checkDevices() {
	s.refreshHealth()
	for i := range s.n.devs {
		d := &s.n.devs[i]
		alive := s.alive(d)
		switch {
		case !alive && !s.dead[d.Name]:
			s.dead[d.Name] = true
			s.log.Warn("sparkplug: device down: DDEATH", "device", d.Name)
			s.publish(s.n.Topic("DDEATH", d.Name), &Payload{}, 0)
		case alive && s.dead[d.Name]:
			s.rebirthDevice(d)
		}
	}
}

// nodeData publishes the gateway metrics that changed as NDATA.
func (s *sess) nodeData() {
	ts := nowMS()
	var ms []Metric
	for _, m := range s.nodeMetrics() {
		if prev, ok := s.nodeLast[m.Alias]; ok && sameValue(prev, m.Value) {
			continue
		}
		s.nodeLast[m.Alias] = m.Value
		ms = append(ms, Metric{Alias: m.Alias, HasAlias: true, Timestamp: ts, HasTimestamp: true, Value: m.Value})
	}
	if len(ms) > 0 {
		s.publish(s.n.Topic("NDATA", ""), &Payload{Metrics: ms}, 0)
	}
}
