"""A message's headers as they were on the wire, in order and with their type
letters, for comparing with what RabbitMQ 3.10 sent in the same scenario
(not a test module).

pika decodes a headers table into a dict (order and types lost), so the
content header's raw bytes are kept on each BasicProperties it decodes
(`_raw`), and decoded here independently of the broker's own code.
"""

from __future__ import annotations

import struct
from typing import Any

import pika.spec

_decode = pika.spec.BasicProperties.decode


def _keep_raw(self: Any, encoded: bytes, offset: int = 0) -> Any:
    self._raw = bytes(encoded[offset:])
    return _decode(self, encoded, offset)


pika.spec.BasicProperties.decode = _keep_raw  # type: ignore[method-assign]

_FIXED = {"b": ">b", "B": ">B", "s": ">h", "u": ">H", "I": ">i", "i": ">I", "l": ">q"}
_FIXED |= {"L": ">Q", "T": ">Q", "f": ">f", "d": ">d"}

# A field: (name, type letter, value); an array item: (type letter, value);
# a table's value is a list of fields, an array's a list of items.
Field = tuple[str, str, Any]


def _value(buf: bytes, at: int) -> tuple[str, Any, int]:
    kind = chr(buf[at])
    at += 1
    if kind in _FIXED:
        fmt = _FIXED[kind]
        return kind, struct.unpack_from(fmt, buf, at)[0], at + struct.calcsize(fmt)
    if kind == "t":
        return kind, bool(buf[at]), at + 1
    if kind == "V":
        return kind, None, at
    if kind == "D":
        return kind, (buf[at], struct.unpack_from(">i", buf, at + 1)[0]), at + 5
    size = struct.unpack_from(">I", buf, at)[0]
    body, end = buf[at + 4 : at + 4 + size], at + 4 + size
    if kind == "S":
        return kind, body.decode(), end
    if kind == "x":
        return kind, body, end
    if kind == "F":
        return kind, table(body), end
    if kind == "A":
        items, pos = [], 0
        while pos < len(body):
            item_kind, item, pos = _value(body, pos)
            items.append((item_kind, item))
        return kind, items, end
    raise ValueError(f"unknown field type {kind!r}")


def table(body: bytes) -> list[Field]:
    """A field table's body (without its length) as fields in wire order."""
    out, at = [], 0
    while at < len(body):
        size = body[at]
        name = body[at + 1 : at + 1 + size].decode()
        kind, value, at = _value(body, at + 1 + size)
        out.append((name, kind, value))
    return out


def headers(props: pika.spec.BasicProperties) -> list[Field]:
    """The headers of a message pika received, as on the wire ([] if none)."""
    raw: bytes = props._raw
    flags = struct.unpack_from(">H", raw, 0)[0]
    at = 2
    if flags & 0x8000:  # content-type
        at += 1 + raw[at]
    if flags & 0x4000:  # content-encoding
        at += 1 + raw[at]
    if not flags & 0x2000:
        return []
    size = struct.unpack_from(">I", raw, at)[0]
    return table(raw[at + 4 : at + 4 + size])


def without_times(fields: list[Field]) -> list[Field]:
    """`fields` with every timestamp value replaced by "T" (times differ per run)."""
    out: list[Field] = []
    for name, kind, value in fields:
        out.append((name, kind, _untimed(kind, value)))
    return out


def _untimed(kind: str, value: Any) -> Any:
    if kind == "T":
        return "T"
    if kind == "F":
        return without_times(value)
    if kind == "A":
        return [(k, _untimed(k, v)) for k, v in value]
    return value
