package conf

import (
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"
)

// config reads every section of the root table.
func (d *decoder) config(raw map[string]any) *Config {
	root := d.newTable("", "", raw, where{})
	cfg := &Config{}
	cfg.AllowEmpty = root.boolean("allow_empty", false)
	d.gateway(root.sub("gateway"), &cfg.Gateway)
	d.http(root.sub("http"), &cfg.HTTP)
	d.ring(root.sub("ring"), &cfg.Ring)
	d.poll(root.sub("poll"), &cfg.Poll)
	d.buffer(root.sub("buffer"), &cfg.Buffer)
	d.history(root.sub("history"), &cfg.History)
	up := root.sub("upstream")
	d.websocket(up.sub("websocket"), &cfg.Upstream.WebSocket)
	d.mqtt(up.sub("mqtt"), &cfg.Upstream.MQTT, cfg.Gateway.ID)
	d.sparkplug(up, &cfg.Upstream, cfg.Gateway.ID)
	cfg.Upstream.TSUnit = up.oneOf("ts_unit", DefaultTSUnit, TSUnitMicros, TSUnitMillis)
	up.done()
	cfg.Profiles = d.profiles(root.tables("profile"))
	cfg.Devices = d.devices(root.tables("device"), cfg.Profiles, cfg.Poll)
	cfg.Endpoints = d.endpoints(root.tables("endpoint"), cfg.Devices)
	cfg.ModbusServers = d.modbusServers(root.tables("modbus_server"), cfg.Devices)
	root.done()
	return cfg
}

const nameRule = `use only letters, digits, "_", "." and "-" (names become MQTT topics and Prometheus labels)`

// validName reports whether s is a non-empty [A-Za-z0-9_.-]+.
func validName(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '.' || c == '-') {
			return false
		}
	}
	return true
}

// hostID is the default gateway id: the host name, made a valid name.
func hostID() string {
	h, err := os.Hostname()
	if err != nil || h == "" {
		return "edgegw"
	}
	b := []byte(h)
	for i, c := range b {
		if !validName(string(c)) {
			b[i] = '_'
		}
	}
	return string(b)
}

func (d *decoder) gateway(t *table, g *Gateway) {
	if id, ok := t.str("id"); ok {
		if !validName(id) {
			t.errf("id", "gateway.id %q: %s", id, nameRule)
		}
		g.ID = id
	} else {
		g.ID = hostID()
	}
	g.DataDir, _ = t.str("data_dir")
	t.done()
}

func (d *decoder) http(t *table, h *HTTP) {
	h.Listen = DefaultHTTPListen
	if s, ok := t.str("listen"); ok {
		if err := checkListen(s); err != nil {
			t.errf("listen", "http.listen %q: %v", s, err)
		} else {
			h.Listen = s
		}
	}
	h.LongPollTimeout = t.positive("long_poll_timeout", DefaultLongPollTimeout, false)
	h.MaxClients = int(t.intIn("max_clients", DefaultMaxClients, 1, 1<<31-1))
	h.MaxRequestBytes = t.size("max_request_bytes", DefaultMaxRequestBytes)
	h.ReadHeaderTimeout = t.positive("read_header_timeout", DefaultReadHeaderTimeout, false)
	h.WriteTimeout = t.positive("write_timeout", DefaultWriteTimeout, true)
	h.IdleTimeout = t.positive("idle_timeout", DefaultIdleTimeout, false)
	for _, o := range t.strs("allowed_origins") {
		if err := checkOrigin(o); err != nil {
			t.errf("allowed_origins", "http.allowed_origins %q: %v", o, err)
			continue
		}
		h.AllowedOrigins = append(h.AllowedOrigins, o)
	}
	h.WriteTokenFile, _ = t.str("write_token_file")
	h.ReadTokenFile, _ = t.str("read_token_file")
	h.BasicAuthUser, _ = t.str("basic_auth_user")
	h.BasicAuthHashFile, _ = t.str("basic_auth_hash_file")
	bothOrNeither(t, "basic_auth_user", h.BasicAuthUser, "basic_auth_hash_file", h.BasicAuthHashFile)
	h.ProtectMetrics = t.boolean("protect_metrics", false)
	h.TLSCertFile, _ = t.str("tls_cert_file")
	h.TLSKeyFile, _ = t.str("tls_key_file")
	bothOrNeither(t, "tls_cert_file", h.TLSCertFile, "tls_key_file", h.TLSKeyFile)
	h.ExemptLoopback = t.boolean("exempt_loopback", false)
	h.HealthzUpstreamMaxDown = t.positive("healthz_upstream_max_down", DefaultHealthzUpstreamMaxDown, true)
	h.TrustedProxies = t.prefixes("trusted_proxies")
	h.AllowedNetworks = t.prefixes("allowed_networks")
	d.limits(t.sub("limits"), &h.Limits)
	t.done()
}

// limits reads [http.limits]; every key may be absent (0: web's default).
func (d *decoder) limits(t *table, l *Limits) {
	for _, r := range []struct {
		name  string
		rate  *float64
		burst *int
	}{
		{"poll", &l.PollRate, &l.PollBurst}, {"read", &l.ReadRate, &l.ReadBurst},
		{"connect", &l.ConnectRate, &l.ConnectBurst}, {"monitor", &l.MonitorRate, &l.MonitorBurst},
		{"write", &l.WriteRate, &l.WriteBurst}, {"auth", &l.AuthRate, &l.AuthBurst},
	} {
		key := r.name + "_rate"
		if v, ok := t.float(key); ok {
			if v != -1 && (v < 0 || v > MaxLimitRate) {
				t.errf(key, "%s %g: want a rate per second in 0..%d (0: default) or -1 (no limit)", t.name(key), v, MaxLimitRate)
			} else {
				*r.rate = v
			}
		}
		*r.burst = int(t.intIn(r.name+"_burst", 0, 0, MaxLimitRate))
	}
	l.ConnectionsPerClient = int(t.intIn("connections_per_client", 0, -1, MaxLimitRate))
	t.done()
}

// prefixes reads an array of CIDRs ("10.0.0.0/8", "2001:db8::/32") or bare
// addresses (a /32 or /128).
func (t *table) prefixes(key string) []netip.Prefix {
	var out []netip.Prefix
	for _, s := range t.strs(key) {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			a, aerr := netip.ParseAddr(s)
			if aerr != nil {
				t.errf(key, "%s %q: want a network such as \"10.0.0.0/8\" or an address", t.name(key), s)
				continue
			}
			p = netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen())
		}
		if p.Addr().Zone() != "" {
			t.errf(key, "%s %q: a zone is not allowed", t.name(key), s)
			continue
		}
		if p.Addr().Is4In6() && p.Bits() >= 96 { // ::ffff:10.0.0.0/104 is 10.0.0.0/8: clients are unmapped
			p = netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-96)
		}
		out = append(out, p.Masked())
	}
	return out
}

func bothOrNeither(t *table, k1, v1, k2, v2 string) {
	switch {
	case v1 != "" && v2 == "":
		t.errf(k1, "%s is set but %s is not: give both or neither", t.name(k1), t.name(k2))
	case v1 == "" && v2 != "":
		t.errf(k2, "%s is set but %s is not: give both or neither", t.name(k2), t.name(k1))
	}
}

func (d *decoder) ring(t *table, r *Ring) {
	r.Size = int(t.intIn("size", DefaultRingSize, 1, MaxRingSize))
	r.MaxBytes = t.size("max_bytes", DefaultRingMax)
	if r.MaxBytes < MinRingBytes || r.MaxBytes > MaxRingBytes {
		t.errf("max_bytes", "%s %d: outside %d..%d (64KiB..1GiB)", t.name("max_bytes"), r.MaxBytes, MinRingBytes, MaxRingBytes)
		r.MaxBytes = DefaultRingMax
	}
	t.done()
}

func (d *decoder) poll(t *table, p *Poll) {
	p.TCPMode = t.oneOf("tcp_mode", DefaultTCPMode, "parallel", "serial")
	p.MaxGap = int(t.intIn("max_gap", DefaultMaxGap, 0, LimitMaxRegisters))
	p.MaxRegisters = int(t.intIn("max_registers", DefaultMaxRegisters, 1, LimitMaxRegisters))
	p.MaxBits = int(t.intIn("max_bits", DefaultMaxBits, 1, LimitMaxBits))
	p.UDPListen = DefaultUDPListen
	if s, ok := t.str("udp_listen"); ok {
		if err := checkListen(s); err != nil {
			t.errf("udp_listen", "poll.udp_listen %q: %v", s, err)
		} else {
			p.UDPListen = s
		}
	}
	p.UDPBufferBytes = t.size("udp_buffer_bytes", DefaultUDPBufferBytes)
	t.done()
}

func (d *decoder) buffer(t *table, b *Buffer) {
	b.MaxBytes = t.size("max_bytes", DefaultBufferMaxBytes)
	b.Fsync = t.oneOf("fsync", DefaultFsync, FsyncBatched, FsyncAlways, FsyncNever)
	b.FsyncInterval = t.positive("fsync_interval", DefaultFsyncInterval, false)
	t.done()
}

func (d *decoder) history(t *table, h *History) {
	h.RawWindow = t.positive("raw_window", DefaultHistoryRawWindow, false)
	h.FineKeep = t.positive("fine_keep", DefaultHistoryFineKeep, false)
	h.Keep = t.positive("keep", DefaultHistoryKeep, false)
	h.MaxRAM = t.size("max_ram", DefaultHistoryMaxRAM)
	if h.FineKeep < time.Minute {
		t.errf("fine_keep", "%s %v: must be at least one bucket (1m)", t.name("fine_keep"), h.FineKeep)
	}
	if h.Keep < 10*time.Minute {
		t.errf("keep", "%s %v: must be at least one bucket (10m)", t.name("keep"), h.Keep)
	}
	t.done()
}

func (d *decoder) websocket(t *table, w *WebSocket) {
	w.URLs = urlList(t, "url", "urls", "ws", "wss")
	if len(w.URLs) > 0 {
		w.URL = w.URLs[0]
	}
	w.PrimaryRetry = t.positive("primary_retry", DefaultPrimaryRetry, false)
	w.Compression = t.boolean("compression", DefaultCompression)
	w.TokenFile, _ = t.str("token_file")
	w.CAFile, _ = t.str("ca_file")
	w.CertFile, _ = t.str("cert_file")
	w.KeyFile, _ = t.str("key_file")
	bothOrNeither(t, "cert_file", w.CertFile, "key_file", w.KeyFile)
	w.ServerName, _ = t.str("server_name")
	w.FallbackAfter = t.positive("fallback_after", DefaultFallbackAfter, false)
	w.BatchMax = int(t.intIn("batch_max", DefaultBatchMax, 1, 1<<20))
	w.BatchWait = t.positive("batch_wait", DefaultBatchWait, false)
	t.done()
}

func (d *decoder) mqtt(t *table, m *MQTT, gatewayID string) {
	m.Brokers = urlList(t, "broker", "brokers", "tcp", "ssl", "tls", "mqtt", "mqtts", "ws", "wss")
	if len(m.Brokers) > 0 {
		m.Broker = m.Brokers[0]
	}
	m.TopicPrefix = DefaultTopicPrefixBase + gatewayID
	if s, ok := t.str("topic_prefix"); ok {
		switch {
		case s == "":
			t.errf("topic_prefix", "%s is empty", t.name("topic_prefix"))
		case strings.ContainsAny(s, "+#\x00"):
			t.errf("topic_prefix", "%s %q: wildcards + and # are not allowed in a topic", t.name("topic_prefix"), s)
		case strings.HasSuffix(s, "/"):
			t.errf("topic_prefix", "%s %q: drop the trailing \"/\"", t.name("topic_prefix"), s)
		default:
			m.TopicPrefix = s
		}
	}
	def := MQTTOff
	if m.Broker != "" {
		def = MQTTFallback
	}
	m.Mode = t.oneOf("mode", def, MQTTFallback, MQTTAlways, MQTTOff)
	if m.Mode != MQTTOff && m.Broker == "" {
		t.errf("mode", "%s %q needs a broker", t.name("mode"), m.Mode)
	}
	m.QoS = int(t.intIn("qos", DefaultQoS, 0, 2))
	m.ClientID = DefaultClientIDPrefix + gatewayID
	if s, ok := t.str("client_id"); ok {
		if s == "" {
			t.errf("client_id", "%s is empty", t.name("client_id"))
		} else {
			m.ClientID = s
		}
	}
	m.UsernameFile, _ = t.str("username_file")
	m.PasswordFile, _ = t.str("password_file")
	m.CAFile, _ = t.str("ca_file")
	m.CertFile, _ = t.str("cert_file")
	m.KeyFile, _ = t.str("key_file")
	bothOrNeither(t, "cert_file", m.CertFile, "key_file", m.KeyFile)
	m.ServerName, _ = t.str("server_name")
	m.PerTagTopics = t.boolean("per_tag_topics", DefaultPerTagTopics)
	m.WriteCommands = t.boolean("write_commands", DefaultWriteCommands)
	t.done()
}

// checkListen accepts host:port with a numeric port 0..65535 and an empty
// host, an IP address or a host name.
func checkListen(s string) error {
	host, port, err := net.SplitHostPort(s)
	if err != nil {
		return fmt.Errorf("want host:port such as \"127.0.0.1:8080\" or \":8080\"")
	}
	if err := checkPort(port, 0); err != nil {
		return err
	}
	if host != "" {
		return checkHost(host)
	}
	return nil
}

func checkPort(port string, min int) error {
	n, err := strconv.Atoi(port)
	if err != nil || n < min || n > 65535 {
		return fmt.Errorf("port %q: want a number %d..65535", port, min)
	}
	return nil
}

func checkHost(host string) error {
	if _, err := netip.ParseAddr(host); err == nil {
		return nil
	}
	if host == "" || host[0] == '-' || host[0] == '.' || len(host) > 253 {
		return fmt.Errorf("host %q is not an IP address or host name", host)
	}
	for i := 0; i < len(host); i++ {
		c := host[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '.' || c == '_') {
			return fmt.Errorf("host %q is not an IP address or host name", host)
		}
	}
	return nil
}

// netAddress normalises a device address to host:port, adding port 502.
func netAddress(s string) (string, error) {
	host, port, err := net.SplitHostPort(s)
	if err != nil {
		// No port: a host name, an IPv4 address, or a (bracketed) IPv6 address.
		h := strings.TrimSuffix(strings.TrimPrefix(s, "["), "]")
		if ip, perr := netip.ParseAddr(h); perr == nil {
			host, port = ip.String(), DefaultModbusPort
		} else if !strings.ContainsAny(s, ":[]") {
			host, port = s, DefaultModbusPort
		} else {
			return "", fmt.Errorf("want host:port such as \"192.168.1.10:502\"")
		}
	}
	if host == "" {
		return "", fmt.Errorf("the host is missing")
	}
	if err := checkHost(host); err != nil {
		return "", err
	}
	if err := checkPort(port, 1); err != nil {
		return "", err
	}
	return net.JoinHostPort(host, port), nil
}

// urlList reads a list of URLs from key list, or one from key one (a
// one-element list); both at once is an error.
func urlList(t *table, one, list string, schemes ...string) []string {
	var out []string
	s, hasOne := t.str(one)
	if hasOne {
		out = []string{s}
	}
	if t.has(list) {
		if hasOne {
			t.strs(list) // read: the one error is that both are set
			t.errf(list, "%s and %s are both set: use %s alone (%s = %q is %s = [%q])", t.name(one), t.name(list), t.name(list), one, s, list, s)
			return out
		}
		out = t.strs(list)
		if len(out) == 0 {
			t.errf(list, "%s is empty", t.name(list))
		}
	}
	seen := map[string]bool{}
	for i, u := range out {
		key, name := one, t.name(one)
		if !hasOne {
			key, name = list, fmt.Sprintf("%s[%d]", t.name(list), i)
		}
		if err := checkURL(u, schemes...); err != nil {
			t.errf(key, "%s %q: %v", name, u, err)
		}
		if seen[u] {
			t.errf(key, "%s %q: listed twice", name, u)
		}
		seen[u] = true
	}
	return out
}

func checkURL(s string, schemes ...string) error {
	u, err := url.Parse(s)
	if err != nil {
		return fmt.Errorf("not a URL")
	}
	ok := false
	for _, sc := range schemes {
		ok = ok || u.Scheme == sc
	}
	if !ok {
		return fmt.Errorf("scheme %q: want %s", u.Scheme, orList(schemes))
	}
	if u.Host == "" || u.Hostname() == "" {
		return fmt.Errorf("the host is missing")
	}
	if p := u.Port(); p != "" {
		if err := checkPort(p, 1); err != nil {
			return err
		}
	}
	return nil
}

func checkOrigin(s string) error {
	u, err := url.Parse(s)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" ||
		(u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.Fragment != "" || u.User != nil {
		return fmt.Errorf("want an origin such as \"https://scada.example:8443\"")
	}
	return nil
}
