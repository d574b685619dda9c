"""Stream queues without IO: their declare arguments, the x-stream-offset
of a consumer, and the x-stream-offset header added to each stored message
(docs/streams.md). RabbitMQ 3.10's rules and texts where it has them.
"""

from __future__ import annotations

import datetime
import re
import struct
from typing import Any, NamedTuple

from shoal.broker.amqp import errors
from shoal.broker.amqp.x_arguments import field_type, non_negative

# RabbitMQ's default segment size (x-stream-max-segment-size-bytes).
DEFAULT_SEGMENT_BYTES = 500_000_000
# Arguments of classic queues that a stream does not have: RabbitMQ 3.10
# refuses them on a stream declare.
UNSUPPORTED = (
    "x-max-length",
    "x-max-priority",
    "x-message-ttl",
    "x-dead-letter-exchange",
    "x-dead-letter-routing-key",
    "x-overflow",
    "x-expires",
    "x-single-active-consumer",
    "x-delivery-limit",
    "x-queue-mode",
    "x-capacity",
    "x-flow-resume-capacity",
)

_AGE_UNITS_MS = {
    "Y": 365 * 86_400_000,
    "M": 30 * 86_400_000,
    "D": 86_400_000,
    "h": 3_600_000,
    "m": 60_000,
    "s": 1_000,
}
_AGE = re.compile(r"^([0-9]+)([YMDhms])$")


def is_stream(arguments: dict[str, Any]) -> bool:
    kind = arguments.get("x-queue-type")
    if isinstance(kind, bytes):
        kind = kind.decode(errors="replace")
    return kind == "stream"


def parse_age(text: str) -> int | None:
    """A RabbitMQ age ("7D", "12h", "30m", "10s", "1Y", "1M") in ms; None
    if it is not one."""
    match = _AGE.match(text)
    if match is None:
        return None
    return int(match.group(1)) * _AGE_UNITS_MS[match.group(2)]


class StreamArguments(NamedTuple):
    max_bytes: int  # 0: none
    max_age_ms: int  # 0: none
    segment_bytes: int


def declare_arguments(
    name: bytes,
    vhost: str,
    arguments: dict[str, Any],
    durable: bool,
    exclusive: bool,
    auto_delete: bool,
) -> StreamArguments:
    """A stream declare's checks: durable, not exclusive nor auto-delete,
    and only the arguments a stream has."""
    qname = name.decode(errors="replace")
    where = f"queue '{qname}' in vhost '{vhost}'"
    if not durable:
        raise errors.ChannelError(
            errors.PRECONDITION_FAILED, f"invalid property 'non-durable' for {where}"
        )
    if exclusive:
        raise errors.ChannelError(
            errors.PRECONDITION_FAILED, f"invalid property 'exclusive-owner' for {where}"
        )
    if auto_delete:
        raise errors.ChannelError(
            errors.PRECONDITION_FAILED, f"invalid property 'auto-delete' for {where}"
        )
    for key in UNSUPPORTED:
        if key in arguments:
            raise errors.ChannelError(
                errors.PRECONDITION_FAILED, f"invalid arg '{key}' for {where}"
            )
    max_bytes = non_negative(name, vhost, arguments, "x-max-length-bytes") or 0
    segment = non_negative(name, vhost, arguments, "x-stream-max-segment-size-bytes")
    age = arguments.get("x-max-age")
    age_ms = 0
    if age is not None:
        text = age.decode(errors="replace") if isinstance(age, bytes) else age
        parsed = parse_age(text) if isinstance(text, str) else None
        if parsed is None:
            raise errors.ChannelError(
                errors.PRECONDITION_FAILED,
                f"invalid arg 'x-max-age' for {where}: "
                + (
                    f"{{invalid_max_age,{text}}}"
                    if isinstance(text, str)
                    else f"{{unacceptable_type,{field_type(age)}}}"
                ),
            )
        age_ms = parsed
    return StreamArguments(max_bytes, age_ms, segment or DEFAULT_SEGMENT_BYTES)


# --------------------------------------------------------------- consumers
FIRST, LAST, NEXT, OFFSET, TIMESTAMP = "first", "last", "next", "offset", "timestamp"


class StartSpec(NamedTuple):
    """Where a stream consumer starts: FIRST, LAST, NEXT, OFFSET (value: the
    offset) or TIMESTAMP (value: ms since the epoch)."""

    kind: str
    value: int = 0


def start_spec(arguments: dict[str, Any], now_ms: int) -> StartSpec:
    """A consumer's x-stream-offset (default: next, as RabbitMQ)."""
    value = arguments.get("x-stream-offset")
    if value is None:
        return StartSpec(NEXT)
    if isinstance(value, bool):
        raise _invalid_offset(value)
    if isinstance(value, int):
        if value < 0:
            raise _invalid_offset(value)
        return StartSpec(OFFSET, value)
    if isinstance(value, datetime.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=datetime.UTC)
        return StartSpec(TIMESTAMP, int(value.timestamp() * 1000))
    if isinstance(value, bytes):
        value = value.decode(errors="replace")
    if isinstance(value, str):
        if value in (FIRST, LAST, NEXT):
            return StartSpec(value)
        age = parse_age(value)
        if age is not None:
            return StartSpec(TIMESTAMP, now_ms - age)
    raise _invalid_offset(value)


def _invalid_offset(value: object) -> errors.ChannelError:
    return errors.ChannelError(
        errors.PRECONDITION_FAILED,
        f"invalid arg 'x-stream-offset' for consumer: {value!r}",
        60,
        20,
    )


# ---------------------------------------------------- the offset header
_HEADERS_FLAG = 0x2000
_CONTENT_TYPE_FLAG = 0x8000
_CONTENT_ENCODING_FLAG = 0x4000
_OFFSET_KEY = b"\x0fx-stream-offset"
_LONG = struct.Struct(">q")


def with_offset(header: bytes | memoryview, offset: int) -> bytes:
    """A content header payload (class, weight, body size, flags,
    properties) with `x-stream-offset` (a signed 64-bit integer, as
    RabbitMQ sends it) appended to its headers table, made if it had none."""
    raw = bytes(header)
    flags = int.from_bytes(raw[12:14], "big")
    pos = 14
    if flags & _CONTENT_TYPE_FLAG:
        pos += 1 + raw[pos]
    if flags & _CONTENT_ENCODING_FLAG:
        pos += 1 + raw[pos]
    entry = _OFFSET_KEY + b"l" + _LONG.pack(offset)
    if flags & _HEADERS_FLAG:
        size = int.from_bytes(raw[pos : pos + 4], "big")
        end = pos + 4 + size
        return b"".join(
            (
                raw[:pos],
                (size + len(entry)).to_bytes(4, "big"),
                raw[pos + 4 : end],
                entry,
                raw[end:],
            )
        )
    flags |= _HEADERS_FLAG
    return b"".join(
        (
            raw[:12],
            flags.to_bytes(2, "big"),
            raw[14:pos],
            len(entry).to_bytes(4, "big"),
            entry,
            raw[pos:],
        )
    )
