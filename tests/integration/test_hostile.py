"""Clients that never log in (issue 16, item 8): a connection is dropped
when its handshake outlasts --handshake-timeout, and one more than
--max-handshaking per IO worker is closed at once; once a slot is free a
client that logs in is served."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable

from tests.broker_process import Broker, wait_for
from tests.clients import connect


def closed_within(sock: socket.socket, seconds: float) -> bool:
    sock.settimeout(seconds)
    try:
        while sock.recv(4096):
            pass  # connection.start and whatever follows
    except TimeoutError:
        return False
    except ConnectionError:
        pass
    return True


def test_idle_handshakes_are_bounded(broker_factory: Callable[..., Broker]) -> None:
    broker = broker_factory(workers=1, args=("--max-handshaking", "2", "--handshake-timeout", "2"))
    # The readiness probe's connection was handed over and is gone: nothing
    # else is logging in when the idle sockets come.
    wait_for(
        lambda: connections(broker, "acceptor") >= 1 and connections(broker) == 0,
        10,
        "the readiness probe's connection to go",
    )
    started = time.monotonic()
    idle = [socket.create_connection(("127.0.0.1", broker.port), timeout=5) for _ in range(2)]
    wait_for(lambda: connections(broker) == 2, 10, "both idle sockets handed to the worker")
    extra = socket.create_connection(("127.0.0.1", broker.port), timeout=5)
    extra.sendall(b"AMQP\x00\x00\x09\x01")
    assert closed_within(extra, 1.5), "a third idle handshake was served"
    for sock in idle:
        assert closed_within(sock, 5), "an idle handshake outlived --handshake-timeout"
    assert time.monotonic() - started < 6
    conn = connect(broker)  # the slots are free: a client that logs in is served
    conn.channel().queue_declare("served")
    conn.close()
    for sock in [*idle, extra]:
        sock.close()


def connections(broker: Broker, role: str = "io-worker") -> int:
    """The worker's open connections, or the acceptor's count of handed ones."""
    (process,) = [p for p in broker.status()["processes"] if p["role"] == role]
    return int(process["connections"])
