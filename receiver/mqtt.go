package receiver

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"edgegw/wire"

	"github.com/eclipse/paho.golang/autopaho"
	"github.com/eclipse/paho.golang/paho"
)

// MQTTConfig is the receiver's MQTT ingest: the batches gateways publish to
// <topic_prefix>/batch while their WebSocket uplink is down (MQTT
// fallback; topic_prefix is "edgegw/<gateway id>" by default), taken from
// the shared subscription
//
//	$share/<Group>/<Prefix>/+/batch
//
// so that any number of receivers in one group split the topic between
// them (MQTT 5; mosquitto 2, EMQX, HiveMQ, NATS 2.9's MQTT listener lacks
// shared subscriptions). Each batch goes to Receiver.Ingest (the dedup by
// (gateway, epoch, seq) applies, so a batch that came both ways is stored
// once) and is acknowledged (PUBACK) only after Ingest returned.
type MQTTConfig struct {
	Brokers  []string      // tcp://host:1883, mqtt://, ssl://, tls://, ws://, wss://; one connection, tried in order (nodes of one cluster); none = off
	Group    string        // shared subscription group ("edgegw-receivers")
	Prefix   string        // the topic levels before <gateway>/batch ("edgegw")
	ClientID string        // "edgegw-receiver-<hostname>": one per receiver, kept across its restarts
	Session  time.Duration // session expiry (1h): the broker keeps what this receiver has not acked while it is away
	Username string
	Password string
	Logger   *slog.Logger
}

// MQTTFlags registers -mqtt, -mqtt-group, -mqtt-prefix, -mqtt-client-id and
// -mqtt-session on fs. The config is filled when fs is parsed.
func MQTTFlags(fs *flag.FlagSet) *MQTTConfig {
	c := &MQTTConfig{}
	fs.Func("mqtt", "MQTT 5 broker URL to take the gateways' fallback batches from (tcp://host:1883; several comma-separated for the nodes of one cluster, one connection tried in order; for independent brokers run one receiver per broker; default none)", func(s string) error {
		for _, b := range strings.Split(s, ",") {
			if b = strings.TrimSpace(b); b != "" {
				c.Brokers = append(c.Brokers, b)
			}
		}
		return nil
	})
	fs.StringVar(&c.Group, "mqtt-group", "edgegw-receivers", "shared subscription group: receivers in one group split the batches")
	fs.StringVar(&c.Prefix, "mqtt-prefix", "edgegw", "topic levels before <gateway>/batch (the gateways' topic_prefix without its last level)")
	fs.StringVar(&c.ClientID, "mqtt-client-id", "", "MQTT client id, one per receiver, the same across its restarts (default edgegw-receiver-<hostname>)")
	fs.DurationVar(&c.Session, "mqtt-session", time.Hour, "MQTT session expiry: how long the broker keeps unacknowledged batches for this receiver while it is away")
	return c
}

// MQTTStats are the MQTT ingest's counters.
type MQTTStats struct {
	Batches  uint64 // batches taken and acknowledged
	Bad      uint64 // payloads that were no batch (acknowledged: a redelivery would not mend them)
	Retries  uint64 // Ingest failures retried before the ack
	Connects uint64
}

// MQTTIngest subscribes the receiver to the gateways' batch topic. Create
// with NewMQTT, run with Run.
type MQTTIngest struct {
	r     *Receiver
	cfg   MQTTConfig
	urls  []*url.URL
	topic string
	log   *slog.Logger

	batches, bad, retries, connects atomic.Uint64
}

// NewMQTT checks cfg and fills its defaults. It starts nothing.
func NewMQTT(r *Receiver, cfg MQTTConfig) (*MQTTIngest, error) {
	if len(cfg.Brokers) == 0 {
		return nil, errors.New("receiver: mqtt: no broker")
	}
	if cfg.Group == "" {
		cfg.Group = "edgegw-receivers"
	}
	if cfg.Prefix == "" {
		cfg.Prefix = "edgegw"
	}
	cfg.Prefix = strings.TrimSuffix(cfg.Prefix, "/")
	if strings.ContainsAny(cfg.Group, "/+#") || strings.ContainsAny(cfg.Prefix, "+#") {
		return nil, fmt.Errorf("receiver: mqtt: group %q / prefix %q: no wildcards (and no / in the group)", cfg.Group, cfg.Prefix)
	}
	if cfg.ClientID == "" {
		host, _ := os.Hostname()
		cfg.ClientID = "edgegw-receiver-" + host
	}
	if cfg.Session <= 0 {
		cfg.Session = time.Hour
	}
	if cfg.Logger == nil {
		cfg.Logger = r.log
	}
	m := &MQTTIngest{r: r, cfg: cfg, log: cfg.Logger.With("client_id", cfg.ClientID),
		topic: "$share/" + cfg.Group + "/" + cfg.Prefix + "/+/batch"}
	for _, b := range cfg.Brokers {
		u, err := url.Parse(b)
		if err != nil || u.Host == "" {
			return nil, fmt.Errorf("receiver: mqtt: broker %q: want tcp://host:port", b)
		}
		m.urls = append(m.urls, u)
	}
	return m, nil
}

// Topic is the shared subscription.
func (m *MQTTIngest) Topic() string { return m.topic }

// Stats copies the counters.
func (m *MQTTIngest) Stats() MQTTStats {
	return MQTTStats{Batches: m.batches.Load(), Bad: m.bad.Load(), Retries: m.retries.Load(), Connects: m.connects.Load()}
}

// Run connects (retrying with backoff), subscribes at every connect and
// ingests until ctx ends; it returns after paho's goroutines have exited.
//
// The session is kept (clean start only the first time is off; expiry
// Session): a receiver that restarts with its client id gets again what it
// had not acknowledged. Acks are manual and in order (paho's
// EnableManualAcknowledgment): a batch is acknowledged after Ingest
// returned without error; while Ingest fails (Out cannot be written), the
// same batch is retried with backoff and nothing after it is taken, so
// the broker holds the rest. A payload that is no batch is counted, logged
// and acknowledged.
func (m *MQTTIngest) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	opts := []paho.SubscribeOptions{{Topic: m.topic, QoS: 1}}
	cfg := autopaho.ClientConfig{
		ServerUrls:                    m.urls,
		KeepAlive:                     20,
		CleanStartOnInitialConnection: false,
		SessionExpiryInterval:         uint32(m.cfg.Session / time.Second),
		ConnectTimeout:                10 * time.Second,
		ReconnectBackoff: func(attempt int) time.Duration {
			return min(time.Duration(1<<min(attempt, 5))*250*time.Millisecond, 10*time.Second)
		},
		ConnectUsername: m.cfg.Username,
		ConnectPassword: []byte(m.cfg.Password),
		OnConnectionUp: func(cm *autopaho.ConnectionManager, _ *paho.Connack) {
			m.connects.Add(1)
			m.log.Info("receiver: mqtt: connected; subscribing", "topic", m.topic)
			go func() { // OnConnectionUp must not block
				sctx, scancel := context.WithTimeout(ctx, 10*time.Second)
				defer scancel()
				if _, err := cm.Subscribe(sctx, &paho.Subscribe{Subscriptions: opts}); err != nil && ctx.Err() == nil {
					m.log.Error("receiver: mqtt: subscribe failed", "topic", m.topic, "err", err)
				}
			}()
		},
		OnConnectError: func(err error) {
			if ctx.Err() == nil {
				m.log.Warn("receiver: mqtt: cannot connect", "err", err)
			}
		},
		ClientConfig: paho.ClientConfig{
			ClientID:                   m.cfg.ClientID,
			EnableManualAcknowledgment: true,
			SendAcksInterval:           10 * time.Millisecond,
			OnPublishReceived: []func(paho.PublishReceived) (bool, error){
				func(pr paho.PublishReceived) (bool, error) { return true, m.handle(ctx, pr) },
			},
			OnClientError: func(err error) {
				if ctx.Err() == nil {
					m.log.Warn("receiver: mqtt: connection error", "err", err)
				}
			},
		},
	}
	cm, err := autopaho.NewConnection(ctx, cfg)
	if err != nil {
		return fmt.Errorf("receiver: mqtt: %w", err)
	}
	<-ctx.Done()
	dctx, dcancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer dcancel()
	_ = cm.Disconnect(dctx)
	return nil
}

// handle runs on paho's one delivery goroutine, in the order the broker
// sent the batches.
func (m *MQTTIngest) handle(ctx context.Context, pr paho.PublishReceived) error {
	p := pr.Packet
	delay := 100 * time.Millisecond
	for {
		_, err := m.r.Ingest(p.Payload)
		switch {
		case err == nil:
			m.batches.Add(1)
		case isBadFrame(err):
			m.bad.Add(1)
			m.log.Warn("receiver: mqtt: not a batch; dropped", "topic", p.Topic, "err", err)
		default:
			m.retries.Add(1)
			m.log.Warn("receiver: mqtt: cannot store the batch; retrying, not acknowledged", "topic", p.Topic, "err", err, "retry_in", delay)
			t := time.NewTimer(delay)
			select {
			case <-t.C:
				delay = min(2*delay, 5*time.Second)
				continue
			case <-ctx.Done():
				t.Stop()
				return ctx.Err() // not acknowledged: the broker sends it again
			}
		}
		return pr.Client.Ack(p)
	}
}

// isBadFrame: the payload itself is wrong (wire's parse error), not the
// store.
func isBadFrame(err error) bool {
	var pe *wire.ProtocolError
	return errors.As(err, &pe)
}
