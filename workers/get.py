"""basic.get: a one-message temporary subscription (seed 000), taken from
the head of the queue (its highest priority level first), dropping what
expired on the way; a queue whose messages wait in paging files
(workers/pager.py) is looked at again while its pager brings them back.
The message is booked as the channel's (workers/delivery.py) unless no-ack."""

from __future__ import annotations

from typing import Protocol

from pamqp import commands as C

from shoal.broker.amqp import errors, field_table, properties
from shoal.broker.amqp import stream_arguments as amqp_streams
from shoal.shm import stats
from shoal.shm.arena import read_message
from shoal.workers import framing
from shoal.workers.channel_state import ChannelConnection, ChannelCore, GetContext
from shoal.workers.connection_access import READ
from shoal.workers.consumer import Consumer
from shoal.workers.pull import take_ready
from shoal.workers.timeouts import TimedChannel

# basic.get on a queue whose messages are in another worker's paging file
# waits for its pager (every 2 ms) this many times this long at most.
GET_TRIES = 250
GET_RETRY_DELAY = 0.004


class GetBook(TimedChannel, Protocol):
    """What basic.get uses of its channel's delivery book (workers/delivery.py;
    its time-outs' parts: a get's delivery is timed from then on)."""

    next_tag: int
    gets: int
    consumers: dict[bytes, Consumer]
    unacked: dict[int, tuple[Consumer | None, int, int, int]]
    unacked_bytes: int

    @property
    def ctx(self) -> GetContext: ...
    @property
    def conn(self) -> ChannelConnection: ...
    @property
    def channel(self) -> ChannelCore: ...
    @property
    def number(self) -> int: ...
    def resolve_queue(
        self, name: str, method: tuple[int, int], permission: str
    ) -> tuple[bytes, int]: ...
    def delivery_count(self, qid: int, seq: int, get: bool) -> int | None: ...


class Getter:
    """A channel's basic.get, over its delivery book."""

    __slots__ = ("book",)

    def __init__(self, book: GetBook) -> None:
        self.book = book

    def _consumers_first(self, qid: int) -> None:
        """The channel's own consumers of the queue take what is ready for
        them first, as from RabbitMQ's queue process, which gave them what
        the channel published before this get (the Java client's
        BindingLifecycle: a publish, then a get on a consumed queue, is empty)."""
        for consumer in list(self.book.consumers.values()):
            if consumer.qid == qid:
                take_ready(self.book.ctx, consumer)

    def _get_later(self, method: C.Basic.Get, tries: int) -> None:
        """Try basic.get again in a moment; the channel's later frames wait."""
        book = self.book
        channel = book.channel
        channel.busy = True
        book.conn.blocks.hold_reading(channel, reason=None)

        def again() -> None:
            if book.conn.closed:
                return
            channel.busy = False
            try:
                self.basic_get(method, tries)
            except errors.AMQPError as exc:  # the queue was deleted meanwhile
                channel.fail(exc)
            if not channel.busy:
                book.conn.blocks.release_reading(channel)
                channel.resume()

        book.ctx.loop.call_later(GET_RETRY_DELAY, again)

    def basic_get(self, method: C.Basic.Get, tries: int = GET_TRIES) -> None:
        """Acquire the first entry from the head and send it (get-ok), or
        get-empty."""
        book = self.book
        name, qid = book.resolve_queue(method.queue, (60, 70), READ if tries == GET_TRIES else "")
        ctx = book.ctx
        if ctx.streams is not None and ctx.streams.words.is_stream(qid):
            raise amqp_streams.not_supported("basic.get", name, book.conn.vhost, 60, 70)
        if tries == GET_TRIES:
            ctx.shared.table.count_get(qid)  # the queue is in use (x-expires)
            if book.consumers:
                self._consumers_first(qid)
        logs = ctx.shared.catalog.logs(qid)  # highest priority first
        for log_qid in logs:
            got = ctx.shared.acquire(log_qid, 0)
            while isinstance(got, tuple) and (
                ctx.expiry.drop_if_expired(log_qid, got[0], got[1], graceless=True)
                or (got[2] and ctx.expiry.drop_if_over_limit(log_qid, got[0], got[1]))
            ):
                got = ctx.shared.acquire(log_qid, 0)  # that one expired: dead-lettered
            if got.__class__ is not int:
                break
        else:
            if tries and ctx.shared.table.paged_out(qid):
                # Its messages are in paging files (workers/pager.py): this
                # worker's are paged in now, another's by its pager soon.
                if ctx.pager is not None and ctx.pager.page_in_now(qid):
                    self.basic_get(method, tries - 1)
                else:
                    self._get_later(method, tries - 1)
                return
            ctx.stats.v[stats.GET_EMPTY] += 1
            book.conn.write(framing.encode_method(book.number, C.Basic.GetEmpty()))
            return
        seq, block, redelivered = got  # type: ignore[misc]
        v = ctx.stats.v
        v[stats.DELIVERED_GET_AUTO_ACK if method.no_ack else stats.DELIVERED_GET_MANUAL_ACK] += 1
        if redelivered:
            v[stats.REDELIVERED] += 1
        exchange, routing_key, header, body = read_message(ctx.seg, block)
        if book.conn.access.tracing and ctx.firehose is not None:
            message = (exchange, routing_key, header, body)
            ctx.firehose.delivered(book.conn, book.number, name, redelivered, message)
        count = book.delivery_count(log_qid, seq, True)
        if count is not None:
            header = properties.with_header(header, b"x-delivery-count", field_table.long(count))
        tag = book.next_tag
        book.next_tag += 1
        if method.no_ack:
            ctx.shared.settle_taken(log_qid, seq)
        else:
            book.unacked[tag] = (None, log_qid, seq, len(body))
            book.gets += 1
            ctx.timed_books.add(book)  # (workers/timeouts.py)
            book.unacked_bytes += len(body)
        paged_out = ctx.shared.table.paged_out(
            qid
        )  # first: a page-in meanwhile counts twice, not never
        ready = ctx.shared.table.ready(qid) + paged_out
        frames = [
            framing.encode_method(
                book.number,
                C.Basic.GetOk(
                    delivery_tag=tag,
                    redelivered=redelivered,
                    exchange=exchange.decode(),
                    routing_key=routing_key.decode(errors="replace"),
                    message_count=ready,
                ),
            )
        ]
        frames += framing.encode_content(book.number, header, body, book.conn.frame_max)
        book.conn.write_many(frames)
