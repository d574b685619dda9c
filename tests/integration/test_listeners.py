"""Where the broker listens. By default, as RabbitMQ: every IPv4 and IPv6
address, one dual-stack socket per listener, so that a client that resolves
`localhost` to `::1` first (Node.js 18 and later do on many systems)
connects as well as one that uses 127.0.0.1; AMQP, the management API and
the metrics endpoint alike. `--bind` may be given more than once."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Callable

import pika
import pytest

from shoal.broker.cli import local_command
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


def test_help_names_the_mqtt_listeners_and_their_defaults() -> None:
    """MQTT listens by default, as RabbitMQ with its MQTT plugins: 1883,
    8883 (with a certificate) and 15675 (WebSocket, /ws). The harness
    (local_command) turns them off; a test gives its own ports."""
    done = subprocess.run(
        [sys.executable, "-m", "shoal.broker", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    text = " ".join(done.stdout.split())  # argparse wraps its lines
    assert "--mqtt-port MQTT_PORT MQTT 3.1.1 and 5.0 port (default 1883; 0: off)" in text
    assert "MQTT over TLS port (default 8883, opened only with --tls-cert; 0: off)" in text
    assert "--mqtt-ws-port MQTT_WS_PORT MQTT over WebSocket port, path /ws" in text
    assert "(default 15675; 0: off)" in text
    assert local_command(5672, 1, "/tmp/x")[-6:] == [
        *("--mqtt-port", "0", "--mqtts-port", "0", "--mqtt-ws-port", "0")
    ]


def test_the_mqtt_listeners_open_on_their_ports(broker_factory: Callable[..., Broker]) -> None:
    """...and the management API lists them with RabbitMQ's protocol names."""
    mqtt, ws, management = free_port(), free_port(), free_port()
    broker = broker_factory(
        args=(
            "--mqtt-port",
            str(mqtt),
            "--mqtt-ws-port",
            str(ws),
            "--management-port",
            str(management),
        )
    )
    names = f"(amqp {broker.port}, mqtt {mqtt}, web-mqtt {ws})"
    assert f"listening on 127.0.0.1 {names}" in broker.log()
    for port in (mqtt, ws):
        socket.create_connection(("127.0.0.1", port), timeout=10).close()
    api = f"http://127.0.0.1:{management}/api"
    wait_for(lambda: _answers(f"{api}/overview"), 20, "the management API")
    listed = {
        (entry["protocol"], entry["port"])
        for entry in json.loads(_get(f"{api}/overview"))["listeners"]
    }
    assert listed == {("amqp", broker.port), ("mqtt", mqtt), ("http/web-mqtt", ws)}
    assert _get(f"{api}/health/checks/protocol-listener/http%2Fweb-mqtt")
    with pytest.raises(urllib.error.HTTPError, match="503"):  # no certificate: no MQTTS
        _get(f"{api}/health/checks/protocol-listener/mqtts")


def test_a_taken_mqtt_port_stops_the_broker_with_one_clear_line(
    broker_factory: Callable[..., Broker],
) -> None:
    """1883 taken (a mosquitto on the machine): the broker says which port,
    which listener, and which flag moves it or turns it off."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        broker = broker_factory(args=("--mqtt-port", str(port)), wait=False)
        assert broker.proc is not None
        assert broker.proc.wait(30) == 1
    assert (
        f"cannot listen on 127.0.0.1 port {port} (mqtt): address already in use; "
        "--mqtt-port chooses another, 0 turns it off"
    ) in broker.log()
