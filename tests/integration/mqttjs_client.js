// One MQTT.js client for tests/integration/test_mqtt_websocket.py: commands
// come as JSON lines on stdin, what happens goes out as JSON lines on stdout.
// Usage: node mqttjs_client.js URL PROTOCOL_VERSION CLIENT_ID
// (require("mqtt") is found through NODE_PATH, .build/node/node_modules).
"use strict";
const mqtt = require("mqtt");
const readline = require("readline");

const [url, version, clientId] = process.argv.slice(2);
const out = (event) => process.stdout.write(JSON.stringify(event) + "\n");
const text = (err) => (err ? String(err.message || err) : null);

const client = mqtt.connect(url, {
  protocolVersion: Number(version),
  clientId,
  clean: true,
  reconnectPeriod: 0, // a test sees every close, never a silent reconnect
  connectTimeout: 10000,
});
client.on("connect", (connack) =>
  out({ event: "connect", code: connack.reasonCode ?? connack.returnCode ?? 0 }),
);
client.on("message", (topic, payload, packet) =>
  out({ event: "message", topic, payload: payload.toString(), qos: packet.qos }),
);
client.on("error", (err) => out({ event: "error", message: text(err) }));
client.on("close", () => out({ event: "close" }));

const commands = readline.createInterface({ input: process.stdin });
commands.on("line", (line) => {
  const c = JSON.parse(line);
  if (c.op === "subscribe") {
    client.subscribe(c.topic, { qos: c.qos }, (err, granted) =>
      out({ event: "suback", error: text(err), granted: (granted || []).map((g) => g.qos) }),
    );
  } else if (c.op === "publish") {
    client.publish(c.topic, c.payload, { qos: c.qos }, (err) =>
      out({ event: "published", payload: c.payload, error: text(err) }),
    );
  } else if (c.op === "end") {
    client.end(false, () => {
      out({ event: "ended" });
      process.exit(0);
    });
  }
});
// stdin closed (the test is over, or it failed): go at once.
commands.on("close", () => client.end(true, () => process.exit(0)));
