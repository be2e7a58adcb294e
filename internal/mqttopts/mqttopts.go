package mqttopts

import (
	"crypto/tls"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"
)

// Options returns paho client options for brokers (tried in this order at
// each connect), with the settings both uplinks share, paho v1.5.1's traps
// handled: a clean session, the ordered memory store (the default one
// resends QoS 1 in random order after a reconnect), SetOrderMatters(false)
// (else a slow handler blocks the network loop), a 10 s write timeout (else
// a Publish on a dead link can block for ever), a 10 s connect timeout, a
// 30 s keepalive, and tlsConf when it is not nil. The caller sets the
// reconnect policy, the will and the handlers.
func Options(brokers []string, clientID, username, password string, tlsConf *tls.Config) *mqtt.ClientOptions {
	o := mqtt.NewClientOptions()
	for _, b := range brokers {
		o.AddBroker(b)
	}
	o.SetClientID(clientID).
		SetUsername(username).
		SetPassword(password).
		SetCleanSession(true).
		SetStore(mqtt.NewOrderedMemoryStore()).
		SetOrderMatters(false).
		SetWriteTimeout(10 * time.Second).
		SetConnectTimeout(10 * time.Second).
		SetKeepAlive(30 * time.Second)
	if tlsConf != nil {
		o.SetTLSConfig(tlsConf)
	}
	return o
}

// Done reports whether t has completed, without waiting for it.
func Done(t mqtt.Token) bool {
	select {
	case <-t.Done():
		return true
	default:
		return false
	}
}
