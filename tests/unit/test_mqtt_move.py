"""workers/mqtt_move.py's byte reading, without sockets: the hand-off
datagram's parts, a CONNECT alone, a PUBLISH's topic."""

from __future__ import annotations

from shoal.broker import ipc
from shoal.broker.mqtt import packets as P
from shoal.workers.mqtt_move import _only_connect, _topic, moved_parts

CONNECT = P.packet(P.CONNECT, 0, P.string("MQTT") + bytes((4, 2, 0, 60)) + P.string("d1"))


def test_a_moved_datagram_s_parts() -> None:
    publish = P.encode_publish(P.MQTT_311, "devices/1", b"x", 1, packet_id=3)
    data = ipc.HANDOFF_MQTT_MOVED + len(CONNECT).to_bytes(4, "big") + CONNECT + publish
    assert moved_parts(data) == (CONNECT, publish)
    assert moved_parts(ipc.HANDOFF_MQTT) is None  # (the acceptor's: no parts)
    assert moved_parts(ipc.HANDOFF_MQTT_MOVED + b"\x00") is None  # (too short)


def test_the_connect_alone() -> None:
    assert _only_connect(CONNECT)
    assert not _only_connect(CONNECT[:-1])  # part of it
    assert not _only_connect(CONNECT + P.packet(P.PINGREQ, 0, b""))  # and a packet after it
    assert not _only_connect(b"\x10")


def test_a_publish_s_topic() -> None:
    for level in (P.MQTT_311, P.MQTT_5):
        publish = P.encode_publish(level, "devices/7/temp", b"21.5", 1, packet_id=9)
        assert _topic(publish) == b"devices/7/temp"
        assert _topic(publish + publish) == b"devices/7/temp"  # (the read's first)
        assert _topic(publish[:5]) is None  # not whole
    long_topic = "t/" + "x" * 300  # (a remaining length of two bytes)
    assert _topic(P.encode_publish(P.MQTT_311, long_topic, b"", 0)) == long_topic.encode()
