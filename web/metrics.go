package web

import (
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"edgegw/stats"
)

// GET /metrics: Prometheus text exposition format 0.0.4, written by hand.
// Every family has a HELP and a TYPE line; label values are escaped
// (\\, \", \n); histogram buckets are cumulative and the +Inf bucket equals
// _count (both are computed from the same copy of the per-bucket counts).
//
//	# HELP edgegw_device_rtt_seconds Round trip of one Modbus request (good responses).
//	# TYPE edgegw_device_rtt_seconds histogram
//	edgegw_device_rtt_seconds_bucket{device="logger-01",le="5e-05"} 0
//	…
//	edgegw_device_rtt_seconds_bucket{device="logger-01",le="+Inf"} 3596
//	edgegw_device_rtt_seconds_sum{device="logger-01"} 1.4384
//	edgegw_device_rtt_seconds_count{device="logger-01"} 3596
//	# HELP edgegw_device_requests_total Modbus requests sent (retries included).
//	# TYPE edgegw_device_requests_total counter
//	edgegw_device_requests_total{device="logger-01"} 3600

const metricsContentType = "text/plain; version=0.0.4; charset=utf-8"

type promWriter struct{ b []byte }

func (p *promWriter) family(name, typ, help string) {
	p.b = append(p.b, "# HELP "...)
	p.b = append(p.b, name...)
	p.b = append(p.b, ' ')
	p.b = append(p.b, strings.NewReplacer(`\`, `\\`, "\n", `\n`).Replace(help)...)
	p.b = append(p.b, "\n# TYPE "...)
	p.b = append(p.b, name...)
	p.b = append(p.b, ' ')
	p.b = append(p.b, typ...)
	p.b = append(p.b, '\n')
}

// single writes a family of one sample without labels.
func (p *promWriter) single(name, typ, help string, v float64) {
	p.family(name, typ, help)
	p.sample(name, v)
}

// sample writes name{k1="v1",…} value; labels alternate name, value.
func (p *promWriter) sample(name string, v float64, labels ...string) {
	p.b = append(p.b, name...)
	if len(labels) > 0 {
		p.b = append(p.b, '{')
		for i := 0; i+1 < len(labels); i += 2 {
			if i > 0 {
				p.b = append(p.b, ',')
			}
			p.b = append(p.b, labels[i]...)
			p.b = append(p.b, `="`...)
			p.b = appendLabelValue(p.b, labels[i+1])
			p.b = append(p.b, '"')
		}
		p.b = append(p.b, '}')
	}
	p.b = append(p.b, ' ')
	p.b = appendFloat(p.b, v)
	p.b = append(p.b, '\n')
}

func appendLabelValue(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case '\\':
			b = append(b, `\\`...)
		case '"':
			b = append(b, `\"`...)
		case '\n':
			b = append(b, `\n`...)
		default:
			b = append(b, c)
		}
	}
	return b
}

func appendFloat(b []byte, v float64) []byte {
	switch {
	case math.IsInf(v, 1):
		return append(b, "+Inf"...)
	case math.IsInf(v, -1):
		return append(b, "-Inf"...)
	case math.IsNaN(v):
		return append(b, "NaN"...)
	}
	return strconv.AppendFloat(b, v, 'g', -1, 64)
}

func (p *promWriter) histogram(name, help string, devs []deviceSnap, get func(*stats.Snapshot) stats.HistogramSnapshot) {
	p.family(name, "histogram", help)
	for i := range devs {
		h := get(&devs[i].st)
		dev := devs[i].info.Name
		var cum uint64
		for j, c := range h.Counts {
			cum += c
			le := "+Inf"
			if j < len(stats.BucketBounds) {
				le = strconv.FormatFloat(stats.BucketBounds[j]/1e6, 'g', -1, 64)
			}
			p.sample(name+"_bucket", float64(cum), "device", dev, "le", le)
		}
		p.sample(name+"_sum", float64(h.SumUS)/1e6, "device", dev)
		p.sample(name+"_count", float64(cum), "device", dev)
	}
}

func (s *Server) handleMetrics(w http.ResponseWriter, r *http.Request) {
	body := s.appendMetrics(make([]byte, 0, 64<<10), time.Now())
	h := w.Header()
	h.Set("Content-Type", metricsContentType)
	h.Set("Cache-Control", "no-store")
	h.Set("Content-Length", strconv.Itoa(len(body)))
	_, _ = w.Write(body)
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// appendMetrics writes the whole exposition.
func (s *Server) appendMetrics(b []byte, now time.Time) []byte {
	p := &promWriter{b: b}
	devs := s.devices()

	p.family("edgegw_build_info", "gauge", "Gateway identity; the value is always 1.")
	p.sample("edgegw_build_info", 1, "gateway", s.cfg.GatewayID, "version", s.cfg.Version)
	p.single("edgegw_uptime_seconds", "gauge", "Seconds since the web server was built.", now.Sub(s.started).Seconds())
	p.single("edgegw_ring_sequence", "gauge", "Last sequence number appended to the ring.", float64(s.cfg.Ring.Snapshot().Seq))

	p.histogram("edgegw_device_rtt_seconds", "Round trip of one Modbus request (good responses).", devs,
		func(st *stats.Snapshot) stats.HistogramSnapshot { return st.RTT })
	p.histogram("edgegw_device_poll_cycle_seconds", "Duration of one whole poll of a device (retries included).", devs,
		func(st *stats.Snapshot) stats.HistogramSnapshot { return st.Cycle })

	counters := []struct {
		name, help string
		get        func(*stats.Snapshot) uint64
	}{
		{"edgegw_device_requests_total", "Modbus requests sent (retries included).", func(s *stats.Snapshot) uint64 { return s.Requests }},
		{"edgegw_device_responses_total", "Valid responses matched to their request.", func(s *stats.Snapshot) uint64 { return s.Responses }},
		{"edgegw_device_timeouts_total", "Requests that got no answer in time.", func(s *stats.Snapshot) uint64 { return s.Timeouts }},
		{"edgegw_device_exceptions_total", "Modbus exception replies.", func(s *stats.Snapshot) uint64 { return s.Exceptions }},
		{"edgegw_device_errors_total", "Other failures: transport, malformed, wrong length.", func(s *stats.Snapshot) uint64 { return s.Errors }},
		{"edgegw_device_reconnects_total", "TCP redials and serial reopens.", func(s *stats.Snapshot) uint64 { return s.Reconnects }},
		{"edgegw_device_late_responses_total", "Responses that came after their request gave up.", func(s *stats.Snapshot) uint64 { return s.Late }},
		{"edgegw_device_duplicate_responses_total", "Second responses to one request.", func(s *stats.Snapshot) uint64 { return s.Duplicates }},
		{"edgegw_device_dropped_frames_total", "Frames dropped: unknown source, malformed, wrong unit.", func(s *stats.Snapshot) uint64 { return s.Dropped }},
		{"edgegw_device_polls_total", "Scheduled polls started.", func(s *stats.Snapshot) uint64 { return s.Polls }},
		{"edgegw_device_good_polls_total", "Polls that produced good samples within their interval.", func(s *stats.Snapshot) uint64 { return s.GoodPolls }},
		{"edgegw_device_overruns_total", "Ticks skipped because the previous poll was still running.", func(s *stats.Snapshot) uint64 { return s.Overruns }},
		{"edgegw_device_demotions_total", "Times the device was demoted.", func(s *stats.Snapshot) uint64 { return s.Demotions }},
	}
	for _, c := range counters {
		p.family(c.name, "counter", c.help)
		for i := range devs {
			p.sample(c.name, float64(c.get(&devs[i].st)), "device", devs[i].info.Name)
		}
	}
	gauges := []struct {
		name, help string
		get        func(*deviceSnap) float64
	}{
		{"edgegw_device_loss_ratio", "Share of requests without a valid response (0..1).", func(d *deviceSnap) float64 { return d.st.LossRate() }},
		{"edgegw_device_valid_sample_ratio", "Share of scheduled polls that produced a good sample in time (0..1).", func(d *deviceSnap) float64 { return d.st.ValidRate() }},
		{"edgegw_device_demoted", "1 while the device is polled at a reduced rate.", func(d *deviceSnap) float64 { return b2f(d.st.Demoted) }},
		{"edgegw_device_up", "1 when the device state is ok.", func(d *deviceSnap) float64 { return b2f(deviceState(d.info, d.st, now) == "ok") }},
		{"edgegw_device_last_good_timestamp_seconds", "Unix time of the last good poll, 0 if never.", func(d *deviceSnap) float64 { return float64(d.st.LastGoodUS) / 1e6 }},
	}
	for _, g := range gauges {
		p.family(g.name, "gauge", g.help)
		for i := range devs {
			p.sample(g.name, g.get(&devs[i]), "device", devs[i].info.Name)
		}
	}

	if a := s.cfg.Acquisition; a != nil {
		p.single("edgegw_udp_unknown_source_total", "counter", "Datagrams on the Modbus UDP socket from an address that is no device.", float64(a.UDPUnknownSource.Load()))
	}

	st := s.Stats()
	ms := [nMethods]MethodStats{mShort: st.ShortPolling, mLong: st.LongPolling, mWS: st.WebSocket}
	p.family("edgegw_web_clients", "gauge", "Clients now: short polls in flight, long polls waiting, WebSocket connections.")
	for m := range nMethods {
		p.sample("edgegw_web_clients", float64(ms[m].Active), "method", methodNames[m])
	}
	p.family("edgegw_web_served_total", "counter", "Requests answered and WebSocket connections ended, per method.")
	for m := range nMethods {
		p.sample("edgegw_web_served_total", float64(ms[m].Served), "method", methodNames[m])
	}
	p.family("edgegw_web_rejected_total", "counter", "Requests refused with 503 beyond max_clients, per method.")
	for m := range nMethods {
		p.sample("edgegw_web_rejected_total", float64(ms[m].Rejected), "method", methodNames[m])
	}
	p.single("edgegw_web_too_large_total", "counter", "Requests refused because their body exceeded the limit.", float64(st.TooLarge))
	p.family("edgegw_web_ws_dropped_total", "counter", "WebSocket clients dropped as too slow, by reason: queue_full (the hub found its queue full), "+
		"write_timeout (a write blocked past its timeout), no_pong (no pong within the read deadline), queue_budget (its next message would pass the queue budget).")
	dr := st.WSDroppedBy
	for i, n := range [nDrops]uint64{dropQueueFull: dr.QueueFull, dropWriteTimeout: dr.WriteTimeout, dropNoPong: dr.NoPong, dropBudget: dr.QueueBudget} {
		p.sample("edgegw_web_ws_dropped_total", float64(n), "reason", dropNames[i])
	}
	p.single("edgegw_web_ws_queued_bytes", "gauge", "Bytes in messages encoded for one WebSocket client alone (snapshots, resume chunks) and not yet written, all clients.", float64(st.WSQueuedBytes))
	p.single("edgegw_web_ws_queue_budget_bytes", "gauge", "The bound of edgegw_web_ws_queued_bytes; beyond it a client is closed with 1013.", float64(st.WSQueueBudget))
	p.single("edgegw_web_ws_frames_sent_total", "counter", "Data frames written to WebSocket clients.", float64(st.WSFramesSent))
	p.single("edgegw_web_ws_bad_messages_total", "counter", "WebSocket clients closed for a malformed or oversized message.", float64(st.WSBadMessages))
	p.family("edgegw_web_rate_limited_total", "counter", "Requests refused with 429, per class (hash: no slot or CPU budget to verify a password; connections: the client held its connections_per_client).")
	p.sample("edgegw_web_rate_limited_total", float64(st.RateLimitedPoll), "class", "poll")
	p.sample("edgegw_web_rate_limited_total", float64(st.RateLimitedRead), "class", "read")
	p.sample("edgegw_web_rate_limited_total", float64(st.RateLimitedConnect), "class", "connect")
	p.sample("edgegw_web_rate_limited_total", float64(st.RateLimitedMonitor), "class", "monitor")
	p.sample("edgegw_web_rate_limited_total", float64(st.RateLimitedWrite), "class", "write")
	p.sample("edgegw_web_rate_limited_total", float64(st.RateLimitedAuth), "class", "auth")
	p.sample("edgegw_web_rate_limited_total", float64(st.HashRefused), "class", "hash")
	p.sample("edgegw_web_rate_limited_total", float64(st.ConnsPerClientLimited), "class", "connections")
	p.single("edgegw_web_forbidden_total", "counter", "Requests refused with 403: the client is outside allowed_networks.", float64(st.Forbidden))
	p.single("edgegw_web_password_hashes_total", "counter", "PBKDF2 verifications of basic-auth passwords (credentials not in the cache).", float64(st.PasswordHashes))
	p.single("edgegw_web_auth_failures_total", "counter", "Requests refused with 401 (missing or wrong credentials).", float64(st.AuthFailures))
	p.single("edgegw_web_connections", "gauge", "TCP connections open now.", float64(st.ConnsOpen))
	p.single("edgegw_web_connections_refused_total", "counter", "Connections closed at accept beyond max_conns.", float64(st.ConnsRefused))
	p.single("edgegw_web_accept_errors_total", "counter", "Accept failures (out of file descriptors): connections left waiting in the backlog.", float64(st.AcceptErrors))
	p.single("edgegw_web_long_polls_gone_total", "counter", "Waiting long polls closed by their client (found by the parker's sweep) or whose reply could not be written.", float64(st.LongPollsGone))
	p.single("edgegw_web_long_polls_not_kept_total", "counter", "Answered long polls whose connection was closed, not kept alive: too many answered connections waited for the server.", float64(st.LongPollsNotKept))
	p.family("edgegw_web_writes_total", "counter", "POST /api/write by outcome: ok, failed (device or check), refused (before the writer).")
	p.sample("edgegw_web_writes_total", float64(st.WritesOK), "result", "ok")
	p.sample("edgegw_web_writes_total", float64(st.WritesFailed), "result", "failed")
	p.sample("edgegw_web_writes_total", float64(st.WritesRefused), "result", "refused")

	if s.cfg.Upstream != nil {
		u := s.upstream(now)
		us := s.cfg.Upstream.Snapshot()
		p.family("edgegw_upstream_path", "gauge", "1 for the upstream path in use, 0 for the others.")
		for _, path := range []string{stats.PathOff, stats.PathWebSocket, stats.PathMQTT, stats.PathBuffering, stats.PathUnauthorized} {
			p.sample("edgegw_upstream_path", b2f(u.Path == path), "path", path)
		}
		p.single("edgegw_upstream_queue_samples", "gauge", "Samples waiting for an upstream acknowledgement.", float64(u.QueueSamples))
		p.single("edgegw_upstream_queue_bytes", "gauge", "Bytes those samples take in the durable queue.", float64(u.QueueBytes))
		p.single("edgegw_upstream_oldest_unacked_age_seconds", "gauge", "Age of the oldest unacknowledged sample, 0 if none.", u.OldestUnackAgeS)
		p.single("edgegw_upstream_queue_degraded", "gauge", "1 while the durable queue keeps samples in memory because the disk refuses writes.", b2f(strings.HasPrefix(us.QueueMode, "memory (disk")))
		p.single("edgegw_upstream_queue_corrupt_total", "counter", "Durable queue records skipped because their checksum failed.", float64(us.QueueCorrupt))
		p.single("edgegw_upstream_dropped_total", "counter", "Samples dropped because the durable queue hit its bound.", float64(u.Dropped))
		p.single("edgegw_upstream_reconnects_total", "counter", "Upstream WebSocket and MQTT reconnects.", float64(u.Reconnects))
		p.single("edgegw_upstream_ws_sessions_failed_total", "counter", "WebSocket sessions that ended with no batch acknowledged (a receiver that stores nothing).", float64(us.WSSessionsFailed))
		p.family("edgegw_upstream_sent_total", "counter", "Samples acknowledged upstream, per path.")
		p.sample("edgegw_upstream_sent_total", float64(u.SentWS), "path", stats.PathWebSocket)
		p.sample("edgegw_upstream_sent_total", float64(u.SentMQTT), "path", stats.PathMQTT)
	}
	if s.cfg.History != nil {
		c := s.cfg.History.Counters()
		for _, m := range []struct {
			name, typ, help string
			v               float64
		}{
			{"edgegw_history_series", "gauge", "Tags with a history.", float64(c.Series)},
			{"edgegw_history_samples_total", "counter", "Samples recorded in the history.", float64(c.Samples)},
			{"edgegw_history_late_samples_total", "counter", "Samples whose bucket had closed (kept in the raw window only).", float64(c.Late)},
			{"edgegw_history_dropped_buckets_total", "counter", "Closed buckets not written to data_dir (write failed or fell behind).", float64(c.Dropped)},
			{"edgegw_history_written_bytes_total", "counter", "Bytes of closed buckets written to data_dir.", float64(c.BytesWritten)},
			{"edgegw_history_write_errors_total", "counter", "Failed writes of closed buckets to data_dir.", float64(c.WriteErrors)},
		} {
			p.family(m.name, m.typ, m.help)
			p.sample(m.name, m.v)
		}
	}
	appendModbusServerMetrics(p, s.cfg.ModbusServers)
	s.appendTagMetrics(p, devs, now) // metrics_tags.go: tag values, process and Go figures
	appendProcessMetrics(p)
	return p.b
}
