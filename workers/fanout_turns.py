"""Bounded work per event-loop turn for messages that fan out.

A publish to a fanout exchange with a thousand bound queues is a thousand
appends in Python, about a millisecond; a socket read holds hundreds of such
publishes, and the event loop handles a whole read in one callback. With a
few such publishers a worker's loop turn lasted seconds, and every other
connection of the worker waited that long for each of its reads: new
connections' handshakes timed out for over a minute (pika's 15 s, the Java
client's 10 s; the Java client's Bug19219Test: 1,500 queues bound to
amq.fanout, 100 publishers).

So a connection counts the appends of its messages that reach more than one
queue (`fanout_work`; a message that reaches one queue costs the publisher a
length test), and once FANOUT_PER_TURN are done its read's remaining frames
wait for the next loop turn, after the other connections' events: its reads
are held meanwhile, so its frames keep their order.

Connections that wait so share one FANOUT_PER_TURN between them: a waiting
connection's next turn does FANOUT_PER_TURN / (connections waiting) appends
(at least one message). Without that share a loop turn grew with their
number: 50 fanning-out publishers on a worker made each turn 50 x 10,000
appends, half a second or more, and a new connection's handshake, a few
round trips, took seconds each (the Java client's Bug19219Test: about three
minutes, RabbitMQ 20 s).
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from typing import Any, Protocol

from shoal.broker.amqp import errors
from shoal.workers.channel_state import ChannelBlocks

log = logging.getLogger("shoal.worker")

# Appends before a fanning-out connection lets the loop turn: ~10-20 ms of them.
FANOUT_PER_TURN = 10_000


class FanoutConnection(Protocol):
    id: int
    fanout_work: int
    closed: bool

    @property
    def blocks(self) -> ChannelBlocks: ...

    def dispatch(self, frames: list[Any]) -> None: ...
    def fail(self, exc: errors.AMQPError) -> None: ...


# Per event loop: the connections whose next turn is scheduled on it.
_waiting: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, int] = weakref.WeakKeyDictionary()


def defer(
    conn: FanoutConnection,
    frames: list[Any],
    loop: asyncio.AbstractEventLoop,
    per_turn: int = FANOUT_PER_TURN,
) -> None:
    """Handle `frames` (the rest of a read) at the next loop turn, with
    this connection's share of `per_turn` (the caller's limit)."""
    holder = object()  # (its own: the connection's other read holds stay as they are)
    conn.blocks.hold_reading(holder, reason=None)
    _waiting[loop] = _waiting.get(loop, 0) + 1

    def next_turn() -> None:
        waiting = _waiting[loop]
        _waiting[loop] = waiting - 1
        # Counted up to per_turn: starting short of it leaves the share.
        conn.fanout_work = per_turn - per_turn // waiting
        if conn.closed:
            return
        try:
            conn.dispatch(frames)  # (it may defer again: a new hold first)
        except Exception as exc:
            # As the connection's data_received: a bug costs this client only.
            log.exception("connection %x: internal error", conn.id)
            conn.fail(errors.ConnectionError_(errors.INTERNAL_ERROR, f"{type(exc).__name__}"))
        conn.blocks.release_reading(holder)

    loop.call_soon(next_turn)
