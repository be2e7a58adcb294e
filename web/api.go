package web

import (
	"encoding/json"
	"math"
	"net/http"
	"sort"
	"strconv"
	"time"

	"edgegw/ringstore"
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
//	     "tags":[{"name":"temperature","unit":"°C","deadband":0.1},{"name":"setpoint","writable":true}]}]}
//	    state: "down" while the transport cannot be opened (retried with backoff) or when polled
//	    without a good poll for 3 intervals (or ever), demoted or not; else "demoted" while
//	    polled at a reduced rate; else "pending" before its first poll has ended; else "ok".
//	    reason (left out when none): why it is down or why its last poll failed, e.g.
//	    "…: open /dev/ttyUSB0: no such file or directory", or, while a TCP dial backs off, the
//	    failure that started the backoff: "…: dial tcp …: connection refused (next try in 9.7 s)".
//	    Sorted by name.
//
//	GET /api/status
//	200 {"gateway":"gw-01","version":"1.2.0","seq":1042,"epoch":"9f3c04e1a2b3c4d5","uptime_s":3600,
//	     "upstream":{"path":"websocket","queue_samples":12,"queue_bytes":1340,"oldest_unack_us":1764450000000000,
//	                 "oldest_unack_age_s":0.8,"dropped":0,"reconnects":1,"sent_ws":35000,"sent_mqtt":120,
//	                 "ws_url":"wss://b.example/ingest","ws_urls":["wss://a.example/ingest","wss://b.example/ingest"],
//	                 "mqtt_broker":"tcp://m1:1883","mqtt_brokers":["tcp://m1:1883","tcp://m2:1883"]},
//	     "clients":{"short_polling":0,"long_polling":3,"websocket":2,"ws_dropped":1,
//	                "ws_dropped_by":{"queue_full":0,"write_timeout":1,"no_pong":0,"queue_budget":0},
//	                "ws_queued_bytes":16384,"ws_queue_budget_bytes":8388608,"rejected":0},
//	     "refused":{"rate_limited":{"poll":0,…},"connections_per_client":0,"forbidden":0,…},
//	     "ring":{"size":5760,"resume_window_s":60},"writes":false,
//	     "storage":{"data_dir":"/var/lib/edgegw","state":"ok","free_bytes":1048576,"writers":{…}}}
//	    refused: every request turned away since start, by cause (ratelimit.go, refusedJSON).
//	    upstream.path: off | websocket | mqtt | buffering | unauthorized ("off" when none configured).
//	    ws_url / mqtt_broker: the receiver URL / broker the link is on or tries now (passwords
//	    redacted), of ws_urls / mqtt_brokers as configured; each left out when not configured.
//	    queue (with an upstream): {"mode":"disk","corrupt":0}; mode "memory" without data_dir, and
//	    "memory (disk: no space left on device)" while the disk refuses writes (samples then wait in
//	    RAM, bounded by max_bytes); corrupt: queue records skipped because their checksum failed.
//	    clients.ws_dropped: WebSocket clients dropped as too slow, by reason in ws_dropped_by;
//	    ws_queued_bytes: bytes in messages encoded for one client alone (snapshots, resume
//	    chunks) not yet written, all clients; beyond ws_queue_budget_bytes a client is closed (1013).
//	    storage (left out without Storage): data_dir, its state (ok | memory | failing | full | why
//	    it is not usable), free_bytes (statfs, -1 unknown) and each writer's state, error and last
//	    error with its time (storage.go).
//
//	GET /healthz
//	200 {"status":"ok","seq":1042,"uptime_s":3600,"gateway":"gw-01","version":"1.2.0","hold_s":10}
//	200 {"status":"ok",…,"down":["rtu-9"]}                      some devices down, others polled well
//	200 {"status":"ok",…,"pending":["storage: history cannot write to /var/lib/edgegw: …"]}   failing, not held yet
//	503 {"status":"unhealthy","reasons":["no device had a good poll in 3 intervals (48 devices)"],…}
//	503 {"status":"unhealthy","reasons":[…],"recovering":true,…} the checks pass, not for hold_s yet
//	    reasons (checks): a writer of data_dir cannot write (its last write failed: the queue,
//	    the sequence mark, the history, the Sparkplug queue or state), upstream or not; no
//	    device had a good poll within 3 of its intervals (none polled yet counts as starting);
//	    no upstream path for longer than HealthzUpstreamMaxDown. "down" lists the devices in
//	    state down or demoted (at once, whatever the hold).
//	    hold_s (HealthzHold, default 10 s): the status changes only after its checks held that
//	    long. It turns 503 at a failing check once the fault has lasted hold_s, passes shorter
//	    than hold_s not ending it (a disk failing every few seconds is unhealthy), and back to
//	    200 once every check has passed for hold_s. Checks are made at each request; reasons
//	    are those of the last failing check.

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
	Reason     string          `json:"reason,omitempty"` // why down (transport not open) or why the last poll failed
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
	Tags       []stats.TagInfo `json:"tags"`
}

// deviceState: down while the transport cannot open, or when polled without
// a good poll for 3 intervals (or ever), whether or not it is also demoted;
// else demoted while polled at a reduced rate; else ok. The demoted flag is
// in the record either way.
func deviceState(info stats.Info, s stats.Snapshot, now time.Time) string {
	if s.Down {
		return "down"
	}
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

// apiState is deviceState as /api/devices says it: "pending" for an ok
// device not polled yet (health and /metrics count it as starting, ok).
func apiState(info stats.Info, s stats.Snapshot, now time.Time) string {
	st := deviceState(info, s, now)
	if st == "ok" && s.Polls == 0 {
		return "pending"
	}
	return st
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
			IntervalMS: d.info.Interval.Milliseconds(), State: apiState(d.info, st, now), Reason: st.Reason,
			RTTms:    quantilesJSON{P50: ms(st.RTT.Quantile(0.5)), P95: ms(st.RTT.Quantile(0.95)), P99: ms(st.RTT.Quantile(0.99))},
			Cyclems:  quantilesJSON{P50: ms(st.Cycle.Quantile(0.5)), P99: ms(st.Cycle.Quantile(0.99))},
			LossRate: st.LossRate(), ValidRate: st.ValidRate(),
			Requests: st.Requests, Responses: st.Responses, Timeouts: st.Timeouts, Exceptions: st.Exceptions,
			Errors: st.Errors, Reconnects: st.Reconnects, Late: st.Late, Duplicates: st.Duplicates,
			Dropped: st.Dropped, Polls: st.Polls, GoodPolls: st.GoodPolls, Overruns: st.Overruns,
			Demotions: st.Demotions, Demoted: st.Demoted, LastGoodUS: st.LastGoodUS, Tags: tags,
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
	// Which receiver URL / broker the link uses now, of the configured ones.
	WSURL       string   `json:"ws_url,omitempty"`
	WSURLs      []string `json:"ws_urls,omitempty"`
	MQTTBroker  string   `json:"mqtt_broker,omitempty"`
	MQTTBrokers []string `json:"mqtt_brokers,omitempty"`
}

func (s *Server) upstream(now time.Time) upstreamJSON {
	if s.cfg.Upstream == nil {
		return upstreamJSON{Path: stats.PathOff}
	}
	u := s.cfg.Upstream.Snapshot()
	out := upstreamJSON{
		Path: u.Path, QueueSamples: u.QueueSamples, QueueBytes: u.QueueBytes, OldestUnackUS: u.OldestUnackUS,
		Dropped: u.Dropped, Reconnects: u.Reconnects, SentWS: u.SentWS, SentMQTT: u.SentMQTT,
		WSURL: u.WSURL, WSURLs: u.WSURLs, MQTTBroker: u.MQTTBroker, MQTTBrokers: u.MQTTBrokers,
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
	snap := s.cfg.Ring.Snapshot()
	st := s.Stats()
	type clients struct {
		Short     int64   `json:"short_polling"`
		Long      int64   `json:"long_polling"`
		WS        int64   `json:"websocket"`
		WSDropped uint64  `json:"ws_dropped"`
		WSDropBy  WSDrops `json:"ws_dropped_by"`
		WSQueued  int64   `json:"ws_queued_bytes"`
		WSBudget  int64   `json:"ws_queue_budget_bytes"`
		Rejected  uint64  `json:"rejected"`
	}
	type queue struct {
		Mode    string `json:"mode"`
		Corrupt uint64 `json:"corrupt"`
	}
	var storage *storageJSON
	if s.cfg.Storage != nil {
		storage = storageOf(s.cfg.Storage.StorageState())
	}
	var qj *queue
	if s.cfg.Upstream != nil {
		u := s.cfg.Upstream.Snapshot()
		qj = &queue{Mode: u.QueueMode, Corrupt: u.QueueCorrupt}
	}
	replyJSON(w, struct {
		Gateway  string             `json:"gateway"`
		Version  string             `json:"version"`
		Seq      uint64             `json:"seq"`
		Epoch    string             `json:"epoch"`
		UptimeS  int64              `json:"uptime_s"`
		Upstream upstreamJSON       `json:"upstream"`
		Queue    *queue             `json:"queue,omitempty"`
		Clients  clients            `json:"clients"`
		Refused  refusedJSON        `json:"refused"` // ratelimit.go
		Ring     ringJSON           `json:"ring"`
		Writes   bool               `json:"writes"` // POST /api/write is on (a write token is set)
		Storage  *storageJSON       `json:"storage,omitempty"`
		Modbus   []modbusServerJSON `json:"modbus_servers,omitempty"`
	}{
		Modbus:  modbusServersJSON(s.cfg.ModbusServers),
		Storage: storage,
		Queue:   qj,
		Gateway: s.cfg.GatewayID, Version: s.cfg.Version, Seq: snap.Seq, Epoch: ringstore.FormatEpoch(snap.Epoch),
		UptimeS: int64(now.Sub(s.started).Seconds()), Upstream: s.upstream(now),
		Clients: clients{
			Short: st.ShortPolling.Active, Long: st.LongPolling.Active, WS: st.WebSocket.Active,
			WSDropped: st.WSDropped, WSDropBy: st.WSDroppedBy, WSQueued: st.WSQueuedBytes, WSBudget: st.WSQueueBudget, Rejected: st.ShortPolling.Rejected + st.LongPolling.Rejected + st.WebSocket.Rejected,
		},
		Refused: refused(st),
		Ring:    ringJSON{Size: s.cfg.RingInfo.Size, ResumeWindowS: math.Round(s.cfg.RingInfo.Window.Seconds()*10) / 10},
		Writes:  s.cfg.WriteToken != "" && s.cfg.Writer != nil,
	})
}

// health checks what /healthz answers for: the reasons it is unhealthy
// (none: healthy) and the devices that are down.
func (s *Server) health(now time.Time) (reasons, down []string) {
	if s.cfg.Storage != nil {
		reasons = append(reasons, storageReasons(s.cfg.Storage.StorageState())...)
	}
	devs := s.devices()
	good := 0
	for _, d := range devs {
		if deviceState(d.info, d.st, now) == "ok" {
			good++
		} else if d.st.Polls > 0 {
			down = append(down, d.info.Name) // down or demoted: no good poll for 3 intervals
		}
	}
	if len(devs) > 0 && good == 0 {
		reasons = append(reasons, "no device had a good poll in 3 intervals ("+strconv.Itoa(len(devs))+" devices)")
	}
	if u := s.cfg.Upstream; u != nil && s.cfg.HealthzUpstreamMaxDown > 0 {
		st := u.Snapshot()
		if (st.Path == stats.PathBuffering || st.Path == stats.PathUnauthorized) && st.PathSinceUS > 0 {
			if d := now.Sub(time.UnixMicro(st.PathSinceUS)); d > s.cfg.HealthzUpstreamMaxDown {
				reasons = append(reasons, "upstream down for "+d.Round(time.Second).String()+
					" (path "+st.Path+", limit "+s.cfg.HealthzUpstreamMaxDown.String()+")")
			}
		}
	}
	return reasons, down
}

func (s *Server) handleHealth(w http.ResponseWriter, r *http.Request) {
	now := time.Now()
	raw, down := s.health(now)
	unhealthy, reasons, pending, recovering := s.healthz.check(now, raw)
	body := struct {
		Status     string   `json:"status"`
		Reasons    []string `json:"reasons,omitempty"`
		Recovering bool     `json:"recovering,omitempty"`
		Pending    []string `json:"pending,omitempty"`
		Down       []string `json:"down,omitempty"`
		Seq        uint64   `json:"seq"`
		UptimeS    int64    `json:"uptime_s"`
		Gateway    string   `json:"gateway,omitempty"`
		Version    string   `json:"version,omitempty"`
		HoldS      float64  `json:"hold_s"`
	}{"ok", reasons, recovering, pending, down, s.cfg.Ring.Snapshot().Seq, int64(now.Sub(s.started).Seconds()),
		s.cfg.GatewayID, s.cfg.Version, s.healthz.hold.Seconds()}
	code := http.StatusOK
	if unhealthy {
		body.Status, code = "unhealthy", http.StatusServiceUnavailable
	}
	b, err := json.Marshal(body)
	if err != nil {
		writeError(w, http.StatusInternalServerError, "encode: "+err.Error())
		return
	}
	writeJSON(w, code, append(b, '\n'))
}

func replyJSON(w http.ResponseWriter, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		writeError(w, http.StatusInternalServerError, "encode: "+err.Error())
		return
	}
	writeJSON(w, http.StatusOK, append(b, '\n'))
}
