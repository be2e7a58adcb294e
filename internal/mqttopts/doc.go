// Package mqttopts holds what the two MQTT uplinks (push's MQTT link and
// sparkplug's edge node) set alike on the paho client: the options of
// Options, and Done, a token's completion without waiting. Each caller
// adds its reconnect policy, its will and its handlers. It imports
// only paho, dials nothing and keeps no state.
package mqttopts
