package web

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"edgegw/stats"
)

// The [[modbus_server]] counters reach /api/status and /metrics.
func TestModbusServerStats(t *testing.T) {
	m := &stats.ModbusServer{Listen: "plant-side"}
	m.Requests.Add(7)
	m.PassRequests.Add(5)
	m.Busy.Add(2)
	m.Exceptions[0x06].Add(2)
	m.Exceptions[0x0B].Add(1)
	m.Wait.Observe(3 * time.Millisecond)
	m.WaitPolls[1].Add(5)
	ts := startServer(t, Config{ModbusServers: []*stats.ModbusServer{m}})
	code, _, body := ts.get(t, "/api/status")
	var st struct {
		Modbus []modbusServerJSON `json:"modbus_servers"`
	}
	if err := json.Unmarshal(body, &st); code != 200 || err != nil || len(st.Modbus) != 1 {
		t.Fatalf("/api/status: %d %v %s", code, err, body)
	}
	g := st.Modbus[0]
	if g.Listen != "plant-side" || g.Requests != 7 || g.Pass != 5 || g.Busy != 2 || g.Exceptions["0x06"] != 2 || g.Exceptions["0x0b"] != 1 ||
		g.WaitPolls[1] != 5 || g.WaitP99MS <= 2 || g.WaitP99MS > 5 {
		t.Errorf("modbus_servers: %+v", g)
	}
	_, _, metrics := ts.get(t, "/metrics")
	for _, want := range []string{
		`edgegw_modbus_server_requests_total{listen="plant-side"} 7`,
		`edgegw_modbus_server_busy_total{listen="plant-side"} 2`,
		`edgegw_modbus_server_exceptions_total{listen="plant-side",code="11"} 1`,
		`edgegw_modbus_server_wait_polls_total{listen="plant-side",polls="1"} 5`,
	} {
		if !strings.Contains(string(metrics), want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
}
