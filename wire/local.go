package wire

import (
	"encoding/json"
	"strconv"

	"edgegw/ringstore"
)

// AppendEpochField appends `,"epoch":"<16 hex digits>"`: the numbering seq
// belongs to, which changes when the gateway's numbering restarts (wiped
// data_dir, memory-only restart, disk failure). A client that sees it
// change starts again from lastSequence=0 instead of taking the new numbers
// for a gap or a replay.
func AppendEpochField(b []byte, epoch uint64) []byte {
	b = append(b, `,"epoch":"`...)
	b = ringstore.AppendEpoch(b, epoch)
	return append(b, '"')
}

// AppendShortPoll appends the shortPolling reply: the ring's last seq and
// epoch, and the latest sample of every tag.
func AppendShortPoll(b []byte, seq, epoch uint64, latest []ringstore.Sample) []byte {
	return appendReply(b, `{"seq":`, seq, epoch, "", `,"tags":`, latest)
}

// AppendLongPoll appends a longPolling reply: the samples after the
// client's lastSequence, or with reset the latest of every tag.
func AppendLongPoll(b []byte, seq, epoch uint64, reset bool, samples []ringstore.Sample) []byte {
	return appendReply(b, `{"seq":`, seq, epoch, resetField(reset), `,"samples":`, samples)
}

// AppendWSSamples appends a WebSocket "samples" message: samples up to
// last, of the epoch of the last one.
func AppendWSSamples(b []byte, last uint64, samples []ringstore.Sample) []byte {
	var epoch uint64
	if len(samples) > 0 {
		epoch = samples[len(samples)-1].Epoch
	}
	return appendReply(b, `{"type":"samples","seq":`, last, epoch, "", `,"samples":`, samples)
}

// AppendWSSnapshot appends a WebSocket "snapshot" message: the latest
// sample of every tag, with reset when it answers a resume the ring could
// not serve.
func AppendWSSnapshot(b []byte, seq, epoch uint64, reset bool, latest []ringstore.Sample) []byte {
	return appendReply(b, `{"type":"snapshot","seq":`, seq, epoch, resetField(reset), `,"samples":`, latest)
}

// appendReply appends open (`{` and the fields before seq) seq, the epoch,
// the reset field (or nothing), the list's key and the samples.
func appendReply(b []byte, open string, seq, epoch uint64, reset, list string, samples []ringstore.Sample) []byte {
	b = append(b, open...)
	b = strconv.AppendUint(b, seq, 10)
	b = AppendEpochField(b, epoch)
	b = append(b, reset...)
	b = append(b, list...)
	b = ringstore.AppendJSONArray(b, samples)
	return append(b, '}')
}

func resetField(reset bool) string {
	if reset {
		return `,"reset":true`
	}
	return `,"reset":false`
}

// ParseResume reads a WebSocket client's {"lastSequence":N}; msg is the
// close reason (short enough for a close frame) when it is not that.
func ParseResume(data []byte) (n uint64, msg string) {
	var m struct {
		LastSequence *json.Number `json:"lastSequence"`
	}
	if err := json.Unmarshal(data, &m); err != nil {
		return 0, "bad message: want {\"lastSequence\":N}"
	}
	if m.LastSequence == nil {
		return 0, "bad message: missing lastSequence"
	}
	n, err := strconv.ParseUint(m.LastSequence.String(), 10, 64)
	if err != nil {
		return 0, "bad message: lastSequence is not a non-negative integer"
	}
	return n, ""
}
