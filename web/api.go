package web

import (
	"encoding/json"
	"math"
	"net/http"
	"sort"
	"time"

	"edgegw/stats"
)

// Wire layouts of the information endpoints:
//
//	GET /api/devices
//	200 {"devices":[{"name":"logger-01","transport":"udp","address":"127.0.0.1:1502","unit":1,"interval_ms":1000,
//	     "state":"ok","rtt_ms":{"p50":0.4,"p95":0.9,"p99":1.8},"cycle_ms":{"p50":0.5,"p99":2.1},
//	     "loss_rate":0.001,"valid_rate":0.998,"requests":3600,"responses":3596,"timeouts":4,"exceptions":0,
//	     "errors":0,"reconnects":0,"late":1,"duplicates":0,"dropped":0,"polls":3600,"good_polls":3593,
//	     "overruns":0,"demotions":0,"demoted":false,"last_good_us":1764450000123456,
//	     "last_error":"","last_error_us":0,
//	     "tags":[{"name":"temperature","unit":"°C"},{"name":"setpoint","writable":true}]}]}
//	    state: "down" when polled but no good poll for 3 intervals (or never), demoted or not;
//	    else "demoted" while polled at a reduced rate; else "ok". Sorted by name.
//
//	GET /api/status
//	200 {"gateway":"gw-01","version":"1.2.0","seq":1042,"uptime_s":3600,
//	     "upstream":{"path":"websocket","queue_samples":12,"queue_bytes":1340,"oldest_unack_us":1764450000000000,
//	                 "oldest_unack_age_s":0.8,"dropped":0,"reconnects":1,"sent_ws":35000,"sent_mqtt":120},
//	     "clients":{"short_polling":0,"long_polling":3,"websocket":2,"ws_dropped":0,"rejected":0},
//	     "ring":{"size":5760,"resume_window_s":60},"writes":false}
//	    upstream.path: off | websocket | mqtt | buffering | unauthorized ("off" when none configured).
//
//	GET /healthz
//	200 {"status":"ok","seq":1042,"uptime_s":3600,"gateway":"gw-01","version":"1.2.0"}

type quantilesJSON struct {
	P50 float64 `json:"p50"`
	P95 float64 `json:"p95,omitempty"`
	P99 float64 `json:"p99"`
}

type deviceJSON struct {
	Name       string          `json:"name"`
	Transport  string          `json:"transport"`
	Address    string          `json:"address"`
	Unit       uint8           `json:"unit"`
	IntervalMS int64           `json:"interval_ms"`
	State      string          `json:"state"`
	RTTms      quantilesJSON   `json:"rtt_ms"`
	Cyclems    quantilesJSON   `json:"cycle_ms"`
	LossRate   float64         `json:"loss_rate"`
	ValidRate  float64         `json:"valid_rate"`
	Requests   uint64          `json:"requests"`
	Responses  uint64          `json:"responses"`
	Timeouts   uint64          `json:"timeouts"`
	Exceptions uint64          `json:"exceptions"`
	Errors     uint64          `json:"errors"`
	Reconnects uint64          `json:"reconnects"`
	Late       uint64          `json:"late"`
	Duplicates uint64          `json:"duplicates"`
	Dropped    uint64          `json:"dropped"`
	Polls      uint64          `json:"polls"`
	GoodPolls  uint64          `json:"good_polls"`
	Overruns   uint64          `json:"overruns"`
	Demotions  uint64          `json:"demotions"`
	Demoted    bool            `json:"demoted"`
	LastGoodUS int64           `json:"last_good_us"`
	LastError  string          `json:"last_error"`    // why the last failed poll failed; "" if none yet
	LastErrUS  int64           `json:"last_error_us"` // when
	Tags       []stats.TagInfo `json:"tags"`
}

// deviceState: down when polled without a good poll for 3 intervals (or
// ever), whether or not it is also demoted; else demoted while polled at a
// reduced rate; else ok. The demoted flag is in the record either way.
func deviceState(info stats.Info, s stats.Snapshot, now time.Time) string {
	if s.Polls > 0 {
		iv := info.Interval
		if iv <= 0 {
			iv = time.Second
		}
		if s.LastGoodUS == 0 || now.Sub(time.UnixMicro(s.LastGoodUS)) > 3*iv {
			return "down"
		}
	}
	if s.Demoted {
		return "demoted"
	}
	return "ok"
}

// deviceSnap is one device's identity and a copy of its record.
type deviceSnap struct {
	info stats.Info
	st   stats.Snapshot
}

// devices copies every device's record, sorted by name.
func (s *Server) devices() []deviceSnap {
	if s.cfg.Devices == nil {
		return nil
	}
	entries := s.cfg.Devices.Devices()
	out := make([]deviceSnap, 0, len(entries))
	for _, e := range entries {
		d := deviceSnap{info: e.Info}
		if e.Stats != nil {
			d.st = e.Stats.Snapshot()
		}
		out = append(out, d)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].info.Name < out[j].info.Name })
	return out
}

func ms(us float64) float64 { return float64(int64(us*10+0.5)) / 10000 } // µs → ms, 0.1 µs precision

func (s *Server) handleDevices(w http.ResponseWriter, r *http.Request) {
	now := time.Now()
	devs := s.devices()
	out := struct {
		Devices []deviceJSON `json:"devices"`
	}{Devices: make([]deviceJSON, 0, len(devs))}
	for _, d := range devs {
		st := d.st
		tags := d.info.Tags
		if tags == nil {
			tags = []stats.TagInfo{}
		}
		out.Devices = append(out.Devices, deviceJSON{
			Name: d.info.Name, Transport: d.info.Transport, Address: d.info.Address, Unit: d.info.Unit,
			IntervalMS: d.info.Interval.Milliseconds(), State: deviceState(d.info, st, now),
			RTTms:    quantilesJSON{P50: ms(st.RTT.Quantile(0.5)), P95: ms(st.RTT.Quantile(0.95)), P99: ms(st.RTT.Quantile(0.99))},
			Cyclems:  quantilesJSON{P50: ms(st.Cycle.Quantile(0.5)), P99: ms(st.Cycle.Quantile(0.99))},
			LossRate: st.LossRate(), ValidRate: st.ValidRate(),
			Requests: st.Requests, Responses: st.Responses, Timeouts: st.Timeouts, Exceptions: st.Exceptions,
			Errors: st.Errors, Reconnects: st.Reconnects, Late: st.Late, Duplicates: st.Duplicates,
			Dropped: st.Dropped, Polls: st.Polls, GoodPolls: st.GoodPolls, Overruns: st.Overruns,
			Demotions: st.Demotions, Demoted: st.Demoted, LastGoodUS: st.LastGoodUS, Tags: tags,
			LastError: st.LastError, LastErrUS: st.LastErrorUS,
		})
	}
	replyJSON(w, out)
}

type upstreamJSON struct {
	Path            string  `json:"path"`
	QueueSamples    int64   `json:"queue_samples"`
	QueueBytes      int64   `json:"queue_bytes"`
	OldestUnackUS   int64   `json:"oldest_unack_us"`
	OldestUnackAgeS float64 `json:"oldest_unack_age_s"`
	Dropped         uint64  `json:"dropped"`
	Reconnects      uint64  `json:"reconnects"`
	SentWS          uint64  `json:"sent_ws"`
	SentMQTT        uint64  `json:"sent_mqtt"`
}

func (s *Server) upstream(now time.Time) upstreamJSON {
	if s.cfg.Upstream == nil {
		return upstreamJSON{Path: stats.PathOff}
	}
	u := s.cfg.Upstream.Snapshot()
	out := upstreamJSON{
		Path: u.Path, QueueSamples: u.QueueSamples, QueueBytes: u.QueueBytes, OldestUnackUS: u.OldestUnackUS,
		Dropped: u.Dropped, Reconnects: u.Reconnects, SentWS: u.SentWS, SentMQTT: u.SentMQTT,
	}
	if u.OldestUnackUS > 0 {
		out.OldestUnackAgeS = max(0, now.Sub(time.UnixMicro(u.OldestUnackUS)).Seconds())
	}
	return out
}

// ringJSON: the ring's size and how far back (seconds, at the configured
// poll rate) a client can resume without a reset.
type ringJSON struct {
	Size          int     `json:"size"`
	ResumeWindowS float64 `json:"resume_window_s"`
}

func (s *Server) handleStatus(w http.ResponseWriter, r *http.Request) {
	now := time.Now()
	st := s.Stats()
	type clients struct {
		Short     int64  `json:"short_polling"`
		Long      int64  `json:"long_polling"`
		WS        int64  `json:"websocket"`
		WSDropped uint64 `json:"ws_dropped"`
		Rejected  uint64 `json:"rejected"`
	}
	replyJSON(w, struct {
		Gateway  string       `json:"gateway"`
		Version  string       `json:"version"`
		Seq      uint64       `json:"seq"`
		UptimeS  int64        `json:"uptime_s"`
		Upstream upstreamJSON `json:"upstream"`
		Clients  clients      `json:"clients"`
		Ring     ringJSON     `json:"ring"`
		Writes   bool         `json:"writes"` // POST /api/write is on (a write token is set)
	}{
		Gateway: s.cfg.GatewayID, Version: s.cfg.Version, Seq: s.cfg.Ring.Snapshot().Seq,
		UptimeS: int64(now.Sub(s.started).Seconds()), Upstream: s.upstream(now),
		Clients: clients{
			Short: st.ShortPolling.Active, Long: st.LongPolling.Active, WS: st.WebSocket.Active,
			WSDropped: st.WSDropped, Rejected: st.ShortPolling.Rejected + st.LongPolling.Rejected + st.WebSocket.Rejected,
		},
		Ring:   ringJSON{Size: s.cfg.RingInfo.Size, ResumeWindowS: math.Round(s.cfg.RingInfo.Window.Seconds()*10) / 10},
		Writes: s.cfg.WriteToken != "" && s.cfg.Writer != nil,
	})
}

func (s *Server) handleHealth(w http.ResponseWriter, r *http.Request) {
	replyJSON(w, struct {
		Status  string `json:"status"`
		Seq     uint64 `json:"seq"`
		UptimeS int64  `json:"uptime_s"`
		Gateway string `json:"gateway,omitempty"`
		Version string `json:"version,omitempty"`
	}{"ok", s.cfg.Ring.Snapshot().Seq, int64(time.Since(s.started).Seconds()), s.cfg.GatewayID, s.cfg.Version})
}

func replyJSON(w http.ResponseWriter, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		writeError(w, http.StatusInternalServerError, "encode: "+err.Error())
		return
	}
	writeJSON(w, http.StatusOK, append(b, '\n'))
}
