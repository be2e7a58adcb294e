package web

import (
	"errors"
	"math"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"edgegw/history"
	"edgegw/wire"
)

// History is what web reads from the gateway's history (history.Store).
type History interface {
	Query(device, tag string, from, to int64, step time.Duration) (*history.Points, error)
	Health(device string, from, to int64, step time.Duration) (*history.Points, error)
	MaxPoints() int
	Counters() history.Counters // for /metrics
}

var _ History = (*history.Store)(nil)

// RingInfo is what /api/status says about the ring: its size and how far
// back a client can resume at the configured poll rate.
type RingInfo struct {
	Size   int
	Window time.Duration
}

// Wire layout:
//
//	GET /api/history?device=D&tag=T&from=US&to=US[&step=S]
//	    from, to: Unix µs like every ts (default: to = now, from = to - 1 h);
//	    step: bucket width, "5m" or µs (default: chosen for the range).
//	200 {"device":"D","tag":"T","unit":"°C","kind":"raw","from":…,"to":…,"step_us":0,"max_points":2000,
//	     "ts":[…],"value":[21.5,null,…],"quality":["good","timeout",…]}
//	200 {…,"kind":"buckets","step_us":60000000,"ts":[bucket starts],"min":[…],"max":[…],"mean":[…],
//	     "last":[…],"good":[…],"bad":[…]}                  (null where a bucket had no good poll)
//	GET /api/history?device=D&from=…&to=…                   (no tag: the device's health)
//	200 {…,"kind":"health","step_us":60000000,"ts":[…],"polls":[…],"good":[…],"valid_rate":[…],
//	     "rtt_mean_ms":[…],"rtt_p99_ms":[…]}                (null: nothing scheduled / nothing answered)
//	400 {"error":"…"}  unknown device or tag, from > to, bad numbers, too many points
//	404                no history configured
//
//	GET /api/trends?from=US&to=US[&step=S]     every configured tag at once (the page's trends:
//	                                           one request, not one a tag)
//	200 {"from":…,"to":…,"series":[{"device":"D","tag":"T",…as above…},…]}   (device, then tag order)
func (s *Server) handleHistory(w http.ResponseWriter, r *http.Request) {
	h := s.cfg.History
	if h == nil {
		writeError(w, http.StatusNotFound, "no history on this gateway")
		return
	}
	q := r.URL.Query()
	device, tag := q.Get("device"), q.Get("tag")
	if device == "" {
		writeError(w, http.StatusBadRequest, "query parameter device is required")
		return
	}
	from, to, step, err := rangeParams(q)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	unit, configured, known := s.historyTag(device, tag)
	if !known {
		what := "unknown device " + quoteInput(device)
		if configured {
			what = "unknown tag " + quoteInput(tag) + " of device " + quoteInput(device)
		}
		writeError(w, http.StatusBadRequest, what)
		return
	}
	p, err := points(h, device, tag, from, to, step)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	writeJSON(w, http.StatusOK, appendPoints(nil, device, tag, unit, h.MaxPoints(), p))
}

// rangeParams reads from, to (Unix µs; default the last hour) and step.
func rangeParams(q url.Values) (from, to int64, step time.Duration, err error) {
	to, err = intParam(q.Get("to"), time.Now().UnixMicro(), "to")
	if err == nil && to < 0 {
		err = errors.New("query parameter to: negative")
	}
	if err == nil {
		from, err = intParam(q.Get("from"), to-time.Hour.Microseconds(), "from")
	}
	if err == nil {
		step, err = stepParam(q.Get("step"))
	}
	return from, to, step, err
}

// points queries a tag (or, with tag "", the device's health); a configured
// one with nothing recorded yet has no points.
func points(h History, device, tag string, from, to int64, step time.Duration) (*history.Points, error) {
	var p *history.Points
	var err error
	if tag == "" {
		p, err = h.Health(device, from, to, step)
	} else {
		p, err = h.Query(device, tag, from, to, step)
	}
	if errors.Is(err, history.ErrUnknown) {
		kind := "raw"
		if tag == "" {
			kind = "health"
		}
		return &history.Points{Kind: kind, From: from, To: to}, nil
	}
	return p, err
}

// handleTrends answers every configured tag's history in one reply.
func (s *Server) handleTrends(w http.ResponseWriter, r *http.Request) {
	h := s.cfg.History
	if h == nil {
		writeError(w, http.StatusNotFound, "no history on this gateway")
		return
	}
	from, to, step, err := rangeParams(r.URL.Query())
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	b := append([]byte(`{"from":`), strconv.FormatInt(from, 10)...)
	b = append(append(b, `,"to":`...), strconv.FormatInt(to, 10)...)
	b = append(b, `,"series":[`...)
	n := 0
	if s.cfg.Devices != nil {
		for _, e := range s.cfg.Devices.Devices() {
			for _, t := range e.Info.Tags {
				p, err := points(h, e.Info.Name, t.Name, from, to, step)
				if err != nil {
					writeError(w, http.StatusBadRequest, "device "+strconv.Quote(e.Info.Name)+" tag "+strconv.Quote(t.Name)+": "+err.Error())
					return
				}
				if n > 0 {
					b = append(b, ',')
				}
				n++
				b = appendPoints(b, e.Info.Name, t.Name, t.Unit, h.MaxPoints(), p)
				b = b[:len(b)-1] // appendPoints ends the object with a newline
			}
		}
	}
	writeJSON(w, http.StatusOK, append(b, "]}\n"...))
}

// historyTag says whether device (and tag, if given) is configured, with
// the tag's unit. configured: the device is.
func (s *Server) historyTag(device, tag string) (unit string, configured, known bool) {
	if s.cfg.Devices == nil {
		return "", false, false
	}
	for _, e := range s.cfg.Devices.Devices() {
		if e.Info.Name != device {
			continue
		}
		if tag == "" {
			return "", true, true
		}
		for _, t := range e.Info.Tags {
			if t.Name == tag {
				return t.Unit, true, true
			}
		}
		return "", true, false
	}
	return "", false, false
}

func intParam(v string, def int64, name string) (int64, error) {
	if v == "" {
		return def, nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return 0, errors.New("query parameter " + name + ": " + quoteInput(v) + " is not an integer (Unix microseconds)")
	}
	return n, nil
}

func stepParam(v string) (time.Duration, error) {
	if v == "" {
		return 0, nil
	}
	if n, err := strconv.ParseInt(v, 10, 64); err == nil && n >= 0 && n < math.MaxInt64/1000 {
		return time.Duration(n) * time.Microsecond, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil || d < 0 {
		return 0, errors.New("query parameter step: " + quoteInput(v) + " is not a duration (\"5m\") or microseconds")
	}
	return d, nil
}

func appendPoints(b []byte, device, tag, unit string, maxPoints int, p *history.Points) []byte {
	b = append(b, `{"device":`...)
	b = wire.AppendString(b, device)
	b = append(b, `,"tag":`...)
	b = wire.AppendString(b, tag)
	b = append(b, `,"unit":`...)
	b = wire.AppendString(b, unit)
	b = append(b, `,"kind":"`...)
	b = append(b, p.Kind...)
	b = append(b, `","from":`...)
	b = strconv.AppendInt(b, p.From, 10)
	b = append(b, `,"to":`...)
	b = strconv.AppendInt(b, p.To, 10)
	b = append(b, `,"step_us":`...)
	b = strconv.AppendInt(b, p.Step.Microseconds(), 10)
	b = append(b, `,"max_points":`...)
	b = strconv.AppendInt(b, int64(maxPoints), 10)
	b = append(b, `,"ts":[`...)
	for i, t := range p.TS {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendInt(b, t, 10)
	}
	b = append(b, ']')
	switch p.Kind {
	case "raw":
		b = appendFloatList(b, "value", p.Value, 1)
		b = append(b, `,"quality":[`...)
		for i, q := range p.Quality {
			if i > 0 {
				b = append(b, ',')
			}
			b = append(b, '"')
			b = append(b, q.String()...)
			b = append(b, '"')
		}
		b = append(b, ']')
		if p.Bool {
			b = append(b, `,"bool":true`...)
		}
	case "buckets":
		b = appendFloatList(b, "min", p.Min, 1)
		b = appendFloatList(b, "max", p.Max, 1)
		b = appendFloatList(b, "mean", p.Mean, 1)
		b = appendFloatList(b, "last", p.Last, 1)
		b = appendUintList(b, "good", p.Good)
		b = appendUintList(b, "bad", p.Bad)
	case "health":
		b = appendUintList(b, "polls", p.Polls)
		b = appendUintList(b, "good", p.Good)
		b = appendFloatList(b, "valid_rate", p.ValidRate, 1)
		b = appendFloatList(b, "rtt_mean_ms", p.RTTMeanUS, 1e-3)
		b = appendFloatList(b, "rtt_p99_ms", p.RTTP99US, 1e-3)
	}
	return append(b, "}\n"...)
}

// appendFloatList appends `,"name":[...]`: v times scale, null for NaN and
// ±Inf. Not inlined: a query calls it once a series, and one copy of the
// loop is enough.
//
//go:noinline
func appendFloatList(b []byte, name string, v []float64, scale float64) []byte {
	b = append(append(append(b, `,"`...), name...), `":[`...)
	for i, x := range v {
		if i > 0 {
			b = append(b, ',')
		}
		if math.IsNaN(x) || math.IsInf(x, 0) {
			b = append(b, "null"...)
		} else {
			b = strconv.AppendFloat(b, x*scale, 'g', -1, 64)
		}
	}
	return append(b, ']')
}

// appendUintList appends `,"name":[...]`. Not inlined, as appendFloatList.
//
//go:noinline
func appendUintList(b []byte, name string, v []uint32) []byte {
	b = append(append(append(b, `,"`...), name...), `":[`...)
	for i, x := range v {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendUint(b, uint64(x), 10)
	}
	return append(b, ']')
}
