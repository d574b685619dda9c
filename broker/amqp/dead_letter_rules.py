"""Dead-lettering as RabbitMQ 3.10 does it (rabbit_dead_letter), without IO:
the queue arguments' checks, the headers a dead-lettered message gets
(`x-death`, `x-first-death-*`), the routing keys it is republished with, and
the cycle rule.

What changes in a dead-lettered message (RabbitMQ's make_msg): its
`expiration` property goes (it is recorded as the x-death entry's
`original-expiration`, so the message does not expire again where it lands);
the x-death entry for (this queue, this reason) is counted up and moved to
the front, or a new one is put there; on its first death the message also
gets `x-first-death-reason` / `-queue` / `-exchange`, and on every death
`x-last-death-*` (RabbitMQ 3.13's, not in 3.10); with a dead-letter
routing key its CC header goes. Everything else, body, other properties and
other headers, stays byte for byte. RabbitMQ re-sorts the headers table by
key whenever it sets a header, and so does this.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from shoal.broker.amqp import errors, properties
from shoal.broker.amqp import field_table as F
from shoal.broker.amqp.x_arguments import field_type, integer_type

EXPIRED, REJECTED, MAXLEN, DELIVERY_LIMIT = "expired", "rejected", "maxlen", "delivery_limit"
REASONS = (EXPIRED, REJECTED, MAXLEN, DELIVERY_LIMIT)


def check_arguments(name: bytes, vhost: str, arguments: dict[str, Any]) -> None:
    """x-dead-letter-exchange and x-dead-letter-routing-key, refused as
    RabbitMQ 3.10's check_dlxname_arg / check_dlxrk_arg refuse them."""
    queue = f"queue '{name.decode()}' in vhost '{vhost}'"
    exchange = arguments.get("x-dead-letter-exchange")
    if exchange is not None and not isinstance(exchange, (str, bytes)):
        raise errors.ChannelError(
            errors.PRECONDITION_FAILED,
            f"invalid type '{_type_name(exchange)}' for arg 'x-dead-letter-exchange' in {queue}",
        )
    key = arguments.get("x-dead-letter-routing-key")
    if key is not None:
        where = f"invalid arg 'x-dead-letter-routing-key' for {queue}"
        if not isinstance(key, (str, bytes)):
            raise errors.ChannelError(
                errors.PRECONDITION_FAILED, f"{where}: {{unacceptable_type,{_type_name(key)}}}"
            )
        if exchange is None:
            raise errors.ChannelError(
                errors.PRECONDITION_FAILED, f"{where}: routing_key_but_no_dlx_defined"
            )


def _type_name(value: Any) -> str:
    if isinstance(value, int) and not isinstance(value, bool):
        return integer_type(value)
    return field_type(value)


class Target(NamedTuple):
    """Where a queue's dead letters go: the exchange ("" the default one) and
    the routing key (None: the message's own routing keys)."""

    exchange: bytes
    routing_key: bytes | None


def target(arguments: dict[str, Any]) -> Target | None:
    """A queue's dead-letter target from its (checked) arguments."""
    exchange = arguments.get("x-dead-letter-exchange")
    if exchange is None:
        return None
    key = arguments.get("x-dead-letter-routing-key")
    return Target(_raw(exchange), None if key is None else _raw(key))


def _raw(value: str | bytes) -> bytes:
    return value.encode() if isinstance(value, str) else value


class DeadLetter(NamedTuple):
    """A message ready to be republished to its queue's dead-letter exchange."""

    header: bytes  # the new content header payload
    routing_keys: list[bytes]  # the keys to route it with
    deaths: list[tuple[bytes, bytes]]  # its x-death (queue, reason) pairs, newest first


def _string_list(raw: bytes | None) -> list[bytes]:
    """The strings of an array header value (CC, BCC)."""
    if raw is None or raw[:1] != b"A":
        return []
    return [s for v in F.array_values(raw) if (s := F.string_value(v)) is not None]


def make(
    header: bytes,
    reason: str,
    queue: bytes,
    exchange: bytes,
    routing_key: bytes,
    now_s: int,
    dead_letter_key: bytes | None,
) -> DeadLetter:
    """The dead-lettered form of a message that died in `queue` for
    `reason`, published to `exchange` with `routing_key` (RabbitMQ 3.10's
    rabbit_dead_letter:make_msg). Raises ValueError for a content header
    whose lengths do not add up (the caller drops the message)."""
    prefix, values = properties.split(header)
    headers = dict(F.entries(values.get(properties.HEADERS_FLAG, b"")))
    # The first routing key is the publish's; the others its CC header's.
    death_keys = [routing_key, *_string_list(headers.get(b"CC"))]
    info: list[F.Entry] = [
        (b"reason", F.longstr(reason)),
        (b"queue", F.longstr(queue)),
        (b"time", F.timestamp(now_s)),
        (b"exchange", F.longstr(exchange)),
        (b"routing-keys", F.array([F.longstr(k) for k in death_keys])),
    ]
    expiration = values.pop(properties.EXPIRATION_FLAG, None)
    if expiration is not None:
        info.append((b"original-expiration", F.longstr(expiration)))
    old = headers.get(b"x-death")
    if old is None or old[:1] != b"A":
        headers[b"x-first-death-reason"] = F.longstr(reason)
        headers[b"x-first-death-queue"] = F.longstr(queue)
        headers[b"x-first-death-exchange"] = F.longstr(exchange)
        tables = [[(b"count", F.long(1)), *info]]
    else:
        tables = _grouped([F.entries(v[5:]) for v in F.array_values(old) if v[:1] == b"F"])
        matches = [t for t in tables if _queue_and_reason(t) == (queue, reason.encode())]
        if matches:
            current = _counted_up(matches[0])
            tables.remove(matches[0])
        else:
            current = [(b"count", F.long(1)), *info]
        tables = [sorted(current), *tables]
    headers[b"x-death"] = F.array([F.nested(t) for t in tables])
    # RabbitMQ 3.13's addition (3.10 has only the x-first-death-* ones).
    headers[b"x-last-death-reason"] = F.longstr(reason)
    headers[b"x-last-death-queue"] = F.longstr(queue)
    headers[b"x-last-death-exchange"] = F.longstr(exchange)
    if dead_letter_key is not None:
        headers.pop(b"CC", None)
    values[properties.HEADERS_FLAG] = F.table(sorted(headers.items()))
    route_keys = (
        [dead_letter_key]
        if dead_letter_key is not None
        else death_keys + _string_list(headers.get(b"BCC"))
    )
    deaths = [_queue_and_reason(t) for t in tables]
    return DeadLetter(properties.join(prefix, values), route_keys, deaths)


def _grouped(tables: list[list[F.Entry]]) -> list[list[F.Entry]]:
    """x-death entries of one queue and reason folded into the first of
    them, which counts them if it has no count of its own: a message from a
    broker before RabbitMQ's per-entry counts (rabbitmq-server#78) had one
    entry per death (RabbitMQ 3.10's group_by_queue_and_reason, which also
    reverses the entries' order; kept here, most recent first, as later
    RabbitMQ keeps it)."""
    if len(tables) < 2:
        return tables
    by_key: dict[tuple[bytes, bytes], list[list[F.Entry]]] = {}
    for table in tables:
        by_key.setdefault(_queue_and_reason(table), []).append(table)
    grouped = []
    for first, *rest in by_key.values():
        if not any(name == b"count" for name, _v in first):
            first = [(b"count", F.long(1 + len(rest))), *first]
        grouped.append(first)
    return grouped


def _queue_and_reason(items: list[F.Entry]) -> tuple[bytes, bytes]:
    fields = dict(items)
    queue = F.string_value(fields.get(b"queue", b"V")) or b""
    reason = F.string_value(fields.get(b"reason", b"V")) or b""
    return queue, reason


def _counted_up(items: list[F.Entry]) -> list[F.Entry]:
    """An x-death entry with its count + 1, a long whatever the type it
    had (RabbitMQ's increment_xdeath_event_count: its other fields stay as
    they were)."""
    out = []
    counted = False
    for name, value in items:
        if name == b"count" and (n := F.integer_value(value)) is not None:
            value = F.long(n + 1)
            counted = True
        out.append((name, value))
    return out if counted else [(b"count", F.long(1)), *out]


def is_cycle(queue: bytes, deaths: list[tuple[bytes, bytes]]) -> bool:
    """RabbitMQ's cycle rule for a message dead-lettered (for a reason other
    than a rejection) towards `queue`: it has died in `queue` before and no
    death since then, that one included, was a rejection. Such a message is
    not delivered to `queue` again (it would go round forever)."""
    for dead_in, reason in deaths:
        if reason == REJECTED.encode():
            return False
        if dead_in == queue:
            return True
    return False
