"""Direct reply-to (`amq.rabbitmq.reply-to`), as RabbitMQ implements it for
RPC clients: a channel consumes from the pseudo-queue in no-ack mode, then
publishes requests with `reply_to` set to it; the broker rewrites that to a
name of the channel's own (`amq.rabbitmq.reply-to.<token>`), and replies
published to that name (default exchange) reach the channel's consumer.

Shoal makes the name a real queue: exclusive to the connection, not
durable, made by the scheduler when the channel starts its reply consumer
and deleted when the consumer is cancelled or the channel closes, so a reply
from any IO worker is routed and delivered as to any queue, and a reply to
a channel that is gone is unroutable (basic.return under mandatory). The
cancel-ok or close-ok waits for that delete (`answer_after`): a reply sent
once the client has it is unroutable, as RabbitMQ's channel is gone then.
"""

from __future__ import annotations

import asyncio
import base64
import os
from collections.abc import Coroutine
from typing import Any, Protocol

from shoal.broker import ipc
from shoal.broker.amqp import errors, properties
from shoal.workers.context import Requests

PSEUDO_QUEUE = "amq.rabbitmq.reply-to"
PREFIX = b"amq.rabbitmq.reply-to."
# How long a cancel-ok or close-ok waits for the reply queue's delete (a
# scheduler being restarted answers late; the client need not wait for that).
ANSWER_WAIT = 3.0
Answer = Coroutine[Any, Any, None]  # answer_after's: a channel holds its later frames for it


class Answering(Protocol):
    """What answer_after uses of a connection."""

    closed: bool

    def write(self, data: bytes) -> None: ...


class ReplyChannel(Protocol):
    """What direct reply-to uses of a channel (workers/delivery.py)."""

    reply_queue: bytes


def new_name() -> bytes:
    """RabbitMQ 3.10's shape, which clients match (php-amqp's suite:
    `amq.rabbitmq.reply-to.%s.%s==`): two base64 tokens after the prefix, a
    dot between, the second 16 random bytes (RabbitMQ: its channel's pid,
    then a secure key)."""
    return PREFIX + base64.b64encode(os.urandom(24)) + b"." + base64.b64encode(os.urandom(16))


def declare_request(vhost: str, name: bytes, conn_id: int) -> ipc.Declare:
    """The reply queue's declare: exclusive to the connection, not durable."""
    return ipc.Declare(
        vhost=vhost,
        name=name,
        passive=False,
        durable=False,
        exclusive=True,
        auto_delete=False,
        owner=conn_id,
        conn_id=conn_id,
        arguments={},
    )


def check_consume(channel: ReplyChannel, no_ack: bool) -> None:
    """RabbitMQ's rules for a consumer of the pseudo-queue."""
    if not no_ack:
        raise errors.ChannelError(
            errors.PRECONDITION_FAILED, "reply consumer cannot acknowledge", 60, 20
        )
    if channel.reply_queue:
        raise errors.ChannelError(errors.PRECONDITION_FAILED, "reply consumer already set", 60, 20)


def rewrite(channel: ReplyChannel, header: bytes) -> bytes:
    """A publish's content header with `reply_to: amq.rabbitmq.reply-to`
    pointed at the channel's reply queue (one flag test for any other)."""
    if len(header) < 14 or not header[12] & (properties.REPLY_TO_FLAG >> 8):
        return header
    if properties.reply_to(header) != PSEUDO_QUEUE.encode():
        return header
    if not channel.reply_queue:
        raise errors.ChannelError(
            errors.PRECONDITION_FAILED, "fast reply consumer does not exist", 60, 40
        )
    return properties.with_reply_to(header, channel.reply_queue)


def delete(ctx: Requests, vhost: str, name: bytes, conn_id: int) -> asyncio.Future[ipc.Counted]:
    """The reply queue's delete, asked of the scheduler (a failure is the
    scheduler's to log: retrieved here, so never reported unretrieved)."""
    done = ctx.request(ipc.Delete(vhost, name, False, False, conn_id))
    done.add_done_callback(lambda f: f.cancelled() or f.exception())
    return done


async def answer_after(
    conn: Answering, deleting: asyncio.Future[ipc.Counted], frame: bytes | None
) -> None:
    """`frame` (a cancel-ok or close-ok; None for a nowait cancel) written once
    the reply queue's delete is answered, at most ANSWER_WAIT s later (a
    cancel's channel holds its later frames meanwhile: answers stay in order)."""
    try:
        await asyncio.wait_for(asyncio.shield(deleting), ANSWER_WAIT)
    except Exception:  # (timed out, or refused: the scheduler's to log)
        pass
    if frame is not None and not conn.closed:
        conn.write(frame)


_ANSWERING: set[asyncio.Task[None]] = set()  # strong references: the loop keeps weak ones


def answer_later(
    loop: asyncio.AbstractEventLoop,
    conn: Answering,
    deleting: asyncio.Future[ipc.Counted],
    frame: bytes,
) -> None:
    """answer_after as a task of its own: a close-ok, whose channel is gone."""
    task = loop.create_task(answer_after(conn, deleting, frame))
    _ANSWERING.add(task)
    task.add_done_callback(_ANSWERING.discard)
