"""Message deduplication's arguments and headers, as pure functions (no IO):
the API of RabbitMQ's message-deduplication plugin and of LavinMQ.

- an exchange of type `x-message-deduplication` (the plugin: routes as
  fanout, `x-cache-size` required), or any exchange declared with
  `x-message-deduplication: true` (LavinMQ);
- a queue declared with `x-message-deduplication: true`;
- `x-cache-size` (entries), `x-cache-ttl` (ms), `x-cache-persistence`
  (`memory` or `disk`; a durable queue's cache is always on disk);
- per message: the `x-deduplication-header` header (its value is the key)
  and an optional `x-cache-ttl` header overriding the cache's TTL.

The cache itself is shm/dedup.py; the publish path workers/dedup.py.
"""

from __future__ import annotations

import hashlib
from typing import Any, NamedTuple

import msgspec

from shoal.broker.amqp import errors

EXCHANGE_TYPE = "x-message-deduplication"
ARGUMENT = "x-message-deduplication"
HEADER = "x-deduplication-header"
HEADER_BYTES = HEADER.encode()
TTL_HEADER = "x-cache-ttl"
# A queue's or a LavinMQ-style exchange's cache when x-cache-size is not given.
DEFAULT_SIZE = 100_000
MAX_SIZE = 10_000_000  # shm/dedup.py MAX_SIZE


class DedupSpec(NamedTuple):
    size: int  # entries
    ttl_ms: int  # 0: keys never expire (only the oldest go when it is full)
    disk: bool


def deduplicates(type_: str, arguments: dict[str, Any]) -> bool:
    """Whether an exchange (of type `type_`, with `arguments`) has a cache."""
    return type_ == EXCHANGE_TYPE or arguments.get(ARGUMENT) is True


def exchange_spec(type_: str, arguments: dict[str, Any]) -> DedupSpec | None:
    """The cache of an exchange being declared, or None: it deduplicates
    nothing. Raises PRECONDITION_FAILED with the plugin's texts."""
    if not deduplicates(type_, arguments):
        return None
    size = _positive(arguments, "x-cache-size", "Missing or invalid argument, ")
    if size is None:
        if type_ == EXCHANGE_TYPE:  # required by the plugin's exchange type
            raise _invalid("Missing or invalid argument, ", "x-cache-size")
        size = DEFAULT_SIZE
    return DedupSpec(size, _ttl(arguments), _persistence(arguments))


def queue_spec(arguments: dict[str, Any], durable: bool) -> DedupSpec | None:
    """The cache of a queue being declared, or None."""
    value = arguments.get(ARGUMENT)
    if value is None or value is False:
        return None
    if value is not True:
        raise errors.ChannelError(
            errors.PRECONDITION_FAILED,
            f"Invalid argument, '{ARGUMENT}' must be a boolean",
        )
    size = _positive(arguments, "x-cache-size", "Invalid argument, ") or DEFAULT_SIZE
    return DedupSpec(size, _ttl(arguments), durable or _persistence(arguments))


def _positive(arguments: dict[str, Any], key: str, lead: str) -> int | None:
    value = arguments.get(key)
    if value is None:
        return None
    if isinstance(value, (str, bytes)):
        try:
            value = int(value)
        except ValueError:
            raise _invalid(lead, key) from None
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise _invalid(lead, key)
    if key == "x-cache-size" and value > MAX_SIZE:
        raise errors.ChannelError(
            errors.PRECONDITION_FAILED,
            f"Invalid argument, 'x-cache-size' must be at most {MAX_SIZE}",
        )
    return value


def _ttl(arguments: dict[str, Any]) -> int:
    return _positive(arguments, "x-cache-ttl", "Invalid argument, ") or 0


def _persistence(arguments: dict[str, Any]) -> bool:
    value = arguments.get("x-cache-persistence")
    if isinstance(value, bytes):
        value = value.decode(errors="replace")
    if value is None or value == "memory":
        return False
    if value == "disk":
        return True
    raise errors.ChannelError(
        errors.PRECONDITION_FAILED,
        "Invalid argument, 'x-cache-persistence' must be either 'disk' or 'memory'",
    )


def _invalid(lead: str, key: str) -> errors.ChannelError:
    return errors.ChannelError(
        errors.PRECONDITION_FAILED, f"{lead}'{key}' must be an integer greater than 0"
    )


def message_key(headers: dict[str, Any]) -> tuple[bytes, int] | None:
    """(key, TTL override in ms, 0: none) of a message's headers, or None
    when it carries no x-deduplication-header (it is not checked). The key
    keeps the value's type: the string "5" and the integer 5 differ, as
    they do for the plugin (Erlang terms) and LavinMQ."""
    value = headers.get(HEADER)
    if value is None:
        return None
    if isinstance(value, str):
        key = b"s" + value.encode()
    elif isinstance(value, bytes):
        key = b"s" + value  # a longstr pamqp left undecoded: the same key
    else:
        key = b"v" + msgspec.msgpack.encode(value)
    ttl = headers.get(TTL_HEADER)
    if isinstance(ttl, (str, bytes)):
        try:
            ttl = int(ttl)
        except ValueError:
            ttl = 0
    if not isinstance(ttl, int) or isinstance(ttl, bool) or ttl <= 0:
        ttl = 0
    return key, ttl


def cache_file(kind: str, vhost: str, name: str, incarnation: int) -> str:
    """The file name of a cache: `kind` "q" or "x", then a digest of where
    it lives (names may hold any byte), then which declare made it (a queue
    deleted and declared again starts with an empty cache)."""
    digest = hashlib.sha256(f"{vhost}\0{name}".encode()).hexdigest()[:32]
    return f"{kind}-{digest}-{incarnation:x}.cache"


# Field value sizes of the AMQP 0-9-1 table types RabbitMQ uses (errata),
# fixed-size ones; S, x (u32 length), s (u8 length), A, F (u32 length) and
# D (1 + 4) are handled in _skip.
_FIXED = {
    ord("t"): 1,
    ord("b"): 1,
    ord("B"): 1,
    ord("U"): 2,
    ord("u"): 2,
    ord("I"): 4,
    ord("i"): 4,
    ord("L"): 8,
    ord("l"): 8,
    ord("f"): 4,
    ord("d"): 8,
    ord("D"): 5,
    ord("T"): 8,
    ord("V"): 0,
}
_NAME = bytes([len(HEADER_BYTES)]) + HEADER_BYTES
SLOW = (b"", -1)  # fast_key's answer when the full parse must decide


def fast_key(raw_header: bytes) -> tuple[bytes, int] | None:
    """message_key() of a raw content header without decoding it, for the
    common case: the header's value a longstr and no x-cache-ttl header.
    None: no key; SLOW: decode the headers (message_headers) and ask
    message_key()."""
    if len(raw_header) < 14:
        return None
    flags = raw_header[12] << 8 | raw_header[13]
    if not flags & 0x2000:
        return None  # no headers table
    if flags & 1:
        return SLOW  # (continuation flags: never sent for class 60)
    pos = 14
    try:
        for bit in (0x8000, 0x4000):  # content-type, content-encoding
            if flags & bit:
                pos += 1 + raw_header[pos]
        end = pos + 4 + int.from_bytes(raw_header[pos : pos + 4], "big")
        pos += 4
        if raw_header.find(b"x-cache-ttl", pos, end) >= 0:
            return SLOW
        while pos < end:
            name_end = pos + 1 + raw_header[pos]
            kind = raw_header[name_end]
            if raw_header.startswith(_NAME, pos):
                if kind != 0x53:  # "S": a longstr; other types the full parse
                    return SLOW
                n = int.from_bytes(raw_header[name_end + 1 : name_end + 5], "big")
                start = name_end + 5
                return b"s" + raw_header[start : start + n], 0
            pos = _skip(raw_header, name_end)
    except (IndexError, KeyError):
        return SLOW  # malformed or exotic: the full parse decides
    return None


def _skip(raw: bytes, at: int) -> int:
    """The offset after the field value whose type byte is at `at`."""
    kind = raw[at]
    if kind in (0x53, 0x78, 0x41, 0x46):  # S, x, A, F: u32 length
        return at + 5 + int.from_bytes(raw[at + 1 : at + 5], "big")
    if kind == 0x73:  # s: u8 length
        return at + 2 + raw[at + 1]
    return at + 1 + _FIXED[kind]
