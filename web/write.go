package web

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"mime"
	"net/http"
	"strconv"
	"time"

	"edgegw/wire"
)

// Writer does one confirmed write (edge's scheduler through main's adapter):
// written is the value asked for, readBack the value read after it. Errors
// that implement WriteErrorKind() string are mapped to status codes by kind.
type Writer interface {
	Write(ctx context.Context, device, tag string, value float64, origin string) (written, readBack float64, err error)
}

// writeKinder classifies a Writer error (edge.WriteError satisfies it).
type writeKinder interface{ WriteErrorKind() string }

// Write (the body and the answers are wire's: WriteRequest, WriteReply,
// WriteFailure; layouts in package wire's comment):
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

// MaxWriteBody is the most bytes of a write body (its nesting is bounded by
// wire.MaxWriteDepth).
const MaxWriteBody = 4 << 10

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
	origin := "http " + s.clientIP(r).String()
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
		b, _ := json.Marshal(wire.WriteFailure{Error: err.Error(), Kind: kind})
		writeJSON(w, code, append(b, '\n'))
		return
	}
	s.writesOK.Add(1)
	replyJSON(w, wire.WriteReply{Device: req.Device, Tag: req.Tag, Written: written, ReadBack: readBack,
		DurationMS: float64(dur.Microseconds()) / 1000})
}

// parseWriteBody reads a write body (wire.ParseWriteRequest). status is 0
// when the body is good, else the status to answer with msg.
func parseWriteBody(body io.Reader) (req wire.WriteRequest, status int, msg string) {
	req, err := wire.ParseWriteRequest(body)
	if err == nil {
		return req, 0, "" // before the error targets below: they escape, so they cost an allocation each
	}
	var mbe *http.MaxBytesError
	var pe *wire.ProtocolError
	switch {
	case errors.As(err, &mbe):
		return req, http.StatusRequestEntityTooLarge, "write body exceeds " + strconv.Itoa(MaxWriteBody) + " bytes"
	case errors.Is(err, wire.ErrEmptyBody):
		return req, http.StatusBadRequest, `empty write body: want {"device":"…","tag":"…","value":…}`
	case errors.As(err, &pe):
		return req, http.StatusBadRequest, "bad write body: " + pe.Msg
	}
	return req, http.StatusBadRequest, "bad write body: " + err.Error()
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
		writeError(w, http.StatusForbidden, "origin "+quoteInput(o)+" is not allowed")
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
