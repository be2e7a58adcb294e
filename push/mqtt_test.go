package push

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"edgegw/lab/mqttbroker"
	"edgegw/receiver"
	"edgegw/stats"
)

// blackHole is an MQTT "broker" on a real socket that accepts the
// connection (CONNACK) and then never acknowledges anything: every
// PUBLISH is recorded, no PUBACK is sent.
type blackHole struct {
	ln     net.Listener
	mu     sync.Mutex
	firsts []uint64 // "first" of every batch published
	wg     sync.WaitGroup
	conns  []net.Conn
}

func startBlackHole(t *testing.T) *blackHole {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b := &blackHole{ln: ln}
	b.wg.Add(1)
	go func() {
		defer b.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			b.mu.Lock()
			b.conns = append(b.conns, c)
			b.mu.Unlock()
			b.wg.Add(1)
			go func() { defer b.wg.Done(); b.serve(c) }()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		b.mu.Lock()
		for _, c := range b.conns {
			c.Close()
		}
		b.mu.Unlock()
		b.wg.Wait()
	})
	return b
}

// serve reads MQTT packets: fixed header, remaining length (varint), body.
func (b *blackHole) serve(c net.Conn) {
	r := bufio.NewReader(c)
	for {
		h, err := r.ReadByte()
		if err != nil {
			return
		}
		var n, shift int
		for {
			x, err := r.ReadByte()
			if err != nil {
				return
			}
			n |= int(x&0x7f) << shift
			shift += 7
			if x&0x80 == 0 {
				break
			}
		}
		body := make([]byte, n)
		if _, err := io.ReadFull(r, body); err != nil {
			return
		}
		switch h >> 4 {
		case 1: // CONNECT -> CONNACK accepted
			if _, err := c.Write([]byte{0x20, 0x02, 0x00, 0x00}); err != nil {
				return
			}
		case 3: // PUBLISH: topic, packet id (QoS > 0), payload
			tl := int(body[0])<<8 | int(body[1])
			p := body[2+tl:]
			if (h>>1)&3 > 0 {
				p = p[2:]
			}
			var f struct{ First uint64 }
			if json.Unmarshal(p, &f) == nil && f.First != 0 {
				b.mu.Lock()
				b.firsts = append(b.firsts, f.First)
				b.mu.Unlock()
			}
		}
	}
}

// A batch whose PUBACK does not come within AckTimeout is not acked in the
// queue: the sender resends from the oldest unacknowledged sample.
func TestMQTTNoPubackNoAck(t *testing.T) {
	bh := startBlackHole(t)
	g := newGateway(t, "")
	st := new(stats.Upstream)
	p, err := New(Config{GatewayID: gwID, MQTT: MQTTConfig{Broker: "tcp://" + bh.ln.Addr().String(), NoPerTagTopics: true},
		WS: WSConfig{BatchWait: 5 * time.Millisecond, AckTimeout: 150 * time.Millisecond, BatchMax: 4}, Queue: g.q, State: st, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	first := g.ring.Seq() + 1
	runPusher(t, p)
	for i := 0; i < 10; i++ {
		g.poll(i)
	}
	resent := func() bool {
		bh.mu.Lock()
		defer bh.mu.Unlock()
		n := 0
		for _, f := range bh.firsts {
			if f == first {
				n++
			}
		}
		return n >= 3
	}
	waitFor(t, 5*time.Second, "the first batch sent three times", resent)
	if qs := g.q.Stats(); qs.Samples != 20 || qs.Acked >= first {
		t.Fatalf("queue acked without PUBACK: %+v", qs)
	}
	if s := st.Snapshot(); s.SentMQTT != 0 {
		t.Fatalf("state: %+v", s)
	}
	bh.mu.Lock()
	defer bh.mu.Unlock()
	// The window: up to 4 batches of 4 in flight, then a restart from the oldest.
	if len(bh.firsts) < 3 || bh.firsts[0] != first || bh.firsts[1] != first+4 {
		t.Fatalf("published batches start at %v", bh.firsts)
	}
}

// Mode always: every batch that goes over WebSocket also goes to MQTT.
func TestModeAlwaysMirrors(t *testing.T) {
	b := mqttbroker.New(mqttbroker.Config{Logger: testLogger(t)})
	baddr, err := b.Listen()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- b.Run(ctx) }()
	defer func() { cancel(); <-done }()

	var wsOut, mqttOut syncBuffer
	r := receiver.New(receiver.Config{Out: &wsOut})
	addr, _ := serveReceiver(t, r)
	viaMQTT := receiver.New(receiver.Config{Out: &mqttOut})
	online := make(chan struct{})
	var onlineOnce sync.Once
	subscribe(t, baddr.String(), "edgegw/"+gwID+"/#", func(topic string, payload []byte, _ bool) {
		switch topic {
		case "edgegw/" + gwID + "/batch":
			_, _ = viaMQTT.Ingest(payload)
		case "edgegw/" + gwID + "/status":
			if string(payload) == "online" {
				onlineOnce.Do(func() { close(online) })
			}
		}
	})
	g := newGateway(t, "")
	st := new(stats.Upstream)
	p, err := New(Config{GatewayID: gwID, WS: wsConfig(addr.String(), ""),
		MQTT:  MQTTConfig{Broker: "tcp://" + baddr.String(), Mode: ModeAlways, NoPerTagTopics: true},
		Queue: g.q, State: st, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	stop := runPusher(t, p)
	waitFor(t, 5*time.Second, "websocket and mqtt up", func() bool { return path(st) == stats.PathWebSocket && r.Stats().Connections == 1 })
	select { // the mirror publishes only while the MQTT link is up
	case <-online:
	case <-time.After(5 * time.Second):
		t.Fatal("status online not seen")
	}
	first := g.ring.Seq() + 1
	prod := startProducer(g, 50)
	<-prod.done
	waitFor(t, 5*time.Second, "both paths got everything", func() bool {
		return r.Stats().Samples == 100 && viaMQTT.Stats().Samples == 100
	})
	checkExactlyOnce(t, wsOut.seqs(t, gwID), first, first+99)
	checkExactlyOnce(t, mqttOut.seqs(t, gwID), first, first+99)
	stop()
	if s := st.Snapshot(); s.SentWS != 100 || s.SentMQTT != 0 {
		t.Fatalf("state: %+v (mirrored batches are not counted as sent over MQTT)", s)
	}
}
