"""Adding an entry to the headers table of a content header payload as the
client sent it (class, weight, body size, property flags, properties),
without decoding the rest: what the broker stamps on a message it hands out
(a stream's `x-stream-offset`, a delivery's `x-shoal-id`).
"""

from __future__ import annotations

import struct

from shoal.broker.amqp import errors, field_table

# The basic class's properties, in their order on the wire (pika's names).
BASIC_PROPERTIES = (
    "content_type",
    "content_encoding",
    "headers",
    "delivery_mode",
    "priority",
    "correlation_id",
    "reply_to",
    "expiration",
    "message_id",
    "timestamp",
    "type",
    "user_id",
    "app_id",
    "cluster_id",
)
NUMERIC_PROPERTIES = ("delivery_mode", "priority", "timestamp")

_HEADERS_FLAG = 0x2000
_CONTENT_TYPE_FLAG = 0x8000
_CONTENT_ENCODING_FLAG = 0x4000
_LONG = struct.Struct(">q")


def long_entry(key: bytes, value: int) -> bytes:
    """A field-table entry: a signed 64-bit integer ('l')."""
    return bytes((len(key),)) + key + b"l" + _LONG.pack(value)


def string_entry(key: bytes, value: bytes) -> bytes:
    """A field-table entry: a long string ('S')."""
    return bytes((len(key),)) + key + b"S" + len(value).to_bytes(4, "big") + value


def _headers_at(raw: bytes) -> tuple[int, int]:
    """The property flags, and where the headers table is (or would be):
    after content-type and content-encoding, the only properties before it."""
    flags = int.from_bytes(raw[12:14], "big")
    pos = 14
    if flags & _CONTENT_TYPE_FLAG:
        pos += 1 + raw[pos]
    if flags & _CONTENT_ENCODING_FLAG:
        pos += 1 + raw[pos]
    return flags, pos


def add_header(header: bytes | memoryview, entry: bytes) -> bytes:
    """`header` with `entry` appended to its headers table (made if it had
    none). A client decoding the table into a map sees the last entry of a
    key: the one added here."""
    raw = bytes(header)
    flags, pos = _headers_at(raw)
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
    return b"".join(
        (
            raw[:12],
            (flags | _HEADERS_FLAG).to_bytes(2, "big"),
            raw[14:pos],
            len(entry).to_bytes(4, "big"),
            entry,
            raw[pos:],
        )
    )


_DELIVERY_MODE_FLAG = 0x1000
_PRIORITY_FLAG = 0x0800
_CORRELATION_ID_FLAG = 0x0400
REPLY_TO_FLAG = 0x0200


def _reply_to_at(raw: bytes) -> int:
    """Where the reply-to shortstr starts (the caller checked its flag)."""
    flags, pos = _headers_at(raw)
    if flags & _HEADERS_FLAG:
        pos += 4 + int.from_bytes(raw[pos : pos + 4], "big")
    if flags & _DELIVERY_MODE_FLAG:
        pos += 1
    if flags & _PRIORITY_FLAG:
        pos += 1
    if flags & _CORRELATION_ID_FLAG:
        pos += 1 + raw[pos]
    return pos


def reply_to(header: bytes) -> bytes | None:
    """The reply-to property of a content header payload (None: not set)."""
    if len(header) < 14 or not header[12] & (REPLY_TO_FLAG >> 8):
        return None
    at = _reply_to_at(header)
    return header[at + 1 : at + 1 + header[at]]


def with_reply_to(header: bytes, value: bytes) -> bytes:
    """`header` (whose reply-to is set) with reply-to replaced by `value`."""
    at = _reply_to_at(header)
    return header[:at] + bytes((len(value),)) + value + header[at + 1 + header[at] :]


EXPIRATION_FLAG = 0x0100
HEADERS_FLAG = _HEADERS_FLAG
# The basic class's properties in wire order: (flag, kind), kind being how
# the value is encoded: "s" shortstr, "t" table, "o" octet, "q" 64-bit.
_BASIC_PROPERTIES = (
    (0x8000, "s"),  # content-type
    (0x4000, "s"),  # content-encoding
    (0x2000, "t"),  # headers
    (0x1000, "o"),  # delivery-mode
    (0x0800, "o"),  # priority
    (0x0400, "s"),  # correlation-id
    (0x0200, "s"),  # reply-to
    (0x0100, "s"),  # expiration
    (0x0080, "s"),  # message-id
    (0x0040, "q"),  # timestamp
    (0x0020, "s"),  # type
    (0x0010, "s"),  # user-id
    (0x0008, "s"),  # app-id
    (0x0004, "s"),  # cluster-id
)
BASIC_PROPERTY_KINDS = _BASIC_PROPERTIES


def split(header: bytes) -> tuple[bytes, dict[int, bytes]]:
    """A content header payload as (class, weight and body size: 12 bytes;
    {flag: the property's value bytes}), each value without its length
    prefix (a table's body, a string's bytes). Raises ValueError when the
    lengths do not add up."""
    raw = bytes(header)
    flags = int.from_bytes(raw[12:14], "big")
    values: dict[int, bytes] = {}
    at = 14
    for flag, kind in _BASIC_PROPERTIES:
        if not flags & flag:
            continue
        if kind == "s":
            start, end = at + 1, at + 1 + raw[at]
        elif kind == "t":
            start = at + 4
            end = start + int.from_bytes(raw[at:start], "big")
        else:
            start, end = at, at + (1 if kind == "o" else 8)
        if end > len(raw):
            raise ValueError("content header properties past its end")
        values[flag] = raw[start:end]
        at = end
    return raw[:12], values


def join(prefix: bytes, values: dict[int, bytes]) -> bytes:
    """split()'s inverse."""
    flags = 0
    parts = [prefix, b""]
    for flag, kind in _BASIC_PROPERTIES:
        value = values.get(flag)
        if value is None:
            continue
        flags |= flag
        if kind == "s":
            parts.append(bytes((len(value),)) + value)
        elif kind == "t":
            parts.append(len(value).to_bytes(4, "big") + value)
        else:
            parts.append(value)
    parts[1] = flags.to_bytes(2, "big")
    return b"".join(parts)


USER_ID_FLAG = 0x0010


def user_id(header: bytes) -> bytes | None:
    """The user-id property of a content header payload (None: not set or
    unreadable)."""
    if len(header) < 14 or not header[13] & USER_ID_FLAG:
        return None
    try:
        return split(header)[1].get(USER_ID_FLAG)
    except ValueError:
        return None


def expiration(header: bytes) -> bytes | None:
    """The expiration property of a content header payload (None: not set)."""
    if len(header) < 14 or not header[12] & EXPIRATION_FLAG >> 8:
        return None
    return split(header)[1].get(EXPIRATION_FLAG)


def with_header(header: bytes, name: bytes, value: bytes) -> bytes:
    """`header` with header `name` set to the typed value `value`
    (broker/amqp/field_table.py), the table sorted by key as RabbitMQ's
    set_table_value leaves it."""
    prefix, values = split(header)
    items = dict(field_table.entries(values.get(HEADERS_FLAG, b"")))
    items[name] = value
    values[HEADERS_FLAG] = field_table.table(sorted(items.items()))
    return join(prefix, values)


def sender_selected(header: bytes) -> tuple[bytes, list[bytes]]:
    """RabbitMQ's sender-selected distribution: the CC and BCC headers
    (arrays of strings) name more routing keys for the publish. Returns
    the header without BCC (no queue sees it) and those keys. A byte test
    and two short searches for a message that has neither."""
    if len(header) < 14 or not header[12] & (HEADERS_FLAG >> 8):
        return header, []
    if b"\x02CC" not in header and b"\x03BCC" not in header:
        return header, []
    # Checked well formed at publish (workers/_wire.c): these parse.
    prefix, values = split(header)
    items = field_table.entries(values.get(HEADERS_FLAG, b""))
    keys: list[bytes] = []
    for name in (b"CC", b"BCC"):
        for key, value in items:
            if key == name and value[:1] != b"A":
                raise errors.ChannelError(
                    errors.PRECONDITION_FAILED,
                    "invalid message: {unacceptable_type_in_header,"
                    f'"{name.decode()}",{field_table.type_name(value)}}}',
                    60,
                    40,
                )
            if key == name:
                keys += [
                    s
                    for v in field_table.array_values(value)
                    if (s := field_table.string_value(v)) is not None
                ]
    if not any(key == b"BCC" for key, _v in items):
        return header, keys
    values[HEADERS_FLAG] = field_table.table([(k, v) for k, v in items if k != b"BCC"])
    return join(prefix, values), keys
