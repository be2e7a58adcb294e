package push

import (
	"context"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"edgegw/internal/backoff"
	"edgegw/internal/mqttopts"
	"edgegw/ringstore"
	"edgegw/stats"
	"edgegw/wire"

	mqtt "github.com/eclipse/paho.mqtt.golang"
)

// mqttLink is the paho client with paho v1.5.1's traps handled: those
// mqttopts.Options handles for both uplinks (the ordered memory store,
// SetOrderMatters(false), SetWriteTimeout), a bounded reconnect interval,
// SetConnectRetry, a retained status with a retained last will, tokens
// waited for with a bound (a token is no delivery receipt: a publish that
// timed out may still arrive, so every payload carries seq), and the link
// state read with IsConnectionOpen (IsConnected is true while
// reconnecting). Changes of the link are broadcast like Queue.Wait.
type mqttLink struct {
	c      mqtt.Client
	prefix string

	mu      sync.Mutex
	change  chan struct{} // closed at the next connect or loss
	connSeq int           // connects so far

	cmds chan mqttCmd // write commands for mqttWriteLoop (nil: WriteCommands off)
}

func (p *Pusher) newMQTT() *mqttLink {
	m := p.cfg.MQTT
	l := &mqttLink{prefix: m.TopicPrefix, change: make(chan struct{})}
	log := p.log.With("broker", strings.Join(redacted(m.Brokers), ","))
	o := mqttopts.Options(m.Brokers, m.ClientID, m.Username, m.Password, p.tlsMQTT) // paho tries the brokers in this order at each connect and reconnect
	o.SetAutoReconnect(true).
		SetConnectRetry(true).
		SetConnectRetryInterval(m.ReconnectMin).
		SetMaxReconnectInterval(m.ReconnectMax).
		SetWill(m.TopicPrefix+"/status", wire.StatusOffline, 1, true)
	if m.WriteCommands {
		l.cmds = make(chan mqttCmd, 8)
	}
	var trying atomic.Value // string: the broker paho tries (or is connected to) now
	o.SetOnConnectHandler(func(c mqtt.Client) {
		if l.cmds != nil {
			// Subscribed here, so that it survives reconnects (clean session).
			c.Subscribe(l.prefix+"/write/+/+", 1, func(c mqtt.Client, msg mqtt.Message) { p.onMQTTWrite(l, c, msg) })
		}
		c.Publish(l.prefix+"/status", 1, true, wire.StatusOnline) // not waited for: we are in paho's callback
		l.mu.Lock()
		l.connSeq++
		if l.connSeq > 1 {
			p.st.Reconnects.Add(1)
		}
		l.mu.Unlock()
		b, _ := trying.Load().(string)
		p.st.MQTTBroker.Store(b)
		p.mqttState.Set(log, slog.LevelInfo, "connected", "push: mqtt: connected", "to", b)
		if len(m.Brokers) > 1 {
			p.brokerState.Set(p.log, slog.LevelInfo, b, "push: mqtt: broker", "broker", b, "of", len(m.Brokers))
		}
		l.notify()
	})
	o.SetConnectionLostHandler(func(_ mqtt.Client, err error) {
		p.mqttState.Set(log, slog.LevelWarn, failState("lost", err), "push: mqtt: connection lost", "err", err)
		l.notify()
	})
	// paho retries by itself (SetConnectRetry, SetAutoReconnect) and says
	// why an attempt failed only here: refused (CONNACK code), unreachable,
	// or the TLS complaint. One line per change of reason.
	o.SetConnectionNotificationHandler(func(_ mqtt.Client, n mqtt.ConnectionNotification) {
		if b, ok := n.(mqtt.ConnectionNotificationBroker); ok && b.Broker != nil {
			trying.Store(b.Broker.Redacted())
			p.st.MQTTBroker.Store(b.Broker.Redacted())
			return
		}
		if f, ok := n.(mqtt.ConnectionNotificationFailed); ok {
			p.mqttFailures.Add(1)
			p.mqttState.Set(log, slog.LevelWarn, failState("failed", f.Reason), "push: mqtt: cannot connect", errArgs(f.Reason)...)
		}
	})
	l.c = mqtt.NewClient(o)
	return l
}

func (l *mqttLink) notify() {
	l.mu.Lock()
	close(l.change)
	l.change = make(chan struct{})
	l.mu.Unlock()
}

// changed returns a channel closed by the next connect or connection loss.
func (l *mqttLink) changed() <-chan struct{} {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.change
}

func (l *mqttLink) up() bool { return l.c.IsConnectionOpen() }

// start connects in the background (paho retries by itself).
func (l *mqttLink) start() { l.c.Connect() }

// stop publishes "offline" (when connected) and disconnects. Disconnect
// returns while paho may still be inside a reconnect attempt (sleeping up to
// its reconnect interval); stop waits for that, bounded by wait, so that
// Run leaves no paho goroutine behind in the usual case.
func (l *mqttLink) stop(wait time.Duration) {
	if l.up() {
		l.c.Publish(l.prefix+"/status", 1, true, wire.StatusOffline).WaitTimeout(time.Second)
	}
	l.c.Disconnect(250)
	deadline := time.Now().Add(wait)
	for l.c.IsConnected() && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond) // paho offers no channel for "fully disconnected"
	}
}

type pub struct {
	tok  mqtt.Token
	last uint64
	n    int
	sent time.Time
}

// mqttSender sends the batch stream to <prefix>/batch while WebSocket is
// down. A batch leaves the queue only when its token completes without
// error (PUBACK for QoS 1) within AckTimeout; on a timeout or error the
// sender starts again from the oldest unacknowledged sample (the receiver
// dedups what the broker got twice).
//
// When ctx ends (WebSocket is back) it publishes nothing more and settles
// the batches still in flight before it returns: each PUBACK that comes
// within its AckTimeout acks the queue, in order, up to the first that does
// not, so the WebSocket session, which starts once the sender is gone,
// resends only what the broker did not confirm: nothing lost, and no
// duplicate unless a PUBACK comes later than AckTimeout. When run ends
// (shutdown) it returns at once; what was in flight stays unacknowledged
// and is sent again after the restart.
func (p *Pusher) mqttSender(ctx, run context.Context, l *mqttLink) {
	w, m := p.cfg.WS, p.cfg.MQTT
	topic := m.TopicPrefix + "/batch"
	log := p.log.With("topic", topic)
	after := p.q.Acked()
	var inflight []pub
	bt := batcher{max: w.BatchMax, wait: w.BatchWait}
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	defer func() { p.settle(run, inflight, log) }()
	for {
		if ctx.Err() != nil {
			return // stopped: publish nothing more
		}
		change := l.changed()
		up := l.up()
		// Settle completed tokens, in order.
		for len(inflight) > 0 {
			f := inflight[0]
			if !mqttopts.Done(f.tok) {
				break
			}
			if err := f.tok.Error(); err != nil {
				log.Warn("push: mqtt: publish failed; resending from the oldest unacknowledged sample", "last", f.last, "err", err)
				inflight, after = nil, p.q.Acked()
				break
			}
			p.q.Ack(f.last)
			p.st.SentMQTT.Add(uint64(f.n))
			inflight = inflight[1:]
		}
		var wake <-chan struct{}
		if up && len(inflight) < w.Window {
			wake = p.q.Wait()
			now := time.Now()
			if batch := bt.next(p.q, after, now); batch != nil {
				last := batch[len(batch)-1].Seq
				tok := l.c.Publish(topic, m.QoS, false, wire.AppendBatchLoss(nil, p.gwJSON, batch, p.cfg.TSMillis, skipRanges(bt.skips), bt.loss))
				inflight = append(inflight, pub{tok: tok, last: last, n: len(batch), sent: now})
				after = last
				continue
			}
		}
		next := time.Hour
		if d := bt.linger(); d >= 0 && wake != nil {
			next = d
		}
		var done <-chan struct{}
		if len(inflight) > 0 {
			done = inflight[0].tok.Done()
			d := time.Until(inflight[0].sent.Add(w.AckTimeout))
			if d <= 0 {
				// Not acknowledged in time: not acked in the queue. It may
				// still arrive (a duplicate for the receiver to drop).
				log.Warn("push: mqtt: no PUBACK in time; resending from the oldest unacknowledged sample", "last", inflight[0].last, "timeout", w.AckTimeout)
				inflight, after = nil, p.q.Acked()
				continue
			}
			next = min(next, d)
		}
		timer.Reset(max(next, time.Millisecond))
		select {
		case <-ctx.Done():
			return
		case <-change:
		case <-wake:
		case <-done:
		case <-timer.C:
		}
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
	}
}

// settle waits for the tokens of a stopped sender, in order, each until its
// AckTimeout: a PUBACK acks the queue up to its batch; the first error,
// timeout or the end of run leaves it and the rest unacknowledged.
func (p *Pusher) settle(run context.Context, inflight []pub, log *slog.Logger) {
	for _, f := range inflight {
		timer := time.NewTimer(time.Until(f.sent.Add(p.cfg.WS.AckTimeout)))
		select {
		case <-f.tok.Done():
		case <-timer.C:
		case <-run.Done():
		}
		timer.Stop()
		if !mqttopts.Done(f.tok) || f.tok.Error() != nil {
			log.Debug("push: mqtt: stopped sender: batch in flight not confirmed; the next path sends it again", "last", f.last)
			return
		}
		p.q.Ack(f.last)
		p.st.SentMQTT.Add(uint64(f.n))
	}
}

// mirrorLoop publishes, best effort, every batch frame the WebSocket
// session sends (mode always). Frames arrive through a bounded channel; when
// it is full (MQTT slow or down) frames are skipped, never waited for, and
// logged at a limited rate. Tokens are waited for with a bound so the
// publisher cannot pile up unbounded work in paho. Mirrored batches never
// ack the queue (the WebSocket does) and are not counted in SentMQTT.
func (p *Pusher) mirrorLoop(ctx context.Context, l *mqttLink, frames <-chan []byte, skipped *atomic.Uint64) {
	topic := p.cfg.MQTT.TopicPrefix + "/batch"
	rl := backoff.Log{Every: 30 * time.Second, Level: slog.LevelWarn}
	for {
		select {
		case <-ctx.Done():
			return
		case f := <-frames:
			if !l.up() {
				skipped.Add(1) // QoS 1 tokens of a down link would only pile up
			}
			if n := skipped.Swap(0); n > 0 {
				rl.Log(p.log, "skipped", "push: mqtt: mirror skipped batches (mode always, best effort)", "batches", n)
			}
			if !l.up() {
				continue
			}
			t := l.c.Publish(topic, p.cfg.MQTT.QoS, false, f)
			select {
			case <-t.Done():
			case <-ctx.Done():
				return
			case <-time.After(p.cfg.WS.AckTimeout):
			}
		}
	}
}

// perTagLoop publishes the latest value of every tag to the retained topic
// <prefix>/<device>/<tag> at QoS 0, payload
//
//	{"value":21.5,"quality":"good","ts":1764450000123456,"seq":42,"unit":"°C"}
//
// (ts in µs, or ms with TSMillis; unit only when the tag has one)
// at most once per BatchWait, only what changed since the last round, and
// everything again after each (re)connect. QoS 0 published while paho is
// reconnecting is dropped silently: by design for "last value" topics, and
// the republish on connect repairs it.
func (p *Pusher) perTagLoop(ctx context.Context, l *mqttLink) {
	var published uint64 // snapshot seq published up to
	connSeen := -1
	pace := time.NewTimer(0)
	defer pace.Stop()
	for {
		change := l.changed()
		wake := p.q.Wait()
		select {
		case <-ctx.Done():
			return
		case <-pace.C:
		}
		if l.up() {
			l.mu.Lock()
			cs := l.connSeq
			l.mu.Unlock()
			all := cs != connSeen
			snap := p.cfg.Latest()
			if snap == nil {
				snap = &ringstore.Snapshot{}
			}
			unit := p.unitIndex()
			for i := range snap.Latest {
				s := &snap.Latest[i]
				if !all && s.Seq <= published {
					continue
				}
				payload := wire.AppendTagPayload(nil, s, unit(s.Device, s.Tag), p.cfg.TSMillis) // paho keeps the slice until written: never reuse it
				l.c.Publish(l.prefix+"/"+topicPart(s.Device)+"/"+topicPart(s.Tag), 0, true, payload)
			}
			published, connSeen = snap.Seq, cs
		}
		select {
		case <-ctx.Done():
			return
		case <-wake:
		case <-change:
		}
		pace.Reset(p.cfg.WS.BatchWait)
	}
}

// unitIndex returns a lookup of tag units over the current devices (one
// sorted copy per round of per-tag publishing; "" without Devices).
func (p *Pusher) unitIndex() func(device, tag string) string {
	if p.cfg.Devices == nil {
		return func(string, string) string { return "" }
	}
	devs := p.cfg.Devices()
	sort.Slice(devs, func(i, j int) bool { return devs[i].Info.Name < devs[j].Info.Name })
	return stats.UnitIndex(len(devs), func(i int) *stats.Info { return &devs[i].Info })
}

// topicPart makes a name safe as one MQTT topic level.
func topicPart(s string) string {
	return strings.Map(func(r rune) rune {
		switch r {
		case '/', '+', '#', 0:
			return '_'
		}
		return r
	}, s)
}

// mqttCmd is a write command taken from the MQTT write topic.
type mqttCmd struct {
	cmd   wire.WriteCommand
	topic string // the command's topic; the answer goes to topic+"/result"
}

// onMQTTWrite is paho's handler for <prefix>/write/<device>/<tag>. It runs
// on a paho goroutine and must not block: it checks the command, applies
// the rate limit and hands it to mqttWriteLoop through a bounded channel;
// whatever it refuses is answered from here.
//
// Payload: a JSON number, true/false (1/0), or {"value":…,"id":"…"}.
// Retained messages are ignored (a retained write would be carried out
// again at every reconnect). Delivery is at least once (QoS 1): a command
// may arrive twice; write absolute values and use ids.
func (p *Pusher) onMQTTWrite(l *mqttLink, c mqtt.Client, msg mqtt.Message) {
	topic := msg.Topic()
	if msg.Retained() {
		p.refuseLog.Log(p.log, "retained", "push: mqtt: retained write command ignored; clear it with an empty retained message", "topic", topic)
		return
	}
	p.wc.received.Add(1)
	reply := func(a wire.WriteAnswer) {
		c.Publish(topic+"/result", 1, false, wire.AppendWriteResult(nil, &a)) // not waited for: paho's goroutine
	}
	var mc mqttCmd
	mc.topic = topic
	rest, ok := strings.CutPrefix(topic, l.prefix+"/write/")
	device, tag, ok2 := strings.Cut(rest, "/")
	id, value, err := wire.ParseMQTTWrite(msg.Payload())
	mc.cmd = wire.WriteCommand{ID: id, Device: device, Tag: tag, Value: value}
	bad := ""
	switch {
	case !ok || !ok2:
		bad = fmt.Sprintf("topic %.80q", topic)
	case err != nil:
		bad = err.Error()
	default:
		bad = mc.cmd.Check()
	}
	if bad != "" {
		reply(p.refuse(id, wire.KindBadRequest, bad, p.mqttOrigin))
		return
	}
	if p.cfg.Writer == nil {
		reply(p.refuse(id, wire.KindRefused, errNoWriter, p.mqttOrigin))
		return
	}
	if !p.mqttRate.Allow() {
		reply(p.refuse(id, wire.KindBusy, fmt.Sprintf("over the rate limit (%g/s)", p.cfg.MQTT.WriteRate), p.mqttOrigin))
		return
	}
	select {
	case l.cmds <- mc:
	default:
		reply(p.refuse(id, wire.KindBusy, "write command queue full", p.mqttOrigin))
	}
}

// mqttWriteLoop carries out the MQTT write commands one at a time (they
// go to the devices' schedulers, which serialize them anyway) and publishes
// each answer to <topic>/result, QoS 1, not retained, in the JSON of the
// WebSocket answer (see wire.WriteAnswer).
func (p *Pusher) mqttWriteLoop(ctx context.Context, l *mqttLink) {
	for {
		select {
		case <-ctx.Done():
			return
		case mc := <-l.cmds:
			a := p.doWrite(ctx, mc.cmd, p.mqttOrigin)
			if ctx.Err() != nil {
				return
			}
			l.c.Publish(mc.topic+"/result", 1, false, wire.AppendWriteResult(nil, &a))
		}
	}
}
