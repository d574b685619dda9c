"""A follower's AMQP listener: every client connection is piped to the
leader's AMQP port, as LavinMQ's followers do, so a client configured with
any node's address works (issue 29). Its MQTT listener is piped alike to
the leader's (issue 41).

The bytes are copied as they are; the leader sees the follower's address as
the client's. When the leader's side ends (it died) or the node stops
following it (failover), a client whose connection was open is told so as
a broker closing it would: connection.close 320 CONNECTION_FORCED, then the
socket is closed, and clients that reconnect reach the new leader. To know
when a connection is open, the leader's bytes are read as frames only until
its connection.open-ok; after that they are piped unread.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import struct

from pamqp import commands
from pamqp import frame as pamqp_frame

log = logging.getLogger("shoal.cluster")


FORCED = pamqp_frame.marshal(
    commands.Connection.Close(
        reply_code=320,
        reply_text="CONNECTION_FORCED - the cluster's leader is gone, reconnect",
        class_id=0,
        method_id=0,
    ),
    0,
)
_FRAME_HEADER = struct.Struct(">BHI")
_OPEN_OK = struct.pack(">HH", 10, 41)


class Handshake:
    """Reads the leader's frames until connection.open-ok (no IO)."""

    def __init__(self) -> None:
        self.buffer = b""
        self.open = False

    def feed(self, data: bytes) -> None:
        if self.open:
            return
        buf = self.buffer + data
        at = 0
        while len(buf) - at >= 7:
            kind, channel, size = _FRAME_HEADER.unpack_from(buf, at)
            if len(buf) - at < 8 + size:
                break
            if kind == 1 and channel == 0 and buf[at + 7 : at + 11] == _OPEN_OK:
                self.open = True
                self.buffer = b""
                return
            at += 8 + size
        self.buffer = buf[at:]


async def _from_leader(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, handshake: Handshake
) -> None:
    try:
        while data := await reader.read(65536):
            handshake.feed(data)
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    if handshake.open:
        with contextlib.suppress(Exception):
            writer.write(FORCED)
            await asyncio.wait_for(writer.drain(), 1)
    with contextlib.suppress(Exception):
        writer.close()


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        with contextlib.suppress(Exception):
            writer.close()


class Proxy:
    def __init__(self, host: str, port: int, amqp: bool = True) -> None:
        self.host = host
        self.port = port
        # AMQP clients hear connection.close 320 when the leader goes; MQTT
        # ones (the MQTT listeners, piped the same way) see the socket close,
        # as from a broker that went away, and reconnect.
        self.amqp = amqp
        self.servers: list[asyncio.base_events.Server] = []
        self.upstreams: set[asyncio.StreamWriter] = set()  # connections to the leader
        self.clients: set[asyncio.StreamWriter] = set()
        self.tasks: set[asyncio.Task[None]] = set()
        self.connections = 0

    async def start(self, bind: tuple[str, ...], port: int) -> None:
        for address in bind:
            self.servers.append(
                await asyncio.start_server(self._client, address, port, reuse_address=True)
            )

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            up_reader, up_writer = await asyncio.wait_for(
                asyncio.open_connection(self.host, self.port), 5
            )
        except (TimeoutError, OSError) as exc:
            log.info("proxy: leader %s:%d unreachable: %s", self.host, self.port, exc)
            writer.close()
            return
        self.upstreams.add(up_writer)
        self.clients.add(writer)
        task = asyncio.current_task()
        assert task is not None
        self.tasks.add(task)
        try:
            from_leader = (
                _from_leader(up_reader, writer, Handshake())
                if self.amqp
                else _pipe(up_reader, writer)
            )
            await asyncio.gather(_pipe(reader, up_writer), from_leader)
        finally:
            self.upstreams.discard(up_writer)
            self.clients.discard(writer)
            self.tasks.discard(task)

    async def close(self) -> None:
        """Stop listening and end every piped connection: the leader's side
        first, so that open clients get their connection.close 320."""
        for server in self.servers:
            server.close()
        for upstream in list(self.upstreams):
            upstream.close()
        if self.tasks:
            await asyncio.wait(list(self.tasks), timeout=2)
        for client in list(self.clients):
            client.close()
        for server in self.servers:
            with contextlib.suppress(Exception):
                await server.wait_closed()
        self.servers.clear()
