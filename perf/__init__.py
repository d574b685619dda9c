"""``shoal perf``: a fast AMQP 0-9-1 load generator.

Each producer and consumer is its own OS process with its own uvloop event loop and one
connection, so the load generator scales with cores and is not the bottleneck of the
broker it measures.  The hot paths avoid a general AMQP library: publishes are
precomputed byte templates (a batch of messages is one bytes multiplication and one
``transport.write``), and incoming frames are split by hand with ``struct.unpack_from``
over the receive buffer.  pamqp is used only for the handshake and rare methods.

Latency: every body starts with the producer's ``time.monotonic_ns()`` (CLOCK_MONOTONIC
is system-wide, so producer and consumer clocks agree on one machine).  Messages of one
batch are written by one ``write`` call and so share a send time.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import ctypes
import json
import math
import multiprocessing
import multiprocessing.connection
import secrets
import signal
import socket
import struct
import sys
import time
import urllib.parse
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any, cast

import uvloop
from pamqp import commands, common, frame

# --- wire constants ---------------------------------------------------------------

FRAME_METHOD = 1
FRAME_HEADER = 2
FRAME_BODY = 3
FRAME_HEARTBEAT = 8
FRAME_END = 0xCE
# The largest frame we accept before deciding the stream is garbage: a sane broker
# never exceeds the negotiated frame_max, and we ask for at most 128 KiB.
MAX_FRAME_SIZE = 1 << 24
CLIENT_FRAME_MAX = 131072

_FRAME_HEADER = struct.Struct(">BHI")
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
_CLASS_METHOD = struct.Struct(">HH")

# class_id << 16 | method_id, compared as one int in the hot paths.
BASIC_DELIVER = 0x003C003C
BASIC_ACK = 0x003C0050
BASIC_NACK = 0x003C0078

TIMESTAMP_BYTES = 8
_PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"
_DELIVERY_MODE_FLAG = 0x1000  # bit 12 of Basic's property flags

# Phase limits.  Together they keep ``main`` under duration + warmup + 30 s even when
# the broker is unreachable or a child hangs.
CONNECT_TIMEOUT_S = 5.0
READY_TIMEOUT_S = 8.0
RESULT_GRACE_S = 5.0
CLOSE_TIMEOUT_S = 1.0
JOIN_TIMEOUT_S = 2.0
# Target bytes per producer write: large enough that per-write overhead is amortised
# over hundreds of small messages, small enough to keep latency samples meaningful.
BATCH_BYTES = 32 * 1024
WRITE_HIGH_WATER = 128 * 1024


class ProtocolError(Exception):
    """The peer sent bytes that are not valid AMQP framing."""


class BrokerError(Exception):
    """The broker closed the channel or connection, or the connection was lost."""


# --- frame building ---------------------------------------------------------------


def _shortstr(value: str) -> bytes:
    raw = value.encode()
    if len(raw) > 255:
        raise ValueError(f"shortstr too long: {value!r}")
    return bytes((len(raw),)) + raw


def _frame(frame_type: int, channel: int, payload: bytes) -> bytes:
    return _FRAME_HEADER.pack(frame_type, channel, len(payload)) + payload + b"\xce"


@dataclass(frozen=True)
class PublishTemplate:
    """A Basic.Publish + content header + body frames split around the timestamp.

    A message on the wire is ``head + timestamp(8 bytes) + tail``; everything but the
    timestamp is computed once.  Bodies shorter than 8 bytes carry no timestamp.
    """

    head: bytes
    tail: bytes
    timestamped: bool

    def message(self, timestamp_ns: int) -> bytes:
        if not self.timestamped:
            return self.head + self.tail
        return self.head + _U64.pack(timestamp_ns) + self.tail

    def batch(self, timestamp_ns: int, count: int) -> bytes:
        return self.message(timestamp_ns) * count


def build_publish_template(
    routing_key: str,
    size: int,
    *,
    exchange: str = "",
    channel: int = 1,
    persistent: bool = False,
    frame_max: int = CLIENT_FRAME_MAX,
) -> PublishTemplate:
    """Precompute the frames of one publish of a ``size``-byte body."""
    method = _frame(
        FRAME_METHOD,
        channel,
        _CLASS_METHOD.pack(60, 40)
        + b"\x00\x00"  # reserved-1 (ticket)
        + _shortstr(exchange)
        + _shortstr(routing_key)
        + b"\x00",  # mandatory=0, immediate=0
    )
    # Without properties (flags 0) a message is transient, the AMQP default.
    props = struct.pack(">HB", _DELIVERY_MODE_FLAG, 2) if persistent else b"\x00\x00"
    content_header = _frame(FRAME_HEADER, channel, struct.pack(">HHQ", 60, 0, size) + props)
    # A body frame costs 8 bytes of framing, so frame_max - 8 bytes of body fit in one.
    chunk = frame_max - 8
    pieces = [b"\x00" * min(chunk, size - start) for start in range(0, size, chunk)]
    body_frames = [_frame(FRAME_BODY, channel, piece) for piece in pieces]
    wire = method + content_header + b"".join(body_frames)
    if size < TIMESTAMP_BYTES:
        return PublishTemplate(head=wire, tail=b"", timestamped=False)
    split = len(method) + len(content_header) + _FRAME_HEADER.size
    return PublishTemplate(
        head=wire[:split], tail=wire[split + TIMESTAMP_BYTES :], timestamped=True
    )


def encode_ack(delivery_tag: int, multiple: bool, channel: int = 1) -> bytes:
    """A Basic.Ack frame, built by hand because consumers send one per batch."""
    payload = (
        _CLASS_METHOD.pack(60, 80) + _U64.pack(delivery_tag) + (b"\x01" if multiple else b"\x00")
    )
    return _frame(FRAME_METHOD, channel, payload)


def parse_deliver_tag(buf: bytes | bytearray, start: int) -> int:
    """The delivery tag of a Basic.Deliver method payload beginning at ``start``.

    It follows the consumer tag (a shortstr after class and method ids).
    """
    return _U64.unpack_from(buf, start + 5 + buf[start + 4])[0]


def parse_confirm(buf: bytes | bytearray, start: int) -> tuple[int, bool]:
    """Delivery tag and ``multiple`` flag of a Basic.Ack/Basic.Nack payload."""
    return _U64.unpack_from(buf, start + 4)[0], bool(buf[start + 12] & 1)


# --- frame parsing ----------------------------------------------------------------

FrameHandler = Callable[[int, int, "bytes | bytearray", int, int], None]


class FrameParser:
    """Splits a byte stream into AMQP frames.

    For each complete frame it calls ``handler(type, channel, buf, start, end)`` where
    the payload is ``buf[start:end]``; handlers read in place so no payload is copied.
    Only an incomplete trailing frame is kept between calls.
    """

    __slots__ = ("_handler", "_pending")

    def __init__(self, handler: FrameHandler) -> None:
        self._handler = handler
        self._pending = bytearray()

    def feed(self, data: bytes) -> None:
        pending = self._pending
        buf: bytes | bytearray
        if pending:
            pending += data
            buf = pending
        else:
            buf = data
        handler = self._handler
        unpack = _FRAME_HEADER.unpack_from
        size_total = len(buf)
        offset = 0
        # 8 bytes is the smallest frame: a 7-byte header and the frame-end octet.
        while size_total - offset >= 8:
            frame_type, channel, size = unpack(buf, offset)
            end = offset + 7 + size
            if end >= size_total:
                if size > MAX_FRAME_SIZE:
                    raise ProtocolError(f"frame of {size} bytes")
                break
            if buf[end] != FRAME_END:
                raise ProtocolError(f"bad frame end 0x{buf[end]:02x} at offset {end}")
            handler(frame_type, channel, buf, offset + 7, end)
            offset = end + 1
        if buf is pending:
            # Deleting a bytearray's prefix only moves its start pointer.
            del pending[:offset]
        elif offset < size_total:
            self._pending = bytearray(memoryview(data)[offset:])


# --- latency histogram ------------------------------------------------------------

_SUB_BITS = 7
_SUB = 1 << _SUB_BITS
_HALF_SHIFT = _SUB_BITS - 1


def bucket_index(value: int) -> int:
    """Log-linear bucket of a non-negative integer: exact below 128, then 64 buckets
    per power of two (at most 1/64 relative width), like HdrHistogram."""
    if value < _SUB:
        return value
    shift = value.bit_length() - _SUB_BITS
    return (shift << _HALF_SHIFT) + (value >> shift)


def bucket_bounds(index: int) -> tuple[int, int]:
    """The ``[low, high)`` value range of a bucket."""
    if index < _SUB:
        return index, index + 1
    shift = (index >> _HALF_SHIFT) - 1
    mantissa = index - (shift << _HALF_SHIFT)
    return mantissa << shift, (mantissa + 1) << shift


class Histogram:
    """A mergeable latency histogram of integer values (microseconds here).

    Children send ``to_wire()`` to the parent, which merges them; a reservoir of raw
    samples could not be merged exactly and would cost memory per message.
    """

    __slots__ = ("counts", "max_value", "total")

    def __init__(self) -> None:
        self.counts: dict[int, int] = {}
        self.total = 0
        self.max_value = 0

    def record(self, value: int, count: int = 1) -> None:
        if value < 0:
            value = 0
        index = bucket_index(value)
        counts = self.counts
        counts[index] = counts.get(index, 0) + count
        self.total += count
        if value > self.max_value:
            self.max_value = value

    def merge(self, other: Histogram) -> None:
        for index, count in other.counts.items():
            self.counts[index] = self.counts.get(index, 0) + count
        self.total += other.total
        self.max_value = max(self.max_value, other.max_value)

    def percentile(self, q: float) -> float | None:
        """Nearest-rank percentile (the smallest value with at least q% of samples at or
        below it), reported as its bucket's midpoint; None when empty."""
        if not self.total:
            return None
        rank = max(1, math.ceil(q / 100.0 * self.total))
        seen = 0
        for index in sorted(self.counts):
            seen += self.counts[index]
            if seen >= rank:
                low, high = bucket_bounds(index)
                return min((low + high - 1) / 2.0, float(self.max_value))
        return float(self.max_value)

    def to_wire(self) -> dict[str, Any]:
        return {"counts": self.counts, "total": self.total, "max": self.max_value}

    @classmethod
    def from_wire(cls, data: dict[str, Any]) -> Histogram:
        hist = cls()
        hist.counts = {int(k): int(v) for k, v in data["counts"].items()}
        hist.total = int(data["total"])
        hist.max_value = int(data["max"])
        return hist


def latency_summary_ms(hist: Histogram) -> dict[str, float] | None:
    """p50/p95/p99/max in milliseconds from a histogram of microseconds."""
    if not hist.total:
        return None
    summary = {f"p{q}": (hist.percentile(q) or 0.0) / 1000.0 for q in (50, 95, 99)}
    summary["max"] = hist.max_value / 1000.0
    return summary


# --- publisher confirms -----------------------------------------------------------


class ConfirmTracker:
    """Counts unconfirmed publishes and measures confirm latency.

    Tags are assigned per batch, so each batch remembers its tag range and send time.
    ``low`` is the highest tag below which everything is settled; tags settled out of
    order by non-multiple acks wait in ``singles`` until ``low`` catches up.
    """

    __slots__ = ("acked", "batches", "low", "nacked", "next_tag", "singles")

    def __init__(self) -> None:
        self.next_tag = 1
        self.low = 0
        self.singles: set[int] = set()
        self.batches: collections.deque[tuple[int, int, int]] = collections.deque()
        self.acked = 0
        self.nacked = 0

    @property
    def outstanding(self) -> int:
        return self.next_tag - 1 - self.low - len(self.singles)

    def sent(self, count: int, send_ns: int) -> None:
        first = self.next_tag
        self.next_tag += count
        self.batches.append((first, self.next_tag - 1, send_ns))

    def settle(
        self, tag: int, multiple: bool, ack: bool, now_ns: int, hist: Histogram | None
    ) -> int:
        """Apply one Basic.Ack/Nack; returns how many publishes it settled."""
        before = self.low + len(self.singles)
        if tag >= self.next_tag:
            raise ProtocolError(f"confirm for unpublished tag {tag}")
        if multiple:
            if tag > self.low:
                self.singles = {t for t in self.singles if t > tag}
                self._advance(tag, now_ns, hist)
        elif tag > self.low and tag not in self.singles:
            self.singles.add(tag)
        new_low = self.low
        while new_low + 1 in self.singles:
            new_low += 1
            self.singles.discard(new_low)
        if new_low > self.low:
            self._advance(new_low, now_ns, hist)
        settled = self.low + len(self.singles) - before
        if ack:
            self.acked += settled
        else:
            self.nacked += settled
        return settled

    def _advance(self, new_low: int, now_ns: int, hist: Histogram | None) -> None:
        # Out-of-order single acks are timed when ``low`` passes them: a slight
        # overestimate for a rare case, in exchange for O(1) bookkeeping per batch.
        batches = self.batches
        low = self.low
        while batches:
            first, last, send_ns = batches[0]
            count = min(last, new_low) - max(first, low + 1) + 1
            if count > 0 and hist is not None:
                hist.record((now_ns - send_ns) // 1000, count)
            if last > new_low:
                break
            batches.popleft()
        self.low = new_low


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
        transport.write(_PROTOCOL_HEADER)

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


# --- configuration ----------------------------------------------------------------


@dataclass(frozen=True)
class PerfConfig:
    uri: str
    producers: int
    consumers: int
    size: int
    confirm: int
    prefetch: int
    multi_ack: int
    no_ack: bool
    duration: float
    warmup: float
    queue: str
    queue_generated: bool
    persistent: bool
    rate: int
    fanout: int = 0  # > 0: publish to a fanout exchange bound to this many queues

    def exchange(self) -> str:
        return f"{self.queue}-fanout" if self.fanout else ""

    def queues(self) -> list[str]:
        if self.fanout:
            return [f"{self.queue}-{i}" for i in range(self.fanout)]
        return [self.queue]

    def queue_for(self, index: int) -> str:
        """The queue consumer `index` reads (spread over the fan-out's queues)."""
        queues = self.queues()
        return queues[index % len(queues)]


@dataclass(frozen=True)
class Window:
    """The shared schedule, in monotonic nanoseconds."""

    start_ns: int
    warm_ns: int
    end_ns: int

    @classmethod
    def from_start(cls, start_s: float, warmup: float, duration: float) -> Window:
        start_ns = int(start_s * 1e9)
        warm_ns = start_ns + int(warmup * 1e9)
        return cls(start_ns, warm_ns, warm_ns + int(duration * 1e9))


# --- producer ---------------------------------------------------------------------


class Producer(AmqpConnection):
    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(loop)
        self.confirms: ConfirmTracker | None = None
        self.confirm_hist = Histogram()
        self.window: Window | None = None
        self.published = 0
        self.acked = 0
        self.nacked = 0
        self.blocked_events = 0

    def _on_frame(
        self, frame_type: int, channel: int, buf: bytes | bytearray, start: int, end: int
    ) -> None:
        if frame_type == FRAME_METHOD and self.confirms is not None:
            method = _U32.unpack_from(buf, start)[0]
            if method in (BASIC_ACK, BASIC_NACK):
                tag, multiple = parse_confirm(buf, start)
                now = time.monotonic_ns()
                window = self.window
                in_window = window is not None and window.warm_ns <= now < window.end_ns
                is_ack = method == BASIC_ACK
                settled = self.confirms.settle(
                    tag, multiple, is_ack, now, self.confirm_hist if in_window else None
                )
                if in_window:
                    if is_ack:
                        self.acked += settled
                    else:
                        self.nacked += settled
                self._wake()
                return
        super()._on_frame(frame_type, channel, buf, start, end)

    def _slow_frame(self, buf: bytes | bytearray, start: int, end: int) -> None:
        was_blocked = self.blocked
        super()._slow_frame(buf, start, end)
        if self.blocked and not was_blocked:
            self.blocked_events += 1

    async def setup(self, cfg: PerfConfig, index: int = 0) -> None:
        if cfg.confirm:
            await self.rpc(commands.Confirm.Select(), commands.Confirm.SelectOk)
            self.confirms = ConfirmTracker()

    async def run(self, cfg: PerfConfig, window: Window) -> dict[str, Any]:
        self.window = window
        template = build_publish_template(
            "" if cfg.fanout else cfg.queue,
            cfg.size,
            exchange=cfg.exchange(),
            persistent=cfg.persistent,
            frame_max=self.frame_max,
        )
        batch = max(1, BATCH_BYTES // len(template.message(0)))
        if cfg.rate:
            # About 5 ms worth of messages per write keeps a capped rate smooth.
            batch = max(1, min(batch, cfg.rate // 200))
        stop_handle = self.loop.call_later(
            max(0.0, (window.end_ns - time.monotonic_ns()) / 1e9), self._wake
        )
        try:
            await self._publish_loop(cfg, window, template, batch)
        finally:
            stop_handle.cancel()
        confirms = self.confirms
        result: dict[str, Any] = {
            "role": "producer",
            "published": self.published,
            "blocked_events": self.blocked_events,
            "error": self.error if self.lost else None,
        }
        if confirms is not None:
            result.update(
                acked=self.acked,
                nacked=self.nacked,
                confirm_hist=self.confirm_hist.to_wire(),
            )
        return result

    async def _publish_loop(
        self, cfg: PerfConfig, window: Window, template: PublishTemplate, batch: int
    ) -> None:
        assert self.transport is not None
        write = self.transport.write
        message = template.message
        confirms = self.confirms
        window_size = cfg.confirm
        rate = cfg.rate
        sent_total = 0
        end_ns = window.end_ns
        warm_ns = window.warm_ns
        while not self.lost:
            now = time.monotonic_ns()
            if now >= end_ns:
                return
            if self.write_paused or self.blocked:
                await self.wait_event()
                continue
            count = batch
            if confirms is not None:
                count = min(count, window_size - confirms.outstanding)
                if count <= 0:
                    await self.wait_event()
                    continue
            if rate:
                due_ns = window.start_ns + int(sent_total * 1e9 / rate)
                if now < due_ns:
                    # libuv timers have 1 ms resolution; a shorter sleep returns at once
                    # and would turn the wait into a busy loop.
                    await asyncio.sleep(max(0.001, min(due_ns - now, end_ns - now) / 1e9))
                    continue
            write(message(now) * count)
            sent_total += count
            if confirms is not None:
                confirms.sent(count, now)
            if now >= warm_ns:
                self.published += count
            # Let the loop read confirms and flow-control frames between writes.
            await asyncio.sleep(0)


# --- consumer ---------------------------------------------------------------------


class DeliveryParser:
    """The consumer's fast path: a FrameParser specialised for a delivery stream.

    One flat loop with no call per frame (a consumer sees three frames per message)
    counts Basic.Deliver frames, collects the delivery tags to ack every ``ack_every``
    deliveries, and reads each body's leading send timestamp.  Timestamps are kept as
    runs ``(sent_ns, count)`` because messages of one producer batch share one.  Any
    other frame goes to ``other``.  The caller drains ``delivered``, ``runs`` and
    ``ack_tags`` after each ``feed``.
    """

    __slots__ = (
        "_other",
        "_pending",
        "_unacked",
        "_want_timestamp",
        "ack_every",
        "ack_tags",
        "delivered",
        "runs",
    )

    def __init__(self, other: FrameHandler, ack_every: int = 0) -> None:
        self._other = other
        self._pending = bytearray()
        self._unacked = 0
        self._want_timestamp = False
        self.ack_every = ack_every
        self.ack_tags: list[int] = []
        self.delivered = 0
        self.runs: list[tuple[int, int]] = []

    def feed(self, data: bytes) -> None:
        pending = self._pending
        buf: bytes | bytearray
        if pending:
            pending += data
            buf = pending
        else:
            buf = data
        unpack_header = _FRAME_HEADER.unpack_from
        unpack_u32 = _U32.unpack_from
        unpack_u64 = _U64.unpack_from
        other = self._other
        every = self.ack_every
        unacked = self._unacked
        want_timestamp = self._want_timestamp
        runs = self.runs
        run_ts = run_len = delivered = 0
        size_total = len(buf)
        offset = 0
        try:
            while size_total - offset >= 8:
                frame_type, channel, size = unpack_header(buf, offset)
                end = offset + 7 + size
                if end >= size_total:
                    if size > MAX_FRAME_SIZE:
                        raise ProtocolError(f"frame of {size} bytes")
                    break
                if buf[end] != FRAME_END:
                    raise ProtocolError(f"bad frame end 0x{buf[end]:02x} at offset {end}")
                start = offset + 7
                if frame_type == FRAME_BODY:
                    # Only a message's first body frame starts with the timestamp.
                    if want_timestamp:
                        want_timestamp = False
                        if size >= TIMESTAMP_BYTES:
                            sent_ns = unpack_u64(buf, start)[0]
                            if sent_ns == run_ts:
                                run_len += 1
                            else:
                                if run_len:
                                    runs.append((run_ts, run_len))
                                run_ts = sent_ns
                                run_len = 1
                elif frame_type == FRAME_HEADER:
                    want_timestamp = True
                elif frame_type == FRAME_METHOD and unpack_u32(buf, start)[0] == BASIC_DELIVER:
                    delivered += 1
                    want_timestamp = False
                    if every:
                        unacked += 1
                        if unacked >= every:
                            unacked = 0
                            self.ack_tags.append(unpack_u64(buf, start + 5 + buf[start + 4])[0])
                else:
                    other(frame_type, channel, buf, start, end)
                offset = end + 1
        finally:
            if run_len:
                runs.append((run_ts, run_len))
            self.delivered += delivered
            self._unacked = unacked
            self._want_timestamp = want_timestamp
            if buf is pending:
                del pending[:offset]
            elif offset < size_total:
                self._pending = bytearray(memoryview(data)[offset:])


class Consumer(AmqpConnection):
    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(loop)
        self.latency = Histogram()
        self.window: Window | None = None
        self.consumed = 0
        self.multiple_acks = True
        self.deliveries = DeliveryParser(self._on_frame)

    async def setup(self, cfg: PerfConfig, index: int = 0) -> None:
        if not cfg.no_ack:
            await self.rpc(commands.Basic.Qos(prefetch_count=cfg.prefetch), commands.Basic.QosOk)
            self.deliveries.ack_every = cfg.multi_ack
            self.multiple_acks = cfg.multi_ack > 1
        await self.rpc(
            commands.Basic.Consume(queue=cfg.queue_for(index), no_ack=cfg.no_ack),
            commands.Basic.ConsumeOk,
        )

    def data_received(self, data: bytes) -> None:
        deliveries = self.deliveries
        try:
            deliveries.feed(data)
        except ProtocolError as exc:
            self._fail(f"protocol error: {exc}")
            return
        if deliveries.ack_tags:
            if not self.closing:
                multiple = self.multiple_acks
                self._send(b"".join([encode_ack(tag, multiple) for tag in deliveries.ack_tags]))
            deliveries.ack_tags.clear()
        # Everything in one read arrived at the same instant, so one clock read and one
        # window test serve the whole chunk.
        window = self.window
        now = time.monotonic_ns()
        if window is not None and window.warm_ns <= now < window.end_ns:
            self.consumed += deliveries.delivered
            record = self.latency.record
            for sent_ns, count in deliveries.runs:
                record((now - sent_ns) // 1000, count)
        deliveries.delivered = 0
        deliveries.runs.clear()

    async def run(self, cfg: PerfConfig, window: Window) -> dict[str, Any]:
        self.window = window
        deadline = self.loop.time() + (window.end_ns - time.monotonic_ns()) / 1e9
        while not self.lost and self.loop.time() < deadline:
            await self.wait_event(deadline - self.loop.time())
        return {
            "role": "consumer",
            "consumed": self.consumed,
            "latency_hist": self.latency.to_wire(),
            "error": self.error if self.lost else None,
        }


# --- child processes --------------------------------------------------------------


def describe(exc: BaseException) -> str:
    """``Type: message``; timeouts often carry no message of their own."""
    return f"{type(exc).__name__}: {str(exc) or 'timed out'}"


def _die_with_parent() -> None:
    """Ask Linux to SIGKILL this child if the parent dies, so no run outlives main."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _child_main(
    role: str,
    index: int,
    cfg: PerfConfig,
    conn: multiprocessing.connection.Connection,
    go: Any,
    start_at: Any,
) -> None:
    _die_with_parent()
    # A last-resort bound in case main is stuck too; SIGALRM's default action kills.
    signal.alarm(int(cfg.warmup + cfg.duration + READY_TIMEOUT_S + 30))
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # main handles Ctrl-C and kills us
    loop = uvloop.new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        result = _run_child(loop, role, index, cfg, conn, go, start_at)
        if result is not None:
            conn.send(("result", index, result))
    except BaseException as exc:  # reported to main, which decides
        conn.send(("error", index, f"{role} {index}: {describe(exc)}"))
    finally:
        loop.close()
        conn.close()


def _run_child(
    loop: asyncio.AbstractEventLoop,
    role: str,
    index: int,
    cfg: PerfConfig,
    conn: multiprocessing.connection.Connection,
    go: Any,
    start_at: Any,
) -> dict[str, Any] | None:
    factory: type[Producer] | type[Consumer] = Producer if role == "producer" else Consumer
    uri = AmqpUri.parse(cfg.uri)
    client = loop.run_until_complete(connect(factory, uri))
    assert isinstance(client, (Producer, Consumer))
    try:
        loop.run_until_complete(asyncio.wait_for(client.setup(cfg, index), CONNECT_TIMEOUT_S))
        conn.send(("ready", 0, None))
        # Blocking here is fine: nothing is flowing until every process is ready.
        if not go.wait(READY_TIMEOUT_S + 2):
            return None
        window = Window.from_start(start_at.value, cfg.warmup, cfg.duration)
        limit = (window.end_ns - time.monotonic_ns()) / 1e9 + RESULT_GRACE_S
        cpu_before = time.process_time()
        wall_before = time.monotonic()
        result = loop.run_until_complete(asyncio.wait_for(client.run(cfg, window), limit))
        # CPU used over the run shows how much of the machine the load generator itself
        # took from the broker it measures.
        result["cpu_s"] = time.process_time() - cpu_before
        result["wall_s"] = time.monotonic() - wall_before
        return result
    finally:
        loop.run_until_complete(client.close())


# --- orchestration ----------------------------------------------------------------


async def _declare_queue(cfg: PerfConfig) -> str:
    client = await connect(AmqpConnection, AmqpUri.parse(cfg.uri))
    try:
        durable = cfg.persistent
        # Auto-delete cleans up after a killed run; with no consumer it would never
        # trigger, and a durable queue is meant to outlive connections.
        auto_delete = not durable and cfg.consumers > 0 and cfg.queue_generated
        if cfg.fanout:
            await client.rpc(
                commands.Exchange.Declare(
                    exchange=cfg.exchange(), exchange_type="fanout", durable=durable
                ),
                commands.Exchange.DeclareOk,
            )
        for queue in cfg.queues():
            await client.rpc(
                commands.Queue.Declare(queue=queue, durable=durable, auto_delete=auto_delete),
                commands.Queue.DeclareOk,
            )
            if cfg.fanout:
                await client.rpc(
                    commands.Queue.Bind(queue=queue, exchange=cfg.exchange()),
                    commands.Queue.BindOk,
                )
        return server_name(client.server_properties)
    finally:
        await client.close()


async def _delete_queue(cfg: PerfConfig) -> None:
    client = await connect(AmqpConnection, AmqpUri.parse(cfg.uri))
    try:
        for queue in cfg.queues():
            await client.rpc(commands.Queue.Delete(queue=queue), commands.Queue.DeleteOk)
        if cfg.fanout:
            await client.rpc(
                commands.Exchange.Delete(exchange=cfg.exchange()), commands.Exchange.DeleteOk
            )
    finally:
        await client.close()


def _run_async(coro: Any, timeout: float) -> Any:
    loop = uvloop.new_event_loop()
    try:
        return loop.run_until_complete(asyncio.wait_for(coro, timeout))
    finally:
        loop.close()


@dataclass
class _Child:
    role: str
    process: Any
    reader: multiprocessing.connection.Connection
    ready: bool = False
    result: dict[str, Any] | None = None
    error: str | None = None


def _start_children(cfg: PerfConfig, go: Any, start_at: Any) -> list[_Child]:
    ctx = multiprocessing.get_context("fork")
    children: list[_Child] = []
    roles = ["consumer"] * cfg.consumers + ["producer"] * cfg.producers
    for index, role in enumerate(roles):
        reader, writer = ctx.Pipe(duplex=False)
        process = ctx.Process(
            target=_child_main,
            args=(role, index, cfg, writer, go, start_at),
            name=f"shoal-perf-{role}-{index}",
            daemon=True,
        )
        process.start()
        writer.close()
        children.append(_Child(role, process, reader))
    return children


def _collect(children: list[_Child], until: Callable[[_Child], bool], deadline: float) -> None:
    """Read messages from children until ``until`` holds for all, or the deadline."""
    open_readers = {c.reader: c for c in children if not until(c) and c.error is None}
    while open_readers:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            for child in open_readers.values():
                child.error = child.error or f"{child.role} timed out"
            return
        for reader in multiprocessing.connection.wait(list(open_readers), remaining):
            assert isinstance(reader, multiprocessing.connection.Connection)
            child = open_readers[reader]
            try:
                kind, _, payload = reader.recv()
            except (EOFError, OSError):
                child.error = child.error or f"{child.role} exited without a result"
                del open_readers[reader]
                continue
            if kind == "ready":
                child.ready = True
            elif kind == "result":
                child.result = payload
            else:
                child.error = payload
            if until(child) or child.error is not None:
                del open_readers[reader]


def _reap(children: list[_Child]) -> None:
    deadline = time.monotonic() + JOIN_TIMEOUT_S
    for child in children:
        child.process.join(max(0.0, deadline - time.monotonic()))
    for child in children:
        if child.process.is_alive():
            child.process.kill()
            child.process.join(1.0)
        child.reader.close()


def run_perf(cfg: PerfConfig) -> dict[str, Any]:
    """Run one measurement and return the aggregated report (see ``summarize``)."""
    overall_deadline = time.monotonic() + cfg.warmup + cfg.duration + 25.0
    errors: list[str] = []
    try:
        server = _run_async(_declare_queue(cfg), CONNECT_TIMEOUT_S + 5)
    except Exception as exc:  # any failure here means "cannot run"
        return {
            "config": asdict(cfg),
            "errors": [f"setup failed: {describe(exc)}"],
            "fatal": True,
        }
    ctx = multiprocessing.get_context("fork")
    go = ctx.Event()
    start_at = ctx.Value("d", 0.0, lock=False)
    children = _start_children(cfg, go, start_at)
    try:
        ready_deadline = min(time.monotonic() + READY_TIMEOUT_S, overall_deadline)
        _collect(children, lambda c: c.ready, ready_deadline)
        errors.extend(c.error for c in children if c.error)
        if not errors:
            # A short lead lets every child reach its loop before the clock starts.
            start_at.value = time.monotonic() + 0.05
            go.set()
            run_deadline = min(
                start_at.value + cfg.warmup + cfg.duration + RESULT_GRACE_S, overall_deadline
            )
            _collect(children, lambda c: c.result is not None, run_deadline)
            errors.extend(c.error for c in children if c.error)
            errors.extend(
                f"{c.role}: {c.result['error']}"
                for c in children
                if c.result and c.result.get("error")
            )
    finally:
        _reap(children)
        if cfg.queue_generated:
            try:
                _run_async(_delete_queue(cfg), 3.0)
            except Exception as exc:  # cleanup must not hide the result
                errors.append(f"queue delete failed: {describe(exc)}")
    report = summarize(cfg, [c.result for c in children if c.result is not None])
    report["server"] = server
    report["errors"] = errors
    report["fatal"] = bool(errors) and not any(c.result for c in children)
    return report


def summarize(cfg: PerfConfig, results: Sequence[dict[str, Any]]) -> dict[str, Any]:
    latency = Histogram()
    confirm = Histogram()
    published = consumed = acked = nacked = 0
    cpu_s = wall_s = 0.0
    for result in results:
        cpu_s += result.get("cpu_s", 0.0)
        wall_s = max(wall_s, result.get("wall_s", 0.0))
        if result["role"] == "producer":
            published += result["published"]
            if "confirm_hist" in result:
                confirm.merge(Histogram.from_wire(result["confirm_hist"]))
                acked += result["acked"]
                nacked += result["nacked"]
        else:
            consumed += result["consumed"]
            latency.merge(Histogram.from_wire(result["latency_hist"]))
    report: dict[str, Any] = {
        "config": asdict(cfg),
        "published": published,
        "consumed": consumed,
        "published_rate": published / cfg.duration,
        "consumed_rate": consumed / cfg.duration,
        "latency_ms": latency_summary_ms(latency),
        # Percent of one core used by all load-generator processes together.
        "client_cpu_percent": 100.0 * cpu_s / wall_s if wall_s else 0.0,
    }
    if cfg.confirm:
        report.update(acked=acked, nacked=nacked, confirm_latency_ms=latency_summary_ms(confirm))
    return report


def _format_latency(label: str, summary: dict[str, float] | None) -> str:
    if summary is None:
        return f"{label} n/a"
    points = " ".join(f"{key} {summary[key]:.2f}" for key in ("p50", "p95", "p99", "max"))
    return f"{label} {points}"


def format_human(report: dict[str, Any]) -> str:
    cfg = report["config"]
    ack = "no-ack" if cfg["no_ack"] else f"multi-ack {cfg['multi_ack']}"
    lines = [
        f"shoal perf: {cfg['producers']} producer(s) -> {cfg['consumers']} consumer(s), "
        f"{cfg['size']} B, confirm {cfg['confirm']}, prefetch {cfg['prefetch']}, {ack}, "
        f"{cfg['duration']:.1f} s" + (f" [{report['server']}]" if report.get("server") else "")
    ]
    if "published_rate" in report:
        lines.append(
            f"published {report['published_rate']:.0f} msg/s  "
            f"consumed {report['consumed_rate']:.0f} msg/s  "
            + _format_latency("latency ms", report["latency_ms"])
        )
        lines.append(f"load generator CPU {report['client_cpu_percent']:.0f}% of one core")
        if cfg["confirm"]:
            lines.append(
                f"confirmed {report['acked']} nacked {report['nacked']}  "
                + _format_latency("confirm latency ms", report["confirm_latency_ms"])
            )
    lines.extend(f"error: {e}" for e in report.get("errors", []))
    return "\n".join(lines)


# --- command line -----------------------------------------------------------------


def _non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError("must be >= 0")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError("must be > 0")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="shoal perf", description="AMQP 0-9-1 throughput and latency test."
    )
    p.add_argument("--uri", default="amqp://guest:guest@127.0.0.1:5672/", help="broker URI")
    p.add_argument("--producers", type=_non_negative_int, default=1, help="producer processes")
    p.add_argument("--consumers", type=_non_negative_int, default=1, help="consumer processes")
    p.add_argument(
        "--size", type=_non_negative_int, default=64, help="body bytes (>= 8 for latency)"
    )
    p.add_argument(
        "--confirm", type=_non_negative_int, default=0, help="publisher-confirm window, 0 = off"
    )
    p.add_argument(
        "--prefetch", type=_non_negative_int, default=500, help="basic.qos prefetch count"
    )
    p.add_argument(
        "--multi-ack",
        type=_non_negative_int,
        default=100,
        help="ack every N deliveries (multiple=true if N > 1)",
    )
    p.add_argument("--no-ack", action="store_true", help="consume in no-ack (auto-ack) mode")
    p.add_argument("--duration", type=_positive_float, default=10.0, help="measured seconds")
    p.add_argument("--warmup", type=float, default=1.0, help="seconds run before measuring")
    p.add_argument(
        "--queue",
        default=None,
        help="queue name (default perf-<random>, deleted at the end; a named queue is kept)",
    )
    p.add_argument("--persistent", action="store_true", help="delivery_mode 2 and a durable queue")
    p.add_argument(
        "--fanout",
        type=_non_negative_int,
        default=0,
        help="publish to a fanout exchange bound to N queues; consumers are spread "
        "over them (0 = publish straight to one queue)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument(
        "--rate", type=_non_negative_int, default=0, help="per-producer msg/s cap, 0 = unlimited"
    )
    return p


def config_from_args(args: argparse.Namespace, parser: argparse.ArgumentParser) -> PerfConfig:
    multi_ack = args.multi_ack
    if not args.no_ack:
        if multi_ack == 0:
            parser.error("--multi-ack must be >= 1 (use --no-ack for auto-ack)")
        if args.prefetch and multi_ack > args.prefetch:
            # Acking only every N deliveries with fewer than N in flight would stall.
            parser.error("--multi-ack must not exceed --prefetch")
    if args.warmup < 0:
        parser.error("--warmup must be >= 0")
    try:
        AmqpUri.parse(args.uri)
    except ValueError as exc:
        parser.error(str(exc))
    generated = args.queue is None
    return PerfConfig(
        uri=args.uri,
        producers=args.producers,
        consumers=args.consumers,
        size=args.size,
        confirm=args.confirm,
        prefetch=args.prefetch,
        multi_ack=multi_ack,
        no_ack=args.no_ack,
        duration=args.duration,
        warmup=args.warmup,
        queue=f"perf-{secrets.token_hex(6)}" if generated else args.queue,
        queue_generated=generated,
        persistent=args.persistent,
        rate=args.rate,
        fanout=args.fanout,
    )


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    cfg = config_from_args(args, parser)
    if cfg.producers + cfg.consumers == 0:
        parser.error("nothing to run: --producers and --consumers are both 0")
    try:
        report = run_perf(cfg)
    except KeyboardInterrupt:
        print("shoal perf: interrupted", file=sys.stderr)
        return 130
    if args.json:
        print(json.dumps(report, sort_keys=True))
    else:
        print(format_human(report))
    if report.get("fatal") or report.get("errors"):
        return 1
    return 0
