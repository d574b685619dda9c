"""Direct reply-to (`amq.rabbitmq.reply-to`), as RabbitMQ implements it for
RPC clients: a channel consumes from the pseudo-queue in no-ack mode, then
publishes requests with `reply_to` set to it; the broker rewrites that to a
name of the channel's own (`amq.rabbitmq.reply-to.<token>`), and replies
published to that name (default exchange) reach the channel's consumer.

Shoal makes the name a real queue: exclusive to the connection, not
durable, made by the scheduler when the channel starts its reply consumer
and deleted when the consumer is cancelled or the channel closes, so a reply
from any IO worker is routed and delivered as to any queue, and a reply to
a channel that is gone is unroutable (basic.return under mandatory).
"""

from __future__ import annotations

import base64
import os
from typing import Protocol

from shoal.broker import ipc
from shoal.broker.amqp import errors, properties

PSEUDO_QUEUE = "amq.rabbitmq.reply-to"
PREFIX = b"amq.rabbitmq.reply-to."


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
