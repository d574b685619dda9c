"""The AMQP frames an MQTT client's bridge (workers/mqtt_connection.py) writes
and reads for every message, by hand, without IO: basic.publish with its
header and body frames, basic.deliver, a content header, basic.ack.

pamqp makes an object per frame and per property; a message through the
bridge crossed it four times (publish in, deliver out, both ways). These
frames have fixed layouts (AMQP 0-9-1 4.2.3, 4.2.6), and a message's
properties repeat: what an MQTT publish at a QoS carries is the same bytes
every time, and a delivery's are decoded once per distinct byte string
(`PropertiesCache`). Every other frame (the handshake, declares, binds)
still goes through pamqp.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

from pamqp import commands as C
from pamqp import header as amqp_header

FRAME_END = b"\xce"
METHOD, HEADER, BODY = 1, 2, 3
FRAME_HEAD = struct.Struct(">BHI")  # type, channel, payload size
_HEADER_START = struct.Struct(">HHQ")  # class, weight, body size
_BODY_SIZE = struct.Struct(">Q")
DELIVER = b"\x00\x3c\x00\x3c"  # basic.deliver: class 60, method 60
_ACK = b"\x00\x3c\x00\x50"  # basic.ack: 60, 80
_NACK = b"\x00\x3c\x00\x78"  # basic.nack: 60, 120
_ACK_OUT = struct.Struct(">HHQB")
# A content header frame up to its properties: type, channel, size, class,
# weight, body size; and the end of that frame with the body frame's head.
_HEADER_HEAD = struct.Struct(">BHIHHQ")
_BODY_HEAD = struct.Struct(">BBHI")
CACHE_MAX = 256  # distinct property byte strings kept decoded


class Delivered(NamedTuple):
    """basic.deliver's fields, as the bridge uses them."""

    consumer_tag: str
    delivery_tag: int
    redelivered: bool
    exchange: str
    routing_key: str


def frame(kind: int, channel: int, payload: bytes) -> bytes:
    return FRAME_HEAD.pack(kind, channel, len(payload)) + payload + FRAME_END


def properties_bytes(props: C.Basic.Properties) -> bytes:
    """A content header's property flags and list, as pamqp encodes them
    (computed once per distinct set: the caller keeps it)."""
    return bytes(amqp_header.ContentHeader(0, 0, props).marshal()[12:])


def publish(
    channel: int,
    exchange: bytes,
    routing_key: bytes,
    properties: bytes,
    payload: bytes,
    frame_max: int,
) -> bytes:
    """basic.publish (not mandatory), its content header and body frames."""
    method = publish_method(channel, exchange, routing_key)
    return with_content(method, channel, properties, payload, frame_max)


def publish_method(channel: int, exchange: bytes, routing_key: bytes) -> bytes:
    """basic.publish's method frame (not mandatory): the same bytes for every
    message to a routing key (a device's topic: kept)."""
    return frame(
        METHOD,
        channel,
        b"\x00\x3c\x00\x28\x00\x00%c%s%c%s\x00"
        % (len(exchange), exchange, len(routing_key), routing_key),
    )


def with_content(
    method: bytes, channel: int, properties: bytes, payload: bytes, frame_max: int
) -> bytes:
    """A publish's method frame, then its content header and body frames."""
    size = len(payload)
    if 0 < size <= frame_max - 8:  # the commonest: the body in one frame, in one join
        return b"".join(
            (
                method,
                _HEADER_HEAD.pack(HEADER, channel, 12 + len(properties), 60, 0, size),
                properties,
                _BODY_HEAD.pack(0xCE, BODY, channel, size),
                payload,
                FRAME_END,
            )
        )
    parts = [method, frame(HEADER, channel, _HEADER_START.pack(60, 0, len(payload)) + properties)]
    step = frame_max - 8
    for at in range(0, len(payload), step):
        parts.append(frame(BODY, channel, payload[at : at + step]))
    return b"".join(parts)


def ack_method(delivery_tag: int) -> bytes:
    """basic.ack's method payload (not multiple)."""
    return _ACK_OUT.pack(60, 80, delivery_tag, 0)


def whole_delivery(buffer: bytearray, at: int, end: int) -> tuple[bytes, bytes, bytes, int] | None:
    """The basic.deliver frame at `at` (it ends at `end`) with its content
    header and body right behind it, the body in one frame (what a run of
    deliveries writes): (method payload, header payload, body, where the
    next frame starts). None where the buffer holds less than that, or the
    body comes in several frames: then they are read one by one."""
    size = len(buffer)
    if size - end < 8:
        return None
    kind, _channel, header_size = FRAME_HEAD.unpack_from(buffer, end)
    header_end = end + 8 + header_size
    if kind != HEADER or header_end > size:
        return None
    body_size = _BODY_SIZE.unpack_from(buffer, end + 11)[0]  # (after class and weight)
    method = bytes(buffer[at + 7 : end - 1])
    header = bytes(buffer[end + 7 : header_end - 1])
    if not body_size:
        return method, header, b"", header_end
    if size - header_end < 8:
        return None
    kind, _channel, frame_size = FRAME_HEAD.unpack_from(buffer, header_end)
    body_end = header_end + 8 + body_size
    if kind != BODY or frame_size != body_size or body_end > size:
        return None  # (not all here, or in several frames)
    return method, header, bytes(buffer[header_end + 7 : body_end - 1]), body_end


def is_deliver(payload: bytes | memoryview) -> bool:
    return bytes(payload[:4]) == DELIVER


def confirm_of(payload: bytes | memoryview) -> tuple[int, bool, bool] | None:
    """basic.ack or basic.nack from the broker (a publisher confirm):
    (delivery tag, multiple, acked), or None for any other method."""
    head = bytes(payload[:4])
    if head != _ACK and head != _NACK:
        return None
    tag = int.from_bytes(payload[4:12], "big")
    return tag, bool(payload[12] & 1), head == _ACK


def deliver(payload: bytes | memoryview) -> Delivered:
    at = 4
    size = payload[at]
    consumer_tag = str(payload[at + 1 : at + 1 + size], "utf-8", "replace")
    at += 1 + size
    delivery_tag = int.from_bytes(payload[at : at + 8], "big")
    redelivered = bool(payload[at + 8] & 1)
    at += 9
    size = payload[at]
    exchange = str(payload[at + 1 : at + 1 + size], "utf-8", "replace")
    at += 1 + size
    size = payload[at]
    # (an AMQP publisher's key need not be UTF-8, an MQTT topic must: one
    # that is not must not fail its delivery on every reconnect)
    routing_key = str(payload[at + 1 : at + 1 + size], "utf-8", "replace")
    return Delivered(consumer_tag, delivery_tag, redelivered, exchange, routing_key)


class PropertiesCache:
    """Content headers' properties, decoded once per distinct byte string."""

    def __init__(self) -> None:
        self.known: dict[bytes, C.Basic.Properties] = {}

    def header(self, payload: bytes | memoryview) -> tuple[int, C.Basic.Properties]:
        """A content header frame's (body size, properties)."""
        body_size = int.from_bytes(payload[4:12], "big")
        raw = bytes(payload[12:])
        props = self.known.get(raw)
        if props is None:
            if len(self.known) >= CACHE_MAX:
                self.known.clear()
            decoded = amqp_header.ContentHeader()
            decoded.unmarshal(bytes(payload))
            props = self.known[raw] = decoded.properties
        return body_size, props
