"""Adding an entry to the headers table of a content header payload as the
client sent it (class, weight, body size, property flags, properties),
without decoding the rest: what the broker stamps on a message it hands out
(a stream's `x-stream-offset`, a delivery's `x-shoal-id`).
"""

from __future__ import annotations

import struct

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


def add_header(header: bytes | memoryview, entry: bytes) -> bytes:
    """`header` with `entry` appended to its headers table (made if it had
    none). A client decoding the table into a map sees the last entry of a
    key: the one added here."""
    raw = bytes(header)
    flags = int.from_bytes(raw[12:14], "big")
    pos = 14
    if flags & _CONTENT_TYPE_FLAG:
        pos += 1 + raw[pos]
    if flags & _CONTENT_ENCODING_FLAG:
        pos += 1 + raw[pos]
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
