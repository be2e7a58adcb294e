// Package mqttbroker owns the embedded MQTT broker of the lab (mochi-mqtt):
// `edgegw demo` and tests run it on loopback so no mosquitto is needed.
//
// It is never part of a gateway: it allows every client and keeps nothing,
// and the release gateway binary (built with -tags nolab) does not link it.
//
// Concurrency: Run owns the broker's goroutines and returns after they stop.
package mqttbroker
