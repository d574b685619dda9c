"""A client that writes its CONNECT, a PUBLISH and maybe a DISCONNECT in one
go and closes its socket before the CONNACK (a script, a device that sends
and sleeps): what it sent is served as if it had waited, as mosquitto does
(workers/mqtt_connection.py eof_received). Before, what waited for the
CONNACK was dropped, the DISCONNECT with it, and the will was published."""

from __future__ import annotations

import socket

import pika
import pytest

from shoal.broker.mqtt import packets as P
from tests.broker_process import Broker, wait_for

WAIT_S = 10
DISCONNECT_311 = b"\xe0\x00"


def _connect_with_will(client_id: str) -> bytes:
    """A 3.1.1 CONNECT, clean session, with a will to `eof/will`."""
    body = P.string("MQTT") + bytes((P.MQTT_311, 0x06)) + (60).to_bytes(2, "big")
    body += P.string(client_id) + P.string("eof/will") + P.binary(b"gone")
    return P.packet(P.CONNECT, 0, body)


def _connections(broker: Broker) -> int:
    return sum(p["connections"] for p in broker.status()["processes"] if p["role"] == "io-worker")


@pytest.mark.parametrize("disconnect", [True, False])
def test_packets_sent_with_the_connect_then_a_close_are_served(
    mqtt_broker: tuple[Broker, int], disconnect: bool
) -> None:
    broker, port = mqtt_broker
    conn = pika.BlockingConnection(pika.URLParameters(broker.url))
    ch = conn.channel()
    for name in ("eof-msg", "eof-will"):
        ch.queue_declare(name)
        ch.queue_bind(name, "amq.topic", name.replace("-", "."))

    def queued(name: str) -> int:
        return int(ch.queue_declare(name, passive=True).method.message_count)

    wait_for(lambda: _connections(broker) == 1, WAIT_S, "the AMQP connection counted")
    data = _connect_with_will("eof-device") + P.encode_publish(P.MQTT_311, "eof/msg", b"hello")
    sock = socket.create_connection(("127.0.0.1", port))
    sock.sendall(data + (DISCONNECT_311 if disconnect else b""))
    sock.close()
    wait_for(lambda: queued("eof-msg") == 1, WAIT_S, "the PUBLISH sent before the close")
    wait_for(lambda: _connections(broker) == 1, WAIT_S, "the MQTT connection's end")
    # A DISCONNECT among them: no will; none: the will, as at any socket's end.
    assert queued("eof-will") == (0 if disconnect else 1)
    conn.close()
