package web

import (
	"math"
	"strconv"

	"edgegw/stats"
)

// modbusServerJSON is one [[modbus_server]] in /api/status.
type modbusServerJSON struct {
	Listen        string            `json:"listen"`
	Connections   int64             `json:"connections"`
	Accepted      uint64            `json:"accepted"`
	ConnsRefused  uint64            `json:"connections_refused"`
	AcceptErrors  uint64            `json:"accept_errors"`
	Requests      uint64            `json:"requests"`
	Pass          uint64            `json:"pass_through"`
	Mirror        uint64            `json:"mirror"`
	Writes        uint64            `json:"writes"`
	WritesRefused uint64            `json:"writes_refused"`
	Busy          uint64            `json:"busy"`       // answered 0x06
	Exceptions    map[string]uint64 `json:"exceptions"` // "0x0b": n
	WaitP50MS     float64           `json:"wait_p50_ms"`
	WaitP99MS     float64           `json:"wait_p99_ms"`
	WaitPolls     [4]uint64         `json:"wait_polls"` // requests that waited for 0, 1, 2, 3+ polls
}

func modbusServersJSON(ms []*stats.ModbusServer) []modbusServerJSON {
	var out []modbusServerJSON
	for _, m := range ms {
		s := m.Snapshot()
		j := modbusServerJSON{Listen: s.Listen, Connections: s.Connections, Accepted: s.Accepted, ConnsRefused: s.ConnsRefused, AcceptErrors: s.AcceptErrors,
			Requests: s.Requests, Pass: s.PassRequests, Mirror: s.MirrorRequests, Writes: s.Writes, WritesRefused: s.WritesRefused,
			Busy: s.Busy, Exceptions: map[string]uint64{}, WaitPolls: s.WaitPolls,
			WaitP50MS: math.Round(s.Wait.Quantile(0.5)) / 1000, WaitP99MS: math.Round(s.Wait.Quantile(0.99)) / 1000}
		for code, n := range s.Exceptions {
			if n > 0 {
				j.Exceptions["0x"+strconv.FormatInt(int64(code)+0x100, 16)[1:]] = n
			}
		}
		out = append(out, j)
	}
	return out
}

// appendModbusServerMetrics writes the [[modbus_server]] families.
func appendModbusServerMetrics(p *promWriter, ms []*stats.ModbusServer) {
	if len(ms) == 0 {
		return
	}
	snaps := make([]stats.ModbusServerSnapshot, len(ms))
	for i, m := range ms {
		snaps[i] = m.Snapshot()
	}
	for _, f := range []struct {
		name, typ, help string
		get             func(*stats.ModbusServerSnapshot) float64
	}{
		{"edgegw_modbus_server_connections", "gauge", "Modbus TCP server connections open.", func(s *stats.ModbusServerSnapshot) float64 { return float64(s.Connections) }},
		{"edgegw_modbus_server_connections_refused_total", "counter", "Connections closed at accept: not an allowed network, or max_connections open.", func(s *stats.ModbusServerSnapshot) float64 { return float64(s.ConnsRefused) }},
		{"edgegw_modbus_server_accept_errors_total", "counter", "Accept failures (out of descriptors), retried after 50 ms.", func(s *stats.ModbusServerSnapshot) float64 { return float64(s.AcceptErrors) }},
		{"edgegw_modbus_server_requests_total", "counter", "Requests answered.", func(s *stats.ModbusServerSnapshot) float64 { return float64(s.Requests) }},
		{"edgegw_modbus_server_pass_through_total", "counter", "Requests passed through to a bus.", func(s *stats.ModbusServerSnapshot) float64 { return float64(s.PassRequests) }},
		{"edgegw_modbus_server_mirror_total", "counter", "Requests answered by the mirror.", func(s *stats.ModbusServerSnapshot) float64 { return float64(s.MirrorRequests) }},
		{"edgegw_modbus_server_writes_total", "counter", "Pass-through writes sent to a device.", func(s *stats.ModbusServerSnapshot) float64 { return float64(s.Writes) }},
		{"edgegw_modbus_server_writes_refused_total", "counter", "Writes answered 0x01 (writes off, or to the mirror).", func(s *stats.ModbusServerSnapshot) float64 { return float64(s.WritesRefused) }},
		{"edgegw_modbus_server_busy_total", "counter", "Requests answered 0x06: the client's in-flight bound or the bus's queue was full.", func(s *stats.ModbusServerSnapshot) float64 { return float64(s.Busy) }},
		{"edgegw_modbus_server_wait_p99_seconds", "gauge", "Pass-through: 99th percentile of the wait for the bus.", func(s *stats.ModbusServerSnapshot) float64 { return s.Wait.Quantile(0.99) / 1e6 }},
	} {
		p.family(f.name, f.typ, f.help)
		for i := range snaps {
			p.sample(f.name, f.get(&snaps[i]), "listen", snaps[i].Listen)
		}
	}
	p.family("edgegw_modbus_server_exceptions_total", "counter", "Answers with a Modbus exception, per code.")
	for i := range snaps {
		for code, n := range snaps[i].Exceptions {
			if n > 0 {
				p.sample("edgegw_modbus_server_exceptions_total", float64(n), "listen", snaps[i].Listen, "code", strconv.Itoa(code))
			}
		}
	}
	p.family("edgegw_modbus_server_wait_polls_total", "counter", "Pass-through requests by the polls they waited for (3 = 3 or more).")
	for i := range snaps {
		for k, n := range snaps[i].WaitPolls {
			p.sample("edgegw_modbus_server_wait_polls_total", float64(n), "listen", snaps[i].Listen, "polls", strconv.Itoa(k))
		}
	}
}
