// A Sparkplug B host for the interop tests, built on independent code:
// Eclipse Tahu's JavaScript payload codec (sparkplug-payload) and the mqtt
// npm client. It prints one JSON line per message received on spBv1.0/#
// ({"topic":…,"payload":<Tahu's decodePayload>}) and takes commands on
// stdin, one JSON line each:
//   {"op":"publish","topic":"…","payload":{…Tahu payload object…}}  (encoded by Tahu, QoS 0)
//   {"op":"state","host":"h","online":true}  STATE, retained, QoS 1
//   {"op":"end"}                             disconnect and exit
// argv: broker URL [host id]: with a host id it is a primary host: its will
// is STATE offline and it publishes STATE online once subscribed.
//
// DDATA/NDATA metrics carry an alias and no datatype (the spec: datatype
// only in births). Tahu's decodePayload needs the datatype to read a
// value, so, as any host does, this one keeps the alias -> datatype table
// of each edge node and device from its births and fills it in before
// decoding.
"use strict";
const mqtt = require("mqtt");
const sparkplug = require("sparkplug-payload").get("spBv1.0");
const proto = require("sparkplug-payload/lib/sparkplugPayloadProto");
const Payload = proto.org.eclipse.tahu.protobuf.Payload;
const readline = require("readline");

const [url, hostID] = process.argv.slice(2);
const types = new Map(); // "group/node[/device]" -> Map(alias -> datatype)

function plain(v) {
  if (v === null || v === undefined) return v;
  if (typeof v === "object" && typeof v.toNumber === "function") return v.toNumber();
  if (Array.isArray(v)) return v.map(plain);
  if (Buffer.isBuffer(v) || v instanceof Uint8Array) return Buffer.from(v).toString("hex");
  if (typeof v === "object") {
    const o = {};
    for (const k of Object.keys(v)) o[k] = plain(v[k]);
    return o;
  }
  return v;
}

function stateMsg(online) {
  return JSON.stringify({ online, timestamp: Date.now() });
}

const opts = { clean: true, reconnectPeriod: 0, clientId: "tahu-host-" + process.pid };
if (hostID) {
  opts.will = { topic: "spBv1.0/STATE/" + hostID, payload: stateMsg(false), qos: 1, retain: true };
}
const client = mqtt.connect(url, opts);
client.on("error", (e) => { console.log(JSON.stringify({ error: String(e) })); process.exit(1); });
client.on("connect", () => {
  client.subscribe("spBv1.0/#", { qos: 1 }, (err) => {
    if (err) { console.log(JSON.stringify({ error: String(err) })); process.exit(1); }
    const ready = () => console.log(JSON.stringify({ ready: true }));
    if (hostID) {
      client.publish("spBv1.0/STATE/" + hostID, stateMsg(true), { qos: 1, retain: true }, ready);
    } else {
      ready();
    }
  });
});
client.on("message", (topic, buf) => {
  const parts = topic.split("/");
  if (parts[1] === "STATE") {
    console.log(JSON.stringify({ topic, state: buf.toString() }));
    return;
  }
  const type = parts[2];
  const wire = buf.length;
  const key = [parts[1], parts[3], parts[4]].filter((x) => x !== undefined).join("/");
  let raw;
  try {
    raw = Payload.decode(buf);
  } catch (e) {
    console.log(JSON.stringify({ topic, error: "undecodable: " + e }));
    return;
  }
  if (type === "NBIRTH" || type === "DBIRTH") {
    const m = new Map();
    for (const mt of raw.metrics) {
      if (mt.alias !== null && mt.alias !== undefined) m.set(Number(mt.alias), mt.datatype);
    }
    if (type === "NBIRTH") {
      for (const k of types.keys()) if (k.startsWith(key + "/")) types.delete(k);
    }
    types.set(key, m);
  } else if (type === "DDATA" || type === "NDATA") {
    const m = types.get(key) || new Map();
    let missing = false;
    for (const mt of raw.metrics) {
      if (!mt.datatype) {
        const dt = m.get(Number(mt.alias));
        if (dt === undefined) missing = true;
        else mt.datatype = dt;
      }
    }
    if (missing) console.log(JSON.stringify({ topic, error: "alias not in any birth" }));
    buf = Payload.encode(raw).finish();
  }
  console.log(JSON.stringify({ topic, bytes: wire, payload: plain(sparkplug.decodePayload(buf)) }));
});

readline.createInterface({ input: process.stdin }).on("line", (line) => {
  const c = JSON.parse(line);
  switch (c.op) {
    case "publish":
      client.publish(c.topic, Buffer.from(sparkplug.encodePayload(c.payload)), { qos: 0 }, () =>
        console.log(JSON.stringify({ published: c.topic })));
      break;
    case "state":
      client.publish("spBv1.0/STATE/" + c.host, stateMsg(c.online), { qos: 1, retain: true }, () =>
        console.log(JSON.stringify({ published: "STATE", online: c.online })));
      break;
    case "end":
      client.end(false, () => process.exit(0));
      break;
  }
});
