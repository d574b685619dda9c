"""MQTT over WebSocket (workers/mqtt_websocket.py, issue 41), RabbitMQ's
web-mqtt way: ws://host:PORT/ws with the subprotocol `mqtt`.

MQTT.js 5 (the client of browsers and Node.js; both protocol versions) and
paho-mqtt's websockets transport against the broker, AMQP clients on the
same messages both ways, and what only a client made by hand reaches:
another path (404), no MQTT subprotocol (400, as RabbitMQ 3.12 and later),
packets split over fragments and messages and several in one message,
ping, the client's close frame (its will is published), and garbage that
closes its own connection only."""

from __future__ import annotations

import json
import os
import queue
import shutil
import socket
import subprocess
import threading
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pika
import pytest
from paho.mqtt import client as paho
from wsproto import ConnectionType, WSConnection
from wsproto.events import (
    AcceptConnection,
    BytesMessage,
    CloseConnection,
    Event,
    Message,
    Ping,
    Pong,
    Request,
)

from tests.broker_process import Broker, free_port, wait_for

WAIT_S = 10
ROOT = Path(__file__).resolve().parents[2]
NODE_MODULES = ROOT / ".build" / "node" / "node_modules"
MQTTJS_REQUIRED = os.environ.get("SHOAL_MQTTJS_REQUIRED") == "1"
needs_mqttjs = pytest.mark.skipif(
    (shutil.which("node") is None or not (NODE_MODULES / "mqtt").is_dir()) and not MQTTJS_REQUIRED,
    reason="needs Node.js and MQTT.js: npm install --prefix .build/node mqtt@5 "
    "(CI installs it: SHOAL_MQTTJS_REQUIRED=1)",
)


@pytest.fixture
def ws_broker(broker_factory: Callable[..., Broker]) -> tuple[Broker, int]:
    port = free_port()
    return broker_factory(args=("--mqtt-ws-port", str(port), "--handshake-timeout", "2")), port


def amqp_get(channel: Any, queue_name: str) -> tuple[str, bytes]:
    """The next message of `queue_name`: (routing key, body)."""

    def got() -> tuple[str, bytes] | None:
        method, _props, body = channel.basic_get(queue_name, auto_ack=True)
        return (method.routing_key, body) if method is not None else None

    result: tuple[str, bytes] = wait_for(got, WAIT_S, f"a message in {queue_name}")
    return result


def worker_connections(broker: Broker) -> int:
    return sum(p["connections"] for p in broker.status()["processes"] if p["role"] == "io-worker")


# ------------------------------------------------------------------ MQTT.js
class MqttJs:
    """An MQTT.js client in a node process (mqttjs_client.js): commands to
    its stdin, its events (JSON lines) read by a thread into a queue."""

    def __init__(self, port: int, version: int, client_id: str) -> None:
        assert shutil.which("node"), "node is not installed (Node.js 20)"
        assert (NODE_MODULES / "mqtt").is_dir(), (
            f"MQTT.js is not in {NODE_MODULES}: npm install --prefix .build/node mqtt@5"
        )
        self.proc = subprocess.Popen(
            [
                "node",
                str(Path(__file__).with_name("mqttjs_client.js")),
                f"ws://127.0.0.1:{port}/ws",
                str(version),
                client_id,
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=dict(os.environ, NODE_PATH=str(NODE_MODULES)),
        )
        self.events: queue.Queue[dict[str, Any]] = queue.Queue()
        self.early: deque[dict[str, Any]] = deque()  # read while waiting for another kind
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                self.events.put(json.loads(line))
            except ValueError:
                self.events.put({"event": "output", "line": line})  # node's own complaint
        self.events.put({"event": "exit"})

    def send(self, **command: Any) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(command) + "\n")
        self.proc.stdin.flush()

    def next(self, kind: str) -> dict[str, Any]:
        for event in list(self.early):
            if event["event"] == kind:
                self.early.remove(event)
                return event
        while True:
            try:
                event = self.events.get(timeout=WAIT_S)
            except queue.Empty:
                raise AssertionError(f"MQTT.js: no {kind} within {WAIT_S}s") from None
            if event["event"] == kind:
                return event
            if event["event"] in ("error", "output", "exit") or (
                event["event"] == "close" and kind != "ended"  # (end closes first)
            ):
                raise AssertionError(f"MQTT.js, waiting for {kind}: {event}")
            self.early.append(event)

    def close(self) -> None:
        """Ends the node process: stdin closed, then killed if need be."""
        if self.proc.poll() is None:
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.close()
                self.proc.wait(5)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait(5)


@pytest.fixture
def mqttjs() -> Iterator[Callable[[int, int, str], MqttJs]]:
    started: list[MqttJs] = []

    def make(port: int, version: int, client_id: str) -> MqttJs:
        started.append(MqttJs(port, version, client_id))
        return started[-1]

    yield make
    for client in started:
        client.close()


@needs_mqttjs
@pytest.mark.parametrize("version", [4, 5])
def test_mqttjs_publishes_and_subscribes_beside_amqp(
    ws_broker: tuple[Broker, int], mqttjs: Callable[[int, int, str], MqttJs], version: int
) -> None:
    """MQTT.js over ws://.../ws: its own QoS 0 and 1 messages come back to
    it and to an AMQP queue bound to amq.topic (a/b is a.b); an AMQP
    publish reaches it."""
    broker, port = ws_broker
    conn = pika.BlockingConnection(pika.URLParameters(broker.url))
    channel = conn.channel()
    amqp_queue = channel.queue_declare("", exclusive=True).method.queue
    channel.queue_bind(amqp_queue, "amq.topic", "a.b")
    client = mqttjs(port, version, f"mqttjs-{version}")
    assert client.next("connect")["code"] == 0
    client.send(op="subscribe", topic="a/+", qos=1)
    assert client.next("suback") == {"event": "suback", "error": None, "granted": [1]}
    for qos in (0, 1):
        client.send(op="publish", topic="a/b", payload=f"qos {qos}", qos=qos)
        assert client.next("published")["error"] is None
    got = [client.next("message") for _ in range(2)]
    assert sorted((m["topic"], m["payload"], m["qos"]) for m in got) == [
        ("a/b", "qos 0", 0),
        ("a/b", "qos 1", 1),
    ]
    from_mqtt = sorted(amqp_get(channel, amqp_queue) for _ in range(2))
    assert from_mqtt == [("a.b", b"qos 0"), ("a.b", b"qos 1")]
    channel.basic_publish("amq.topic", "a.c", b"from amqp")
    message = client.next("message")
    assert (message["topic"], message["payload"]) == ("a/c", "from amqp")
    client.send(op="end")
    client.next("ended")
    conn.close()


# ------------------------------------------------------------------ paho-mqtt
@pytest.mark.parametrize("version", [paho.MQTTv311, paho.MQTTv5])
def test_paho_over_websocket_with_a_large_message(
    ws_broker: tuple[Broker, int], version: int
) -> None:
    """paho-mqtt's websockets transport: a 1 MiB message each way, one
    frame over many socket reads."""
    _broker, port = ws_broker
    events: queue.Queue[tuple[str, Any]] = queue.Queue()
    client = paho.Client(
        paho.CallbackAPIVersion.VERSION2,
        client_id=f"paho-ws-{version}",
        protocol=version,
        transport="websockets",
    )
    client.ws_set_options(path="/ws")
    client.on_connect = lambda c, u, f, rc, p: events.put(("connack", rc))
    client.on_subscribe = lambda c, u, mid, codes, p: events.put(("suback", codes))
    client.on_message = lambda c, u, m: events.put(("message", m))
    client.connect("127.0.0.1", port)
    client.loop_start()
    try:
        assert events.get(timeout=WAIT_S) == ("connack", 0)
        client.subscribe("big/#", 1)
        kind, codes = events.get(timeout=WAIT_S)
        assert kind == "suback" and [int(c.value) for c in codes] == [1]
        payload = os.urandom(1 << 20)
        client.publish("big/one", payload, qos=1).wait_for_publish(WAIT_S)
        kind, message = events.get(timeout=WAIT_S)
        assert kind == "message"
        assert (message.topic, message.payload, message.qos) == ("big/one", payload, 1)
        from tests.integration.test_ctl import rows

        level = "5.0" if version == paho.MQTTv5 else "3.1.1"
        listed = rows(_broker, "list_connections", "protocol")
        assert [r["protocol"] for r in listed] == [f"Web MQTT {level}"]  # as RabbitMQ's web-mqtt
    finally:
        client.disconnect()
        client.loop_stop()


# ------------------------------------------------------------------ by hand
def _string(text: str | bytes) -> bytes:
    data = text.encode() if isinstance(text, str) else text
    return len(data).to_bytes(2, "big") + data


def _packet(first: int, body: bytes) -> bytes:
    length, size = b"", len(body)
    while True:
        size, digit = size >> 7, size & 0x7F
        length += bytes([digit | (0x80 if size else 0)])
        if not size:
            return bytes([first]) + length + body


def connect(client_id: str, will: tuple[str, bytes] | None = None) -> bytes:
    """MQTT 3.1.1 CONNECT, clean session, keep-alive 60 s."""
    flags, payload = 0x02, _string(client_id)
    if will is not None:
        flags |= 0x04
        payload += _string(will[0]) + _string(will[1])
    return _packet(0x10, _string("MQTT") + bytes([4, flags]) + (60).to_bytes(2, "big") + payload)


def subscribe(packet_id: int, topic_filter: str) -> bytes:
    return _packet(0x82, packet_id.to_bytes(2, "big") + _string(topic_filter) + b"\x00")


def publish(topic: str, payload: bytes) -> bytes:
    return _packet(0x30, _string(topic) + payload)


CONNACK = b"\x20\x02\x00\x00"
PINGREQ, PINGRESP = b"\xc0\x00", b"\xd0\x00"


def suback(packet_id: int) -> bytes:
    return b"\x90\x03" + packet_id.to_bytes(2, "big") + b"\x00"


class RawWs:
    """A WebSocket client by hand (wsproto's client side), whose frames the
    test splits as it likes; the MQTT bytes it receives as one stream."""

    def __init__(
        self, port: int, subprotocols: tuple[str, ...] = ("mqtt",), expect: str = "mqtt"
    ) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=WAIT_S)
        self.ws = WSConnection(ConnectionType.CLIENT)
        self.stream = bytearray()
        self.messages: list[bytes] = []  # each binary message the broker sent
        self.events: deque[Event] = deque()
        self.eof = False
        self.send(Request(host="127.0.0.1", target="/ws", subprotocols=list(subprotocols)))
        accepted = self.next_event(AcceptConnection)
        assert accepted.subprotocol == expect

    def send(self, event: Event, bytewise: bool = False) -> None:
        data = self.ws.send(event)
        if bytewise:  # each byte its own segment (TCP_NODELAY): any split of a frame
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            for i in range(len(data)):
                self.sock.send(data[i : i + 1])
        else:
            self.sock.sendall(data)

    def send_message(self, data: bytes, fragment: int = 0, bytewise: bool = False) -> None:
        """One binary message; in fragments of `fragment` bytes if given."""
        size = fragment or max(1, len(data))
        for at in range(0, len(data), size):
            last = at + size >= len(data)
            self.send(Message(data=data[at : at + size], message_finished=last), bytewise)

    def _pump(self) -> None:
        data = self.sock.recv(65536)
        if not data:
            self.eof = True
            return
        self.ws.receive_data(data)
        for event in self.ws.events():
            if isinstance(event, BytesMessage):
                self.stream += event.data
                self.messages.append(event.data)
            else:
                self.events.append(event)

    def next_event(self, kind: type[Any]) -> Any:
        while True:
            for event in self.events:
                if isinstance(event, kind):
                    self.events.remove(event)
                    return event
            assert not self.eof, f"closed before a {kind.__name__}: {list(self.events)}"
            self._pump()

    def read(self, size: int) -> bytes:
        while len(self.stream) < size:
            assert not self.eof, f"closed with {bytes(self.stream)!r} read"
            self._pump()
        data = bytes(self.stream[:size])
        del self.stream[:size]
        return data

    def packet(self) -> bytes:
        """The next MQTT packet the broker sent, whole."""
        first = self.read(1)
        length, shift, raw = 0, 0, b""
        while True:
            byte = self.read(1)
            raw += byte
            length |= (byte[0] & 0x7F) << shift
            shift += 7
            if not byte[0] & 0x80:
                return first + raw + self.read(length)

    def closed(self) -> int:
        """Read until the broker closes: the code of its close frame."""
        close = self.next_event(CloseConnection)
        while not self.eof:
            self._pump()
        return int(close.code)

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def raw_clients() -> Iterator[list[RawWs]]:
    made: list[RawWs] = []
    yield made
    for client in made:
        client.close()


def test_packets_split_anyhow_over_fragments_and_messages(
    ws_broker: tuple[Broker, int], raw_clients: list[RawWs]
) -> None:
    """A message's fragments split anywhere (one byte a segment), packets
    spanning messages and several in one; ping and pong; the client's close
    frame ends its connection, its will published."""
    _broker, port = ws_broker
    raw = RawWs(port)
    raw_clients.append(raw)
    raw.send_message(connect("split") + subscribe(1, "split/#"), fragment=3, bytewise=True)
    assert raw.packet() == CONNACK
    assert raw.packet() == suback(1)
    one, two = publish("split/a", b"one"), publish("split/b", b"two" * 5000)
    stream = one + two + PINGREQ
    raw.send_message(stream[: len(one) + 7])  # `two` starts in this message...
    raw.send_message(stream[len(one) + 7 :], fragment=1000)  # ...and ends in this one
    assert sorted([raw.packet(), raw.packet(), raw.packet()]) == sorted([one, two, PINGRESP])
    # One packet a message, as mosquitto sends them: the answers of one read
    # went in one message, and Eclipse Paho's C client hung on the second.
    raw.send_message(PINGREQ * 3)
    assert [raw.packet() for _ in range(3)] == [PINGRESP] * 3
    assert raw.messages[-3:] == [PINGRESP] * 3
    raw.send(Message(data=b"", message_finished=True))  # an empty message: nothing
    raw.send_message(PINGREQ)
    assert raw.packet() == PINGRESP
    raw.send(Ping(b"are you there"))
    assert raw.next_event(Pong).payload == b"are you there"

    raw.send_message(subscribe(2, "will/#"))
    assert raw.packet() == suback(2)
    leaving = RawWs(port)
    raw_clients.append(leaving)
    leaving.send_message(connect("leaving", will=("will/leaving", b"gone")))
    assert leaving.packet() == CONNACK
    leaving.send(CloseConnection(code=1000))  # no DISCONNECT: the will goes
    assert leaving.closed() == 1000
    assert raw.packet() == publish("will/leaving", b"gone")


UPGRADE = (
    "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
    "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n{more}\r\n"
)


def answer(port: int, request: bytes) -> bytes:
    """What the broker answers `request` with, up to its close."""
    with socket.create_connection(("127.0.0.1", port), timeout=WAIT_S) as sock:
        sock.sendall(request)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
        return data


@pytest.mark.parametrize(
    ("request_text", "status"),
    [
        (UPGRADE.format(path="/mqtt", more="Sec-WebSocket-Protocol: mqtt\r\n"), b"404"),
        (UPGRADE.format(path="/", more="Sec-WebSocket-Protocol: mqtt\r\n"), b"404"),
        # RabbitMQ 3.12 and later: the client must offer mqtt (MQTT-6.0.0-3).
        (UPGRADE.format(path="/ws", more=""), b"400"),
        (UPGRADE.format(path="/ws", more="Sec-WebSocket-Protocol: chat\r\n"), b"400"),
        ("GET /ws HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", b"400"),  # not an upgrade
        ("\x10\x0c\x00\x04MQTT\x04\x02\x00\x3c\x00\x00", b"400"),  # MQTT on the wrong port
    ],
    ids=["other-path", "root", "no-subprotocol", "not-mqtt", "no-upgrade", "not-http"],
)
def test_a_bad_upgrade_is_refused(
    ws_broker: tuple[Broker, int], request_text: str, status: bytes
) -> None:
    broker, port = ws_broker
    assert answer(port, request_text.encode()).startswith(b"HTTP/1.1 " + status + b" ")
    wait_for(lambda: worker_connections(broker) == 0, WAIT_S, "the refused connection counted out")


@pytest.mark.parametrize(
    ("offered", "chosen"),
    [(("chat", "mqtt"), "mqtt"), (("mqttv3.1",), "mqttv3.1"), (("mqttv3.1", "mqtt"), "mqttv3.1")],
)
def test_the_first_mqtt_subprotocol_offered_is_chosen(
    ws_broker: tuple[Broker, int],
    raw_clients: list[RawWs],
    offered: tuple[str, ...],
    chosen: str,
) -> None:
    """As RabbitMQ 4.1.7 and later: `mqtt` or `mqttv3.1` (old Paho clients),
    answered as offered."""
    _broker, port = ws_broker
    raw_clients.append(RawWs(port, offered, expect=chosen))


def test_a_silent_client_is_closed_after_the_handshake_timeout(
    ws_broker: tuple[Broker, int],
) -> None:
    broker, port = ws_broker  # --handshake-timeout 2
    assert answer(port, b"") == b""  # closed, nothing said
    wait_for(lambda: worker_connections(broker) == 0, WAIT_S, "the connection counted out")


def _garbage_frames(raw: RawWs) -> None:
    raw.sock.sendall(b"\xff" * 32)  # opcode 0xF: no such frame


def _unmasked_frame(raw: RawWs) -> None:
    raw.sock.sendall(b"\x82\x03abc")  # a client's frame must be masked


def _text_message(raw: RawWs) -> None:
    raw.send(Message(data="CONNECT"))  # MQTT-6.0.0-1: binary only


def _malformed_mqtt(raw: RawWs) -> None:
    raw.send_message(b"\xf0\x00")  # a well framed message, but not CONNECT


@pytest.mark.parametrize(
    ("garbage", "code"),
    [
        (_garbage_frames, 1002),
        (_unmasked_frame, 1002),
        (_text_message, 1003),
        (_malformed_mqtt, 1000),
    ],
    ids=["bad-opcode", "unmasked", "text", "malformed-mqtt"],
)
def test_garbage_closes_only_its_own_connection(
    ws_broker: tuple[Broker, int],
    raw_clients: list[RawWs],
    garbage: Callable[[RawWs], None],
    code: int,
) -> None:
    broker, port = ws_broker
    workers = broker.pids("io-worker")
    watcher = RawWs(port)
    raw_clients.append(watcher)
    watcher.send_message(connect("watcher") + subscribe(1, "still/#"))
    assert watcher.packet() == CONNACK and watcher.packet() == suback(1)
    bad = RawWs(port)
    raw_clients.append(bad)
    garbage(bad)
    assert bad.closed() == code
    watcher.send_message(publish("still/here", b"yes"))
    assert watcher.packet() == publish("still/here", b"yes")
    assert broker.pids("io-worker") == workers  # no worker went down
