"""The AMQPS listener (issue 16, item 4) with pika over real TLS sockets:
TLS 1.2 and 1.3, a login with a password and no client certificate, SASL
EXTERNAL with a client certificate (the user is its CN), a certificate
from an unknown CA refused, the plain listener switched off, certificates
reloaded on SIGHUP. Certificates come from trustme (a throwaway CA)."""

from __future__ import annotations

import signal
import socket
import ssl
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import amqp
import pika
import pika.exceptions
import pytest
import trustme

from tests.broker_process import Broker, free_port, wait_for
from tests.clients import shoal


class Certs:
    def __init__(self, tmp: Path) -> None:
        self.ca = trustme.CA()
        server = self.ca.issue_cert("127.0.0.1", "localhost")
        self.server_pem = tmp / "server.pem"
        server.private_key_and_cert_chain_pem.write_to_path(str(self.server_pem))
        self.ca_pem = tmp / "ca.pem"
        self.ca.cert_pem.write_to_path(str(self.ca_pem))
        self.client = self.ca.issue_cert("tls-user@example", common_name="tlsuser")

    def client_context(self, with_cert: bool = False, **versions: Any) -> ssl.SSLContext:
        context = ssl.create_default_context()
        self.ca.configure_trust(context)
        if with_cert:
            self.client.configure_cert(context)
        for attribute, version in versions.items():
            setattr(context, attribute, version)
        return context


@pytest.fixture
def certs(tmp_path: Path) -> Certs:
    return Certs(tmp_path)


@pytest.fixture
def tls_broker(broker_factory: Callable[..., Broker], certs: Certs) -> Iterator[Broker]:
    port = free_port()
    broker = broker_factory(
        args=(
            *("--tls-port", str(port), "--tls-cert", str(certs.server_pem)),
            *("--tls-ca", str(certs.ca_pem)),
            *("--auth-mechanisms", "PLAIN,AMQPLAIN,EXTERNAL"),
        )
    )
    broker.tls_port = port  # type: ignore[attr-defined]
    yield broker


def tls_connect(
    broker: Broker,
    context: ssl.SSLContext,
    credentials: Any = None,
    port: int | None = None,
) -> pika.BlockingConnection:
    return pika.BlockingConnection(
        pika.ConnectionParameters(
            "127.0.0.1",
            port or broker.tls_port,  # type: ignore[attr-defined]
            credentials=credentials or pika.PlainCredentials("guest", "guest"),
            ssl_options=pika.SSLOptions(context, "localhost"),
            connection_attempts=1,
        )
    )


def round_trip(conn: pika.BlockingConnection) -> bytes:
    ch = conn.channel()
    ch.queue_declare("tls-q")
    ch.confirm_delivery()
    ch.basic_publish("", "tls-q", b"over tls")
    _m, _p, body = ch.basic_get("tls-q", auto_ack=True)
    return bytes(body or b"")


@pytest.mark.parametrize("version", [ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.TLSv1_3])
def test_a_password_login_over_tls_1_2_and_1_3(
    tls_broker: Broker, certs: Certs, version: ssl.TLSVersion
) -> None:
    context = certs.client_context(minimum_version=version, maximum_version=version)
    conn = tls_connect(tls_broker, context)
    assert round_trip(conn) == b"over tls"
    sock = conn._impl._transport._sock  # the TLS socket pika reads
    assert sock.version() == {"TLSv1_2": "TLSv1.2", "TLSv1_3": "TLSv1.3"}[version.name]
    conn.close()


def test_external_login_takes_the_user_from_the_certificate(
    tls_broker: Broker, certs: Certs
) -> None:
    for args in (("add_user", "tlsuser", ""), ("set_permissions", "tlsuser", ".*", ".*", ".*")):
        done = shoal(tls_broker, "ctl", *args)
        assert done.returncode == 0, done.stderr
    external = pika.credentials.ExternalCredentials()
    conn = tls_connect(tls_broker, certs.client_context(with_cert=True), external)
    assert round_trip(conn) == b"over tls"
    conn.close()
    # Without a certificate, EXTERNAL is not offered: pika finds no mechanism.
    with pytest.raises(pika.exceptions.AMQPConnectionError):
        tls_connect(tls_broker, certs.client_context(), external)
    # A certificate whose CN is no user is refused.
    done = shoal(tls_broker, "ctl", "delete_user", "tlsuser")
    assert done.returncode == 0
    with pytest.raises(pika.exceptions.ProbableAuthenticationError) as caught:
        tls_connect(tls_broker, certs.client_context(with_cert=True), external)
    assert "authentication mechanism EXTERNAL" in str(caught.value)


def test_external_is_offered_only_where_enabled_as_rabbitmq(
    broker_factory: Callable[..., Broker], certs: Certs
) -> None:
    """By default (RabbitMQ's auth_mechanisms, PLAIN and AMQPLAIN) a client
    certificate does not bring EXTERNAL: py-amqp (Celery, Kombu) takes
    EXTERNAL first where offered, and a mutual-TLS client that logs in with
    a password got 403 for a CN that is no user."""
    port = free_port()
    broker_factory(
        args=(
            *("--tls-port", str(port), "--tls-cert", str(certs.server_pem)),
            *("--tls-ca", str(certs.ca_pem)),
        )
    )
    client_pem = certs.server_pem.parent / "client.pem"
    certs.client.private_key_and_cert_chain_pem.write_to_path(str(client_pem))
    conn = amqp.Connection(
        f"127.0.0.1:{port}",
        userid="guest",
        password="guest",
        ssl={
            "ca_certs": str(certs.ca_pem),
            "certfile": str(client_pem),
            "cert_reqs": ssl.CERT_REQUIRED,
            "server_hostname": "localhost",
        },
        connect_timeout=10,
    )
    conn.connect()
    try:
        assert conn.mechanisms == [b"PLAIN", b"AMQPLAIN"]
        channel = conn.channel()
        channel.queue_declare("py-amqp-tls", auto_delete=True)
    finally:
        conn.close()


def test_a_certificate_from_another_ca_fails_the_handshake(
    tls_broker: Broker, certs: Certs
) -> None:
    stranger = trustme.CA().issue_cert("client", common_name="tlsuser")
    context = certs.client_context()
    stranger.configure_cert(context)
    with pytest.raises(pika.exceptions.AMQPConnectionError):
        conn = tls_connect(tls_broker, context)
        round_trip(conn)
    conn = tls_connect(tls_broker, certs.client_context())
    assert round_trip(conn) == b"over tls"
    conn.close()  # (else the broker's stop waits out its close timeout for it)


def test_the_plain_listener_can_be_switched_off(
    broker_factory: Callable[..., Broker], certs: Certs
) -> None:
    port = free_port()
    broker = broker_factory(
        args=(
            *("--tls-port", str(port), "--tls-cert", str(certs.server_pem)),
            "--no-plain-listener",
        ),
        wait=False,
    )

    def tls_up() -> bool:
        assert broker.proc is not None and broker.proc.poll() is None, broker.log()
        with socket.socket() as s:
            return s.connect_ex(("127.0.0.1", port)) == 0

    wait_for(tls_up, 20, "the AMQPS listener")
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", broker.port)) != 0  # nothing listens there
    wait_for(lambda: _connects(broker, certs, port), 20, "an AMQPS login")


def _connects(broker: Broker, certs: Certs, port: int) -> bool:
    try:
        conn = tls_connect(broker, certs.client_context(), port=port)
    except (pika.exceptions.AMQPConnectionError, ssl.SSLError):
        return False  # workers still starting, or the old certificate still served
    conn.close()
    return True


def test_sighup_reloads_the_certificates(
    broker_factory: Callable[..., Broker], tmp_path: Path
) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    old, new = Certs(tmp_path / "a"), Certs(tmp_path / "b")
    live = tmp_path / "live.pem"
    live.write_bytes(old.server_pem.read_bytes())
    port = free_port()
    broker = broker_factory(args=("--tls-port", str(port), "--tls-cert", str(live)))
    tls_connect(broker, old.client_context(), port=port).close()
    live.write_bytes(new.server_pem.read_bytes())
    assert broker.proc is not None
    broker.proc.send_signal(signal.SIGHUP)
    wait_for(lambda: _connects(broker, new, port), 20, "the new certificate in use")
    with pytest.raises(ssl.SSLCertVerificationError):  # the old CA does not know it
        tls_connect(broker, old.client_context(), port=port)
