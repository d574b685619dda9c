"""AMQP 0-8, as RabbitMQ 3.10 still speaks it to a client that asks for it.

py-amqplib (Celery's and kombu's client before py-amqp), and other clients
of its age, open with the 0-8 header `AMQP 1 1 9 1` (the header of the 0-8
spec as published) or `AMQP 1 1 8 0`. RabbitMQ answers them in 0-8
(measured, 3.10.8): connection.start says 8-0 and its capabilities table is
empty (0-8's tables know no booleans: such a client fails to read one).

The rest is 0-9-1's methods but for what this module maps, on the few
paths where they differ:

- connection.close and close-ok are 10/60 and 10/61 in 0-8 (10/50 is
  connection.redirect there; 0-9-1's 10/60 is RabbitMQ's connection.blocked,
  which a 0-8 client never announced and never gets);
- channel.open-ok has no field;
- basic.consume has no arguments table.
"""

from __future__ import annotations

import struct
from typing import Any

HEADERS = (b"AMQP\x01\x01\x09\x01", b"AMQP\x01\x01\x08\x00")
PROTOCOL = "AMQP 0-8"  # Connection.protocol, as RabbitMQ's list_connections shows it

_CLOSE_0_8, _CLOSE_OK_0_8 = b"\x00\x0a\x00\x3c", b"\x00\x0a\x00\x3d"
_CLOSE, _CLOSE_OK = b"\x00\x0a\x00\x32", b"\x00\x0a\x00\x33"
_CONSUME = b"\x00\x3c\x00\x14"
_FRAME_HEAD = struct.Struct(">BHI")


def server_properties(properties: dict[str, Any]) -> dict[str, Any]:
    """connection.start's table for a 0-8 client: no capabilities."""
    return {**properties, "capabilities": {}}


def inbound(payload: memoryview) -> memoryview | bytes:
    """A channel-0 method from a 0-8 client, numbered as 0-9-1."""
    head = bytes(payload[:4])
    if head == _CLOSE_0_8:
        return _CLOSE + bytes(payload[4:])
    if head == _CLOSE_OK_0_8:
        return _CLOSE_OK + bytes(payload[4:])
    return payload


def for_client(protocol: str, frame: bytes) -> bytes:
    """A connection.close or close-ok frame (0-9-1's numbers) as the
    connection's protocol numbers it."""
    if protocol != PROTOCOL:
        return frame
    head = frame[7:11]
    if head == _CLOSE:
        return frame[:7] + _CLOSE_0_8 + frame[11:]
    if head == _CLOSE_OK:
        return frame[:7] + _CLOSE_OK_0_8 + frame[11:]
    return frame


def consume(payload: memoryview) -> memoryview | bytes:
    """basic.consume from a 0-8 client, with the arguments table 0-9-1 adds
    (empty)."""
    return bytes(payload) + b"\x00\x00\x00\x00" if bytes(payload[:4]) == _CONSUME else payload


def close_ok(protocol: str) -> bytes:
    """connection.close-ok, numbered as the connection's protocol does."""
    body = _CLOSE_OK_0_8 if protocol == PROTOCOL else _CLOSE_OK
    return _FRAME_HEAD.pack(1, 0, len(body)) + body + b"\xce"


def channel_open_ok(channel: int) -> bytes:
    """channel.open-ok without 0-9-1's reserved long string."""
    body = b"\x00\x14\x00\x0b"
    return _FRAME_HEAD.pack(1, channel, len(body)) + body + b"\xce"
