"""An MQTT client's socket protocol in C (workers/_mqtt_front.h MqttFront,
workers/mqtt_front.py): installed on uvloop's plain TCP transport, it takes
the socket's reads (Python's path, `rest`, where no fast read is set) and
passes the connection's other protocol calls on. A real uvloop loop and a
real TCP socket; the fast reads themselves: test_mqtt_device_read."""

from __future__ import annotations

import asyncio
import socket
import time
import types
from pathlib import Path
from typing import Any

import uvloop

from shoal.shm import layout
from shoal.shm.segment import Segment
from shoal.shm.subscribe_barrier import SubscribeBarrier
from shoal.workers._wire import MqttFront
from shoal.workers.mqtt_front import counted, failed, install

WAIT_S = 5.0


class Connection(asyncio.Protocol):
    """An MqttConnection's part the front calls: its reads and its end."""

    def __init__(self, done: asyncio.Future[None]) -> None:
        self.done = done
        self.reads: list[bytes] = []
        self.lost: list[Exception | None] = []
        self.front = MqttFront(self, Connection.read, counted, failed, 1024)
        self.transport: Any = None

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        loop = asyncio.get_running_loop()
        install(self.front, transport, types.SimpleNamespace(ack_batch=None, loop=loop))

    def read(self, data: bytes) -> None:
        self.reads.append(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost.append(exc)
        self.done.set_result(None)


def test_the_front_is_a_plain_sockets_protocol() -> None:
    loop = uvloop.new_event_loop()
    listener = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(listener.getsockname())
    accepted, _ = listener.accept()
    listener.close()

    async def serve() -> Connection:
        done: asyncio.Future[None] = loop.create_future()
        transport, conn = await loop.connect_accepted_socket(lambda: Connection(done), accepted)
        assert transport.get_protocol() is conn.front
        assert conn.front.fast is None
        client.sendall(b"\xc0\x00")  # a PINGREQ: Python's path's (no fast read set)
        client.shutdown(socket.SHUT_WR)  # the end: eof_received, then connection_lost
        await asyncio.wait_for(done, WAIT_S)
        return conn

    try:
        conn = loop.run_until_complete(serve())
    finally:
        client.close()
        loop.close()
    assert b"".join(conn.reads) == b"\xc0\x00"
    assert conn.lost == [None]


def test_only_a_plain_tcp_transport_gets_the_front() -> None:
    """TLS's and WebSocket's transports keep the connection as protocol:
    their reads reach the front through MqttConnection.data_received."""

    class Other:
        protocol = None

        def set_protocol(self, protocol: Any) -> None:
            self.protocol = protocol

    other = Other()
    install(object(), other, None)
    assert other.protocol is None


def test_a_read_that_starts_like_a_subscribe_raises_the_barrier_word_before_python(
    tmp_path: Path,
) -> None:
    """The front raises its worker's P_SUBSCRIBING (and the hint) as it takes
    a read whose first byte is SUBSCRIBE's, before the connection's Python
    sees it (shm/subscribe_barrier.py): a publisher on another worker must
    not find the socket read and the word down. Other reads leave it."""
    limits = layout.Limits(max_workers=2, max_queues=64, queue_capacity=16, arena_bytes=1 << 16)
    seg = Segment.create(str(tmp_path / "front.shm"), limits)
    try:
        barrier = SubscribeBarrier(seg, 0)
        atomic, word, hint = barrier.front_words
        seen: list[int] = []
        conn = types.SimpleNamespace(read=lambda _c, data: seen.append(atomic.load(word)))
        front = MqttFront(conn, conn.read, counted, failed, 1024, *barrier.front_words)
        before = time.monotonic_ns()
        front.data_received(b"\x30\x03\x00\x01a")
        assert seen == [0] and atomic.load(hint) == 0
        front.data_received(b"\x82\x06\x00\x01\x00\x01a\x01")
        assert seen[1] >= before and atomic.load(hint) == seen[1], "up before Python ran"
        token = barrier.begin()
        assert atomic.load(word) == seen[1], "begin() takes the front's time as the start"
        barrier.end(token)
        atomic.store(word, 5)  # (another SUBSCRIBE's start: the front leaves it)
        front.data_received(b"\x82\x06\x00\x02\x00\x01a\x01")
        assert atomic.load(word) == 5
    finally:
        seg.unlink()
