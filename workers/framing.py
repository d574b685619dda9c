"""AMQP 0-9-1 framing, sans IO: split bytes into frames, and the hot codecs.

The message path (Basic.Publish, content header, body, Basic.Ack/Nack/Reject
in; Basic.Deliver, Basic.Ack out) is parsed and built by hand with `struct`:
pamqp costs ~26 us to parse a publish and 17-31 us to build a deliver, struct
on a memoryview a few us. Everything else goes through pamqp, where the
validation is worth its cost.
"""

from __future__ import annotations

import struct
from typing import Any

from pamqp import commands
from pamqp import frame as pamqp_frame

from shoal.shm.arena import check_record_format
from shoal.workers._wire import MSG_PREFIX_SIZE, MSG_TIME_SIZE, MSG_TIMED, Lane, scan

# workers/_wire.c reads message records itself (to build deliveries).
check_record_format("workers/_wire.c", MSG_PREFIX_SIZE, MSG_TIMED, MSG_TIME_SIZE)

FRAME_METHOD = 1
FRAME_HEADER = 2
FRAME_BODY = 3
FRAME_HEARTBEAT = 8
FRAME_END = 0xCE
FRAME_END_BYTE = b"\xce"
FRAME_OVERHEAD = 8  # 7-byte header + frame end

PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"
# The 0-9 header is accepted as 0-9-1 (RabbitMQ does the same); 0-8's two
# headers are workers/amqp_0_8.py's.
ACCEPTED_HEADERS = (PROTOCOL_HEADER, b"AMQP\x01\x01\x00\x09")

# Method indexes (class_id << 16 | method_id) taken from pamqp, not typed in.
PUBLISH = commands.Basic.Publish.index
PUBLISH_ID = PUBLISH.to_bytes(4, "big")
ACK = commands.Basic.Ack.index
NACK = commands.Basic.Nack.index
REJECT = commands.Basic.Reject.index

_HEADER = struct.Struct(">BHI")
_METHOD_ID = struct.Struct(">I")
_HEADER_PREFIX = struct.Struct(">HHQ")  # class id, weight, body size
_DELIVER_TAIL = struct.Struct(">QB")
_ACK_ARGS = struct.Struct(">QB")
_HEARTBEAT = b"\x08\x00\x00\x00\x00\x00\x00\xce"

HEARTBEAT_FRAME = _HEARTBEAT


class FrameError(Exception):
    """A framing violation: the connection must close with this code."""

    def __init__(
        self, reply_code: int, reply_text: str, class_id: int = 0, method_id: int = 0
    ) -> None:
        super().__init__(reply_text)
        self.reply_code = reply_code
        self.reply_text = reply_text
        self.class_id = class_id
        self.method_id = method_id


# AMQP's smallest frame_max: the limit on every frame until connection.tune-ok
# settles the connection's (rabbit_reader's ?FRAME_MIN_SIZE: a larger
# connection.start-ok is refused, as the Java client's FrameMax tests expect).
FRAME_MIN_SIZE = 4096

# scan()'s item for a whole publish (method, content header and one body
# frame in one read): (PUBLISH_WHOLE, channel, view, start, exchange,
# routing key, bits, header, body); workers/_wire.c says more.
PUBLISH_WHOLE = 0


class FrameReader:
    """Splits a byte stream into (frame type, channel, payload) triples, and
    a whole publish into one PUBLISH_WHOLE item (workers/_wire.c `scan`).

    Payloads are memoryviews into the received chunk (no copy); they stay
    valid because the chunk they view is kept alive by them.
    """

    __slots__ = ("frame_max", "pending")

    def __init__(self, frame_max: int) -> None:
        self.frame_max = frame_max
        self.pending = b""

    def feed(self, data: bytes, lane: Lane | None = None) -> list[Any]:
        """The read's frames, a whole publish as one item; with an armed
        `lane` (workers/lane.py) the publishes it takes are no items."""
        if self.pending:
            data = self.pending + data
            self.pending = b""
        view = memoryview(data)
        frames, off, anomaly = scan(view, self.frame_max, lane)
        if anomaly:
            # A frame too large, without its end byte or of an unknown type:
            # split() raises the error, in RabbitMQ's words.
            split(data, view, off, self.frame_max, frames)
        elif off < len(data):
            self.pending = data[off:]
        return frames


def split(
    data: bytes | memoryview,
    view: memoryview,
    off: int,
    frame_max: int,
    frames: list[Any],
    most: int = -1,
) -> int:
    """Frames of `data` from `off` into `frames`, as (type, channel, payload);
    `most` of them at most (-1: all complete ones). Returns where it stopped.
    Raises FrameError for a frame that breaks the rules."""
    end = len(data)
    unpack = _HEADER.unpack_from
    while end - off >= 7 and most != 0:
        ftype, channel, size = unpack(data, off)
        # RabbitMQ forgives the 8 bytes of framing many clients leave
        # out of their sums; so do we (its error text counts them).
        if size > frame_max:
            raise FrameError(
                501,
                f"FRAME_ERROR - type {ftype}, all octets = <<>>: "
                f"{{frame_too_large,{size},{frame_max - FRAME_OVERHEAD}}}",
            )
        stop = off + 7 + size
        if stop >= end:
            break
        if data[stop] != FRAME_END:
            raise FrameError(
                501,
                f"FRAME_ERROR - type {ftype}, "
                f"{payload_snippet(bytes(data[off + 7 : stop]))}: "
                f"{{invalid_frame_end_marker,{data[stop]}}}",
            )
        if ftype not in (FRAME_METHOD, FRAME_HEADER, FRAME_BODY, FRAME_HEARTBEAT):
            raise FrameError(
                501,
                f"FRAME_ERROR - type {ftype}, {payload_snippet(bytes(data[off + 7 : stop]))}: "
                "unknown_frame",
            )
        frames.append((ftype, channel, view[off + 7 : stop]))
        off = stop + 1
        most -= 1
    return off


def publish_frames(item: tuple[Any, ...]) -> list[tuple[int, int, memoryview]]:
    """A PUBLISH_WHOLE item's three frames again, for the general path."""
    view: memoryview = item[2]
    frames: list[tuple[int, int, memoryview]] = []
    split(view, view, item[3], 1 << 32, frames, 3)
    return frames


def method_index(payload: memoryview) -> int:
    if len(payload) < 4:
        raise FrameError(502, "SYNTAX_ERROR - method frame shorter than its method id")
    return int(_METHOD_ID.unpack_from(payload, 0)[0])


def decode_method(payload: memoryview) -> Any:
    """A rare method, decoded by pamqp. Raises FrameError on bad input."""
    index = method_index(payload)
    cls = commands.INDEX_MAPPING.get(index)
    if cls is None:
        raise FrameError(
            540, f"NOT_IMPLEMENTED - unknown method class {index >> 16} method {index & 0xFFFF}"
        )
    method = cls()
    try:
        method.unmarshal(bytes(payload[4:]))
    except Exception as exc:  # pamqp raises assorted errors on truncated input
        raise FrameError(
            501,
            f"FRAME_ERROR - cannot decode {erlang_binary(bytes(payload[4:]))}",
            index >> 16,
            index & 0xFFFF,
        ) from exc
    return method


def payload_snippet(payload: bytes) -> str:
    """How rabbit_reader's frame errors show a frame's payload: `all octets
    = <<...>>` up to 16 bytes, else `first 16 octets = <<...>>`, the
    bytes as Erlang's ~p prints a binary (<<"text">> when printable)."""
    if len(payload) <= 16:
        return f"all octets = {erlang_term(payload)}"
    return f"first 16 octets = {erlang_term(payload[:16])}"


# Erlang's printable Latin-1 (io_lib:printable_latin1_list) and ~p's escapes.
_ESCAPES = {10: "\\n", 13: "\\r", 9: "\\t", 11: "\\v", 8: "\\b", 12: "\\f", 27: "\\e"}
_ESCAPES.update({34: '\\"', 92: "\\\\"})


def erlang_term(data: bytes) -> str:
    """A binary as Erlang's ~p prints it: <<"ab">>, <<0,20>>, <<>>."""
    if data and all(32 <= b <= 126 or b >= 160 or b in _ESCAPES for b in data):
        return '<<"' + "".join(_ESCAPES.get(b) or chr(b) for b in data) + '">>'
    return "<<" + ",".join(str(b) for b in data) + ">>"


def erlang_binary(data: bytes, limit: int = 64) -> str:
    """Bytes as RabbitMQ prints them in error texts: <<0,0,3>>."""
    shown = ",".join(str(b) for b in data[:limit])
    return f"<<{shown}{',...' if len(data) > limit else ''}>>"


def _shortstr(payload: memoryview, off: int) -> tuple[bytes, int]:
    n = payload[off]
    end = off + 1 + n
    if end > len(payload):
        raise IndexError("short string past the end of the frame")
    return bytes(payload[off + 1 : end]), end


def decode_publish(payload: memoryview) -> tuple[bytes, bytes, bool, bool]:
    """Basic.Publish -> (exchange, routing key, mandatory, immediate)."""
    try:
        exchange, off = _shortstr(payload, 6)  # 4-byte method id + 2-byte ticket
        routing_key, off = _shortstr(payload, off)
        bits = payload[off]
    except IndexError as exc:
        raise FrameError(502, "SYNTAX_ERROR - truncated basic.publish") from exc
    return exchange, routing_key, bool(bits & 1), bool(bits & 2)


def decode_content_header(payload: memoryview) -> tuple[int, int]:
    """Content header -> (class id, body size). The properties stay raw."""
    if len(payload) < 14:
        raise FrameError(502, "SYNTAX_ERROR - truncated content header")
    class_id, _weight, body_size = _HEADER_PREFIX.unpack_from(payload, 0)
    return class_id, body_size


def _octet_property(header: bytes, bit: int) -> int:
    """An octet property of a raw content header (delivery-mode 0x1000,
    priority 0x0800): 0 when absent.

    Properties come in flag order: content-type and content-encoding
    (shortstr), headers (table), delivery-mode (octet), then priority; only
    those before the one wanted are skipped. A header too short for what
    its flags claim counts as 0 (the message was accepted as it is)."""
    try:
        flags = header[12] << 8 | header[13]
        if not flags & bit:
            return 0
        if not flags & 0xE001 and bit == 0x1000:
            return header[14]  # delivery mode first: nothing to skip
        off = 14
        while int.from_bytes(header[off - 2 : off], "big") & 1:
            off += 2  # continuation flag words (unused in 0-9-1)
        for before in (0x8000, 0x4000):
            if flags & before:
                off += 1 + header[off]
        if flags & 0x2000:
            off += 4 + int.from_bytes(header[off : off + 4], "big")
        if bit == 0x0800 and flags & 0x1000:
            off += 1
        return header[off]
    except IndexError:
        return 0


def message_priority(header: bytes) -> int:
    """basic.properties priority of a raw content header (0 when absent)."""
    return _octet_property(header, 0x0800)


def delivery_mode(header: bytes) -> int:
    """basic.properties delivery-mode of a raw content header (2: persistent)."""
    return _octet_property(header, 0x1000)


def decode_ack(payload: memoryview) -> tuple[int, int]:
    """Basic.Ack/Nack/Reject -> (delivery tag, bits).

    Ack bits: multiple=1. Nack bits: multiple=1, requeue=2. Reject: requeue=1.
    """
    if len(payload) < 13:
        raise FrameError(502, "SYNTAX_ERROR - truncated acknowledgement")
    tag, bits = _ACK_ARGS.unpack_from(payload, 4)
    return tag, bits


def shortstr(value: bytes) -> bytes:
    return bytes((len(value),)) + value


def encode_deliver(
    channel: int,
    consumer_tag: bytes,
    delivery_tag: int,
    redelivered: bool,
    exchange: bytes,
    routing_key: bytes,
) -> bytes:
    """Basic.Deliver method frame. `consumer_tag` is already a shortstr."""
    args = b"".join(
        (
            b"\x00\x3c\x00\x3c",
            consumer_tag,
            _DELIVER_TAIL.pack(delivery_tag, 1 if redelivered else 0),
            bytes((len(exchange),)),
            exchange,
            bytes((len(routing_key),)),
            routing_key,
        )
    )
    return _HEADER.pack(FRAME_METHOD, channel, len(args)) + args + FRAME_END_BYTE


def encode_content(channel: int, header: bytes, body: bytes, frame_max: int) -> list[bytes]:
    """The content header frame (payload as the publisher sent it) and the
    body split into frames of at most frame_max bytes."""
    parts = [_HEADER.pack(FRAME_HEADER, channel, len(header)), header, FRAME_END_BYTE]
    step = frame_max - FRAME_OVERHEAD
    size = len(body)
    for off in range(0, size, step):
        chunk = body[off : off + step]
        parts += (_HEADER.pack(FRAME_BODY, channel, len(chunk)), chunk, FRAME_END_BYTE)
    return parts


def encode_ack(channel: int, delivery_tag: int, multiple: bool) -> bytes:
    """Basic.Ack from the broker (publisher confirms)."""
    return _HEADER.pack(FRAME_METHOD, channel, 13) + (
        b"\x00\x3c\x00\x50" + _ACK_ARGS.pack(delivery_tag, 1 if multiple else 0) + FRAME_END_BYTE
    )


def encode_method(channel: int, method: Any) -> bytes:
    return pamqp_frame.marshal(method, channel)


# channel.open-ok's reserved long string, empty as RabbitMQ and LavinMQ send it.
# pamqp's OpenOk can only say "0" (its default, and all its validation takes):
# CloudAMQP's amqp-client.js skips the field as 4 bytes and loses the frame.
_CHANNEL_OPEN_OK = b"\x00\x14\x00\x0b\x00\x00\x00\x00"


# access.request (AMQP 0-8's realms, still sent by old clients and codecs):
# pamqp no longer knows the class; RabbitMQ answers access.request-ok with
# ticket 1 and the channel goes on.
ACCESS_REQUEST = 0x001E000A
_ACCESS_REQUEST_OK = b"\x00\x1e\x00\x0b\x00\x01"


def encode_access_request_ok(channel: int) -> bytes:
    return _HEADER.pack(FRAME_METHOD, channel, len(_ACCESS_REQUEST_OK)) + (
        _ACCESS_REQUEST_OK + FRAME_END_BYTE
    )


def encode_channel_open_ok(channel: int) -> bytes:
    return _HEADER.pack(FRAME_METHOD, channel, len(_CHANNEL_OPEN_OK)) + (
        _CHANNEL_OPEN_OK + FRAME_END_BYTE
    )
