"""A broker started under a shell's small open-files limit raises it: each
client is a file descriptor in its worker (broker/supervisor/open_files.py)."""

from __future__ import annotations

import resource
import socket
import time

import pytest

from tests.broker_process import Broker

CLIENTS = 600  # (300 a worker, past the soft limit of 256 the broker starts under)
START = b"\x01\x00\x00"  # a method frame on channel 0: connection.start


def test_a_broker_started_under_a_low_limit_serves_more_clients_than_it(
    broker_factory: type,
) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 4 * CLIENTS:
        pytest.skip(f"the hard open-files limit ({hard}) is under {4 * CLIENTS}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))  # the broker inherits it
    try:
        broker: Broker = broker_factory()
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))  # (this process's clients)
    socks: list[socket.socket] = []
    try:
        for _ in range(CLIENTS):
            s = socket.create_connection(("127.0.0.1", broker.port), timeout=10)
            s.sendall(b"AMQP\x00\x00\x09\x01")
            socks.append(s)
        deadline = time.monotonic() + 30
        for s in socks:  # each one's worker holds it: its connection.start comes
            s.settimeout(max(0.1, deadline - time.monotonic()))
            assert s.recv(3) == START
    finally:
        for s in socks:
            s.close()
