"""Queue types and quorum queues on one node (issue 15, item 4), without IO:
x-queue-type, a quorum queue's declare rules and texts (RabbitMQ 3.10.8's,
measured), delivery limits (RabbitMQ 4's default of 20 for quorum queues;
on classic queues too, as LavinMQ has them) and the dead-letter strategy.

A quorum queue here is a durable classic queue that keeps a delivery count
per message (the x-delivery-count header) and dead-letters a message
returned more often than its delivery limit. It is not replicated.
"""

from __future__ import annotations

from typing import Any

from shoal.broker.amqp import errors
from shoal.broker.amqp.x_arguments import replicated_properties

CLASSIC, QUORUM, STREAM = "classic", "quorum", "stream"
QUEUE_TYPE = "rabbit_quorum_queue"
CLASSIC_QUEUE_TYPE = "rabbit_classic_queue"
DEFAULT_DELIVERY_LIMIT = 20  # RabbitMQ 4's for quorum queues (3.10 had none)
# Arguments a quorum queue refuses (RabbitMQ 3.10: priorities came in 4.0).
UNSUPPORTED = (
    "x-max-priority",
    "x-queue-mode",
    "x-queue-version",
    "x-queue-master-locator",
    "x-capacity",
    "x-flow-resume-capacity",
)
# Arguments of quorum and stream queues a classic queue refuses (RabbitMQ
# 3.10, measured; x-delivery-limit is Shoal's on classic queues too).
CLASSIC_UNSUPPORTED = (
    "x-quorum-initial-group-size",
    "x-max-in-memory-length",
    "x-max-in-memory-bytes",
    "x-max-age",
    "x-stream-max-segment-size-bytes",
    "x-initial-cluster-size",
)
AT_MOST_ONCE, AT_LEAST_ONCE = "at-most-once", "at-least-once"


def _text(value: Any) -> Any:
    return value.decode(errors="replace") if isinstance(value, bytes) else value


def queue_type(name: bytes, vhost: str, arguments: dict[str, Any]) -> str:
    """x-queue-type: classic (the default), quorum or stream."""
    kind = _text(arguments.get("x-queue-type", CLASSIC))
    if kind not in (CLASSIC, QUORUM, STREAM):
        raise errors.ChannelError(
            errors.PRECONDITION_FAILED,
            f"invalid arg 'x-queue-type' for queue '{name.decode()}' in vhost '{vhost}': "
            f"\"unsupported queue type '{kind}'\"",
        )
    return str(kind)


def check_classic(name: bytes, vhost: str, arguments: dict[str, Any]) -> None:
    """A classic queue's declare: other types' arguments refused."""
    for key in CLASSIC_UNSUPPORTED:
        if key in arguments:
            raise errors.ChannelError(
                errors.PRECONDITION_FAILED,
                f"invalid arg '{key}' for queue '{name.decode(errors='replace')}' in vhost "
                f"'{vhost}' of queue type {CLASSIC_QUEUE_TYPE}",
            )


def check_declare(
    name: bytes,
    vhost: str,
    arguments: dict[str, Any],
    durable: bool,
    exclusive: bool,
    auto_delete: bool,
) -> None:
    """A quorum queue's declare, in RabbitMQ 3.10's order and words."""
    where = f"queue '{name.decode(errors='replace')}' in vhost '{vhost}'"
    for key in UNSUPPORTED:
        if key in arguments:
            raise errors.ChannelError(
                errors.PRECONDITION_FAILED,
                f"invalid arg '{key}' for {where} of queue type {QUEUE_TYPE}",
            )
    replicated_properties(name, vhost, durable, exclusive, auto_delete)


def dead_letter_strategy(name: bytes, vhost: str, arguments: dict[str, Any], kind: str) -> str:
    """x-dead-letter-strategy: quorum queues only. At-least-once holds only
    with x-overflow reject-publish and a dead-letter exchange (else, as
    RabbitMQ, at-most-once)."""
    value = arguments.get("x-dead-letter-strategy")
    where = f"invalid arg 'x-dead-letter-strategy' for queue '{name.decode()}' in vhost '{vhost}'"
    if value is None:
        return AT_MOST_ONCE
    if kind != QUORUM:
        raise errors.ChannelError(
            errors.PRECONDITION_FAILED, f"{where} of queue type {CLASSIC_QUEUE_TYPE}"
        )
    if _text(value) not in (AT_MOST_ONCE, AT_LEAST_ONCE):
        raise errors.ChannelError(errors.PRECONDITION_FAILED, f"{where}: invalid_dlx_strategy")
    return AT_LEAST_ONCE if at_least_once(arguments) else AT_MOST_ONCE


def at_least_once(arguments: dict[str, Any]) -> bool:
    """Whether a quorum queue's (checked) arguments make its dead-lettering
    at-least-once: asked for, with x-overflow reject-publish and a
    dead-letter exchange (RabbitMQ falls back to at-most-once otherwise)."""
    return (
        _text(arguments.get("x-dead-letter-strategy")) == AT_LEAST_ONCE
        and _text(arguments.get("x-overflow")) == "reject-publish"
        and "x-dead-letter-exchange" in arguments
    )


def delivery_limit_word(name: bytes, vhost: str, arguments: dict[str, Any], kind: str) -> int:
    """The queue record's Q_DELIVERY_LIMIT word: 0 deliveries not counted,
    1 counted with no limit, limit + 2. Quorum queues always count (limit 20
    unless x-delivery-limit says otherwise, -1 none; a value RabbitMQ 3.10
    ignores, it ignores); classic queues count only with a limit."""
    value = arguments.get("x-delivery-limit")
    limit = value if isinstance(value, int) and not isinstance(value, bool) else None
    if kind == QUORUM:
        if limit is None:
            return DEFAULT_DELIVERY_LIMIT + 2
        return 1 if limit < 0 else limit + 2
    if value is None:
        return 0
    if limit is None or limit < -1:
        raise errors.ChannelError(
            errors.PRECONDITION_FAILED,
            f"invalid arg 'x-delivery-limit' for queue '{name.decode()}' in vhost '{vhost}': "
            f"a delivery limit is an integer, -1 for none (got {value!r})",
        )
    return 0 if limit == -1 else limit + 2
