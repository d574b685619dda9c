"""The arguments of a basic.consume, checked as RabbitMQ checks them:
flags, x-priority, a JMS selector, and where a stream consumer starts."""

from __future__ import annotations

import time
from typing import Any, Protocol

from pamqp import commands as C

from shoal.broker.amqp import errors
from shoal.broker.amqp import stream_arguments as amqp_streams
from shoal.broker.amqp.selector import Selector, SelectorError, compile_selector
from shoal.broker.amqp.x_arguments import not_integer
from shoal.shm.queues import SharedQueues
from shoal.workers.consumer import Consumer, DeliveryChannel
from shoal.workers.levels import Levels
from shoal.workers.stream_io import StreamReading, Streams


class ConsumeContext(Protocol):
    """What a consume's checks use of the worker: the queues, the stream
    readers, and a new consumer's id."""

    @property
    def shared(self) -> SharedQueues: ...
    @property
    def streams(self) -> Streams | None: ...
    def next_cid(self) -> int: ...


def invalid(name: str, value: object) -> errors.ChannelError:
    """RabbitMQ's refusal of a consume argument."""
    return errors.ChannelError(
        errors.PRECONDITION_FAILED, f"invalid arg '{name}' for consumer: {value!r}", 60, 20
    )


def flag(args: dict[str, Any], name: str) -> bool:
    """A boolean consume argument (absent: false)."""
    value = args.get(name, False)
    if not isinstance(value, bool):
        raise invalid(name, value)
    return value


def selector(args: dict[str, Any]) -> Selector | None:
    """x-filter-jms-selector, compiled; an empty one selects everything."""
    text = args.get("x-filter-jms-selector")
    if text is None:
        return None
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    if not isinstance(text, str):
        raise invalid("x-filter-jms-selector", text)
    try:
        compiled = compile_selector(text)
    except SelectorError as exc:
        raise errors.ChannelError(errors.PRECONDITION_FAILED, str(exc), 60, 20) from None
    return compiled if text.strip() else None


def stream_reading(
    ctx: ConsumeContext,
    vhost: str,
    name: bytes,
    qid: int,
    method: C.Basic.Consume,
    args: dict[str, Any],
    prefetch: bool,
) -> StreamReading | None:
    """A consumer of a stream queue: where it starts (None: `qid` is no
    stream). RabbitMQ's rules: acknowledging consumers with a prefetch count
    (`prefetch`: its channel has one) only."""
    streams = ctx.streams
    if streams is None or not streams.words.is_stream(qid):
        return None
    where = f"queue '{name.decode(errors='replace')}' in vhost '{vhost}'"
    if "x-priority" in args:
        raise errors.ChannelError(
            errors.PRECONDITION_FAILED,
            f"invalid arg 'x-priority' for {where} of queue type rabbit_stream_queue",
            60,
            20,
        )
    if not prefetch:
        raise errors.ChannelError(
            errors.PRECONDITION_FAILED,
            f"consumer prefetch count is not set for '{where}'",
            60,
            20,
        )
    if method.no_ack:
        raise errors.ConnectionError_(
            errors.NOT_IMPLEMENTED,
            f"automatic acknowledgement not supported by stream queues {where}",
            60,
            20,
        )
    now_ms = int(time.time() * 1000)
    return StreamReading(
        amqp_streams.start_spec(args, now_ms, name, vhost),
        amqp_streams.filter_spec(args, name, vhost),
    )


def new_consumer(
    ctx: ConsumeContext,
    channel: DeliveryChannel,
    vhost: str,
    name: bytes,
    qid: int,
    tag: bytes,
    method: C.Basic.Consume,
) -> tuple[Consumer, dict[str, Any]]:
    """The consumer a basic.consume asks for, its arguments checked, and
    those arguments."""
    args = method.arguments or {}
    priority = args.get("x-priority", 0)
    if not isinstance(priority, int) or isinstance(priority, bool):
        # (RabbitMQ 3.10 checks a consumer's x-priority as a queue's integer
        # arguments, in the same words: measured on 3.10.8.)
        raise errors.ChannelError(
            errors.PRECONDITION_FAILED,
            f"invalid arg 'x-priority' for queue '{name.decode(errors='replace')}' in vhost "
            f"'{vhost}': {not_integer(priority)}",
            60,
            20,
        )
    browse, auto_close = (
        flag(args, name) for name in ("x-filter-no-consume", "x-filter-auto-close")
    )
    chosen = selector(args)
    stream = stream_reading(
        ctx,
        vhost,
        name,
        qid,
        method,
        args,
        bool(channel.prefetch_count or channel.global_prefetch),
    )
    consumer = Consumer(
        ctx.next_cid(),
        tag,
        channel,
        qid,
        name,
        method.no_ack,
        # RabbitMQ ignores `exclusive` on a stream (nobody takes anything).
        method.exclusive and stream is None,
        priority,
        acquiring=not browse and stream is None,
        auto_close=auto_close,
        stream=stream,
        stamp=flag(args, "x-shoal-id"),
        wanted=None if chosen is None else chosen.matches,
        selector=None if chosen is None else chosen.text,
        levels=Levels(ctx.shared, qid) if qid in ctx.shared.catalog.priority_levels() else None,
    )
    return consumer, args
