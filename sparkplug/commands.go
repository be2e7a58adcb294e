package sparkplug

// NCMD and DCMD: decoded on paho's goroutine, writes carried out one at a
// time by writeLoop.

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	mqtt "github.com/eclipse/paho.mqtt.golang"
)

type writeCmd struct {
	t     *tagInfo
	value float64
}

// onMessage runs on paho's goroutine: it decodes and hands over, never blocks.
func (n *Node) onMessage(ev *events, m mqtt.Message) {
	topic := m.Topic()
	if strings.HasPrefix(topic, "spBv1.0/STATE/") {
		online, ts, ok := parseState(m.Payload())
		if !ok {
			n.log.Warn("sparkplug: unreadable STATE ignored", "topic", topic, "payload", fmt.Sprintf("%.100q", m.Payload()))
			return
		}
		ev.mu.Lock()
		if ts != 0 && ts < ev.stateTS {
			ev.mu.Unlock()
			return // an older STATE (the spec: ignore it)
		}
		ev.online, ev.stateTS = online, ts
		ev.mu.Unlock()
		ev.kick(ev.state)
		return
	}
	if m.Retained() {
		// A retained command would be carried out again at every connect.
		n.refuse("sparkplug: retained command ignored; clear it with an empty retained message", "topic", topic)
		return
	}
	p, err := DecodePayload(m.Payload())
	if err != nil {
		n.refuse("sparkplug: undecodable command refused", "topic", topic, "err", err)
		return
	}
	if topic == n.Topic("NCMD", "") {
		for _, mt := range p.Metrics {
			if (mt.HasName && mt.Name == MetricRebirth || mt.HasAlias && mt.Alias == aliasRebirth) && mt.Value.Kind == KindBool && mt.Value.B {
				n.log.Info("sparkplug: rebirth requested")
				ev.kick(ev.rebirth)
				continue
			}
			n.refuse("sparkplug: NCMD metric not supported", "name", mt.Name, "alias", mt.Alias)
		}
		return
	}
	device, ok := strings.CutPrefix(topic, n.Topic("DCMD", "")+"/")
	if !ok {
		return
	}
	for _, mt := range p.Metrics {
		var t *tagInfo
		if mt.HasName {
			t = n.tags[aliasKey{device, mt.Name}]
		} else if mt.HasAlias {
			t = n.byAlias[mt.Alias]
		}
		if t == nil || t.device != device {
			n.refuse("sparkplug: DCMD for an unknown metric refused", "device", device, "name", mt.Name, "alias", mt.Alias)
			continue
		}
		if mt.IsNull {
			n.refuse("sparkplug: DCMD without a value refused", "device", device, "tag", t.Name)
			continue
		}
		if !n.cfg.Writes || n.cfg.Writer == nil {
			n.refuse("sparkplug: DCMD refused: writes are off ([upstream.sparkplug] writes = false)", "device", device, "tag", t.Name)
			continue
		}
		v, err := commandValue(&t.Tag, t.datatype, mt.Value)
		if err != nil {
			n.refuse("sparkplug: DCMD refused: "+err.Error(), "device", device, "tag", t.Name)
			continue
		}
		select {
		case n.writes <- writeCmd{t: t, value: v}:
		default:
			n.refuse("sparkplug: DCMD refused: write queue full", "device", device, "tag", t.Name)
		}
	}
}

// refuse counts a refused command and logs it, at most once per 10 s
// (with the number refused meanwhile): a publisher cannot flood the log.
func (n *Node) refuse(msg string, args ...any) {
	total := n.refused.Add(1)
	n.refuseLog.Log(n.log, "refused", msg, append(args, "refused_total", total)...)
}

// parseState reads a STATE payload: Sparkplug 3.0 JSON
// {"online":true,"timestamp":…}, or the 2.2 strings ONLINE / OFFLINE.
func parseState(b []byte) (online bool, ts uint64, ok bool) {
	s := strings.TrimSpace(string(b))
	switch strings.ToUpper(s) {
	case "ONLINE":
		return true, 0, true
	case "OFFLINE":
		return false, 0, true
	}
	var st struct {
		Online    *bool  `json:"online"`
		Timestamp uint64 `json:"timestamp"`
	}
	if err := json.Unmarshal(b, &st); err != nil || st.Online == nil {
		return false, 0, false
	}
	return *st.Online, st.Timestamp, true
}

// writeLoop carries out DCMD writes one at a time through the Writer; the
// result shows in the next DDATA (the device is read back and polled).
func (n *Node) writeLoop(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case w := <-n.writes:
			wctx, cancel := context.WithTimeout(ctx, n.cfg.WriteTimeout)
			written, back, err := n.cfg.Writer.Write(wctx, w.t.device, w.t.Name, w.value, "sparkplug DCMD "+n.cfg.Broker)
			cancel()
			if err != nil {
				n.refused.Add(1)
				n.log.Warn("sparkplug: DCMD write failed", "device", w.t.device, "tag", w.t.Name, "value", w.value, "err", err)
				continue
			}
			n.log.Info("sparkplug: DCMD written", "device", w.t.device, "tag", w.t.Name, "written", written, "read_back", back)
		}
	}
}
