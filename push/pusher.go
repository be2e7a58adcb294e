package push

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"edgegw/stats"
)

// Run sends the queue upstream until ctx ends: it owns the WebSocket dial
// loop and sessions, the MQTT client, the MQTT batch sender, the per-tag
// publisher and the failover policy. It returns after all have exited.
//
// Failover: the WebSocket session has the batch stream whenever it is
// connected. When it has been down longer than FallbackAfter (mode fallback
// or always), the MQTT sender takes the stream from the oldest
// unacknowledged sample. When WebSocket connects again, the MQTT sender is
// told to stop: it publishes nothing more and settles its batches in flight
// (a PUBACK within AckTimeout acks what the broker got; see mqttSender).
// Only then does the session start, from the oldest unacknowledged sample:
// no gap, no reordering within a path, and no duplicate across paths unless
// a PUBACK came later than AckTimeout or the broker lost the connection
// with batches in flight. Acks are cumulative and only move forward, so
// the two never undo each other.
func (p *Pusher) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	mode := p.cfg.MQTT.Mode

	var link *mqttLink
	if mode != ModeOff {
		link = p.newMQTT()
		link.start()
		if link.cmds != nil {
			wg.Add(1)
			go func() { defer wg.Done(); p.mqttWriteLoop(ctx, link) }()
		}
		if !p.cfg.MQTT.NoPerTagTopics && p.cfg.Latest != nil {
			wg.Add(1)
			go func() { defer wg.Done(); p.perTagLoop(ctx, link) }()
		}
		if mode == ModeAlways && p.cfg.WS.URL != "" {
			frames := make(chan []byte, 64)
			skipped := new(atomic.Uint64)
			p.mirror = func(f []byte) {
				select {
				case frames <- append([]byte(nil), f...):
				default: // best effort: MQTT is slow or down
					skipped.Add(1)
				}
			}
			wg.Add(1)
			go func() { defer wg.Done(); p.mirrorLoop(ctx, link, frames, skipped) }()
		}
	}
	events := make(chan wsEvent)
	if p.cfg.WS.URL != "" {
		wg.Add(1)
		go func() { defer wg.Done(); p.wsLoop(ctx, events) }()
	}

	// The MQTT sender, when it has the stream. stopSender does not wait;
	// the WebSocket session is granted the stream once the stopped sender
	// has settled its batches in flight (waited for at most AckTimeout),
	// and the next sender waits for the old one to be gone, so MQTT never
	// has two senders.
	var senderCancel context.CancelFunc
	var senderDone chan struct{}
	stopSender := func() {
		if senderCancel != nil {
			senderCancel()
			senderCancel = nil
		}
	}
	startSender := func() {
		if senderCancel != nil || link == nil {
			return
		}
		if senderDone != nil {
			<-senderDone
		}
		var sctx context.Context
		sctx, senderCancel = context.WithCancel(ctx)
		senderDone = make(chan struct{})
		done := senderDone
		go func() { defer close(done); p.mqttSender(sctx, ctx, link) }()
	}

	// Shutdown order: stop everything, wait for it, then say "offline".
	defer func() {
		cancel()
		if senderDone != nil {
			<-senderDone
		}
		wg.Wait()
		if link != nil {
			link.stop(min(p.cfg.MQTT.ReconnectMax+time.Second, 5*time.Second))
		}
		p.publishState()
	}()
	unauthorized, wsIsUp := false, false
	// The dispatcher is the only writer of State.Path.
	updatePath := func() {
		switch {
		case wsIsUp:
			p.setPath(stats.PathWebSocket)
		case unauthorized:
			p.setPath(stats.PathUnauthorized) // sticky: it needs a person, even while MQTT carries the data
		case senderCancel != nil && link.up():
			p.setPath(stats.PathMQTT)
		default:
			p.setPath(stats.PathBuffering)
		}
	}
	fallback := time.NewTimer(p.cfg.MQTT.FallbackAfter)
	defer fallback.Stop()
	if p.cfg.WS.URL == "" {
		startSender() // MQTT is the only path
	}
	var linkChange <-chan struct{}
	if link != nil {
		linkChange = link.changed()
	}
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	p.publishState()
	for {
		updatePath()
		select {
		case <-ctx.Done():
			return nil
		case ev := <-events:
			switch ev.kind {
			case wsUp:
				wsIsUp = true
				fallback.Stop()
				stopSender()
				if senderDone != nil {
					// Its batches in flight settled, the session starts after
					// what the broker confirmed. Bounded: a Publish stuck on a
					// dead link (paho's write timeout) does not hold the
					// WebSocket longer than AckTimeout; a PUBACK after that
					// still acks (acks only move forward).
					wait := time.NewTimer(p.cfg.WS.AckTimeout)
					select {
					case <-senderDone:
					case <-wait.C:
					case <-ctx.Done():
					}
					wait.Stop()
				}
				updatePath()
				close(ev.granted)
			case wsDown, wsUnauthorized:
				wsIsUp = false
				unauthorized = unauthorized || ev.kind == wsUnauthorized
				if mode != ModeOff {
					fallback.Reset(p.cfg.MQTT.FallbackAfter)
				}
			}
		case <-fallback.C:
			if mode != ModeOff && !wsIsUp {
				startSender()
			}
		case <-linkChange:
			linkChange = link.changed()
		case <-tick.C:
			p.publishState()
		}
	}
}

func (p *Pusher) publishState() {
	qs := p.q.Stats()
	p.st.QueueSamples.Store(qs.Samples)
	p.st.QueueBytes.Store(qs.Bytes)
	p.st.OldestUnackUS.Store(qs.OldestTS)
	p.st.Dropped.Store(qs.Dropped)
	p.st.QueueMode.Store(qs.Mode)
	p.st.QueueCorrupt.Store(qs.Corrupt)
}
