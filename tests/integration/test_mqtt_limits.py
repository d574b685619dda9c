"""An MQTT client's inner connection under RabbitMQ's limits and access
rules (its login in place, workers/handshake.py open_in_place): a vhost's
or a user's max-connections refuses the connect past it (CONNACK 5 / 0x87),
as an AMQP client's connection.open is refused; under the limit the client
connects and publishes (its inner connection.open waits for the
scheduler's count, workers/handshake.py), and a place freed by a close is
taken again. A vhost the user may not use, or that does not exist, is
refused as not authorized; a wrong password as a bad login."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from shoal.broker.mqtt import packets as P
from tests.broker_process import Broker, free_port, wait_for
from tests.integration.test_ctl import ctl
from tests.mqtt_raw import RawClient

WAIT_S = 10


def _connack(port: int, level: int, client_id: str, raws: list[RawClient]) -> int:
    client = RawClient(port, level)
    raws.append(client)
    return client.connect(client_id)[1]


def _published(client: RawClient) -> None:
    """A QoS 1 PUBLISH answered: the inner connection is open and confirming."""
    client.publish("limits/t", b"m", qos=1, packet_id=7)
    assert client.read(P.PUBACK)[:3] == (P.PUBACK, 0, b"\x00\x07")


@pytest.mark.parametrize("level", [P.MQTT_311, P.MQTT_5])
@pytest.mark.parametrize("limit", ["vhost", "user"])
def test_a_connection_limit_refuses_the_connect_past_it(
    broker_factory: Callable[..., Broker], raws: list[RawClient], level: int, limit: str
) -> None:
    port = free_port()
    broker = broker_factory(args=("--mqtt-port", str(port)))
    assert _connack(port, level, "unlimited", raws) == 0
    _published(raws[-1])
    raws.pop().close()
    if limit == "vhost":
        ctl(broker, "set_vhost_limits", "-p", "/", '{"max-connections": 1}')
    else:
        ctl(broker, "set_user_limits", "guest", '{"max-connections": 1}')
    wait_for(lambda: _connack(port, level, "first", raws) == 0, WAIT_S, "the old one uncounted")
    first = raws[-1]
    _published(first)
    refused = _connack(port, level, "second", raws)
    assert refused == (5 if level == P.MQTT_311 else 0x87)
    first.close()
    wait_for(lambda: _connack(port, level, "third", raws) == 0, WAIT_S, "a place again")
    _published(raws[-1])


@pytest.mark.parametrize("level", [P.MQTT_311, P.MQTT_5])
def test_the_vhost_and_the_password_decide_the_connack(
    broker_factory: Callable[..., Broker], raws: list[RawClient], level: int
) -> None:
    port = free_port()
    broker = broker_factory(args=("--mqtt-port", str(port)))
    for args in (
        ("add_vhost", "fleet"),
        ("add_vhost", "other"),
        ("add_user", "dev", "pw"),
        ("set_permissions", "-p", "fleet", "dev", ".*", ".*", ".*"),
    ):
        ctl(broker, *args)
    not_authorized = 5 if level == P.MQTT_311 else 0x87
    bad_login = 4 if level == P.MQTT_311 else 0x86
    cases = [
        ("other:dev", b"pw", not_authorized),  # (no permissions there)
        ("nowhere:dev", b"pw", not_authorized),  # (no such vhost)
        ("fleet:dev", b"wrong", bad_login),
        ("fleet:dev", b"pw", 0),
    ]
    for n, (username, password, expected) in enumerate(cases):
        client = RawClient(port, level)
        raws.append(client)
        code = client.connect(f"c{n}", username=username, password=password)[1]
        assert code == expected, (username, password)
    _published(raws[-1])
