"""One AMQP connection with channel 1 open: handshake, RPCs and the rare frames."""

from __future__ import annotations

import asyncio
import collections
import socket
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

from pamqp import commands, common, frame

from shoal.perf.config import CLOSE_TIMEOUT_S, CONNECT_TIMEOUT_S
from shoal.perf.wire import (
    CLIENT_FRAME_MAX,
    FRAME_HEARTBEAT,
    FRAME_METHOD,
    PROTOCOL_HEADER,
    BrokerError,
    FrameParser,
    ProtocolError,
)

WRITE_HIGH_WATER = 128 * 1024


# --- connection -------------------------------------------------------------------


@dataclass(frozen=True)
class AmqpUri:
    host: str
    port: int
    user: str
    password: str
    vhost: str

    @classmethod
    def parse(cls, uri: str) -> AmqpUri:
        parts = urllib.parse.urlsplit(uri)
        if parts.scheme != "amqp":
            raise ValueError(f"only amqp:// URIs are supported, got {uri!r}")
        path = parts.path[1:] if parts.path.startswith("/") else parts.path
        return cls(
            host=parts.hostname or "127.0.0.1",
            port=parts.port or 5672,
            user=urllib.parse.unquote(parts.username or "guest"),
            password=urllib.parse.unquote(parts.password or "guest"),
            # The RabbitMQ convention: no vhost in the URI means the default "/".
            vhost=urllib.parse.unquote(path) or "/",
        )


class AmqpConnection(asyncio.Protocol):
    """One AMQP connection with channel 1 open.

    Subclasses put their hot path in front of ``_on_frame`` (the producer's confirms) or
    of the whole frame loop (the consumer's ``DeliveryParser``) and leave every other
    frame to ``_slow_frame``, which decodes with pamqp.  Setup code awaits ``rpc``.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self.parser = FrameParser(self._on_frame)
        self.frame_max = CLIENT_FRAME_MAX
        self.server_properties: dict[str, Any] = {}
        self.error: str | None = None
        self.lost = False
        self.blocked = False
        self.write_paused = False
        # Set once Connection.Close is sent: the broker ignores anything after it.
        self.closing = False
        self._inbox: collections.deque[tuple[int, Any]] = collections.deque()
        self._waiter: asyncio.Future[None] | None = None

    # asyncio.Protocol --------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        transport = cast(asyncio.Transport, transport)
        self.transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        transport.set_write_buffer_limits(high=WRITE_HIGH_WATER)
        transport.write(PROTOCOL_HEADER)

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed(data)
        except ProtocolError as exc:
            self._fail(f"protocol error: {exc}")

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        if self.error is None:
            self.error = f"connection lost: {exc}" if exc else "connection closed by broker"
        self._wake()

    def pause_writing(self) -> None:
        self.write_paused = True

    def resume_writing(self) -> None:
        self.write_paused = False
        self._wake()

    # frames ------------------------------------------------------------------------

    def _on_frame(
        self, frame_type: int, channel: int, buf: bytes | bytearray, start: int, end: int
    ) -> None:
        if frame_type == FRAME_METHOD:
            self._slow_frame(buf, start, end)
        elif frame_type == FRAME_HEARTBEAT:
            self._send(b"\x08\x00\x00\x00\x00\x00\x00\xce")

    def _slow_frame(self, buf: bytes | bytearray, start: int, end: int) -> None:
        try:
            _, channel, value = frame.unmarshal(bytes(buf[start - 7 : end + 1]))
        except Exception as exc:  # pamqp raises several types for undecodable input
            self._fail(f"undecodable frame from broker: {describe(exc)}")
            return
        if isinstance(value, commands.Connection.Close):
            self._send(frame.marshal(commands.Connection.CloseOk(), 0))
            self._fail(f"broker closed the connection: {value.reply_code} {value.reply_text}")
        elif isinstance(value, commands.Channel.Close):
            self._send(frame.marshal(commands.Channel.CloseOk(), channel))
            self._fail(f"broker closed the channel: {value.reply_code} {value.reply_text}")
        elif isinstance(value, commands.Connection.Blocked):
            self.blocked = True
        elif isinstance(value, commands.Connection.Unblocked):
            self.blocked = False
            self._wake()
        elif isinstance(value, commands.Basic.Cancel):
            self._fail("broker cancelled the consumer")
        else:
            self._inbox.append((channel, value))
            self._wake()

    # helpers -----------------------------------------------------------------------

    def _send(self, data: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    def _fail(self, message: str) -> None:
        if self.error is None:
            self.error = message
        self.lost = True
        if self.transport is not None:
            self.transport.close()
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def wait_event(self, timeout: float | None = None) -> None:
        """Sleep until a frame, a flow-control change or a loss wakes us."""
        self._waiter = self.loop.create_future()
        try:
            await asyncio.wait_for(self._waiter, timeout)
        except TimeoutError:
            pass
        finally:
            self._waiter = None

    async def receive(self, timeout: float) -> tuple[int, Any]:
        deadline = self.loop.time() + timeout
        while not self._inbox:
            if self.lost:
                raise BrokerError(self.error or "connection lost")
            remaining = deadline - self.loop.time()
            if remaining <= 0:
                raise TimeoutError("no reply from broker")
            await self.wait_event(remaining)
        return self._inbox.popleft()

    async def rpc(self, request: Any, reply: type, channel: int = 1, timeout: float = 5.0) -> Any:
        self._send(frame.marshal(request, channel))
        return await self.rpc_wait(reply, timeout)

    async def handshake(self, uri: AmqpUri, timeout: float) -> None:
        start = await self.rpc_wait(commands.Connection.Start, timeout)
        self.server_properties = dict(start.server_properties or {})
        mechanisms = (
            start.mechanisms.decode() if isinstance(start.mechanisms, bytes) else start.mechanisms
        )
        if "PLAIN" not in str(mechanisms).split():
            raise BrokerError(f"broker offers no PLAIN auth: {mechanisms}")
        capabilities: common.FieldTable = {
            "publisher_confirms": True,
            "connection.blocked": True,
            "basic.nack": True,
            "consumer_cancel_notify": True,
            "authentication_failure_close": True,  # (a bad password: 403 at once)
        }
        self._send(
            frame.marshal(
                commands.Connection.StartOk(
                    client_properties={"product": "shoal-perf", "capabilities": capabilities},
                    mechanism="PLAIN",
                    response=f"\x00{uri.user}\x00{uri.password}",
                ),
                0,
            )
        )
        tune = await self.rpc_wait(commands.Connection.Tune, timeout)
        self.frame_max = min(tune.frame_max or CLIENT_FRAME_MAX, CLIENT_FRAME_MAX)
        channel_max = tune.channel_max or 2047
        # Heartbeat 0: runs are short and a busy process could miss its own beat.
        self._send(
            frame.marshal(
                commands.Connection.TuneOk(
                    channel_max=channel_max, frame_max=self.frame_max, heartbeat=0
                ),
                0,
            )
        )
        await self.rpc(
            commands.Connection.Open(virtual_host=uri.vhost), commands.Connection.OpenOk, 0, timeout
        )
        await self.rpc(commands.Channel.Open(), commands.Channel.OpenOk, 1, timeout)

    async def rpc_wait(self, reply: type, timeout: float) -> Any:
        _, value = await self.receive(timeout)
        if not isinstance(value, reply):
            raise BrokerError(f"expected {reply.__name__}, got {type(value).__name__}")
        return value

    async def close(self) -> None:
        """Close politely, but never wait longer than CLOSE_TIMEOUT_S."""
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        self._inbox.clear()
        self.closing = True
        self._send(
            frame.marshal(
                commands.Connection.Close(
                    reply_code=200, reply_text="bye", class_id=0, method_id=0
                ),
                0,
            )
        )
        deadline = self.loop.time() + CLOSE_TIMEOUT_S
        while not self.lost and self.loop.time() < deadline:
            if any(isinstance(v, commands.Connection.CloseOk) for _, v in self._inbox):
                break
            await self.wait_event(deadline - self.loop.time())
        # abort, not close: bytes still queued for a stopped test are worthless.
        transport.abort()


async def connect(
    factory: Callable[[asyncio.AbstractEventLoop], AmqpConnection], uri: AmqpUri
) -> AmqpConnection:
    loop = asyncio.get_running_loop()
    _, protocol = await asyncio.wait_for(
        loop.create_connection(lambda: factory(loop), uri.host, uri.port), CONNECT_TIMEOUT_S
    )
    assert isinstance(protocol, AmqpConnection)
    try:
        await protocol.handshake(uri, CONNECT_TIMEOUT_S)
    except BaseException:
        if protocol.transport is not None:
            protocol.transport.abort()
        raise
    return protocol


def server_name(props: dict[str, Any]) -> str:
    def text(value: Any) -> str:
        return value.decode(errors="replace") if isinstance(value, bytes) else str(value or "")

    return f"{text(props.get('product'))} {text(props.get('version'))}".strip()


def describe(exc: BaseException) -> str:
    """``Type: message``; timeouts often carry no message of their own."""
    return f"{type(exc).__name__}: {str(exc) or 'timed out'}"
