"""Where the broker listens. By default, as RabbitMQ: every IPv4 and IPv6
address, one dual-stack socket per listener, so that a client that resolves
`localhost` to `::1` first (Node.js 18 and later do on many systems)
connects as well as one that uses 127.0.0.1; AMQP, the management API and
the metrics endpoint alike. `--bind` may be given more than once."""

from __future__ import annotations

import json
import socket
import urllib.request
from collections.abc import Callable

import pika
import pytest

from tests.broker_process import Broker, free_port, wait_for

needs_ipv6 = pytest.mark.skipif(not socket.has_ipv6, reason="no IPv6 in this Python")


def _get(url: str) -> bytes:
    request = urllib.request.Request(url)
    request.add_header("Authorization", "Basic Z3Vlc3Q6Z3Vlc3Q=")  # guest:guest
    with urllib.request.urlopen(request, timeout=10) as answer:
        return bytes(answer.read())


def _answers(url: str) -> bool:
    try:
        return bool(_get(url))
    except OSError:  # not listening yet
        return False


def _amqp_roundtrip(host: str, port: int) -> None:
    params = pika.ConnectionParameters(host=host, port=port, connection_attempts=1)
    conn = pika.BlockingConnection(params)
    ch = conn.channel()
    ch.queue_declare("where", auto_delete=True)
    ch.basic_publish("", "where", host.encode())
    method, _props, body = ch.basic_get("where", auto_ack=True)
    assert method is not None and body == host.encode()
    conn.close()


@needs_ipv6
def test_the_default_address_takes_ipv4_and_ipv6(broker_factory: Callable[..., Broker]) -> None:
    management, metrics = free_port(), free_port()
    broker = broker_factory(
        args=("--management-port", str(management), "--metrics-port", str(metrics)), bind=None
    )
    for host, url_host in (("127.0.0.1", "127.0.0.1"), ("::1", "[::1]")):
        _amqp_roundtrip(host, broker.port)
        url = f"http://{url_host}:{management}/api/overview"
        wait_for(lambda u=url: _answers(u), 20, f"the management API on {url_host}")  # type: ignore[misc]
        overview = json.loads(_get(f"http://{url_host}:{management}/api/overview"))
        assert {"protocol": "amqp", "ip_address": "::", "port": broker.port}.items() <= next(
            entry for entry in overview["listeners"] if entry["protocol"] == "amqp"
        ).items()
        scrape = f"http://{url_host}:{metrics}/metrics"
        wait_for(lambda u=scrape: _answers(u), 20, f"the metrics on {url_host}")  # type: ignore[misc]
        assert b"rabbitmq_identity_info" in _get(scrape)


@needs_ipv6
def test_bind_can_be_given_more_than_once(broker_factory: Callable[..., Broker]) -> None:
    """Each address its own socket: an IPv6 one then takes IPv6 only, so the
    IPv4 address is not bound twice."""
    broker = broker_factory(args=("--bind", "::1"))  # after the harness's 127.0.0.1
    _amqp_roundtrip("127.0.0.1", broker.port)
    _amqp_roundtrip("::1", broker.port)
