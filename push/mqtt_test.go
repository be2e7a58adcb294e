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

	"edgegw/internal/testenv"
	"edgegw/lab/mqttbroker"
	"edgegw/receiver"
	"edgegw/stats"
)

// blackHole is an MQTT "broker" on a real socket that accepts the
// connection (CONNACK) and then acknowledges nothing unless told to
// (ackAll): every PUBLISH is recorded, no PUBACK is sent by itself.
type blackHole struct {
	ln      net.Listener
	mu      sync.Mutex
	firsts  []uint64 // "first" of every batch published
	lasts   []uint64 // "last" of every batch published
	pending map[net.Conn][]uint16
	wg      sync.WaitGroup
	conns   []net.Conn
}

// ackAll sends the PUBACKs of every PUBLISH received so far.
func (b *blackHole) ackAll() {
	b.mu.Lock()
	defer b.mu.Unlock()
	for c, ids := range b.pending {
		for _, id := range ids {
			_, _ = c.Write([]byte{0x40, 0x02, byte(id >> 8), byte(id)})
		}
	}
	b.pending = nil
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
		testenv.Wait(t, 10*time.Second, "the black-hole broker's connections to end", b.wg.Wait)
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
			b.mu.Lock()
			if (h>>1)&3 > 0 {
				if b.pending == nil {
					b.pending = map[net.Conn][]uint16{}
				}
				b.pending[c] = append(b.pending[c], uint16(p[0])<<8|uint16(p[1]))
				p = p[2:]
			}
			var f struct{ First, Last uint64 }
			if json.Unmarshal(p, &f) == nil && f.First != 0 {
				b.firsts = append(b.firsts, f.First)
				b.lasts = append(b.lasts, f.Last)
			}
			b.mu.Unlock()
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

// A stopped MQTT sender (WebSocket is back) publishes nothing more and
// settles its batches in flight: a PUBACK that comes after the stop, within
// AckTimeout, acks the queue, so the WebSocket session does not send that
// batch again; without a PUBACK the queue stays unacknowledged, and at
// shutdown the sender does not wait.
func TestMQTTStoppedSenderSettles(t *testing.T) {
	for _, c := range []struct {
		name       string
		ack        bool // the broker acks after the stop
		shutdown   bool // run ends instead of the sender being stopped
		ackTimeout time.Duration
	}{
		{"late puback acks", true, false, 10 * time.Second},
		{"no puback", false, false, time.Second},
		{"shutdown", false, true, time.Minute},
	} {
		t.Run(c.name, func(t *testing.T) {
			bh := startBlackHole(t)
			g := newGateway(t, "")
			st := new(stats.Upstream)
			p, err := New(Config{GatewayID: gwID, MQTT: MQTTConfig{Broker: "tcp://" + bh.ln.Addr().String(), NoPerTagTopics: true},
				WS: WSConfig{BatchWait: 5 * time.Millisecond, AckTimeout: c.ackTimeout, BatchMax: 4}, Queue: g.q, State: st, Logger: testLogger(t)})
			if err != nil {
				t.Fatal(err)
			}
			link := p.newMQTT()
			link.start()
			defer link.stop(time.Second)
			waitFor(t, 5*time.Second, "mqtt connected", link.up)
			before, ackedBefore := g.ring.Seq(), g.q.Acked()
			for i := 0; i < 4; i++ {
				g.poll(i)
			}
			last := g.ring.Seq()
			run, end := context.WithCancel(context.Background())
			defer end()
			sctx, stop := context.WithCancel(run)
			defer stop()
			done := make(chan struct{})
			go func() { defer close(done); p.mqttSender(sctx, run, link) }()
			waitFor(t, 5*time.Second, "every sample published", func() bool {
				bh.mu.Lock()
				defer bh.mu.Unlock()
				return len(bh.lasts) > 0 && bh.lasts[len(bh.lasts)-1] == last
			})
			if c.shutdown {
				end()
			} else {
				stop()
			}
			if c.ack {
				bh.ackAll()
			}
			waitFor(t, 5*time.Second, "the sender gone", func() bool {
				select {
				case <-done:
					return true
				default:
					return false
				}
			})
			bh.mu.Lock()
			published := len(bh.lasts)
			bh.mu.Unlock()
			acked, sent := g.q.Acked(), st.Snapshot().SentMQTT
			if c.ack && (acked != last || sent != last-before) {
				t.Errorf("after late PUBACKs: queue acked to %d (want %d), SentMQTT %d (want %d)", acked, last, sent, last-before)
			}
			if !c.ack && (acked != ackedBefore || sent != 0) {
				t.Errorf("without PUBACK: queue acked to %d (want %d), SentMQTT %d", acked, ackedBefore, sent)
			}
			if c.ack && published*4 != int(last-before) { // no resend: AckTimeout never passed
				t.Errorf("%d batches published for %d samples: the stopped sender published again", published, last-before)
			}
		})
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
	defer func() { cancel(); testenv.Recv(t, done, 10*time.Second, "the broker's Run to return after cancel") }()

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
	w := wsConfig(addr.String(), "")
	w.AckTimeout = loadedAckTimeout // one session throughout: a late ack must not end it
	p, err := New(Config{GatewayID: gwID, WS: w,
		MQTT:  MQTTConfig{Broker: "tcp://" + baddr.String(), Mode: ModeAlways, NoPerTagTopics: true},
		Queue: g.q, State: st, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	stop := runPusher(t, p)
	// the mirror publishes only while the MQTT link is up
	testenv.Closed(t, online, 5*time.Second, "status online")
	first := g.ring.Seq() + 1
	prod := startProducer(g, 50)
	prod.finished(30 * time.Second)
	waitFor(t, 30*time.Second, "both paths got everything", func() bool {
		return r.Stats().Samples == 100 && viaMQTT.Stats().Samples == 100
	})
	if path(st) != stats.PathWebSocket || r.Stats().Connections != 1 {
		t.Fatalf("path %s, receiver %+v", path(st), r.Stats())
	}
	checkExactlyOnce(t, wsOut.seqs(t, gwID), first, first+99)
	checkExactlyOnce(t, mqttOut.seqs(t, gwID), first, first+99)
	// the receiver has stored everything; its last ack may still be on its
	// way to the gateway, which counts a batch sent when the ack arrives
	waitFor(t, 30*time.Second, "the gateway counting the last acked batch", func() bool { return st.Snapshot().SentWS >= 100 })
	stop()
	if s := st.Snapshot(); s.SentWS != 100 || s.SentMQTT != 0 {
		t.Fatalf("state: %+v (mirrored batches are not counted as sent over MQTT)", s)
	}
}
