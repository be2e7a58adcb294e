package conf

import "strings"

// Sparkplug is the optional Sparkplug B edge node ([upstream.sparkplug]).
// It publishes through the broker of [upstream.mqtt] (and its credentials
// and TLS files) with a client of its own. Keys and defaults: defaults.go.
type Sparkplug struct {
	GroupID       string
	NodeID        string
	PrimaryHostID string
	Writes        bool
	ClientID      string
}

// sparkplug reads [upstream.sparkplug] of the upstream table; up.Sparkplug stays nil when the
// section is absent.
func (d *decoder) sparkplug(upstream *table, up *Upstream, gatewayID string) {
	if !upstream.has("sparkplug") {
		return
	}
	t := upstream.sub("sparkplug")
	s := &Sparkplug{NodeID: gatewayID, ClientID: up.MQTT.ClientID + "-sparkplug"}
	id := func(key string, required bool) string {
		v, ok := t.str(key)
		switch {
		case !ok && required:
			t.errf(key, "%s is required", t.name(key))
		case !ok:
		case v == "":
			t.errf(key, "%s is empty", t.name(key))
		case strings.ContainsAny(v, "+#/\x00"):
			t.errf(key, "%s %q: Sparkplug forbids + # / in an id", t.name(key), v)
		}
		return v
	}
	s.GroupID = id("group_id", true)
	if v := id("node_id", false); v != "" {
		s.NodeID = v
	}
	s.PrimaryHostID = id("primary_host_id", false)
	s.Writes = t.boolean("writes", false)
	if v, ok := t.str("client_id"); ok {
		if v == "" || v == up.MQTT.ClientID {
			t.errf("client_id", "%s %q: must be non-empty and differ from upstream.mqtt.client_id", t.name("client_id"), v)
		} else {
			s.ClientID = v
		}
	}
	if up.MQTT.Broker == "" {
		t.errf("group_id", "[upstream.sparkplug] needs [upstream.mqtt] broker")
	}
	t.done()
	up.Sparkplug = s
}
