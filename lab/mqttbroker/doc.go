// Package mqttbroker owns the embedded MQTT broker of the lab (mochi-mqtt):
// `edgegw demo` and tests run it on loopback so no mosquitto is needed.
//
// It is never part of a gateway: it allows every client and keeps nothing,
// and the release gateway binary (built with -tags nolab) does not link it.
//
// Its log is mochi's, with one change (log.go): mochi's listeners warn with
// an empty message whenever a client connection ends with an error. A
// connection that was only closed (EOF, or closed while the broker stops)
// becomes a debug line, "client connection closed"; any other error stays a
// warning, with a message.
//
// Concurrency: Run owns the broker's goroutines and returns after they stop.
package mqttbroker
