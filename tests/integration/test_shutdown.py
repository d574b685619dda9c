"""SIGTERM closes clients with 320 CONNECTION_FORCED and exits in time; SIGINT
stops fast; either way no process and no shared memory is left behind."""

from __future__ import annotations

import signal
import time

import pika

from tests.broker_process import wait_for


def test_sigterm_closes_clients_cleanly(broker_factory) -> None:  # type: ignore[no-untyped-def]
    broker = broker_factory(workers=2)
    conns = [pika.BlockingConnection(pika.URLParameters(broker.url)) for _ in range(3)]
    for c in conns:
        c.channel().queue_declare("t")
    closed: list[tuple[int, str]] = []
    started = time.monotonic()
    broker.proc.send_signal(signal.SIGTERM)
    for c in conns:

        def closed_by_broker(c: pika.BlockingConnection = c) -> bool:
            try:
                c.process_data_events(0.05)
            except pika.exceptions.ConnectionClosedByBroker as exc:
                closed.append((exc.reply_code, exc.reply_text))
                return True
            return False

        wait_for(closed_by_broker, 10, "connection.close from the broker")
    assert (
        closed
        == [(320, "CONNECTION_FORCED - broker forced connection closure with reason 'shutdown'")]
        * 3
    )
    assert broker.stop(timeout=10) == 0
    assert time.monotonic() - started < 5 + 3, "exceeded --graceful-timeout"
    broker.assert_clean()


def test_sigterm_does_not_wait_past_graceful_timeout(broker_factory) -> None:  # type: ignore[no-untyped-def]
    """A client that never answers connection.close does not hold the broker."""
    import socket

    broker = broker_factory(workers=1, args=("--graceful-timeout", "1"))
    raw = socket.create_connection(("127.0.0.1", broker.port))
    raw.sendall(b"AMQP\x00\x00\x09\x01")
    conn = pika.BlockingConnection(pika.URLParameters(broker.url))
    started = time.monotonic()
    broker.proc.send_signal(signal.SIGTERM)
    assert broker.stop(timeout=10) == 0
    assert time.monotonic() - started < 6
    broker.assert_clean()
    raw.close()
    del conn


def test_sigint_fast_stop_leaves_nothing(broker_factory) -> None:  # type: ignore[no-untyped-def]
    broker = broker_factory(workers=2)
    conn = pika.BlockingConnection(pika.URLParameters(broker.url))
    conn.channel().queue_declare("i")
    assert broker.stop(signal.SIGINT, timeout=10) == 0
    broker.assert_clean()
