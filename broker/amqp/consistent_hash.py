"""The consistent-hash exchange, `x-consistent-hash`: RabbitMQ's plugin
(rabbitmq_consistent_hash_exchange), for spreading messages over queues by
a key so that one key always reaches one queue.

A binding's routing key is its weight, a positive integer: the exchange's
buckets are its bindings' weights laid end to end, in binding order. A
message goes to the one destination whose bucket jump consistent hashing
(Lamping and Veach) picks for its key: its routing key (the first; CC keys
do not count), or the header its exchange names in `hash-header`, or the
property in `hash-property` (correlation_id, message_id or timestamp). A
message without that header or property still has a key (its absence), as
in RabbitMQ: all of them reach one destination. Which destination a key
reaches is Shoal's own (RabbitMQ hashes Erlang terms); that a key keeps it,
that weights share keys out in proportion and that a new binding moves few
keys are the plugin's properties, kept.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from shoal.broker.amqp import errors

CONSISTENT_HASH = "x-consistent-hash"
PROPERTIES = ("correlation_id", "message_id", "timestamp")
_MASK = (1 << 64) - 1
_D = TypeVar("_D")


def check_arguments(arguments: Mapping[str, Any]) -> None:
    """exchange.declare's arguments, in the plugin's words (RabbitMQ 3.10.8,
    measured; a hash-header that is not a string crashes its channel)."""
    header, prop = arguments.get("hash-header"), arguments.get("hash-property")
    for value in (header, prop):
        if value is not None and not isinstance(value, str):
            raise errors.ConnectionError_(errors.INTERNAL_ERROR, "INTERNAL_ERROR", 0, 0)
    if header is not None and prop is not None:
        raise errors.ChannelError(
            errors.PRECONDITION_FAILED, "hash-header and hash-property are mutually exclusive"
        )
    if prop is not None and prop not in PROPERTIES:
        raise errors.ChannelError(errors.PRECONDITION_FAILED, f"Unsupported property: {prop}")


def check_weight(routing_key: str) -> None:
    """A binding's routing key: its weight, a positive integer."""
    try:
        weight = int(routing_key, 10)
    except ValueError:
        shown = f'<<"{routing_key}">>' if routing_key else "<<>>"  # (Erlang's ~p)
        raise errors.ChannelError(
            errors.PRECONDITION_FAILED, f"The binding key must be an integer: {shown}"
        ) from None
    if weight < 1:
        raise errors.ChannelError(
            errors.PRECONDITION_FAILED, "The binding key must be greater than 0"
        )


def buckets(bindings: Sequence[tuple[_D, str]]) -> list[_D]:
    """Each binding's destination, as many times as its weight, in binding
    order (a weight that does not parse counts as none: refused at bind)."""
    ring: list[_D] = []
    for dest, routing_key in bindings:
        try:
            ring += [dest] * max(0, int(routing_key, 10))
        except ValueError:
            continue
    return ring


def jump(key: int, count: int) -> int:
    """Jump consistent hash: the bucket in [0, count) of a 64-bit key; growing
    `count` by one moves a key only to the new bucket."""
    bucket, j = -1, 0
    while j < count:
        bucket = j
        key = (key * 2862933555777941757 + 1) & _MASK
        j = int((bucket + 1) * ((1 << 31) / ((key >> 33) + 1)))
    return bucket


def key_bytes(value: Any) -> bytes:
    """A hash key's bytes: a string's own, a number's digits (a timestamp as
    RabbitMQ's integer_to_binary), anything else its repr."""
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode()
    if value is None:
        return b"undefined"
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value).encode()
    return repr(value).encode()


def pick(
    ring: Sequence[_D],
    arguments: Mapping[str, Any],
    routing_key: str,
    headers: Callable[[], Mapping[str, Any]],
    properties: Callable[[], Mapping[str, Any]],
) -> _D | None:
    """The destination a message reaches (None: the exchange has no binding)."""
    if not ring:
        return None
    header = arguments.get("hash-header")
    if isinstance(header, str):
        value: Any = headers().get(header)
    elif isinstance(prop := arguments.get("hash-property"), str):
        value = properties().get(prop)
    else:
        value = routing_key
    digest = hashlib.blake2b(key_bytes(value), digest_size=8).digest()
    return ring[jump(int.from_bytes(digest, "big"), len(ring))]
