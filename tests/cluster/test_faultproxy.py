"""The fault proxy's own faults, over real sockets against an echo server:
what the cluster's fault tests rely on it to do (tests/cluster/faultproxy.py)."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from tests.cluster.faultproxy import FaultProxy


@pytest.fixture
def proxy() -> Iterator[FaultProxy]:
    server = socket.create_server(("127.0.0.1", 0))

    def echo() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            threading.Thread(target=lambda c=conn: _echo(c), daemon=True).start()

    threading.Thread(target=echo, daemon=True).start()
    front = FaultProxy(server.getsockname()[1]).start()
    try:
        yield front
    finally:
        front.stop()
        server.close()


def _echo(conn: socket.socket) -> None:
    with contextlib.suppress(OSError):
        while data := conn.recv(65536):
            conn.sendall(data)
    conn.close()


def _client(proxy: FaultProxy) -> socket.socket:
    return socket.create_connection(("127.0.0.1", proxy.port), timeout=5)


def test_a_one_way_cut_stalls_that_direction_and_loses_nothing(proxy: FaultProxy) -> None:
    c = _client(proxy)
    c.sendall(b"before")
    assert c.recv(100) == b"before"
    proxy.cut("back")  # the echo's answers stop; what we send still arrives
    c.sendall(b"during")
    c.settimeout(0.5)
    with pytest.raises(TimeoutError):
        c.recv(100)
    proxy.heal()
    c.settimeout(5)
    assert c.recv(100) == b"during"  # held, not lost


def test_a_delay_slows_each_chunk(proxy: FaultProxy) -> None:
    c = _client(proxy)
    proxy.delay(0.3)
    started = time.monotonic()
    c.sendall(b"x")
    assert c.recv(10) == b"x"
    assert time.monotonic() - started >= 0.6  # once each way
    proxy.heal()


def test_a_reset_ends_open_connections_with_rst_and_new_ones_pass(proxy: FaultProxy) -> None:
    c = _client(proxy)
    c.sendall(b"a")
    assert c.recv(10) == b"a"
    proxy.reset()
    with pytest.raises(ConnectionResetError):
        c.sendall(b"b")
        c.recv(10)
    fresh = _client(proxy)
    fresh.sendall(b"c")
    assert fresh.recv(10) == b"c"
