// Package tlsfile builds the client TLS configuration of an uplink from
// the files named in the config: the CA to trust, the client certificate
// and key, the server name. push (WebSocket and MQTT) and sparkplug (MQTT)
// use it, so the two read the same files the same way. It reads files and
// never dials.
package tlsfile
