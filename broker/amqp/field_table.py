"""AMQP field tables at the byte level: split a table into its entries with
each value's wire bytes untouched, and build tables from entries again.

The broker rewrites a few headers of a message it dead-letters (x-death and
friends, broker/amqp/dead_letter_rules.py) and must hand every other header back
exactly as the publisher wrote it: decoding the table into Python values and
encoding it again would change wire types (a 'b' becoming an 'I', say). So
values stay raw bytes here, type letter included, and only the entries the
broker owns are decoded.
"""

from __future__ import annotations

import struct

# Fixed-size value types (RabbitMQ's, as in the 0-9-1 errata): their sizes.
_FIXED = {
    b"t": 1,
    b"b": 1,
    b"B": 1,
    b"s": 2,
    b"u": 2,
    b"U": 2,
    b"I": 4,
    b"i": 4,
    b"f": 4,
    b"l": 8,
    b"L": 8,
    b"d": 8,
    b"T": 8,
    b"D": 5,
    b"V": 0,
}
# Types whose value is a 32-bit length and that many bytes.
_SIZED = frozenset((b"S", b"x", b"A", b"F"))
_INTEGERS = {b"b": ">b", b"B": ">B", b"s": ">h", b"u": ">H", b"U": ">h", b"I": ">i", b"i": ">I"}
_INTEGERS |= {b"l": ">q", b"L": ">Q", b"T": ">Q"}

Entry = tuple[bytes, bytes]  # (name, type letter + value bytes)
# RabbitMQ's names of the types (rabbit_binary_parser), as its errors print them.
_TYPE_NAMES = {
    b"S": "longstr",
    b"I": "signedint",
    b"i": "unsignedint",
    b"D": "decimal",
    b"T": "timestamp",
    b"F": "table",
    b"A": "array",
    b"b": "byte",
    b"B": "unsignedbyte",
    b"s": "short",
    b"u": "unsignedshort",
    b"U": "short",
    b"l": "long",
    b"L": "long",
    b"f": "float",
    b"d": "double",
    b"t": "bool",
    b"x": "binary",
    b"V": "void",
}


class MalformedTable(ValueError):
    """A table whose lengths or types do not add up."""


def _value_end(data: bytes, at: int) -> int:
    """Where the typed value starting at `at` (its type letter) ends."""
    kind = data[at : at + 1]
    size = _FIXED.get(kind)
    if size is not None:
        end = at + 1 + size
    elif kind in _SIZED:
        if at + 5 > len(data):
            raise MalformedTable("truncated length")
        end = at + 5 + int.from_bytes(data[at + 1 : at + 5], "big")
    else:
        raise MalformedTable(f"unknown field type {kind!r}")
    if end > len(data):
        raise MalformedTable("value past the table's end")
    return end


def type_name(raw: bytes) -> str:
    """A raw value's type as RabbitMQ names it (`longstr`, `signedint`...)."""
    return _TYPE_NAMES.get(raw[:1], "unknown")


def entries(table: bytes) -> list[Entry]:
    """A table's body (without its 32-bit length) as (name, raw value)."""
    out, at = [], 0
    while at < len(table):
        size = table[at]
        name = table[at + 1 : at + 1 + size]
        at += 1 + size
        end = _value_end(table, at)
        out.append((name, table[at:end]))
        at = end
    return out


def array_values(raw: bytes) -> list[bytes]:
    """The raw values of an 'A' value (type letter included)."""
    body, out, at = raw[5:], [], 0
    while at < len(body):
        end = _value_end(body, at)
        out.append(body[at:end])
        at = end
    return out


def table(items: list[Entry]) -> bytes:
    """A table's body from its entries (the 32-bit length not included)."""
    return b"".join(bytes((len(name),)) + name + value for name, value in items)


def sized(kind: bytes, body: bytes) -> bytes:
    return kind + len(body).to_bytes(4, "big") + body


def longstr(value: str | bytes) -> bytes:
    return sized(b"S", value.encode() if isinstance(value, str) else value)


def long(value: int) -> bytes:
    return b"l" + struct.pack(">q", value)


def timestamp(seconds: int) -> bytes:
    return b"T" + struct.pack(">Q", seconds)


def array(values: list[bytes]) -> bytes:
    return sized(b"A", b"".join(values))


def nested(items: list[Entry]) -> bytes:
    """An 'F' value."""
    return sized(b"F", table(items))


def string_value(raw: bytes) -> bytes | None:
    """The bytes of a string value ('S' or 'x'); None for another type."""
    if raw[:1] in (b"S", b"x"):
        return raw[5:]
    return None


def integer_value(raw: bytes) -> int | None:
    """An integer value of any width; None for another type."""
    fmt = _INTEGERS.get(raw[:1])
    if fmt is None:
        return None
    value: int = struct.unpack(fmt, raw[1:])[0]
    return value
