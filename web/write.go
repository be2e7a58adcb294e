package web

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"mime"
	"net/http"
	"strconv"
	"time"
)

// Writer does one confirmed write (edge's scheduler through main's adapter):
// written is the value asked for, readBack the value read after it. Errors
// that implement WriteErrorKind() string are mapped to status codes by kind.
type Writer interface {
	Write(ctx context.Context, device, tag string, value float64, origin string) (written, readBack float64, err error)
}

// writeKinder classifies a Writer error (edge.WriteError satisfies it).
type writeKinder interface{ WriteErrorKind() string }

// Write wire layout:
//
//	POST /api/write
//	Authorization: Bearer <write token>
//	Content-Type: application/json
//	{"device":"boiler-plc","tag":"setpoint","value":21.5}          value: a number, or true/false (1/0)
//
//	200 {"device":"boiler-plc","tag":"setpoint","written":21.5,"read_back":21.5,"duration_ms":3.2}
//	400 bad JSON, unknown field, nesting deeper than 4, trailing data, missing device/tag/value
//	401 no or wrong token (WWW-Authenticate: Bearer)     403 writes disabled (no write token configured)
//	404 unknown device or tag    409 busy (Retry-After: 1)    413 body over 4 KiB    415 not JSON
//	422 not writable, out of range, wrong type    429 rate limit    502 device error, read-back mismatch
//	503 acquisition stopped      504 timed out before the write started
//	errors: {"error":"edge: write \"boiler-plc\"/\"setpoint\" = 95: out of range: above max 90","kind":"out of range"}

// Limits of a write body.
const (
	MaxWriteBody  = 4 << 10
	maxWriteDepth = 4
)

var kindStatus = map[string]int{
	"unknown device": http.StatusNotFound,
	"unknown tag":    http.StatusNotFound,
	"busy":           http.StatusConflict,
	"not writable":   http.StatusUnprocessableEntity,
	"out of range":   http.StatusUnprocessableEntity,
	"device":         http.StatusBadGateway,
	"mismatch":       http.StatusBadGateway,
	"stopped":        http.StatusServiceUnavailable,
}

type writeReply struct {
	Device     string  `json:"device"`
	Tag        string  `json:"tag"`
	Written    float64 `json:"written"`
	ReadBack   float64 `json:"read_back"`
	DurationMS float64 `json:"duration_ms"`
}

func (s *Server) handleWrite(w http.ResponseWriter, r *http.Request) {
	if s.cfg.WriteToken == "" || s.cfg.Writer == nil {
		s.writesRefused.Add(1)
		writeError(w, http.StatusForbidden, "writes are disabled on this gateway: no write token is configured (http.write_token_file)")
		return
	}
	tok, ok := bearer(r)
	if !ok || !tokenEqual(tok, s.cfg.WriteToken) {
		s.unauthorized(w, r, "writes need Authorization: Bearer <write token>", false)
		return
	}
	if ct := r.Header.Get("Content-Type"); ct != "" {
		if mt, _, err := mime.ParseMediaType(ct); err != nil || mt != "application/json" {
			s.writesRefused.Add(1)
			writeError(w, http.StatusUnsupportedMediaType, "Content-Type must be application/json")
			return
		}
	}
	req, status, msg := parseWriteBody(http.MaxBytesReader(w, r.Body, MaxWriteBody))
	if status != 0 {
		s.writesRefused.Add(1)
		if status == http.StatusRequestEntityTooLarge {
			s.tooLarge.Add(1)
			w.Header().Set("Connection", "close")
		}
		writeError(w, status, msg)
		return
	}
	origin := "http " + clientIP(r).String()
	t0 := time.Now()
	written, readBack, err := s.cfg.Writer.Write(r.Context(), req.Device, req.Tag, req.Value, origin)
	dur := time.Since(t0)
	if err != nil {
		s.writesFailed.Add(1)
		code, kind := http.StatusInternalServerError, ""
		var k writeKinder
		switch {
		case errors.As(err, &k):
			kind = k.WriteErrorKind()
			if c, ok := kindStatus[kind]; ok {
				code = c
			}
			if kind == "busy" {
				w.Header().Set("Retry-After", "1")
			}
		case errors.Is(err, context.DeadlineExceeded):
			code = http.StatusGatewayTimeout
		case errors.Is(err, context.Canceled):
			return // the client went away before the write started
		}
		b, _ := json.Marshal(struct {
			Error string `json:"error"`
			Kind  string `json:"kind,omitempty"`
		}{err.Error(), kind})
		writeJSON(w, code, append(b, '\n'))
		return
	}
	s.writesOK.Add(1)
	replyJSON(w, writeReply{Device: req.Device, Tag: req.Tag, Written: written, ReadBack: readBack,
		DurationMS: float64(dur.Microseconds()) / 1000})
}

// writeRequest is a parsed write body.
type writeRequest struct {
	Device, Tag string
	Value       float64
}

var errTooDeep = errors.New("nested too deeply")

// depthReader fails as soon as the JSON passing through nests deeper than
// max (outside strings), so a body of 100k '[' costs a few bytes, not a parse.
type depthReader struct {
	r              io.Reader
	max, depth     int
	inStr, escaped bool
}

func (d *depthReader) Read(p []byte) (int, error) {
	n, err := d.r.Read(p)
	for _, c := range p[:n] {
		switch {
		case d.inStr:
			switch {
			case d.escaped:
				d.escaped = false
			case c == '\\':
				d.escaped = true
			case c == '"':
				d.inStr = false
			}
		case c == '"':
			d.inStr = true
		case c == '[' || c == '{':
			d.depth++
			if d.depth > d.max {
				return 0, errTooDeep
			}
		case c == ']' || c == '}':
			d.depth--
		}
	}
	return n, err
}

// parseWriteBody reads {"device":…,"tag":…,"value":…} strictly. status is
// 0 when the body is good, else the status to answer with msg.
func parseWriteBody(body io.Reader) (req writeRequest, status int, msg string) {
	var m struct {
		Device *string          `json:"device"`
		Tag    *string          `json:"tag"`
		Value  *json.RawMessage `json:"value"`
	}
	dec := json.NewDecoder(&depthReader{r: body, max: maxWriteDepth})
	dec.DisallowUnknownFields()
	bad := func(err error) (writeRequest, int, string) {
		var mbe *http.MaxBytesError
		switch {
		case errors.As(err, &mbe):
			return req, http.StatusRequestEntityTooLarge, "write body exceeds " + strconv.Itoa(MaxWriteBody) + " bytes"
		case errors.Is(err, errTooDeep):
			return req, http.StatusBadRequest, "bad write body: JSON nested deeper than " + strconv.Itoa(maxWriteDepth)
		case errors.Is(err, io.EOF):
			return req, http.StatusBadRequest, `empty write body: want {"device":"…","tag":"…","value":…}`
		}
		return req, http.StatusBadRequest, "bad write body: " + err.Error()
	}
	if err := dec.Decode(&m); err != nil {
		return bad(err)
	}
	if _, err := dec.Token(); err != io.EOF {
		if err == nil {
			return req, http.StatusBadRequest, "bad write body: data after the JSON object"
		}
		return bad(err)
	}
	switch {
	case m.Device == nil || *m.Device == "":
		return req, http.StatusBadRequest, `bad write body: missing "device"`
	case m.Tag == nil || *m.Tag == "":
		return req, http.StatusBadRequest, `bad write body: missing "tag"`
	case m.Value == nil:
		return req, http.StatusBadRequest, `bad write body: missing "value"`
	}
	req.Device, req.Tag = *m.Device, *m.Tag
	v := bytes.TrimSpace(*m.Value)
	switch {
	case bytes.Equal(v, []byte("true")):
		req.Value = 1
	case bytes.Equal(v, []byte("false")):
		req.Value = 0
	default:
		f, err := strconv.ParseFloat(string(v), 64)
		if err != nil || len(v) == 0 || !(v[0] == '-' || (v[0] >= '0' && v[0] <= '9')) {
			return req, http.StatusBadRequest, `bad write body: "value" must be a number or true/false`
		}
		req.Value = f
	}
	return req, 0, ""
}

// handlePreflight answers CORS preflights of /api/ for allowed origins only.
func (s *Server) handlePreflight(w http.ResponseWriter, r *http.Request) {
	o := r.Header.Get("Origin")
	if o == "" || r.Header.Get("Access-Control-Request-Method") == "" {
		w.Header().Set("Allow", "GET, POST, OPTIONS")
		w.WriteHeader(http.StatusNoContent)
		return
	}
	if !sameOrigin(o, r.Host) && !s.allowed(o) {
		writeError(w, http.StatusForbidden, "origin "+strconv.Quote(o)+" is not allowed")
		return
	}
	h := w.Header()
	h.Set("Access-Control-Allow-Origin", o)
	h.Set("Vary", "Origin")
	if r.URL.Path == "/api/write" {
		h.Set("Access-Control-Allow-Methods", "POST")
	} else {
		h.Set("Access-Control-Allow-Methods", "GET")
	}
	h.Set("Access-Control-Allow-Headers", "Authorization, Content-Type")
	h.Set("Access-Control-Max-Age", "600")
	w.WriteHeader(http.StatusNoContent)
}
