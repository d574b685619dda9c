"""Stream queues without IO: their declare arguments, the x-stream-offset
of a consumer, and the x-stream-offset header added to each stored message
(docs/streams.md). RabbitMQ 3.10's rules and texts where it has them.
"""

from __future__ import annotations

import datetime
import re
from typing import Any, NamedTuple

from shoal.broker.amqp import errors, properties
from shoal.broker.amqp.x_arguments import field_type, not_integer, replicated_properties

# RabbitMQ's default segment size (x-stream-max-segment-size-bytes).
DEFAULT_SEGMENT_BYTES = 500_000_000
# Arguments of other queue types: RabbitMQ 3.10 refuses them on a stream
# declare (after checking the stream's own), whatever their value.
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
    "x-queue-version",
    "x-queue-master-locator",
    "x-max-in-memory-length",
    "x-capacity",
    "x-flow-resume-capacity",
)
MAX_SEGMENT_BYTES = 3_000_000_000  # RabbitMQ's ceiling for x-stream-max-segment-size-bytes
QUEUE_TYPE = "rabbit_stream_queue"

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
    """A RabbitMQ age ("7D", "12h", "30m", "10s", "1Y", "1M": a positive
    integer and a unit) in ms; None if it is not one."""
    match = _AGE.match(text)
    if match is None or not int(match.group(1)):
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
    """A stream declare's checks, in RabbitMQ 3.10's order and words:
    durable, not exclusive nor auto-delete, the stream's own arguments, then
    the arguments of other queue types."""
    where = f"queue '{name.decode(errors='replace')}' in vhost '{vhost}'"
    replicated_properties(name, vhost, durable, exclusive, auto_delete)
    max_bytes = _integer(arguments, "x-max-length-bytes", where)
    segment = _integer(arguments, "x-stream-max-segment-size-bytes", where)
    if segment is not None and segment > MAX_SEGMENT_BYTES:
        raise errors.ChannelError(
            errors.PRECONDITION_FAILED,
            "Exceeded max value for x-stream-max-segment-size-bytes",
        )
    age = arguments.get("x-max-age")
    age_ms = 0
    if age is not None:
        if not isinstance(age, (str, bytes)):
            raise errors.ChannelError(
                errors.PRECONDITION_FAILED,
                f"invalid arg 'x-max-age' for {where}: {{unacceptable_type,{field_type(age)}}}",
            )
        text = age.decode(errors="replace") if isinstance(age, bytes) else age
        parsed = parse_age(text)
        if parsed is None:
            raise errors.ChannelError(
                errors.PRECONDITION_FAILED, f"invalid arg 'x-max-age' for {where}: invalid_max_age"
            )
        age_ms = parsed
    for key in UNSUPPORTED:
        if key in arguments:
            raise errors.ChannelError(
                errors.PRECONDITION_FAILED,
                f"invalid arg '{key}' for {where} of queue type {QUEUE_TYPE}",
            )
    return StreamArguments(max_bytes or 0, age_ms, segment or DEFAULT_SEGMENT_BYTES)


def server_named_refused() -> errors.ChannelError:
    return errors.ChannelError(
        errors.PRECONDITION_FAILED,
        f"Cannot declare a server-named queue for type {QUEUE_TYPE}",
    )


def _integer(arguments: dict[str, Any], key: str, where: str) -> int | None:
    """A stream's integer argument, in RabbitMQ's words when it is not one."""
    value = arguments.get(key)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool):
        raise errors.ChannelError(
            errors.PRECONDITION_FAILED,
            f"invalid arg '{key}' for {where}: {not_integer(value)}",
        )
    if value < 0:
        raise errors.ChannelError(
            errors.PRECONDITION_FAILED,
            f"invalid arg '{key}' for {where}: {{value_negative,{value}}}",
        )
    return value


def not_supported(
    what: str, name: bytes, vhost: str, class_id: int, method_id: int
) -> errors.ConnectionError_:
    """basic.get and queue.purge on a stream: RabbitMQ closes the connection."""
    return errors.ConnectionError_(
        errors.NOT_IMPLEMENTED,
        f"{what} not supported by stream queues queue '{name.decode(errors='replace')}' "
        f"in vhost '{vhost}'",
        class_id,
        method_id,
    )


# --------------------------------------------------------------- consumers
FIRST, LAST, NEXT, OFFSET, TIMESTAMP = "first", "last", "next", "offset", "timestamp"


class StartSpec(NamedTuple):
    """Where a stream consumer starts: FIRST, LAST, NEXT, OFFSET (value: the
    offset) or TIMESTAMP (value: ms since the epoch)."""

    kind: str
    value: int = 0


def start_spec(arguments: dict[str, Any], now_ms: int, name: bytes, vhost: str) -> StartSpec:
    """A consumer's x-stream-offset (default: next, as RabbitMQ). A
    negative offset means the first, as in RabbitMQ."""
    value = arguments.get("x-stream-offset")
    if value is None:
        return StartSpec(NEXT)
    if isinstance(value, bool):
        raise _invalid_offset(value, name, vhost)
    if isinstance(value, int):
        return StartSpec(OFFSET, value) if value >= 0 else StartSpec(FIRST)
    if isinstance(value, datetime.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=datetime.UTC)
        return StartSpec(TIMESTAMP, int(value.timestamp() * 1000))
    text = value.decode(errors="replace") if isinstance(value, bytes) else value
    if isinstance(text, str):
        if text in (FIRST, LAST, NEXT):
            return StartSpec(text)
        age = parse_age(text)
        if age is not None:
            return StartSpec(TIMESTAMP, now_ms - age)
    raise _invalid_offset(value, name, vhost)


def _invalid_offset(value: object, name: bytes, vhost: str) -> errors.ChannelError:
    if isinstance(value, (str, bytes)):
        raw = value.encode() if isinstance(value, str) else value
        shown = f'{{longstr,<<"{raw.decode(errors="replace")}">>}}'
    else:
        shown = f"{{{field_type(value)},{value}}}"
    return errors.ChannelError(
        errors.PRECONDITION_FAILED,
        f"invalid arg 'x-stream-offset' for queue '{name.decode(errors='replace')}' in vhost "
        f"'{vhost}': {{invalid_stream_offset_arg,{shown}}}",
        60,
        20,
    )


# ---------------------------------------------------------------- filtering
_FILTER_KEY = b"\x15x-stream-filter-value"


def filter_value(header: bytes | memoryview) -> bytes:
    """A stored message's `x-stream-filter-value` header (a string; b"":
    none), found without decoding the properties: the writer reads it once
    per message so that filtering readers never decode headers. A key that
    only looks like it (inside another value) is told apart by its type byte
    and length; a false find costs nothing but a missed filter value."""
    raw = bytes(header)
    at = raw.find(_FILTER_KEY)
    if at < 0:
        return b""
    at += len(_FILTER_KEY)
    kind = raw[at : at + 1]
    if kind == b"S":
        size = int.from_bytes(raw[at + 1 : at + 5], "big")
        return raw[at + 5 : at + 5 + size][:255]
    if kind == b"s":
        size = raw[at + 1]
        return raw[at + 2 : at + 2 + size]
    return b""


class FilterSpec(NamedTuple):
    """A consumer's x-stream-filter (the values it wants) and
    x-stream-match-unfiltered (also messages without a value)."""

    values: frozenset[bytes]
    match_unfiltered: bool

    def accepts(self, value: bytes) -> bool:
        return value in self.values if value else self.match_unfiltered


def filter_spec(arguments: dict[str, Any], name: bytes, vhost: str) -> FilterSpec | None:
    """x-stream-filter: a string or an array of strings (as RabbitMQ 3.13+);
    None: no filtering. Shoal filters exactly, per message (RabbitMQ's Bloom
    filters let some others through, which its clients filter again)."""
    wanted = arguments.get("x-stream-filter")
    unfiltered = arguments.get("x-stream-match-unfiltered", False)
    where = f"queue '{name.decode(errors='replace')}' in vhost '{vhost}'"
    if wanted is None:
        return None
    items = wanted if isinstance(wanted, list) else [wanted]
    values = set()
    for item in items:
        if isinstance(item, str):
            item = item.encode()
        if not isinstance(item, bytes):
            raise _unacceptable("x-stream-filter", item, where)
        values.add(item)
    if not isinstance(unfiltered, bool):
        raise _unacceptable("x-stream-match-unfiltered", unfiltered, where)
    return FilterSpec(frozenset(values), unfiltered)


def _unacceptable(key: str, value: object, where: str) -> errors.ChannelError:
    """A consume argument of the wrong type (basic.consume's class/method)."""
    return errors.ChannelError(
        errors.PRECONDITION_FAILED,
        f"invalid arg '{key}' for {where}: {{unacceptable_type,{field_type(value)}}}",
        60,
        20,
    )


# ---------------------------------------------------- the offset header
def with_offset(header: bytes | memoryview, offset: int) -> bytes:
    """A content header payload with `x-stream-offset` (a signed 64-bit
    integer, as RabbitMQ sends it) added to its headers table."""
    return properties.add_header(header, properties.long_entry(b"x-stream-offset", offset))
