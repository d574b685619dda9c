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

The cache itself is shm/dedup_cache.py; the publish path workers/dedup_filter.py.
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
MAX_SIZE = 10_000_000  # shm/dedup_cache.py MAX_SIZE


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
