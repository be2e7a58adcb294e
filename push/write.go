package push

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"sync/atomic"
	"time"
)

// Writer carries out one write command: the value goes to the tag of the
// device, is read back once, and both are returned. Declared here, the
// consumer; main adapts edge's scheduler to it (push never imports edge).
// Origin says who asked ("websocket uplink collector.example:443",
// "mqtt 127.0.0.1:1883"); the writer logs it with the result.
//
// An error may carry a kind for the answer by having a method
// WriteErrorKind() string (edge's *WriteError: "unknown device", "not
// writable", "out of range", "busy", "device", "mismatch", "stopped", …);
// other errors are answered with kind "failed", a context deadline with
// "timeout".
type Writer interface {
	Write(ctx context.Context, device, tag string, value float64, origin string) (written, readBack float64, err error)
}

// Kinds of write answers decided by push itself (the writer adds its own).
const (
	KindBusy       = "busy"        // too many write commands in flight, or over the rate limit
	KindRefused    = "refused"     // write commands are off on this gateway (no Writer)
	KindBadRequest = "bad request" // malformed command: id, device, tag or value
	KindTimeout    = "timeout"     // the writer did not finish within WriteTimeout
	KindFailed     = "failed"      // the writer failed without saying why
)

// WriteAnswer is the result of one write command, as sent on the wire
// (WebSocket uplink and MQTT result topic alike):
//
//	{"type":"write_result","id":"7","ok":true,"written":42.5,"read_back":42.5}
//	{"type":"write_result","id":"7","ok":false,"error":"edge: …: out of range","kind":"out of range"}
//
// A number that is not finite is written as null.
type WriteAnswer struct {
	ID       string  `json:"id"`
	OK       bool    `json:"ok"`
	Written  float64 `json:"written"`
	ReadBack float64 `json:"read_back"`
	Error    string  `json:"error"`
	Kind     string  `json:"kind"`
}

// Limits on what a write command may carry.
const (
	maxNameLen      = 128  // device and tag names
	maxIDLen        = 128  // command ids
	maxWritePayload = 1024 // an MQTT write payload
)

// validName reports whether s is a name conf accepts: [A-Za-z0-9_.-]+,
// at most maxNameLen bytes.
func validName(s string) bool {
	if s == "" || len(s) > maxNameLen {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_' || c == '.' || c == '-') {
			return false
		}
	}
	return true
}

// parseValue reads a write value: a JSON number (finite) or true/false
// (1/0). raw must already be valid JSON (it comes out of json.Unmarshal).
func parseValue(raw json.RawMessage) (float64, error) {
	switch s := string(raw); {
	case s == "true":
		return 1, nil
	case s == "false":
		return 0, nil
	case s == "" || s == "null":
		return 0, errors.New("no value")
	case s[0] == '-' || '0' <= s[0] && s[0] <= '9':
		f, err := strconv.ParseFloat(s, 64)
		if err != nil || math.IsInf(f, 0) || math.IsNaN(f) {
			return 0, fmt.Errorf("value %.40s is out of range", s)
		}
		return f, nil
	default:
		return 0, fmt.Errorf("value %.40s is not a number or true/false", s)
	}
}

// command is one write command, checked.
type command struct {
	ID, Device, Tag string
	Value           float64
}

// Write command, receiver to gateway over the WebSocket uplink:
//
//	{"type":"write","id":"7","device":"boiler-plc","tag":"setpoint","value":42.5}
//
// value: a JSON number or true/false. id: a string of at most 128 bytes,
// echoed in the answer.
func appendWriteCommand(b []byte, id, device, tag string, value float64) []byte {
	b = append(b, `{"type":"write","id":`...)
	b = appendString(b, id)
	b = append(b, `,"device":`...)
	b = appendString(b, device)
	b = append(b, `,"tag":`...)
	b = appendString(b, tag)
	b = append(b, `,"value":`...)
	b = appendNumber(b, value)
	return append(b, '}')
}

// appendWriteResult writes the answer (layout above WriteAnswer).
func appendWriteResult(b []byte, a *WriteAnswer) []byte {
	b = append(b, `{"type":"write_result","id":`...)
	b = appendString(b, a.ID)
	if a.OK {
		b = append(b, `,"ok":true,"written":`...)
		b = appendNumber(b, a.Written)
		b = append(b, `,"read_back":`...)
		b = appendNumber(b, a.ReadBack)
	} else {
		b = append(b, `,"ok":false,"error":`...)
		b = appendString(b, a.Error)
		b = append(b, `,"kind":`...)
		b = appendString(b, a.Kind)
	}
	return append(b, '}')
}

func appendString(b []byte, s string) []byte {
	j, _ := json.Marshal(s) // a string always marshals
	return append(b, j...)
}

func appendNumber(b []byte, f float64) []byte {
	if math.IsInf(f, 0) || math.IsNaN(f) {
		return append(b, "null"...)
	}
	return strconv.AppendFloat(b, f, 'g', -1, 64)
}

// uplinkMsg is what the gateway reads from the uplink: an ack or a write
// command. For a write command with unusable fields, bad says why (the
// command is answered, the connection stays).
type uplinkMsg struct {
	typ  string
	last uint64  // ack
	cmd  command // write
	bad  string  // write: why it cannot be carried out
}

// parseUplink reads one uplink message. A message that is not JSON, has an
// unknown type or an ack without last is a *ProtocolError (the connection
// is then dropped, as for any broken peer).
func parseUplink(data []byte) (uplinkMsg, error) {
	var f struct {
		Type   string          `json:"type"`
		Last   *uint64         `json:"last"`
		ID     json.RawMessage `json:"id"`
		Device string          `json:"device"`
		Tag    string          `json:"tag"`
		Value  json.RawMessage `json:"value"`
	}
	if err := json.Unmarshal(data, &f); err != nil {
		return uplinkMsg{}, &ProtocolError{"uplink", err.Error()}
	}
	m := uplinkMsg{typ: f.Type}
	switch f.Type {
	case "ack":
		if f.Last == nil {
			return m, &ProtocolError{"ack", "no last"}
		}
		m.last = *f.Last
	case "write":
		var id string
		if len(f.ID) > 0 && json.Unmarshal(f.ID, &id) != nil {
			id = "" // not a string: answered with an empty id
			m.bad = "id is not a string"
		}
		m.cmd = command{ID: id, Device: f.Device, Tag: f.Tag}
		if m.bad != "" {
			break
		}
		m.bad = m.cmd.check()
		if m.bad == "" {
			v, err := parseValue(f.Value)
			if err != nil {
				m.bad = err.Error()
			}
			m.cmd.Value = v
		}
		if len(m.cmd.ID) > maxIDLen {
			m.cmd.ID = ""
		}
	default:
		return m, &ProtocolError{"uplink", fmt.Sprintf("type %.40q", f.Type)}
	}
	return m, nil
}

// check returns why c's names cannot be used, or "".
func (c *command) check() string {
	switch {
	case len(c.ID) > maxIDLen:
		return fmt.Sprintf("id longer than %d bytes", maxIDLen)
	case !validName(c.Device):
		return fmt.Sprintf("device %.40q: want [A-Za-z0-9_.-]{1,%d}", c.Device, maxNameLen)
	case !validName(c.Tag):
		return fmt.Sprintf("tag %.40q: want [A-Za-z0-9_.-]{1,%d}", c.Tag, maxNameLen)
	}
	return ""
}

// parseMQTTWrite reads the payload of <prefix>/write/<device>/<tag>: a JSON
// number, true/false, or {"value":…,"id":"…"} (id optional).
func parseMQTTWrite(payload []byte) (id string, value float64, err error) {
	if len(payload) > maxWritePayload {
		return "", 0, fmt.Errorf("payload of %d bytes (at most %d)", len(payload), maxWritePayload)
	}
	var raw json.RawMessage
	if err := json.Unmarshal(payload, &raw); err != nil {
		return "", 0, fmt.Errorf("payload is not JSON: %w", err)
	}
	if raw[0] == '{' {
		var f struct {
			Value json.RawMessage `json:"value"`
			ID    string          `json:"id"`
		}
		if err := json.Unmarshal(raw, &f); err != nil {
			return "", 0, fmt.Errorf("payload: %w", err)
		}
		if len(f.ID) > maxIDLen {
			return "", 0, fmt.Errorf("id longer than %d bytes", maxIDLen)
		}
		value, err = parseValue(f.Value)
		return f.ID, value, err
	}
	value, err = parseValue(raw)
	return "", value, err
}

// WriteStats counts write commands by outcome, over both paths.
type WriteStats struct {
	Received uint64 // commands seen (WebSocket and MQTT)
	OK       uint64 // written and read back
	Failed   uint64 // answered with an error by the writer (or its timeout)
	Busy     uint64 // refused: in-flight bound or rate limit
	Refused  uint64 // refused: no writer
	Bad      uint64 // refused: malformed command
}

type writeCounters struct {
	received, ok, failed, busy, refused, bad atomic.Uint64
}

// WriteStats returns the write command counters.
func (p *Pusher) WriteStats() WriteStats {
	c := &p.wc
	return WriteStats{Received: c.received.Load(), OK: c.ok.Load(), Failed: c.failed.Load(),
		Busy: c.busy.Load(), Refused: c.refused.Load(), Bad: c.bad.Load()}
}

// refuse builds the answer to a command push does not pass to the writer,
// counts it and logs it at a limited rate.
func (p *Pusher) refuse(id, kind, msg, origin string) WriteAnswer {
	switch kind {
	case KindBusy:
		p.wc.busy.Add(1)
	case KindRefused:
		p.wc.refused.Add(1)
	default:
		p.wc.bad.Add(1)
	}
	p.refuseLog.Log(p.log, "refused", "push: write command refused", "origin", origin, "kind", kind, "err", msg)
	return WriteAnswer{ID: id, Kind: kind, Error: "push: write: " + msg}
}

// errNoWriter is the answer when no Writer is configured.
const errNoWriter = "write commands are off on this gateway"

// doWrite carries out a checked command with the writer, bounded by
// WriteTimeout, and builds the answer.
func (p *Pusher) doWrite(ctx context.Context, c command, origin string) WriteAnswer {
	if p.cfg.Writer == nil {
		return p.refuse(c.ID, KindRefused, errNoWriter, origin)
	}
	ctx, cancel := context.WithTimeout(ctx, p.cfg.WriteTimeout)
	defer cancel()
	start := time.Now()
	written, readBack, err := p.cfg.Writer.Write(ctx, c.Device, c.Tag, c.Value, origin)
	if err == nil {
		p.wc.ok.Add(1)
		p.log.Debug("push: write command done", "origin", origin, "id", c.ID, "device", c.Device, "tag", c.Tag,
			"value", c.Value, "read_back", readBack, "took", time.Since(start))
		return WriteAnswer{ID: c.ID, OK: true, Written: written, ReadBack: readBack}
	}
	p.wc.failed.Add(1)
	kind := KindFailed
	var k interface{ WriteErrorKind() string }
	switch {
	case errors.As(err, &k):
		kind = k.WriteErrorKind()
	case errors.Is(err, context.DeadlineExceeded):
		kind = KindTimeout
	}
	p.log.Debug("push: write command failed", "origin", origin, "id", c.ID, "device", c.Device, "tag", c.Tag,
		"value", c.Value, "kind", kind, "err", err, "took", time.Since(start))
	return WriteAnswer{ID: c.ID, Kind: kind, Error: err.Error()}
}
