package wire

import (
	"bytes"
	"encoding/json"
	"strconv"

	"edgegw/ringstore"
)

// Status payloads of the retained <prefix>/status topic (the last will is
// StatusOffline).
const (
	StatusOnline  = "online"
	StatusOffline = "offline"
)

var keyValue = []byte(`,"value":`)

// AppendTagPayload appends the retained per-tag payload of
// <prefix>/<device>/<tag>, the sample's value, quality and ts (ms when ms
// is set) as the sample encoder writes them, its seq, and the tag's unit
// when not "":
//
//	{"value":21.5,"quality":"good","ts":1764450000123456,"seq":1042,"unit":"°C"}
func AppendTagPayload(b []byte, s *ringstore.Sample, unit string, ms bool) []byte {
	n := len(b)
	b = s.AppendJSONTS(b, ms) // {"seq":N,"device":"…","tag":"…","value":V,"quality":"q","ts":T}
	i := bytes.Index(b[n:], keyValue)
	b = append(b[:n+1], b[n+i+1:len(b)-1]...) // {"value":V,"quality":"q","ts":T
	b = append(b, `,"seq":`...)
	b = strconv.AppendUint(b, s.Seq, 10)
	if unit != "" {
		u, _ := json.Marshal(unit)
		b = append(b, `,"unit":`...)
		b = append(b, u...)
	}
	return append(b, '}')
}
