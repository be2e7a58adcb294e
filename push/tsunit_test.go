package push

import (
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"

	"edgegw/internal/testenv"
	"edgegw/ringstore"
	"edgegw/stats"
	"edgegw/wire"
)

// Per-tag payloads carry the tag's unit; with TSMillis every upstream
// payload has ts in milliseconds, and batch frames say so.
func TestMQTTPerTagUnitAndMillis(t *testing.T) {
	mosq := testenv.StartMosquitto(t)
	prefix := "site/gw"
	var mu sync.Mutex
	got := map[string]string{}
	subscribe(t, mosq.Addr, prefix+"/#", func(topic string, payload []byte, _ bool) {
		mu.Lock()
		got[topic] = string(payload)
		mu.Unlock()
	})
	get := func(topic string) string {
		mu.Lock()
		defer mu.Unlock()
		return got[topic]
	}
	devices := func() []stats.Entry {
		var out []stats.Entry
		for _, d := range []string{"logger-03", "logger-01", "logger-00", "logger-02"} {
			out = append(out, stats.Entry{Info: stats.Info{Name: d, Tags: []stats.TagInfo{{Name: "temperature", Unit: "°C"}, {Name: "humidity", Unit: "%RH"}}}})
		}
		out[0].Info.Tags[0].Unit = "" // logger-03 temperature: no unit, no "unit" key
		return out
	}
	g := newGateway(t, "")
	p, err := New(Config{GatewayID: gwID, MQTT: MQTTConfig{Broker: "tcp://" + mosq.Addr, TopicPrefix: prefix},
		WS: WSConfig{BatchWait: 20 * time.Millisecond}, Queue: g.q, Latest: g.ring.Snapshot, Logger: testLogger(t),
		Devices: devices, TSMillis: true})
	if err != nil {
		t.Fatal(err)
	}
	runPusher(t, p)
	for i := 0; i < 8; i++ {
		g.poll(i)
	}
	var want, wantT ringstore.Sample
	for _, s := range g.ring.Snapshot().Latest {
		switch {
		case s.Device == "logger-03" && s.Tag == "humidity":
			want = s
		case s.Device == "logger-03" && s.Tag == "temperature":
			wantT = s
		}
	}
	var v struct {
		Value   float64
		Quality string
		TS      int64
		Seq     uint64
		Unit    *string
	}
	waitFor(t, 10*time.Second, "the latest per-tag value and the batches", func() bool {
		return json.Unmarshal([]byte(get(prefix+"/logger-03/humidity")), &v) == nil && v.Seq == want.Seq && g.q.Stats().Samples == 0
	})
	if v.Unit == nil || *v.Unit != "%RH" || v.TS != want.TS/1000 || v.Value != want.Value || v.Quality != "good" {
		t.Fatalf("per-tag payload %s, want unit %%RH, ts %d ms", get(prefix+"/logger-03/humidity"), want.TS/1000)
	}
	if tp := get(prefix + "/logger-03/temperature"); strings.Contains(tp, "unit") || !strings.Contains(tp, `"seq":`) {
		t.Fatalf("per-tag payload of a tag without unit: %s (want %d)", tp, wantT.Seq)
	}
	batch := get(prefix + "/batch")
	if !strings.HasPrefix(batch, `{"type":"batch","v":2,"gateway":"`+gwID+`","epoch":"`) || !strings.Contains(batch, `","ts_unit":"ms","first":`) {
		t.Fatalf("batch frame %.120s", batch)
	}
	f, err := wire.ParseBatch([]byte(batch), wire.DefaultMaxBatch)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range f.Samples { // a receiver turns ms back into µs
		if s.TS%1000 != 0 || s.TS < want.TS-60e6 || s.TS > want.TS+60e6 {
			t.Fatalf("received ts %d µs, polled around %d", s.TS, want.TS)
		}
	}
}
