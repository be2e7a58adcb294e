package wire

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
)

// Limits on what a write command may carry.
const (
	MaxNameLen    = 128  // device and tag names
	MaxIDLen      = 128  // command ids
	MaxMQTTWrite  = 1024 // the payload of an MQTT write command
	MaxWriteDepth = 4    // nesting of a local write body
)

// Kinds of write answers a gateway decides before (or instead of) writing;
// the writer adds its own ("unknown device", "unknown tag", "not writable",
// "out of range", "busy", "device", "mismatch", "stopped").
const (
	KindBusy       = "busy"        // too many write commands in flight, or over the rate limit
	KindRefused    = "refused"     // write commands are off on this gateway
	KindBadRequest = "bad request" // malformed command: id, device, tag or value
	KindTimeout    = "timeout"     // the write did not finish in time
	KindFailed     = "failed"      // the writer failed without saying why
)

// ValidName reports whether s is a device or tag name the configuration
// accepts: [A-Za-z0-9_.-]+, at most MaxNameLen bytes.
func ValidName(s string) bool {
	if s == "" || len(s) > MaxNameLen {
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

// ParseValue reads a write value: a finite JSON number, or true/false
// (1/0). raw must already be valid JSON (it comes out of a decoder).
func ParseValue(raw []byte) (float64, error) {
	switch { // string(raw) only where it does not escape: no allocation on success
	case string(raw) == "true":
		return 1, nil
	case string(raw) == "false":
		return 0, nil
	case len(raw) == 0 || string(raw) == "null":
		return 0, errors.New("no value")
	case raw[0] == '-' || '0' <= raw[0] && raw[0] <= '9':
		f, err := strconv.ParseFloat(string(raw), 64)
		if err != nil || math.IsInf(f, 0) || math.IsNaN(f) {
			return 0, fmt.Errorf("value %.40s is out of range", raw)
		}
		return f, nil
	default:
		return 0, fmt.Errorf("value %.40s is not a number or true/false", raw)
	}
}

// WriteCommand is one write command (receiver → gateway).
type WriteCommand struct {
	ID, Device, Tag string
	Value           float64
}

// Check returns why c's id or names cannot be used, or "".
func (c *WriteCommand) Check() string {
	switch {
	case len(c.ID) > MaxIDLen:
		return fmt.Sprintf("id longer than %d bytes", MaxIDLen)
	case !ValidName(c.Device):
		return fmt.Sprintf("device %.40q: want [A-Za-z0-9_.-]{1,%d}", c.Device, MaxNameLen)
	case !ValidName(c.Tag):
		return fmt.Sprintf("tag %.40q: want [A-Za-z0-9_.-]{1,%d}", c.Tag, MaxNameLen)
	}
	return ""
}

// AppendWriteCommand appends a write command frame (layout in the package
// comment). A value that is not finite is written as null.
func AppendWriteCommand(b []byte, id, device, tag string, value float64) []byte {
	b = append(b, `{"type":"write","id":`...)
	b = AppendString(b, id)
	b = append(b, `,"device":`...)
	b = AppendString(b, device)
	b = append(b, `,"tag":`...)
	b = AppendString(b, tag)
	b = append(b, `,"value":`...)
	b = appendNumber(b, value)
	return append(b, '}')
}

// WriteAnswer is the result of one write command (gateway → receiver over
// the WebSocket uplink, or on the MQTT result topic):
//
//	{"type":"write_result","id":"7","ok":true,"written":42.5,"read_back":42.5}
//	{"type":"write_result","id":"7","ok":false,"error":"edge: …: out of range","kind":"out of range"}
type WriteAnswer struct {
	ID       string  `json:"id"`
	OK       bool    `json:"ok"`
	Written  float64 `json:"written"`
	ReadBack float64 `json:"read_back"`
	Error    string  `json:"error"`
	Kind     string  `json:"kind"`
}

// AppendWriteResult appends the answer's frame. A number that is not finite
// is written as null.
func AppendWriteResult(b []byte, a *WriteAnswer) []byte {
	b = append(b, `{"type":"write_result","id":`...)
	b = AppendString(b, a.ID)
	if a.OK {
		b = append(b, `,"ok":true,"written":`...)
		b = appendNumber(b, a.Written)
		b = append(b, `,"read_back":`...)
		b = appendNumber(b, a.ReadBack)
	} else {
		b = append(b, `,"ok":false,"error":`...)
		b = AppendString(b, a.Error)
		b = append(b, `,"kind":`...)
		b = AppendString(b, a.Kind)
	}
	return append(b, '}')
}

// appendString writes s as encoding/json does (HTML-safe, invalid UTF-8
// replaced): answers carry error texts from anywhere.
func AppendString(b []byte, s string) []byte {
	j, _ := json.Marshal(s) // a string always marshals
	return append(b, j...)
}

func appendNumber(b []byte, f float64) []byte {
	if math.IsInf(f, 0) || math.IsNaN(f) {
		return append(b, "null"...)
	}
	return strconv.AppendFloat(b, f, 'g', -1, 64)
}

// Uplink is one message a gateway reads from its WebSocket uplink: an ack
// (Type "ack", Last) or a write command (Type "write", Cmd). For a write
// command with unusable fields Bad says why: the gateway answers it with
// kind "bad request" and keeps the connection.
type Uplink struct {
	Type string
	Last uint64       // ack
	Cmd  WriteCommand // write
	Bad  string       // write: why it cannot be carried out
}

// ParseUplink reads one uplink message. One that is not JSON, has an
// unknown type or is an ack without last is a *ProtocolError (a broken
// peer: the gateway drops the connection).
func ParseUplink(data []byte) (Uplink, error) {
	var f struct {
		Type   string          `json:"type"`
		Last   *uint64         `json:"last"`
		ID     json.RawMessage `json:"id"`
		Device string          `json:"device"`
		Tag    string          `json:"tag"`
		Value  json.RawMessage `json:"value"`
	}
	if err := json.Unmarshal(data, &f); err != nil {
		return Uplink{}, &ProtocolError{Frame: "uplink", Msg: err.Error()}
	}
	m := Uplink{Type: f.Type}
	switch f.Type {
	case "ack":
		if f.Last == nil {
			return m, &ProtocolError{Frame: "ack", Msg: "no last"}
		}
		m.Last = *f.Last
	case "write":
		var id string
		if len(f.ID) > 0 && json.Unmarshal(f.ID, &id) != nil {
			id = "" // not a string: answered with an empty id
			m.Bad = "id is not a string"
		}
		m.Cmd = WriteCommand{ID: id, Device: f.Device, Tag: f.Tag}
		if m.Bad != "" {
			break
		}
		m.Bad = m.Cmd.Check()
		if m.Bad == "" {
			v, err := ParseValue(f.Value)
			if err != nil {
				m.Bad = err.Error()
			}
			m.Cmd.Value = v
		}
		if len(m.Cmd.ID) > MaxIDLen {
			m.Cmd.ID = ""
		}
	default:
		return m, protoErr("uplink", "type %.40q", f.Type)
	}
	return m, nil
}

// ParseMQTTWrite reads the payload of <prefix>/write/<device>/<tag>: a JSON
// number, true/false, or {"value":…,"id":"…"} (id optional).
func ParseMQTTWrite(payload []byte) (id string, value float64, err error) {
	if len(payload) > MaxMQTTWrite {
		return "", 0, fmt.Errorf("payload of %d bytes (at most %d)", len(payload), MaxMQTTWrite)
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
		if len(f.ID) > MaxIDLen {
			return "", 0, fmt.Errorf("id longer than %d bytes", MaxIDLen)
		}
		value, err = ParseValue(f.Value)
		return f.ID, value, err
	}
	value, err = ParseValue(raw)
	return "", value, err
}

// WriteRequest is the body of the local API's POST /api/write.
type WriteRequest struct {
	Device, Tag string
	Value       float64
}

// WriteReply is the local API's answer to a write that was carried out.
type WriteReply struct {
	Device     string  `json:"device"`
	Tag        string  `json:"tag"`
	Written    float64 `json:"written"`
	ReadBack   float64 `json:"read_back"`
	DurationMS float64 `json:"duration_ms"`
}

// WriteFailure is the local API's answer to a write that failed; Kind is
// the writer's kind, left out when it gave none.
type WriteFailure struct {
	Error string `json:"error"`
	Kind  string `json:"kind,omitempty"`
}

// ErrEmptyBody is a write body with nothing in it.
var ErrEmptyBody = errors.New(`wire: write: empty body: want {"device":"…","tag":"…","value":…}`)

var errTooDeep = &ProtocolError{Frame: "write", Msg: "JSON nested deeper than " + strconv.Itoa(MaxWriteDepth)}

// depthReader fails as soon as the JSON passing through nests deeper than
// MaxWriteDepth, so a body of 100k '[' costs a scan of one read, not a
// parse. It marks the reader's own errors (readError) for the caller.
type depthReader struct {
	r  io.Reader
	sc Scanner
}

// readError is an error of the body's reader (not io.EOF).
type readError struct{ err error }

func (e *readError) Error() string { return e.err.Error() }
func (e *readError) Unwrap() error { return e.err }

func (d *depthReader) Read(p []byte) (int, error) {
	n, err := d.r.Read(p)
	if err != nil && err != io.EOF {
		err = &readError{err}
	}
	d.sc.Scan(p[:n])
	if d.sc.Deepest > MaxWriteDepth {
		return 0, errTooDeep
	}
	return n, err
}

// ParseWriteRequest reads {"device":…,"tag":…,"value":…} strictly: no
// other field, nothing after the object, nesting at most MaxWriteDepth,
// value a finite number or true/false. An error from body (such as
// *http.MaxBytesError) is returned wrapped; an empty body is ErrEmptyBody;
// anything else is a *ProtocolError whose Msg says what is wrong.
func ParseWriteRequest(body io.Reader) (WriteRequest, error) {
	var req WriteRequest
	var m struct {
		Device *string          `json:"device"`
		Tag    *string          `json:"tag"`
		Value  *json.RawMessage `json:"value"`
	}
	dec := json.NewDecoder(&depthReader{r: body})
	dec.DisallowUnknownFields()
	bad := func(err error) (WriteRequest, error) {
		var re *readError
		var pe *ProtocolError
		switch {
		case errors.As(err, &re):
			return req, fmt.Errorf("wire: write: %w", re.err) // such as *http.MaxBytesError
		case errors.As(err, &pe):
			return req, err // too deep
		case errors.Is(err, io.EOF):
			return req, ErrEmptyBody
		}
		return req, &ProtocolError{Frame: "write", Msg: err.Error()}
	}
	if err := dec.Decode(&m); err != nil {
		return bad(err)
	}
	if _, err := dec.Token(); err != io.EOF {
		if err == nil {
			return req, &ProtocolError{Frame: "write", Msg: "data after the JSON object"}
		}
		return bad(err)
	}
	switch {
	case m.Device == nil || *m.Device == "":
		return req, &ProtocolError{Frame: "write", Msg: `missing "device"`}
	case m.Tag == nil || *m.Tag == "":
		return req, &ProtocolError{Frame: "write", Msg: `missing "tag"`}
	case m.Value == nil:
		return req, &ProtocolError{Frame: "write", Msg: `missing "value"`}
	}
	req.Device, req.Tag = *m.Device, *m.Tag
	v, err := ParseValue(bytes.TrimSpace(*m.Value))
	if err != nil {
		return req, &ProtocolError{Frame: "write", Msg: `"value" must be a number or true/false`}
	}
	req.Value = v
	return req, nil
}
