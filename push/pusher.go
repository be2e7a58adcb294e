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
// Failover: WebSocket is up ("connected") from the first batch a session
// gets acknowledged within AckTimeout until that session ends; a handshake
// alone is not up, so a receiver that answers it and then never acks, sends
// garbage or closes after every batch counts as down. When WebSocket has
// been down longer than FallbackAfter (mode fallback or always), the MQTT
// sender takes the stream from the oldest unacknowledged sample. Each new
// session (dialled with backoff and jitter) gets the stream to prove the
// receiver: the MQTT sender is told to stop, it publishes nothing more and
// settles its batches in flight (a PUBACK within AckTimeout acks what the
// broker got; see mqttSender); a session that then ends without an ack
// hands the stream straight back to MQTT, one that acks keeps it.
// The session starts from the oldest unacknowledged sample:
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
		if mode == ModeAlways && len(p.cfg.WS.URLs) > 0 {
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
	if len(p.cfg.WS.URLs) > 0 {
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
	// wsActive: a session holds the batch stream; wsIsUp: its first batch
	// was acknowledged (only that is "connected"); fellBack: WebSocket has
	// been down (not connected) longer than FallbackAfter, and MQTT carries
	// the stream whenever no session holds it; paused: the session took the
	// stream from a running MQTT sender (it gets it back unless the session
	// acks).
	unauthorized, wsActive, wsIsUp, fellBack, paused := false, false, false, len(p.cfg.WS.URLs) == 0, false
	// The dispatcher is the only writer of State.Path.
	updatePath := func() {
		switch {
		case wsIsUp:
			p.setPath(stats.PathWebSocket)
		case unauthorized:
			p.setPath(stats.PathUnauthorized) // sticky: it needs a person, even while MQTT carries the data
		case (senderCancel != nil || paused) && link.up():
			// Also while a new session tries the receiver (MQTT paused, at
			// most AckTimeout): WebSocket is not up until it acks.
			p.setPath(stats.PathMQTT)
		default:
			p.setPath(stats.PathBuffering)
		}
	}
	fallback := time.NewTimer(p.cfg.MQTT.FallbackAfter)
	defer fallback.Stop()
	if len(p.cfg.WS.URLs) == 0 {
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
				// The session gets the stream to prove the receiver stores
				// (one batch acked within AckTimeout); the fallback timer
				// keeps running until it does.
				wsActive, paused = true, senderCancel != nil
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
			case wsConnected:
				wsIsUp, fellBack, paused = true, false, false
				fallback.Stop()
			case wsDown, wsUnauthorized:
				wsActive, paused = false, false
				unauthorized = unauthorized || ev.kind == wsUnauthorized
				switch {
				case mode == ModeOff:
				case wsIsUp:
					// Down from now: fall back once it has lasted FallbackAfter.
					fallback.Reset(p.cfg.MQTT.FallbackAfter)
				case fellBack:
					startSender() // the session never acked: MQTT resumes at once
				}
				wsIsUp = false
			}
		case <-fallback.C:
			if mode != ModeOff && !wsIsUp {
				fellBack = true
				if !wsActive {
					startSender()
				} // else: once the session trying the receiver ends unacked
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
