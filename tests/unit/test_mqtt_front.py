"""An MQTT client's socket protocol in C (workers/_mqtt_front.h MqttFront,
workers/mqtt_front.py): installed on uvloop's plain TCP transport, it takes
the socket's reads (Python's path, `rest`, where no fast read is set) and
passes the connection's other protocol calls on. A real uvloop loop and a
real TCP socket; the fast reads themselves: test_mqtt_device_read."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import uvloop

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
        install(self.front, transport)

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
    install(object(), other)
    assert other.protocol is None
