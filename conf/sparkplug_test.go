package conf

import (
	"strings"
	"testing"
)

const spDev = "[[device]]\nname = \"d\"\ntransport = \"tcp\"\naddress = \"h\"\ntags = [ { name = \"t\", address = 0 } ]\n"

func TestSparkplugSection(t *testing.T) {
	cfg, err := Parse("x.toml", []byte("[gateway]\nid = \"gw\"\n[upstream.mqtt]\nbroker = \"tcp://127.0.0.1:1883\"\nmode = \"off\"\n"+
		"[upstream.sparkplug]\ngroup_id = \"plant\"\n"+spDev))
	if err != nil {
		t.Fatal(err)
	}
	want := Sparkplug{GroupID: "plant", NodeID: "gw", ClientID: "edgegw-gw-sparkplug"}
	if cfg.Upstream.Sparkplug == nil || *cfg.Upstream.Sparkplug != want {
		t.Fatalf("sparkplug = %+v, want %+v", cfg.Upstream.Sparkplug, want)
	}
	cfg, err = Parse("x.toml", []byte("[upstream.mqtt]\nbroker = \"tcp://h:1883\"\n"+spDev))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Upstream.Sparkplug != nil {
		t.Fatalf("absent section: %+v", cfg.Upstream.Sparkplug)
	}
	cfg, err = Parse("x.toml", []byte("[upstream.mqtt]\nbroker = \"tcp://h:1883\"\n[upstream.sparkplug]\ngroup_id = \"g\"\nnode_id = \"n1\"\nprimary_host_id = \"scada\"\nwrites = true\nclient_id = \"spb\"\n"+spDev))
	if err != nil {
		t.Fatal(err)
	}
	if s := cfg.Upstream.Sparkplug; s.NodeID != "n1" || s.PrimaryHostID != "scada" || !s.Writes || s.ClientID != "spb" {
		t.Fatalf("sparkplug = %+v", s)
	}
}

func TestSparkplugErrors(t *testing.T) {
	for _, c := range []struct{ name, src, want string }{
		{"group required", "[upstream.mqtt]\nbroker = \"tcp://h\"\n[upstream.sparkplug]\nwrites = true\n", `upstream.sparkplug.group_id is required`},
		{"forbidden char", "[upstream.mqtt]\nbroker = \"tcp://h\"\n[upstream.sparkplug]\ngroup_id = \"a/b\"\n", `upstream.sparkplug.group_id "a/b": Sparkplug forbids + # / in an id`},
		{"wildcard node", "[upstream.mqtt]\nbroker = \"tcp://h\"\n[upstream.sparkplug]\ngroup_id = \"g\"\nnode_id = \"n+\"\n", `upstream.sparkplug.node_id "n+"`},
		{"no broker", "[upstream.sparkplug]\ngroup_id = \"g\"\n", `[upstream.sparkplug] needs [upstream.mqtt] broker`},
		{"unknown key", "[upstream.mqtt]\nbroker = \"tcp://h\"\n[upstream.sparkplug]\ngroup_id = \"g\"\ngroupid = 1\n", `unknown key "upstream.sparkplug.groupid"`},
		{"same client id", "[upstream.mqtt]\nbroker = \"tcp://h\"\nclient_id = \"c\"\n[upstream.sparkplug]\ngroup_id = \"g\"\nclient_id = \"c\"\n", `must be non-empty and differ`},
	} {
		_, err := Parse("x.toml", []byte(c.src+spDev))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: err = %v, want %q", c.name, err, c.want)
		}
	}
}
