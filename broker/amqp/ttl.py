"""Message TTL as RabbitMQ defines it (issue 15, item 1), without IO: the
x-message-ttl argument's check, the `expiration` property's parse, and
when a message expires in a queue.

A message expires in a queue at publish time + the queue's TTL, or at
publish time + its own `expiration`, whichever comes first, and keeps that
time when it is requeued (RabbitMQ's classic queues do the same). Times are
wall-clock milliseconds, so a persistent message's expiry survives a restart.
"""

from __future__ import annotations

import time
from typing import Any

from shoal.broker.amqp import errors, properties
from shoal.broker.amqp.x_arguments import MAX_EXPIRY, not_integer

# A TTL of 0 means "deliverable only to a consumer ready now". A consumer
# that is ready acquires the message within a loop iteration of its publish
# (the scheduler's notify and the consumer's pull); this is how long after
# the publish such a message still counts as caught in time.
ZERO_TTL_GRACE_MS = 20


def now_ms() -> int:
    """Wall-clock milliseconds: the times messages carry (MSG_TIME)."""
    return int(time.time() * 1000)


def message_ttl(name: bytes, vhost: str, arguments: dict[str, Any]) -> int | None:
    """x-message-ttl in ms (None: none), checked as RabbitMQ 3.10's
    check_message_ttl_arg checks it."""
    value = arguments.get("x-message-ttl")
    if value is None:
        return None
    where = f"invalid arg 'x-message-ttl' for queue '{name.decode()}' in vhost '{vhost}'"
    if not isinstance(value, int) or isinstance(value, bool):
        raise errors.ChannelError(errors.PRECONDITION_FAILED, f"{where}: {not_integer(value)}")
    problem = expiry_problem(value)
    if problem:
        raise errors.ChannelError(errors.PRECONDITION_FAILED, f"{where}: {problem}")
    return value


def expiry_problem(value: int) -> str:
    """rabbit_misc:check_expiry's refusal of a TTL, as its error term reads."""
    if value < 0:
        return f"{{value_negative,{value}}}"
    if value > MAX_EXPIRY:
        return f"{{value_too_large,{value}}}"
    return ""


def expiration_ms(header: bytes) -> int | None:
    """The message's own TTL from its `expiration` property (None: none).
    A value RabbitMQ would refuse closes the channel with its text."""
    raw = properties.expiration(header)
    if raw is None:
        return None
    text = raw.decode(errors="replace")
    digits = len(text) - len(text.lstrip("+-"))
    digits += len(text[digits:]) - len(text[digits:].lstrip("0123456789"))
    if digits == 0 or not text[:digits].lstrip("+-"):
        problem = "no_integer"
    elif digits < len(text):
        problem = f'{{leftover_string,"{text[digits:]}"}}'
    else:
        problem = expiry_problem(int(text))
    if problem:
        raise errors.ChannelError(
            errors.PRECONDITION_FAILED, _wrapped(f"invalid expiration '{text}': ", problem), 60, 40
        )
    return int(text)


def _wrapped(prefix: str, term: str) -> str:
    """RabbitMQ formats this text with Erlang's ~p, which breaks a tuple
    that would pass column 80 after its first element, indenting the rest
    to the column after the brace."""
    if len(prefix) + len(term) <= 80 or "," not in term:
        return prefix + term
    head, rest = term.split(",", 1)
    return f"{prefix}{head},\n{' ' * (len(prefix) + 1)}{rest}"


def deadline(published: int, expires: int, queue_ttl_word: int) -> int:
    """When a message published at `published` (ms) with its own expiry
    time `expires` (0: none) expires in a queue whose Q_MESSAGE_TTL word is
    `queue_ttl_word` (TTL + 1; 0: none). 0: never."""
    if queue_ttl_word:
        by_queue = published + queue_ttl_word - 1
        if not expires or by_queue < expires:
            return by_queue
    return expires


def is_due(published: int, due: int, now: int, grace: int = ZERO_TTL_GRACE_MS) -> bool:
    """Whether a message with deadline `due` (0: none) has expired at `now`.
    A TTL of 0 reaches only a consumer ready now: one that takes it within
    `grace` ms (basic.get passes 0: RabbitMQ's get never sees such a message)."""
    if not due:
        return False
    if due <= published:
        return now >= published + grace
    return now >= due
