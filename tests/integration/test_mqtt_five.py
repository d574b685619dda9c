"""MQTT 5.0's features on the broker (issue 41): topic aliases both ways,
subscription identifiers, no local, retain as published and retain
handling, shared subscriptions, message expiry counted down, enhanced
authentication refused, and TLS client certificates as logins. The bare
client (tests/mqtt_raw.py) sees the packets as sent; paho-mqtt and aiomqtt
show real clients use them."""

from __future__ import annotations

import asyncio
import queue
import select
import socket
import time
from collections.abc import Callable
from typing import Any

import pytest
from paho.mqtt import client as paho
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.subscribeoptions import SubscribeOptions

from shoal.broker.mqtt import packets as P
from tests.broker_process import Broker, free_port, wait_for
from tests.integration.test_ctl import ctl
from tests.mqtt_raw import RawClient

WAIT_S = 10
NO_LOCAL, RETAIN_AS_PUBLISHED = 0x04, 0x08


def raw(raws: list[RawClient], port: int, client_id: str, **props: Any) -> RawClient:
    client = RawClient(port)
    raws.append(client)
    assert client.connect(client_id, props)[1] == 0
    return client


def test_connack_offers_what_the_broker_does(
    mqtt_broker: tuple[Broker, int], raws: list[RawClient]
) -> None:
    _broker, port = mqtt_broker
    client = RawClient(port)
    raws.append(client)
    _present, code, props = client.connect("offers", {})
    assert code == 0
    assert props["topic_alias_maximum"] > 0
    # QoS 2, subscription identifiers and shared subscriptions: all there
    # (absent means available, 3.2.2.3).
    for absent in (
        "maximum_qos",
        "subscription_identifier_available",
        "shared_subscription_available",
    ):
        assert absent not in props


def test_topic_aliases_both_ways(mqtt_broker: tuple[Broker, int], raws: list[RawClient]) -> None:
    _broker, port = mqtt_broker
    sub = raw(raws, port, "alias-sub", topic_alias_maximum=2)
    sub.subscribe("al/#", 0)
    pub = raw(raws, port, "alias-pub")
    pub.publish("al/one", b"1", properties={"topic_alias": 1})  # sets alias 1
    pub.publish("", b"2", properties={"topic_alias": 1})  # uses it
    for topic in ("al/two", "al/three"):
        pub.publish(topic, topic.encode())
    got = [sub.received()[1] for _ in range(4)]
    # To the subscriber: the first two topics get aliases 1 and 2, sent in
    # full once and then as the alias alone; a third topic goes in full.
    assert [(m.topic, m.properties.get("topic_alias"), m.payload) for m in got] == [
        ("al/one", 1, b"1"),
        ("", 1, b"2"),
        ("al/two", 2, b"al/two"),
        ("al/three", None, b"al/three"),
    ]
    pub.publish("", b"?", properties={"topic_alias": 2})  # never set: a protocol error
    assert pub.closed_by_broker()
    assert pub.read(P.DISCONNECT)[2][:1] == b"\x82"


def test_a_topic_alias_over_the_maximum_gets_disconnect_0x94(
    mqtt_broker: tuple[Broker, int], raws: list[RawClient]
) -> None:
    _broker, port = mqtt_broker
    pub = raw(raws, port, "alias-big")
    pub.publish("x/y", b"1", properties={"topic_alias": 65000})
    assert pub.closed_by_broker()
    assert pub.read(P.DISCONNECT)[2][:1] == b"\x94"


def test_subscription_identifiers_name_every_filter_that_matched(
    mqtt_broker: tuple[Broker, int], raws: list[RawClient]
) -> None:
    _broker, port = mqtt_broker
    sub = raw(raws, port, "ids")
    sub.subscribe("ids/+/t", 1, packet_id=1, props={"subscription_identifier": [7]})
    sub.subscribe("ids/#", 1, packet_id=2, props={"subscription_identifier": [42]})
    sub.subscribe("ids/none", 1, packet_id=3)
    pub = raw(raws, port, "ids-pub")
    pub.publish("ids/a/t", b"both", qos=1, packet_id=1)
    _f, both = sub.received()
    assert both.payload == b"both" and sorted(both.properties["subscription_identifier"]) == [7, 42]
    sub.ack(P.PUBACK, both.packet_id or 0)
    pub.publish("ids/none", b"one", qos=1, packet_id=2)
    _f, one = sub.received()
    assert one.payload == b"one" and one.properties["subscription_identifier"] == [42]


def test_a_new_or_dropped_filter_applies_to_the_next_message_alike(
    mqtt_broker: tuple[Broker, int], raws: list[RawClient]
) -> None:
    """A delivery's topic, properties and identifiers are worked out once per
    message alike (workers/mqtt_outbound.py plans): a SUBSCRIBE or an
    UNSUBSCRIBE between two such messages changes what the second carries."""
    _broker, port = mqtt_broker
    sub = raw(raws, port, "plans")
    sub.subscribe("plan/+/t", 1, packet_id=1, props={"subscription_identifier": [7]})
    pub = raw(raws, port, "plans-pub")

    def identifiers(packet_id: int) -> list[int]:
        pub.publish("plan/a/t", b"same", qos=1, packet_id=packet_id)
        _f, got = sub.received()
        sub.ack(P.PUBACK, got.packet_id or 0)
        assert got.payload == b"same"
        return sorted(got.properties.get("subscription_identifier", []))

    assert identifiers(1) == [7]
    sub.subscribe("plan/#", 1, packet_id=2, props={"subscription_identifier": [42]})
    assert identifiers(2) == [7, 42]
    body = (3).to_bytes(2, "big") + P.encode_properties({}) + P.string("plan/+/t")
    sub.sock.sendall(P.packet(P.UNSUBSCRIBE, 2, body))
    sub.read(P.UNSUBACK)
    assert identifiers(3) == [42]


def test_no_local_keeps_a_clients_own_messages_from_it(
    mqtt_broker: tuple[Broker, int], raws: list[RawClient]
) -> None:
    _broker, port = mqtt_broker
    me = raw(raws, port, "me")
    me.subscribe("chat/#", 0 | NO_LOCAL)
    other = raw(raws, port, "other")
    other.subscribe("chat/#", 0)
    me.publish("chat/room", b"from me")
    other.publish("chat/room", b"from other")
    assert {other.received()[1].payload for _ in range(2)} == {b"from me", b"from other"}
    assert me.received()[1].payload == b"from other"  # not its own
    me.sock.settimeout(0.5)
    with pytest.raises(socket.timeout):
        me.received()


def test_retain_as_published_and_retain_handling(
    mqtt_broker: tuple[Broker, int], raws: list[RawClient]
) -> None:
    _broker, port = mqtt_broker
    pub = raw(raws, port, "ret-pub")
    pub.publish("ret/a", b"kept", qos=1, packet_id=1, retain=True)
    pub.read(P.PUBACK)
    keeps = raw(raws, port, "keeps")
    assert keeps.subscribe("ret/#", RETAIN_AS_PUBLISHED) == b"\x00"
    flags, retained = keeps.received()
    assert retained.payload == b"kept" and flags & 1  # the retained copy: RETAIN set
    plain = raw(raws, port, "plain")
    plain.subscribe("ret/#", 0x20)  # retain handling 2: no retained messages
    pub.publish("ret/a", b"live", qos=1, packet_id=2, retain=True)
    pub.read(P.PUBACK)
    flags, live = keeps.received()
    assert live.payload == b"live" and flags & 1  # retain as published
    flags, live = plain.received()
    assert live.payload == b"live" and not flags & 1  # the first it gets: not the retained one
    assert keeps.subscribe("ret/#", 0x10, packet_id=5) == b"\x00"  # 1: only if new; it is not
    keeps.sock.settimeout(0.5)
    with pytest.raises(socket.timeout):
        keeps.received()


def test_a_retained_message_s_expiry_counts_down_and_an_expired_one_is_not_sent(
    mqtt_broker: tuple[Broker, int], raws: list[RawClient]
) -> None:
    """MQTT-3.3.2-5 / -6: a retained message whose expiry passed is not
    handed to a new subscription; one that has not goes with what is left of
    its interval, RETAIN set (they went on as published before)."""
    _broker, port = mqtt_broker
    pub = raw(raws, port, "expiring-pub")
    for packet_id, (topic, expiry) in enumerate((("exp/short", 1), ("exp/long", 3600)), 1):
        props = {"message_expiry_interval": expiry}
        pub.publish(topic, b"kept", 1, packet_id, retain=True, properties=props)
        pub.read(P.PUBACK)
    published = time.time()
    # The short one's second is over: the broker counts whole seconds of the
    # wall clock (as a queue's copies, MQTT-3.3.2-6), so 2 s on ours.
    wait_for(lambda: time.time() > published + 2.05, 5, "the short expiry passed")
    sub = raw(raws, port, "expiring-sub")
    assert sub.subscribe("exp/#", 1) == b"\x01"
    flags, kept = sub.received()
    assert kept.topic == "exp/long" and flags & 1
    assert 3500 < kept.properties["message_expiry_interval"] <= 3598
    sub.sock.settimeout(0.5)
    with pytest.raises(socket.timeout):
        sub.received()  # not the short one


def test_a_shared_subscription_gives_each_message_to_one_member(
    mqtt_broker: tuple[Broker, int],
) -> None:
    _broker, port = mqtt_broker
    got: queue.Queue[tuple[str, bytes]] = queue.Queue()
    members = []
    try:
        for name in ("m1", "m2"):
            c = paho.Client(paho.CallbackAPIVersion.VERSION2, client_id=name, protocol=paho.MQTTv5)
            c.on_message = lambda _c, _u, m, name=name: got.put((name, m.payload))
            subscribed: queue.Queue[Any] = queue.Queue()
            c.on_subscribe = lambda _c, _u, _mid, codes, _p, s=subscribed: s.put(codes)
            c.connect("127.0.0.1", port)
            c.loop_start()
            members.append(c)
            c.subscribe("$share/workers/jobs/#", 1)
            assert [int(x.value) for x in subscribed.get(timeout=WAIT_S)] == [1]
        pub = members[0]
        for i in range(20):
            pub.publish(f"jobs/{i}", b"%d" % i, qos=1).wait_for_publish(WAIT_S)
        taken = [got.get(timeout=WAIT_S) for _ in range(20)]
        assert sorted(int(p) for _n, p in taken) == list(range(20))  # each once
        assert {n for n, _p in taken} == {"m1", "m2"}  # spread over the group
        with pytest.raises(queue.Empty):
            got.get(timeout=0.5)
    finally:
        for c in members:
            c.disconnect()
            c.loop_stop()


def test_no_local_on_a_shared_subscription_is_a_protocol_error_for_the_whole_packet(
    mqtt_broker: tuple[Broker, int], raws: list[RawClient]
) -> None:
    """MQTT-3.8.3-4: DISCONNECT 0x82 before any filter of the SUBSCRIBE takes
    effect, also when the shared one is not its first (it was an internal
    error, 0x83, raised while the first filter's binding was under way)."""
    broker, port = mqtt_broker
    client = raw(raws, port, "nolocal-shared", session_expiry_interval=60)
    body = b"\x00\x07" + P.encode_properties({})
    body += P.string("plain/a") + b"\x01" + P.string("$share/g/x") + bytes((1 | NO_LOCAL,))
    client.sock.sendall(P.packet(P.SUBSCRIBE, 2, body))
    assert client.read(P.DISCONNECT)[2][:1] == b"\x82"
    assert client.closed_by_broker()
    again = raw(raws, port, "nolocal-shared", session_expiry_interval=60)
    checker = raw(raws, port, "nolocal-checker")
    checker.publish("plain/a", b"to nobody", 1, packet_id=1)
    checker.read(P.PUBACK)
    again.sock.settimeout(0.5)
    with pytest.raises(TimeoutError):  # plain/a was never subscribed
        again.received()
    assert "internal error" not in broker.log()


def test_message_expiry_is_counted_down_and_other_properties_pass(
    mqtt_broker: tuple[Broker, int],
) -> None:
    _broker, port = mqtt_broker
    got: queue.Queue[Any] = queue.Queue()
    c = paho.Client(paho.CallbackAPIVersion.VERSION2, client_id="exp", protocol=paho.MQTTv5)
    c.on_message = lambda _c, _u, m: got.put(m)
    try:
        c.connect("127.0.0.1", port)
        c.loop_start()
        c.subscribe("exp/#", options=SubscribeOptions(qos=1, noLocal=False))
        props = Properties(PacketTypes.PUBLISH)
        props.MessageExpiryInterval = 120
        props.PayloadFormatIndicator = 1
        props.UserProperty = ("k", "v")
        c.publish("exp/x", b"soon", qos=1, properties=props).wait_for_publish(WAIT_S)
        message = got.get(timeout=WAIT_S)
        assert 0 < message.properties.MessageExpiryInterval <= 120
        assert message.properties.PayloadFormatIndicator == 1
        assert ("k", "v") in message.properties.UserProperty
    finally:
        c.disconnect()
        c.loop_stop()


def test_enhanced_authentication_is_refused_cleanly(
    mqtt_broker: tuple[Broker, int], raws: list[RawClient]
) -> None:
    _broker, port = mqtt_broker
    client = RawClient(port)
    raws.append(client)
    _present, code, _props = client.connect("scram", {"authentication_method": "SCRAM-SHA-1"})
    assert code == 0x8C  # bad authentication method
    assert client.closed_by_broker()
    other = raw(raws, port, "after-auth")
    other.sock.sendall(P.encode_auth(0x18, {"authentication_method": "X"}))  # AUTH unasked
    assert other.closed_by_broker()
    assert other.read(P.DISCONNECT)[2][:1] == b"\x82"


def test_max_keep_alive_is_the_server_keep_alive_or_a_refusal(
    broker_factory: Callable[..., Broker], raws: list[RawClient]
) -> None:
    """--mqtt-max-keep-alive, as mosquitto's max_keepalive: a 5.0 client
    asking more, or none (0), gets it as CONNACK's Server Keep Alive and is
    held to it; a 3.1.1 client, which cannot be told, is refused with
    "identifier rejected". Eclipse Paho's interoperability
    test_server_keep_alive runs against a broker set so (60 for 120)."""
    port = free_port()
    broker_factory(args=("--mqtt-port", str(port), "--mqtt-max-keep-alive", "2"))
    connacks: queue.Queue[Any] = queue.Queue()
    c = paho.Client(paho.CallbackAPIVersion.VERSION2, client_id="ka-paho", protocol=paho.MQTTv5)
    c.on_connect = lambda _c, _u, _f, code, props: connacks.put((code, props))
    try:
        c.connect("127.0.0.1", port, keepalive=120)
        c.loop_start()
        code, props = connacks.get(timeout=WAIT_S)
        assert code == 0 and props.ServerKeepAlive == 2
    finally:
        c.disconnect()
        c.loop_stop()
    for asked, server in ((1, None), (2, None), (3, 2), (0, 2)):
        client = RawClient(port)
        raws.append(client)
        _present, code, props = client.connect(f"ka-{asked}", {}, keep_alive=asked)
        assert (code, props.get("server_keep_alive")) == (0, server), asked
    # The last one asked for none and was told 2 s: silent, it is closed at 1.5x that.
    assert client.closed_by_broker()
    for asked, code in ((3, 0x02), (0, 0x02), (2, 0)):
        old = RawClient(port, P.MQTT_311)
        raws.append(old)
        assert old.connect(f"ka311-{asked}", keep_alive=asked)[1] == code, asked


def test_aiomqtt_publishes_and_subscribes(mqtt_broker: tuple[Broker, int]) -> None:
    aiomqtt = pytest.importorskip("aiomqtt")
    _broker, port = mqtt_broker

    async def run() -> list[tuple[str, bytes, int]]:
        async with aiomqtt.Client("127.0.0.1", port, identifier="aio-1") as client:
            await client.subscribe("aio/#", qos=2)
            for qos in (0, 1, 2):
                await client.publish(f"aio/{qos}", b"q%d" % qos, qos=qos)
            out = []
            async for message in client.messages:
                out.append((str(message.topic), bytes(message.payload), message.qos))
                if len(out) == 3:
                    return out
        return []

    got = asyncio.run(asyncio.wait_for(run(), WAIT_S))
    assert sorted(got) == [("aio/0", b"q0", 0), ("aio/1", b"q1", 1), ("aio/2", b"q2", 2)]


def test_a_tls_client_certificate_logs_in_as_its_common_name(
    broker_factory: Callable[..., Broker], tmp_path: Any
) -> None:
    from tests.integration.test_tls import Certs

    certs = Certs(tmp_path)
    port = free_port()
    broker = broker_factory(
        args=(
            "--mqtts-port",
            str(port),
            "--tls-cert",
            str(certs.server_pem),
            "--tls-ca",
            str(certs.ca_pem),
            *("--auth-mechanisms", "PLAIN,AMQPLAIN,EXTERNAL"),  # (mqtt.ssl_cert_login)
        )
    )
    from tests.clients import shoal

    for args in (("add_user", "tlsuser", ""), ("set_permissions", "tlsuser", ".*", ".*", ".*")):
        assert shoal(broker, "ctl", *args).returncode == 0
    got: queue.Queue[Any] = queue.Queue()
    c = paho.Client(paho.CallbackAPIVersion.VERSION2, client_id="cert-1", protocol=paho.MQTTv5)
    c.tls_set_context(certs.client_context(with_cert=True))
    c.on_connect = lambda _c, _u, _f, rc, _p: got.put(int(rc.value))
    try:
        c.connect("127.0.0.1", port)  # no user name: the certificate's
        c.loop_start()
        assert got.get(timeout=WAIT_S) == 0
        from tests.integration.test_ctl import rows

        users = {r["user"] for r in rows(broker, "list_connections", "user")}
        assert "tlsuser" in users
    finally:
        c.disconnect()
        c.loop_stop()


@pytest.mark.parametrize("level", [P.MQTT_311, P.MQTT_5])
def test_topic_permissions_refuse_a_subscription_and_a_publish_not_the_connection(
    mqtt_broker: tuple[Broker, int], raws: list[RawClient], level: int
) -> None:
    from tests.clients import shoal

    broker, port = mqtt_broker
    for args in (
        ("add_user", "dev", "pw"),
        ("set_permissions", "dev", ".*", ".*", ".*"),
        ("set_topic_permissions", "dev", "amq.topic", "^open", "^open"),
    ):
        assert shoal(broker, "ctl", *args).returncode == 0
    client = RawClient(port, level)
    raws.append(client)
    assert client.connect("perm", {}, username="dev", password=b"pw")[1] == 0
    refused = 0x87 if level == P.MQTT_5 else 0x80
    assert client.subscribe("secret/#", 1) == bytes((refused,))  # read refused: SUBACK says so
    assert client.subscribe("open/#", 1, packet_id=2) == b"\x01"  # the connection lives on
    client.publish("open/a", b"fine", qos=1, packet_id=3)
    assert client.read(P.PUBACK)[2][:2] == b"\x00\x03"
    assert client.received()[1].payload == b"fine"
    client.publish("secret/a", b"no", qos=1, packet_id=4)
    if level == P.MQTT_5:
        puback = client.read(P.PUBACK)[2]
        assert puback[:3] == b"\x00\x04\x87"  # not authorized
    else:  # 3.1.1 has no way to say it: the connection goes, as with RabbitMQ
        assert client.closed_by_broker()


@pytest.mark.parametrize("level", [P.MQTT_311, P.MQTT_5])
def test_a_binding_refused_fails_its_filter_not_the_connection(
    mqtt_broker: tuple[Broker, int], raws: list[RawClient], level: int
) -> None:
    """A user who may make and read its subscription queue and publish to
    amq.topic, but not write to the queue: the queue is declared and
    consumed, its queue.bind refused (RabbitMQ's write permission on the
    queue). The SUBACK says not authorized for that filter and the
    connection goes on, as for a topic permission (the bind goes on the
    subscriptions' own channel)."""
    from tests.clients import shoal

    broker, port = mqtt_broker
    for args in (
        ("add_user", "reader", "pw"),
        ("set_permissions", "reader", ".*", "^amq\\.topic$", ".*"),
    ):
        assert shoal(broker, "ctl", *args).returncode == 0
    client = RawClient(port, level)
    raws.append(client)
    assert client.connect("bindless", {}, username="reader", password=b"pw")[1] == 0
    refused = 0x87 if level == P.MQTT_5 else 0x80
    assert client.subscribe("any/#", 1) == bytes((refused,))
    assert client.subscribe("other/+", 0, packet_id=2) == bytes((refused,))
    client.publish("any/a", b"m", qos=1, packet_id=3)
    assert client.read(P.PUBACK)[2][:2] == b"\x00\x03"


@pytest.mark.parametrize("level", [P.MQTT_311, P.MQTT_5])
def test_a_device_publishing_again_to_a_topic_is_checked_each_read(
    mqtt_broker: tuple[Broker, int], raws: list[RawClient], level: int
) -> None:
    """Publishes to a topic used before go through C (Inbound.publish_run)
    only where the user may write to every key: with topic permissions
    they are checked one by one, and a write permission taken away applies
    from the next read."""
    from tests.clients import shoal

    broker, port = mqtt_broker
    user = f"dev{level}"
    for args in (
        ("add_user", user, "pw"),
        ("set_permissions", user, ".*", ".*", ".*"),
        ("set_topic_permissions", user, "amq.topic", "^open", "^open"),
    ):
        assert shoal(broker, "ctl", *args).returncode == 0
    client = RawClient(port, level)
    raws.append(client)
    assert client.connect(f"again-{level}", {}, username=user, password=b"pw")[1] == 0
    assert client.subscribe("open/#", 1) == b"\x01"
    for packet_id in (1, 2, 3):  # the later two: a topic published to before
        client.publish("open/a", b"m%d" % packet_id, qos=1, packet_id=packet_id)
        assert client.read(P.PUBACK)[2][:2] == packet_id.to_bytes(2, "big")
        assert client.received()[1].payload == b"m%d" % packet_id
    assert shoal(broker, "ctl", "clear_topic_permissions", user).returncode == 0
    client.publish("open/a", b"m4", qos=1, packet_id=4)  # every key allowed now
    assert client.read(P.PUBACK)[2][:2] == b"\x00\x04"
    assert client.received()[1].payload == b"m4"
    assert shoal(broker, "ctl", "set_permissions", user, ".*", "", ".*").returncode == 0
    client.publish("open/a", b"m5", qos=1, packet_id=5)
    if level == P.MQTT_5:
        assert client.read(P.PUBACK)[2][:3] == b"\x00\x05\x87"  # not authorized
    else:
        assert client.closed_by_broker()


def test_wildcards_do_not_match_dollar_topics(
    mqtt_broker: tuple[Broker, int], raws: list[RawClient]
) -> None:
    import pika

    broker, port = mqtt_broker
    everything = raw(raws, port, "everything")
    everything.subscribe("#", 0)
    system = raw(raws, port, "system")
    system.subscribe("$SYS/#", 0)
    conn = pika.BlockingConnection(pika.URLParameters(broker.url))
    try:
        ch = conn.channel()
        ch.basic_publish("amq.topic", "$SYS.broker.load", b"0.5")  # MQTT-4.7.2-1
        ch.basic_publish("amq.topic", "plain.topic", b"x")
    finally:
        conn.close()
    assert system.received()[1].topic == "$SYS/broker/load"
    assert everything.received()[1].topic == "plain/topic"  # not the $SYS one before it


def test_retain_as_published_changed_holds_from_the_next_delivery(
    mqtt_broker: tuple[Broker, int],
) -> None:
    """A delivery's bytes are planned once per (queue, topic, properties)
    and its later alike ones written in C (Outbound.run): a subscription
    changed in between must change them, as retain-as-published does here."""
    _broker, port = mqtt_broker
    got: queue.Queue[Any] = queue.Queue()
    sub = paho.Client(paho.CallbackAPIVersion.VERSION2, client_id="rap-sub", protocol=paho.MQTTv5)
    pub = paho.Client(paho.CallbackAPIVersion.VERSION2, client_id="rap-pub", protocol=paho.MQTTv5)
    sub.on_message = lambda _c, _u, m: got.put(m)
    subscribed: queue.Queue[Any] = queue.Queue()
    sub.on_subscribe = lambda *_a: subscribed.put(True)
    try:
        for c in (sub, pub):
            c.connect("127.0.0.1", port)
            c.loop_start()
        for rap in (True, False, True):
            sub.subscribe("rap/#", options=SubscribeOptions(qos=1, retainAsPublished=rap))
            subscribed.get(timeout=WAIT_S)
            flags = []
            for i in range(6):  # the first planned in Python, the rest alike
                pub.publish("rap/x", b"%d" % i, qos=1, retain=True).wait_for_publish(WAIT_S)
                message = got.get(timeout=WAIT_S)
                if message.payload == b"%d" % i:  # (not the retained copy a new subscription gets)
                    flags.append(message.retain)
                else:
                    flags.append(got.get(timeout=WAIT_S).retain)
            assert flags == [rap] * 6
    finally:
        for c in (sub, pub):
            c.disconnect()
            c.loop_stop()


def test_what_amqp_fields_cannot_hold_travels_in_headers_as_rabbitmqs(
    mqtt_broker: tuple[Broker, int], raws: list[RawClient]
) -> None:
    """Binary correlation data (a UUID's bytes) and a response topic of over
    255 bytes reach an MQTT subscriber unchanged and an AMQP consumer in
    RabbitMQ 3.13's headers (x-correlation-id, x-reply-to-topic); a content
    type or user property name AMQP cannot hold is dropped, as RabbitMQ's
    plugin drops it, and the message still goes (a fuzzer's PUBLISH of them
    was an internal error)."""
    from tests.clients import connect

    mqtt_port = mqtt_broker[1]
    amqp = connect(mqtt_broker[0]).channel()
    amqp.queue_declare("fields-seen", exclusive=True)
    amqp.queue_bind("fields-seen", "amq.topic", "fields.#")
    sub = raw(raws, mqtt_port, "fields-sub")
    assert sub.subscribe("fields/#", 1) == b"\x01"
    pub = raw(raws, mqtt_port, "fields-pub")
    correlation = b"\xff\x00\x10" + bytes(range(13))  # 16 bytes, not UTF-8
    long_topic = "replies/" + "r" * 300
    pub.publish(
        "fields/x",
        b"payload",
        1,
        packet_id=5,
        properties={
            "correlation_data": correlation,
            "response_topic": long_topic,
            "content_type": "c" * 300,
            "user_property": [("k" * 200, "dropped"), ("kept", "v")],
        },
    )
    assert pub.read(P.PUBACK)[2][:2] == b"\x00\x05"
    _flags, message = sub.received()
    assert message.payload == b"payload"
    assert message.properties["correlation_data"] == correlation
    assert message.properties["response_topic"] == long_topic
    assert "content_type" not in message.properties
    assert message.properties["user_property"] == [("kept", "v")]
    _method, props, body = amqp.basic_get("fields-seen", auto_ack=True)
    assert body == b"payload" and props.correlation_id is None and props.reply_to is None
    assert bytes(props.headers["x-correlation-id"]) == correlation
    assert props.headers["x-reply-to-topic"] == long_topic
    assert props.headers["kept"] == "v" and "k" * 200 not in props.headers


@pytest.mark.parametrize("level", [P.MQTT_311, P.MQTT_5])
def test_a_client_silent_for_one_and_a_half_keep_alives_is_disconnected(
    mqtt_broker: tuple[Broker, int], raws: list[RawClient], level: int
) -> None:
    """MQTT-3.1.2-24: nothing received for 1.5x the keep-alive (1 s here),
    the broker closes the connection, 5.0 after a DISCONNECT 0x8D (keep
    alive timeout); a PINGREQ before then keeps it open."""
    _broker, port = mqtt_broker
    client = RawClient(port, level)
    raws.append(client)
    assert client.connect(f"silent-{level}", keep_alive=1)[1] == 0
    started = time.monotonic()
    assert not select.select([client.sock], [], [], 1.0)[0]  # (1 s of the broker's silence)
    client.sock.sendall(P.packet(P.PINGREQ, 0, b""))
    assert client.read(P.PINGRESP)
    pinged = time.monotonic()
    assert client.closed_by_broker()
    silent = time.monotonic() - pinged
    assert 1.4 <= silent <= 3.0, silent
    assert time.monotonic() - started > 2.4  # (the ping counted)
    if level == P.MQTT_5:
        _kind, _flags, body = client.read(P.DISCONNECT)
        assert body[0] == 0x8D


def test_a_subscription_past_a_queue_limit_is_refused_and_the_connection_goes_on(
    mqtt_broker: tuple[Broker, int], raws: list[RawClient]
) -> None:
    """A filter whose queue the broker refuses (here the vhost's max-queues)
    gets a SUBACK failure, 5.0's quota exceeded (0x97), 3.1.1's 0x80, and
    the connection keeps its other subscriptions (MQTT-3.9.3); once the
    limit is gone the same filter is granted."""
    broker, port = mqtt_broker
    ctl(broker, "set_vhost_limits", "-p", "/", '{"max-queues": 1}')
    client = raw(raws, port, "limited")
    assert client.subscribe("limit/a", 1) == b"\x01"
    assert client.subscribe("limit/b", 0, packet_id=2) == b"\x97", "a second queue: refused"
    older = RawClient(port, P.MQTT_311)
    raws.append(older)
    assert older.connect("limited-311")[1] == 0
    assert older.subscribe("limit/c", 1) == b"\x80"
    client.publish("limit/a", b"still subscribed", 1, packet_id=3)
    _flags, message = client.received()
    assert (message.topic, message.payload) == ("limit/a", b"still subscribed")
    ctl(broker, "clear_vhost_limits", "-p", "/")
    assert client.subscribe("limit/b", 0, packet_id=4) == b"\x00"
    older.publish("limit/b", b"granted now")
    _flags, message = client.received()
    assert (message.topic, message.payload) == ("limit/b", b"granted now")
