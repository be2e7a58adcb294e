// Package sparkplug owns the Eclipse Sparkplug B (3.0) edge node: the
// topic namespace spBv1.0/<group>/<type>/<node>[/<device>], the payload
// (protobuf encoded and decoded by hand with protowire, schema in
// sparkplug_b.proto), the session (bdSeq kept in its data directory,
// NDEATH as the MQTT will, NBIRTH, seq 0..255), a DBIRTH per device with
// every tag (each tag type as tagtype's Sparkplug datatype, strings
// included), DDATA of changed tags by alias, DDEATH/DBIRTH as devices go
// down and come back, NCMD rebirth, DCMD writes (values checked against
// the tag's type before the Writer sees them), primary host STATE
// awareness and the replay of what was stored while no host or broker was
// there, flagged is_historical.
//
// It never polls devices, never serves local clients and never imports
// edge, web or push: it reads the durable queue through its own cursor
// (a spool.Reader: the gateway's one queue, shared with push, so each
// sample is written to flash once), the latest values (a func returning a
// ringstore.Snapshot) and the device health records (stats), and writes
// through a Writer declared here. Only samples whose message paho has
// written (or that needed none) move its cursor on.
//
// Concurrency: Node.Run owns every goroutine it starts (the session loop
// runs in Run's goroutine; one DCMD write worker) and returns after they
// have exited. One paho client per session; paho's callbacks only decode
// and hand over through bounded channels, never block.
//
// Files by job: node.go (Config, New, Run), types.go (tag types onto
// Sparkplug datatypes and values), session.go (one connection and its
// loop), commands.go (NCMD, DCMD, STATE, the write worker), births.go
// (births, DDATA, device liveness, NDATA), payload.go (the codec),
// store.go (bdSeq and aliases on disk).
package sparkplug
