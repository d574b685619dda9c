"""AMQP 0-9-1 framing for the hot paths, by hand.

Publishes are precomputed byte templates and acks are built from ``struct``; incoming
frames are split over the receive buffer without copying payloads.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass

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

FRAME_HEADER_STRUCT = struct.Struct(">BHI")
U32 = struct.Struct(">I")
U64 = struct.Struct(">Q")
_CLASS_METHOD = struct.Struct(">HH")

# class_id << 16 | method_id, compared as one int in the hot paths.
BASIC_DELIVER = 0x003C003C
BASIC_ACK = 0x003C0050
BASIC_NACK = 0x003C0078

TIMESTAMP_BYTES = 8
PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"
_DELIVERY_MODE_FLAG = 0x1000  # bit 12 of Basic's property flags


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
    return FRAME_HEADER_STRUCT.pack(frame_type, channel, len(payload)) + payload + b"\xce"


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
        return self.head + U64.pack(timestamp_ns) + self.tail

    def batch(self, timestamp_ns: int, count: int) -> bytes:
        return self.message(timestamp_ns) * count


DEDUP_KEY_BYTES = 16
_HEADERS_FLAG = 0x2000  # bit 13 of Basic's property flags


@dataclass(frozen=True)
class KeyedTemplate:
    """A PublishTemplate whose messages each carry a unique
    x-deduplication-header (a 16-byte string: producer, then a counter)."""

    template: PublishTemplate
    producer: int

    def batch(self, timestamp_ns: int, first: int, count: int) -> bytes:
        head, key_at = self.template.head, self.template.head.index(b"\x00" * DEDUP_KEY_BYTES)
        before, after = head[:key_at], head[key_at + DEDUP_KEY_BYTES :]
        stamp = U64.pack(timestamp_ns) if self.template.timestamped else b""
        tail = stamp + self.template.tail
        prefix = b"%04d" % (self.producer % 10000)
        return b"".join(
            before + prefix + b"%012d" % n + after + tail for n in range(first, first + count)
        )


def build_publish_template(
    routing_key: str,
    size: int,
    *,
    exchange: str = "",
    channel: int = 1,
    persistent: bool = False,
    frame_max: int = CLIENT_FRAME_MAX,
    dedup_key: bool = False,
) -> PublishTemplate:
    """Precompute the frames of one publish of a ``size``-byte body.
    `dedup_key`: the properties carry an x-deduplication-header of 16 zero
    bytes, for KeyedTemplate to fill in."""
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
    if dedup_key:
        entry = (
            _shortstr("x-deduplication-header")
            + b"S"
            + U32.pack(DEDUP_KEY_BYTES)
            + b"\x00" * DEDUP_KEY_BYTES
        )
        flags = _HEADERS_FLAG | (_DELIVERY_MODE_FLAG if persistent else 0)
        props = struct.pack(">H", flags) + U32.pack(len(entry)) + entry
        props += b"\x02" if persistent else b""
    content_header = _frame(FRAME_HEADER, channel, struct.pack(">HHQ", 60, 0, size) + props)
    # A body frame costs 8 bytes of framing, so frame_max - 8 bytes of body fit in one.
    chunk = frame_max - 8
    pieces = [b"\x00" * min(chunk, size - start) for start in range(0, size, chunk)]
    body_frames = [_frame(FRAME_BODY, channel, piece) for piece in pieces]
    wire = method + content_header + b"".join(body_frames)
    if size < TIMESTAMP_BYTES:
        return PublishTemplate(head=wire, tail=b"", timestamped=False)
    split = len(method) + len(content_header) + FRAME_HEADER_STRUCT.size
    return PublishTemplate(
        head=wire[:split], tail=wire[split + TIMESTAMP_BYTES :], timestamped=True
    )


def encode_ack(delivery_tag: int, multiple: bool, channel: int = 1) -> bytes:
    """A Basic.Ack frame, built by hand because consumers send one per batch."""
    payload = (
        _CLASS_METHOD.pack(60, 80) + U64.pack(delivery_tag) + (b"\x01" if multiple else b"\x00")
    )
    return _frame(FRAME_METHOD, channel, payload)


def parse_deliver_tag(buf: bytes | bytearray, start: int) -> int:
    """The delivery tag of a Basic.Deliver method payload beginning at ``start``.

    It follows the consumer tag (a shortstr after class and method ids).
    """
    return U64.unpack_from(buf, start + 5 + buf[start + 4])[0]


def parse_confirm(buf: bytes | bytearray, start: int) -> tuple[int, bool]:
    """Delivery tag and ``multiple`` flag of a Basic.Ack/Basic.Nack payload."""
    return U64.unpack_from(buf, start + 4)[0], bool(buf[start + 12] & 1)


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
        unpack = FRAME_HEADER_STRUCT.unpack_from
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
