"""MQTT on the broker (workers/mqtt_connection.py, issue 41's first step):
paho-mqtt 2 clients, both protocol versions, over `--mqtt-port`, and AMQP
clients on the same messages both ways through amq.topic."""

from __future__ import annotations

import os
import queue
import shutil
import signal
import subprocess
from collections.abc import Callable, Iterator
from typing import Any

import pika
import pytest
from paho.mqtt import client as paho
from paho.mqtt.enums import MQTTErrorCode
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from shoal.broker.mqtt import packets as P
from shoal.shm import layout
from tests.broker_process import Broker, free_port, wait_for
from tests.mqtt_raw import RawClient

WAIT_S = 10
VERSIONS = [paho.MQTTv311, paho.MQTTv5]


class Client:
    """A paho client whose callbacks land in a queue."""

    def __init__(
        self, port: int, version: int, client_id: str, clean: bool = True, expiry: int | None = None
    ) -> None:
        self.events: queue.Queue[tuple[str, Any]] = queue.Queue()
        kwargs: dict[str, Any] = {"client_id": client_id, "protocol": version}
        if version != paho.MQTTv5:
            kwargs["clean_session"] = clean
        self.version = version
        self.clean = clean
        self.expiry = (0 if clean else 3600) if expiry is None else expiry  # 5.0's
        self.c = paho.Client(paho.CallbackAPIVersion.VERSION2, **kwargs)
        self.c.on_connect = lambda c, u, f, rc, p: self.events.put(("connack", rc))
        self.c.on_subscribe = lambda c, u, mid, codes, p: self.events.put(("suback", codes))
        self.c.on_unsubscribe = lambda c, u, mid, codes, p: self.events.put(("unsuback", mid))
        self.c.on_message = lambda c, u, m: self.events.put(("message", m))
        self.c.on_disconnect = lambda c, u, f, rc, p: self.events.put(("gone", rc))
        self.port = port

    def connect(self, username: str | None = None, password: str | None = None) -> Any:
        if username is not None:
            self.c.username_pw_set(username, password)
        props = None
        if self.version == paho.MQTTv5:
            props = Properties(PacketTypes.CONNECT)
            props.SessionExpiryInterval = self.expiry
        self.c.connect(
            "127.0.0.1", self.port, keepalive=30, clean_start=self.clean, properties=props
        ) if self.version == paho.MQTTv5 else self.c.connect("127.0.0.1", self.port, 30)
        self.c.loop_start()
        return self.next("connack")

    def next(self, kind: str) -> Any:
        while True:
            got, value = self.events.get(timeout=WAIT_S)
            if got == kind:
                return value

    def subscribe(self, topic: str, qos: int) -> list[int]:
        self.c.subscribe(topic, qos)
        return [int(getattr(c, "value", c)) for c in self.next("suback")]

    def close(self) -> None:
        self.c.disconnect()
        self.c.loop_stop()


def connected(
    clients: list[Client], port: int, version: int, client_id: str, clean: bool = True
) -> Client:
    """A client connected (CONNACK 0), closed after the test."""
    client = Client(port, version, client_id, clean)
    clients.append(client)
    assert client.connect() == 0
    return client


@pytest.fixture
def clients() -> Iterator[list[Client]]:
    made: list[Client] = []
    yield made
    for c in made:
        c.close()


@pytest.mark.parametrize("version", VERSIONS)
def test_publish_and_subscribe_at_each_qos(
    mqtt_broker: tuple[Broker, int], clients: list[Client], version: int
) -> None:
    _broker, port = mqtt_broker
    sub = Client(port, version, "sub-1")
    pub = Client(port, version, "pub-1")
    clients += [sub, pub]
    assert sub.connect() == 0 and pub.connect() == 0
    assert sub.subscribe("sensors/+/temp", 1) == [1]
    for qos in (0, 1, 2):
        info = pub.c.publish(f"sensors/{qos}/temp", f"t{qos}".encode(), qos=qos)
        if qos:  # PUBACK, or PUBREC then PUBCOMP: confirmed by the broker
            info.wait_for_publish(WAIT_S)
            assert info.is_published()
        message = sub.next("message")
        assert (message.topic, message.payload) == (f"sensors/{qos}/temp", f"t{qos}".encode())
        assert message.qos == min(qos, 1)
    pub.c.publish("other/topic", b"no", qos=1).wait_for_publish(WAIT_S)
    pub.c.publish("sensors/9/temp", b"last", qos=1).wait_for_publish(WAIT_S)
    assert sub.next("message").payload == b"last"  # the other topic never came


@pytest.mark.parametrize("version", VERSIONS)
def test_runs_of_deliveries_arrive_whole_in_order_at_the_subscriptions_qos(
    mqtt_broker: tuple[Broker, int], clients: list[Client], version: int
) -> None:
    """Runs of alike deliveries, each but the first written in C
    (Outbound.run), of every size class of a PUBLISH's remaining length."""
    broker, port = mqtt_broker
    sub = connected(clients, port, version, "run-sub")
    assert sub.subscribe("runs/q1/#", 1) == [1] and sub.subscribe("runs/q0/#", 0) == [0]
    sizes = [0, 1, 120, 130, 16_380, 20_000] * 5
    conn = pika.BlockingConnection(pika.URLParameters(broker.url))
    try:
        ch = conn.channel()
        for level in ("q1", "q0"):
            for i, size in enumerate(sizes):
                props = pika.BasicProperties(headers={"x-mqtt-publish-qos": 1})
                ch.basic_publish("amq.topic", f"runs.{level}.t", bytes([i]) * size, props)
    finally:
        conn.close()
    for qos, level in ((1, "q1"), (0, "q0")):
        for i, size in enumerate(sizes):
            message = sub.next("message")
            assert (message.topic, message.qos) == (f"runs/{level}/t", qos)
            assert message.payload == bytes([i]) * size


def test_amqp_and_mqtt_share_messages_both_ways(
    mqtt_broker: tuple[Broker, int], clients: list[Client]
) -> None:
    broker, port = mqtt_broker
    device = connected(clients, port, paho.MQTTv311, "device-3")
    assert device.subscribe("commands/device-3/#", 1) == [1]
    conn = pika.BlockingConnection(pika.URLParameters(broker.url))
    try:
        ch = conn.channel()
        q = ch.queue_declare("", exclusive=True).method.queue
        ch.queue_bind(q, "amq.topic", "sensors.*.temp")
        device.c.publish("sensors/3/temp", b"21.5", qos=1).wait_for_publish(WAIT_S)
        got = None
        for method, props, body in ch.consume(q, inactivity_timeout=WAIT_S):
            got = (method.routing_key, body, props.headers)
            break
        assert got is not None
        assert got[0] == "sensors.3.temp" and got[1] == b"21.5"
        assert got[2]["x-mqtt-publish-qos"] == 1
        ch.cancel()
        ch.basic_publish("amq.topic", "commands.device-3.reboot", b"now")
        message = device.next("message")
        assert (message.topic, message.payload) == ("commands/device-3/reboot", b"now")
    finally:
        conn.close()


def test_a_topic_with_dots_keeps_its_levels_and_its_name(
    mqtt_broker: tuple[Broker, int], clients: list[Client]
) -> None:
    """A `.` in a topic (an address, Sparkplug B's spBv1.0) is an ordinary
    character in MQTT: `devices/+/status` matches `devices/192.168.0.5/status`
    and the subscriber gets that name back, as from mosquitto (RabbitMQ 3.x
    routes it as `devices.192.168.0.5.status`: not matched, and named
    `devices/192/168/0/5/status` where a `#` gets it). AMQP sees the dots as `/`."""
    broker, port = mqtt_broker
    subscriber = connected(clients, port, paho.MQTTv5, "dots-sub")
    assert subscriber.subscribe("devices/+/status", 1) == [1]
    assert subscriber.subscribe("spBv1.0/#", 1) == [1]
    device = connected(clients, port, paho.MQTTv311, "dots-device")
    conn = pika.BlockingConnection(pika.URLParameters(broker.url))
    try:
        ch = conn.channel()
        q = ch.queue_declare("", exclusive=True).method.queue
        ch.queue_bind(q, "amq.topic", "devices.*.status")
        for topic in ("devices/192.168.0.5/status", "spBv1.0/plant/NBIRTH/edge"):
            device.c.publish(topic, b"up", qos=1).wait_for_publish(WAIT_S)
            message = subscriber.next("message")
            assert (message.topic, message.payload) == (topic, b"up")
        method, _props, body = next(ch.consume(q, inactivity_timeout=WAIT_S))
        assert (method.routing_key, body) == ("devices.192/168/0/5.status", b"up")
        ch.cancel()
        ch.basic_publish("amq.topic", "devices.10/0/0/1.status", b"from amqp")
        message = subscriber.next("message")
        assert (message.topic, message.payload) == ("devices/10.0.0.1/status", b"from amqp")
    finally:
        conn.close()


def test_a_returning_session_drops_the_binding_a_dot_had_before(
    mqtt_broker: tuple[Broker, int], clients: list[Client]
) -> None:
    """A session's filter with a `.` was bound with the dot as a level before
    the mapping kept dots (devices.10.0.0.5.#): when the session returns, that
    binding goes, and only what the filter matches is delivered."""
    broker, port = mqtt_broker
    away = connected(clients, port, paho.MQTTv311, "legacy-dots", clean=False)
    assert away.subscribe("devices/10.0.0.5/#", 1) == [1]
    away.close()
    conn = pika.BlockingConnection(pika.URLParameters(broker.url))
    try:  # what the earlier mapping bound for that filter
        conn.channel().queue_bind(
            "mqtt-subscription-legacy-dotsqos1", "amq.topic", "devices.10.0.0.5.#"
        )
    finally:
        conn.close()
    back = connected(clients, port, paho.MQTTv311, "legacy-dots", clean=False)
    publisher = connected(clients, port, paho.MQTTv311, "legacy-dots-pub")
    for topic in ("devices/10/0/0/5/x", "devices/10.0.0.5/y"):
        publisher.c.publish(topic, topic.encode(), qos=1).wait_for_publish(WAIT_S)
    message = back.next("message")
    assert message.topic == "devices/10.0.0.5/y"
    assert back.events.empty()


def test_empty_small_and_multi_frame_messages_reach_a_subscriber_whole(
    mqtt_broker: tuple[Broker, int], clients: list[Client]
) -> None:
    """Deliveries cross the bridge as AMQP frames: a message with no body
    frame, one in one frame, and one larger than a frame (131,072 B here) all
    arrive whole and in order."""
    broker, port = mqtt_broker
    device = connected(clients, port, paho.MQTTv311, "sizes")
    assert device.subscribe("sizes/#", 1) == [1]
    bodies = [b"", b"one", bytes(range(256)) * 1200, b"", b"last"]  # (307,200 B)
    conn = pika.BlockingConnection(pika.URLParameters(broker.url))
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        for body in bodies:
            ch.basic_publish("amq.topic", "sizes.x", body, pika.BasicProperties(delivery_mode=2))
    finally:
        conn.close()
    got = [device.next("message") for _ in bodies]
    assert [(m.topic, m.payload) for m in got] == [("sizes/x", body) for body in bodies]


def test_a_wrong_password_gets_connack_4_and_a_known_user_connects(
    mqtt_broker: tuple[Broker, int], clients: list[Client]
) -> None:
    _broker, port = mqtt_broker
    bad = Client(port, paho.MQTTv311, "bad-1")
    clients.append(bad)
    assert str(bad.connect("guest", "wrong")) == "Bad user name or password"  # CONNACK 4
    good = Client(port, paho.MQTTv5, "good-1")
    clients.append(good)
    assert good.connect("/:guest", "guest") == 0  # RabbitMQ's vhost:user form


@pytest.mark.parametrize("password", [b"\xffguest", b"gu\x00est"], ids=["not-utf8", "nul"])
def test_a_password_that_is_not_text_is_a_refused_login(
    mqtt_broker: tuple[Broker, int], password: bytes
) -> None:
    """MQTT's password is binary data; SASL PLAIN's is text without NULs, so
    no user's password is such bytes: CONNACK 4 (5.0: 0x86), as a wrong one
    (it was an internal error, or "server unavailable" for a NUL)."""
    _broker, port = mqtt_broker
    for level, code in ((4, 4), (5, 0x86)):
        client = RawClient(port, level)
        try:
            assert client.connect("binary-pw", username="guest", password=password)[1] == code
            assert client.closed_by_broker()
        finally:
            client.close()


@pytest.mark.parametrize("password", [None, b""], ids=["no-password", "empty-password"])
def test_an_empty_user_name_without_a_password_is_anonymous(
    mqtt_broker: tuple[Broker, int], password: bytes | None
) -> None:
    """An empty user name and no (or an empty) password log in as a client
    with no user name does (the default user), as on mosquitto: the tests of
    clients written against it send them (gmqtt's, aiomqtt's). RabbitMQ 3.10
    refuses them; an empty name with a password is still checked, and refused."""
    _broker, port = mqtt_broker
    for level, refused in ((4, 4), (5, 0x86)):
        client = RawClient(port, level)
        try:
            assert client.connect("empty-name", username="", password=password)[1] == 0
            assert client.subscribe("anon/x", 1) == b"\x01"  # (a user with its rights)
        finally:
            client.close()
        client = RawClient(port, level)
        try:
            assert client.connect("empty-name", username="", password=b"guest")[1] == refused
            assert client.closed_by_broker()
        finally:
            client.close()


def test_the_will_goes_out_when_a_client_vanishes_not_when_it_disconnects(
    mqtt_broker: tuple[Broker, int], clients: list[Client]
) -> None:
    _broker, port = mqtt_broker
    watcher = connected(clients, port, paho.MQTTv311, "watcher")
    assert watcher.subscribe("status/#", 1) == [1]
    polite = Client(port, paho.MQTTv311, "polite")
    polite.c.will_set("status/polite", b"gone", qos=1)
    assert polite.connect() == 0
    polite.close()  # DISCONNECT: no will
    rude = Client(port, paho.MQTTv311, "rude")
    rude.c.will_set("status/rude", b"gone", qos=1)
    assert rude.connect() == 0
    sock = rude.c.socket()
    assert sock is not None
    sock.close()  # vanished: its will is published
    message = watcher.next("message")
    assert (message.topic, message.payload) == ("status/rude", b"gone")
    rude.c.loop_stop()


def test_a_persistent_session_keeps_its_messages_while_away(
    mqtt_broker: tuple[Broker, int], clients: list[Client]
) -> None:
    _broker, port = mqtt_broker
    away = Client(port, paho.MQTTv311, "away-1", clean=False)
    assert away.connect() == 0
    assert away.subscribe("news/#", 1) == [1]
    away.close()
    pub = connected(clients, port, paho.MQTTv311, "pub-2")
    pub.c.publish("news/today", b"kept", qos=1).wait_for_publish(WAIT_S)
    back = connected(clients, port, paho.MQTTv311, "away-1", clean=False)
    message = back.next("message")
    assert (message.topic, message.payload, message.qos) == ("news/today", b"kept", 1)


@pytest.mark.parametrize("clean", [True, False])
def test_client_ids_topics_and_groups_outside_amqps_name_grammar_subscribe(
    mqtt_broker: tuple[Broker, int], clients: list[Client], clean: bool
) -> None:
    """A client id, a topic and a shared group with non-ASCII letters and
    punctuation: their queues' names (mqtt-subscription-<id>qos1,
    mqtt-shared-<group>/<filter>) are outside pamqp's grammar, which made the
    bridge's queue.declare raise (broker/amqp/names.py)."""
    _broker, port = mqtt_broker
    sub = connected(clients, port, paho.MQTTv5, "dév!ce$1", clean=clean)
    assert sub.subscribe("tëst/#", 1) == [1]
    assert sub.subscribe("$share/grüppe!/x/+", 1) == [1]
    pub = connected(clients, port, paho.MQTTv311, "pub-utf8")
    pub.c.publish("tëst/a", b"hello", qos=1).wait_for_publish(WAIT_S)
    pub.c.publish("x/y", b"shared", qos=1).wait_for_publish(WAIT_S)
    got = {sub.next("message").payload for _ in range(2)}
    assert got == {b"hello", b"shared"}


def test_a_malformed_packet_closes_only_its_connection(
    mqtt_broker: tuple[Broker, int], clients: list[Client]
) -> None:
    import socket

    _broker, port = mqtt_broker
    other = connected(clients, port, paho.MQTTv311, "bystander")
    assert other.subscribe("t", 0) == [0]
    with socket.create_connection(("127.0.0.1", port), timeout=WAIT_S) as s:
        s.sendall(b"\x30\x02\x00\x01")  # a PUBLISH before any CONNECT
        assert s.recv(10) == b""  # closed
    rc = other.c.publish("t", b"still here", qos=0).rc
    assert rc == MQTTErrorCode.MQTT_ERR_SUCCESS
    assert other.next("message").payload == b"still here"


def test_unsubscribe_stops_the_messages_of_that_filter_only(
    mqtt_broker: tuple[Broker, int], clients: list[Client]
) -> None:
    _broker, port = mqtt_broker
    c = connected(clients, port, paho.MQTTv5, "unsub-1")
    assert c.subscribe("a/#", 1) == [1]
    assert c.subscribe("b/#", 0) == [0]
    c.c.unsubscribe("a/#")
    c.next("unsuback")
    c.c.publish("a/1", b"dropped", qos=1).wait_for_publish(WAIT_S)
    c.c.publish("b/1", b"kept", qos=1).wait_for_publish(WAIT_S)
    message = c.next("message")
    assert (message.topic, message.payload, message.qos) == ("b/1", b"kept", 0)


def test_a_publish_read_after_another_clients_subscribe_reaches_it(
    mqtt_broker: tuple[Broker, int], clients: list[Client]
) -> None:
    """A client subscribes and another publishes without waiting for the
    SUBACK (Eclipse Paho's test_subscribe_options and test_request_response):
    as on mosquitto, the message reaches the subscription. The scheduler
    stopped holds the SUBSCRIBE's bind; the PUBLISH goes once a worker has
    read the SUBSCRIBE (its subscribe barrier word, shm/subscribe_barrier.py)
    and must wait for the bind rather than be routed to no queue."""
    broker, port = mqtt_broker
    publisher = connected(clients, port, paho.MQTTv5, "race-publisher")
    subscriber = connected(clients, port, paho.MQTTv5, "race-subscriber")
    publish_during_a_held_subscribe(broker, publisher, subscriber, "race/1")


def publish_during_a_held_subscribe(
    broker: Broker, publisher: Client, subscriber: Client, topic: str
) -> None:
    """The scheduler stopped, `subscriber` subscribes to `topic` and, once a
    worker has read the SUBSCRIBE, `publisher` publishes "after the
    subscribe" to it: the subscriber gets it."""
    seg = broker.segment()
    words = [seg.layout.proc(i) + layout.P_SUBSCRIBING for i in broker.pids("io-worker")]
    scheduler = broker.pids("scheduler")[0]
    os.kill(scheduler, signal.SIGSTOP)
    try:
        subscriber.c.subscribe(topic, 1)
        wait_for(lambda: any(seg.atomic.load(word) for word in words), WAIT_S, "the SUBSCRIBE read")
        publisher.c.publish(topic, b"after the subscribe", qos=1)
    finally:
        os.kill(scheduler, signal.SIGCONT)
    assert subscriber.next("suback")
    message = subscriber.next("message")
    assert (message.topic, message.payload) == (topic, b"after the subscribe")
    wait_for(lambda: not any(seg.atomic.load(word) for word in words), WAIT_S, "the barrier down")


def test_a_read_inside_a_payload_that_starts_like_a_subscribe_raises_no_barrier(
    mqtt_broker: tuple[Broker, int],
) -> None:
    """A publish whose payload's second read starts with SUBSCRIBE's first
    byte (0x82) is no SUBSCRIBE: no worker's barrier word goes up, which
    would hold every MQTT publisher for 2 s. The PINGRESP shows the first
    part (PINGREQ and the PUBLISH's head) was read before the rest is sent."""
    broker, port = mqtt_broker
    seg = broker.segment()
    words = [seg.layout.proc(i) + layout.P_SUBSCRIBING for i in broker.pids("io-worker")]
    raw = RawClient(port)
    try:
        assert raw.connect("payload-0x82")[1] == 0
        publish = P.encode_publish(P.MQTT_5, "plain/1", b"head" + b"\x82\x05tail", 1, packet_id=7)
        split = publish.index(b"\x82\x05tail")
        raw.sock.sendall(P.packet(P.PINGREQ, 0, b"") + publish[:split])
        raw.read(P.PINGRESP)
        raw.sock.sendall(publish[split:])
        assert raw.read(P.PUBACK)[2][:2] == (7).to_bytes(2, "big")
        assert not any(seg.atomic.load(word) for word in words)
    finally:
        raw.close()


def test_five_properties_cross_to_amqp_and_back(
    mqtt_broker: tuple[Broker, int], clients: list[Client]
) -> None:
    broker, port = mqtt_broker
    c = connected(clients, port, paho.MQTTv5, "props-1")
    assert c.subscribe("replies/#", 1) == [1]
    conn = pika.BlockingConnection(pika.URLParameters(broker.url))
    try:
        ch = conn.channel()
        q = ch.queue_declare("", exclusive=True).method.queue
        ch.queue_bind(q, "amq.topic", "requests.#")
        props = Properties(PacketTypes.PUBLISH)
        props.ContentType = "application/json"
        props.ResponseTopic = "replies/props-1"
        props.CorrelationData = b"req-7"
        props.UserProperty = ("tenant", "north")
        props.MessageExpiryInterval = 60
        c.c.publish("requests/x", b"{}", qos=1, properties=props).wait_for_publish(WAIT_S)
        got = None
        for _m, p, body in ch.consume(q, inactivity_timeout=WAIT_S):
            got = (p, body)
            break
        assert got is not None
        amqp_props = got[0]
        assert amqp_props.content_type == "application/json"
        assert amqp_props.reply_to == "replies/props-1"
        assert amqp_props.correlation_id == "req-7"
        assert amqp_props.expiration == "60000"
        assert amqp_props.headers["tenant"] == "north"
        ch.cancel()
        reply = pika.BasicProperties(
            content_type="text/plain", correlation_id="req-7", headers={"tenant": "north"}
        )
        ch.basic_publish("amq.topic", "replies.props-1", b"done", reply)
        message = c.next("message")
        assert (message.topic, message.payload) == ("replies/props-1", b"done")
        assert message.properties.ContentType == "text/plain"
        assert message.properties.CorrelationData == b"req-7"
        assert message.properties.UserProperty == [("tenant", "north")]
    finally:
        conn.close()


def test_a_qos2_publish_sent_again_before_pubrel_is_delivered_once(
    mqtt_broker: tuple[Broker, int], clients: list[Client]
) -> None:
    import socket

    _broker, port = mqtt_broker
    sub = connected(clients, port, paho.MQTTv311, "sub-q2")
    assert sub.subscribe("q2/#", 1) == [1]
    reader = P.PacketReader()

    def read(s: socket.socket, kind: int) -> tuple[int, int, bytes]:
        while True:
            for packet in reader.feed(s.recv(4096)):
                if packet[0] == kind:
                    return packet

    with socket.create_connection(("127.0.0.1", port), timeout=WAIT_S) as s:
        connect = P.string("MQTT") + bytes((P.MQTT_311, 0x02)) + b"\x00\x3c" + P.string("raw-q2")
        s.sendall(P.packet(P.CONNECT, 0, connect))
        assert read(s, P.CONNACK)[2] == b"\x00\x00"
        once = P.encode_publish(P.MQTT_311, "q2/x", b"once", qos=2, packet_id=5)
        again = P.encode_publish(P.MQTT_311, "q2/x", b"once", qos=2, dup=True, packet_id=5)
        s.sendall(once + again)  # the resend before the PUBREL
        assert read(s, P.PUBREC)[2] == b"\x00\x05"
        s.sendall(P.encode_ack(P.MQTT_311, P.PUBREL, 5))
        assert read(s, P.PUBCOMP)[2] == b"\x00\x05"
        s.sendall(P.encode_publish(P.MQTT_311, "q2/x", b"marker", qos=1, packet_id=6))
        assert read(s, P.PUBACK)[2] == b"\x00\x06"
    assert sub.next("message").payload == b"once"
    assert sub.next("message").payload == b"marker"  # and "once" only once before it


def test_an_mqtt_connection_is_listed_with_its_protocol_and_client_id(
    mqtt_broker: tuple[Broker, int], clients: list[Client]
) -> None:
    from tests.integration.test_ctl import rows

    broker, port = mqtt_broker
    connected(clients, port, paho.MQTTv5, "listed-5")
    connected(clients, port, paho.MQTTv311, "listed-3")
    listed = rows(broker, "list_connections", "protocol", "user", "client_properties")
    assert sorted((r["protocol"], r["client_properties"]["client_id"]) for r in listed) == [  # type: ignore[index]
        ("MQTT 3.1.1", "listed-3"),
        ("MQTT 5.0", "listed-5"),
    ]
    assert {r["user"] for r in listed} == {"guest"}


def test_a_subscriber_keeps_one_channel_between_its_subscribes(
    mqtt_broker: tuple[Broker, int], clients: list[Client]
) -> None:
    """The declares' channel (channel 2 of the inner connection) closes once
    a SUBSCRIBE's queues are declared, and opens again for the next one:
    a connection listed with one channel after each SUBACK, each
    subscription delivering, at its own QoS (a queue for each QoS)."""
    from tests.integration.test_ctl import rows

    broker, port = mqtt_broker
    sub = connected(clients, port, paho.MQTTv311, "two-subscribes")
    pub = connected(clients, port, paho.MQTTv311, "their-publisher")

    host, local_port = sub.c.socket().getsockname()[:2]

    def channels() -> list[object]:
        """The numbers of its inner connection's channels (RabbitMQ's names:
        "peer:port -> local:port (number)")."""
        listed = rows(broker, "list_channels", "name", "number")
        return [r["number"] for r in listed if str(r["name"]).startswith(f"{host}:{local_port} ")]

    for topic, qos in (("first/t", 1), ("second/t", 0), ("first/u", 1)):
        assert sub.subscribe(topic, qos) == [qos]
        wait_for(lambda: channels() == [1], WAIT_S, f"channel 1 alone after {topic}'s SUBACK")
        pub.c.publish(topic, topic.encode(), qos=1).wait_for_publish(WAIT_S)
        message = sub.next("message")
        assert (message.topic, message.payload, message.qos) == (topic, topic.encode(), qos)
    # One SUBSCRIBE of three filters at three QoS: a declare each, one after
    # another, the channel closing after each and opening again for the next.
    sub.c.subscribe([("third/0", 0), ("third/1", 1), ("third/2", 2)])
    assert [int(getattr(c, "value", c)) for c in sub.next("suback")] == [0, 1, 2]
    wait_for(lambda: channels() == [1], WAIT_S, "channel 1 alone after the three")
    for qos in (0, 1, 2):
        pub.c.publish(f"third/{qos}", b"%d" % qos, qos=2).wait_for_publish(WAIT_S)
        message = sub.next("message")
        assert (message.topic, message.payload, message.qos) == (f"third/{qos}", b"%d" % qos, qos)


def test_status_and_metrics_count_mqtt_connections(
    broker_factory: Callable[..., Broker], clients: list[Client]
) -> None:
    from tests.integration.test_metrics import scrape, value

    port, metrics = free_port(), free_port()
    broker = broker_factory(args=("--mqtt-port", str(port), "--metrics-port", str(metrics)))
    for i in range(3):
        connected(clients, port, paho.MQTTv5, f"counted-{i}")

    def mqtt_connections() -> int:
        workers = [p for p in broker.status()["processes"] if p["role"] == "io-worker"]
        return sum(p["mqtt_connections"] for p in workers)

    wait_for(lambda: mqtt_connections() == 3, WAIT_S, "shoal status to count 3 MQTT clients")
    assert value(scrape(metrics), "shoal_mqtt_connections") == 3
    clients.pop().close()
    wait_for(lambda: mqtt_connections() == 2, WAIT_S, "shoal status to count one gone")


@pytest.mark.parametrize("version", VERSIONS)
def test_a_client_id_connecting_again_takes_the_session_over(
    broker_factory: Callable[..., Broker], clients: list[Client], version: int
) -> None:
    """MQTT-3.1.4-2: the older connection of a client id is closed, whichever
    IO worker holds it (four workers: the two connections are spread)."""
    port = free_port()
    broker_factory(workers=4, args=("--mqtt-port", str(port)))
    first = connected(clients, port, version, "phone-1")
    first.c.reconnect_delay_set(60, 120)  # paho's loop must not take it back
    assert first.subscribe("inbox/phone-1", 1) == [1]
    second = connected(clients, port, version, "phone-1")
    reason = first.next("gone")
    if version == paho.MQTTv5:
        assert str(reason) == "Session taken over"  # DISCONNECT 0x8E
    assert second.subscribe("inbox/phone-1", 1) == [1]
    second.c.publish("inbox/phone-1", b"for the new one", qos=1).wait_for_publish(WAIT_S)
    assert second.next("message").payload == b"for the new one"


@pytest.mark.parametrize("version", VERSIONS)
def test_a_retained_message_reaches_later_subscribers_and_survives_a_restart(
    mqtt_broker: tuple[Broker, int], clients: list[Client], version: int
) -> None:
    broker, port = mqtt_broker
    device = connected(clients, port, version, "thermostat")
    device.c.publish("home/thermostat/mode", b"eco", qos=1, retain=True).wait_for_publish(WAIT_S)
    device.c.publish("home/door", b"shut", qos=0, retain=True)
    device.c.publish("home/door", b"", qos=1, retain=True).wait_for_publish(WAIT_S)  # cleared
    device.c.publish("home/light", b"live", qos=1).wait_for_publish(WAIT_S)  # not retained
    late = connected(clients, port, version, "app-1")
    assert late.subscribe("home/#", 1) == [1]
    message = late.next("message")
    assert (message.topic, message.payload, message.qos) == ("home/thermostat/mode", b"eco", 1)
    assert message.retain
    device.c.publish("home/thermostat/mode", b"comfort", qos=1).wait_for_publish(WAIT_S)
    live = late.next("message")
    assert live.payload == b"comfort" and not live.retain  # MQTT-3.3.1-9
    for c in clients:
        c.close()
    clients.clear()
    broker.restart()
    again = connected(clients, port, version, "app-2")
    assert again.subscribe("home/+/mode", 0) == [0]
    kept = again.next("message")
    assert (kept.topic, kept.payload, kept.qos, kept.retain) == (
        "home/thermostat/mode",
        b"eco",
        0,
        True,
    )


MOSQUITTO_REQUIRED = os.environ.get("SHOAL_MOSQUITTO_REQUIRED") == "1"
needs_mosquitto = pytest.mark.skipif(
    shutil.which("mosquitto_pub") is None and not MOSQUITTO_REQUIRED,
    reason="needs Debian's mosquitto-clients (CI installs them: SHOAL_MOSQUITTO_REQUIRED=1)",
)


@needs_mosquitto
@pytest.mark.parametrize("version", ["mqttv311", "mqttv5"])
def test_mosquitto_clients_publish_and_subscribe(
    mqtt_broker: tuple[Broker, int], version: str
) -> None:
    """Debian's mosquitto_sub and mosquitto_pub (libmosquitto), QoS 1 and a
    retained message, both protocol versions."""
    _broker, port = mqtt_broker
    common = ["-h", "127.0.0.1", "-p", str(port), "-V", version]
    subprocess.run(
        ["mosquitto_pub", *common, "-t", "plant/boiler", "-m", "hot", "-q", "1", "-r"],
        check=True,
        timeout=WAIT_S,
    )
    sub = subprocess.Popen(
        ["mosquitto_sub", *common, "-t", "plant/#", "-q", "1", "-C", "2", "-v", "-W", str(WAIT_S)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        first = sub.stdout.readline() if sub.stdout is not None else ""
        assert first == "plant/boiler hot\n"  # the retained message, on subscribing
        subprocess.run(
            ["mosquitto_pub", *common, "-t", "plant/pump", "-m", "on", "-q", "1"],
            check=True,
            timeout=WAIT_S,
        )
        out, _err = sub.communicate(timeout=WAIT_S)
        assert out == "plant/pump on\n"
        assert sub.returncode == 0
    finally:
        if sub.poll() is None:
            sub.kill()
            sub.wait(WAIT_S)


def test_a_five_session_lasts_its_expiry_interval_whatever_clean_start_says(
    mqtt_broker: tuple[Broker, int], clients: list[Client]
) -> None:
    broker, port = mqtt_broker
    pub = connected(clients, port, paho.MQTTv5, "pub-5")
    # Clean start off but no expiry interval: the session ends with the connection.
    brief = Client(port, paho.MQTTv5, "brief", clean=False, expiry=0)
    assert brief.connect() == 0 and brief.subscribe("log/#", 1) == [1]
    brief.close()
    # An expiry interval of 1 s: the session is kept, then goes.
    short = Client(port, paho.MQTTv5, "short", clean=False, expiry=1)
    assert short.connect() == 0 and short.subscribe("log/#", 1) == [1]
    short.close()
    pub.c.publish("log/a", b"kept a while", qos=1).wait_for_publish(WAIT_S)
    conn = pika.BlockingConnection(pika.URLParameters(broker.url))
    try:
        ch = conn.channel()
        kept = ch.queue_declare("mqtt-subscription-shortqos1", passive=True)
        assert kept.method.message_count == 1
        assert [q for q in _queue_names(broker) if "brief" in q] == []

        def expired() -> bool:
            return "mqtt-subscription-shortqos1" not in _queue_names(broker)

        wait_for(expired, WAIT_S, "the session's queue to expire")
    finally:
        conn.close()


def _queue_names(broker: Broker) -> list[str]:
    from tests.integration.test_ctl import rows

    return [str(r["name"]) for r in rows(broker, "list_queues", "name")]


def test_five_receive_maximum_and_maximum_packet_size_bound_what_is_sent(
    mqtt_broker: tuple[Broker, int], clients: list[Client]
) -> None:
    import socket

    broker, port = mqtt_broker
    raw = RawClient(port)
    try:
        raw.connect("bounded", {"receive_maximum": 2, "maximum_packet_size": 200})
        raw.sock.sendall(P.packet(P.SUBSCRIBE, 2, b"\x00\x01\x00" + P.string("in/#") + b"\x01"))
        raw.read(P.SUBACK)
        conn = pika.BlockingConnection(pika.URLParameters(broker.url))
        try:
            ch = conn.channel()
            ch.confirm_delivery()
            persistent = pika.BasicProperties(delivery_mode=2)
            ch.basic_publish("amq.topic", "in.big", b"x" * 500, persistent)  # over 200 B
            for i in range(4):
                ch.basic_publish("amq.topic", "in.small", b"m%d" % i, persistent)
        finally:
            conn.close()
        first = [P.decode(*raw.read(P.PUBLISH), P.MQTT_5) for _ in range(2)]
        assert [m.payload for m in first] == [b"m0", b"m1"]  # type: ignore[union-attr]
        raw.sock.settimeout(0.5)
        with pytest.raises(socket.timeout):
            raw.read(P.PUBLISH)  # receive maximum 2: nothing more until a PUBACK
        raw.sock.settimeout(WAIT_S)
        # QoS 0 goes past it (MQTT-3.3.4-9 bounds QoS 1 and 2 only), though
        # an AMQP channel's global limit holds its no-ack consumers.
        raw.sock.sendall(P.packet(P.SUBSCRIBE, 2, b"\x00\x02\x00" + P.string("zero/#") + b"\x00"))
        raw.read(P.SUBACK)
        conn = pika.BlockingConnection(pika.URLParameters(broker.url))
        conn.channel().basic_publish("amq.topic", "zero.x", b"at most once")
        conn.close()
        zero = P.decode(*raw.read(P.PUBLISH), P.MQTT_5)
        assert isinstance(zero, P.Publish) and (zero.payload, zero.qos) == (b"at most once", 0)
        raw.sock.sendall(P.encode_ack(P.MQTT_5, P.PUBACK, first[0].packet_id))  # type: ignore[union-attr, arg-type]
        third = P.decode(*raw.read(P.PUBLISH), P.MQTT_5)
        assert isinstance(third, P.Publish) and third.payload == b"m2"
    finally:
        raw.close()


def test_five_a_packet_over_the_maximum_size_gets_disconnect_0x95(
    mqtt_broker: tuple[Broker, int],
) -> None:
    _broker, port = mqtt_broker
    raw = RawClient(port)
    try:
        limit = raw.connect("too-big", {})[2]["maximum_packet_size"]
        raw.sock.sendall(b"\x30" + P.varint(limit + 10))  # a PUBLISH larger than that
        disconnect = raw.read(P.DISCONNECT)
        assert disconnect[2][:1] == b"\x95"  # packet too large
    finally:
        raw.close()


def test_mqtt_over_tls_on_its_own_port(
    broker_factory: Callable[..., Broker], clients: list[Client], tmp_path: Any
) -> None:
    from tests.integration.test_tls import Certs

    certs = Certs(tmp_path)
    port = free_port()
    broker_factory(args=("--mqtts-port", str(port), "--tls-cert", str(certs.server_pem)))
    client = Client(port, paho.MQTTv5, "secure-1")
    client.c.tls_set_context(certs.client_context())
    clients.append(client)
    assert client.connect() == 0
    assert client.subscribe("secure/#", 1) == [1]
    client.c.publish("secure/x", b"over tls", qos=1).wait_for_publish(WAIT_S)
    message = client.next("message")
    assert (message.topic, message.payload) == ("secure/x", b"over tls")
