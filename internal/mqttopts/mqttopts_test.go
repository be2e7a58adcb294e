package mqttopts

import (
	"crypto/tls"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"
)

// TestOptions: the shared settings, the brokers in order, and TLS only
// when given.
func TestOptions(t *testing.T) {
	tc := &tls.Config{ServerName: "broker.test"}
	r := mqtt.NewOptionsReader(Options([]string{"tcp://broker-a.invalid:1883", "ssl://broker-b.invalid:8883"}, "cid", "u", "p", tc))
	if s := r.Servers(); len(s) != 2 || s[0].String() != "tcp://broker-a.invalid:1883" || s[1].String() != "ssl://broker-b.invalid:8883" {
		t.Errorf("servers %v, want both in order", s)
	}
	if r.ClientID() != "cid" || r.Username() != "u" || r.Password() != "p" {
		t.Errorf("client id %q, user %q, password %q", r.ClientID(), r.Username(), r.Password())
	}
	if !r.CleanSession() || r.Order() {
		t.Errorf("clean session %v, order matters %v; want true, false", r.CleanSession(), r.Order())
	}
	if r.WriteTimeout() != 10*time.Second || r.ConnectTimeout() != 10*time.Second || r.KeepAlive() != 30*time.Second {
		t.Errorf("write timeout %v, connect timeout %v, keepalive %v", r.WriteTimeout(), r.ConnectTimeout(), r.KeepAlive())
	}
	if r.TLSConfig() != tc {
		t.Error("the TLS config is not the one given")
	}
	if r := mqtt.NewOptionsReader(Options(nil, "cid", "", "", nil)); r.TLSConfig() != nil && r.TLSConfig().ServerName != "" {
		t.Errorf("TLS config %+v without one given", r.TLSConfig())
	}
}

// token is a paho token completed when ch is closed.
type token struct{ ch chan struct{} }

func (t token) Wait() bool                     { <-t.ch; return true }
func (t token) WaitTimeout(time.Duration) bool { return false }
func (t token) Done() <-chan struct{}          { return t.ch }
func (t token) Error() error                   { return nil }

// TestDone: a token not completed is not done (and Done does not wait for
// it), a completed one is.
func TestDone(t *testing.T) {
	tok := token{ch: make(chan struct{})}
	if Done(tok) {
		t.Error("done before the token completed")
	}
	close(tok.ch)
	if !Done(tok) {
		t.Error("not done after the token completed")
	}
}
