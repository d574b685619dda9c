"""One AMQP channel: frame dispatch, the channel's own methods (open,
close, flow) and its lifecycle. The work is done by its parts, one job
each and each with its own state: the publisher (publish.py), the
delivery book (delivery.py), the declarer (declare.py) and the
transactions (tx.py); what they know of each other is in
channel_state.py. Sans IO: it writes through its connection."""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable, Coroutine
from itertools import islice
from typing import Any

from pamqp import commands as C

from shoal.broker import ipc
from shoal.broker.amqp import errors
from shoal.workers import amqp_0_8, device_gate, framing, reply_to
from shoal.workers.channel_state import IDLE, ChannelConnection, out_of_order
from shoal.workers.context import RemoteError
from shoal.workers.declare import Declarer
from shoal.workers.delivery import DeliveryBook
from shoal.workers.get import Getter
from shoal.workers.memory_guard import ALARM_PENDING
from shoal.workers.publish import Publisher
from shoal.workers.tx import Transactions
from shoal.workers.unmade import UNMADE, made

log = logging.getLogger("shoal.worker")


_Handler = Callable[[Any, Any], Coroutine[Any, Any, None] | None]


class Channel:
    """A channel: its parts, and what they share (the frames kept back
    while it is busy or flow-blocked, whether it is closing)."""

    __slots__ = (
        "_ack_each",
        "_acknowledge",
        "_on_body",
        "_on_header",
        "_on_publish",
        "backlog",
        "busy",
        "closing",
        "conn",
        "counted_user",
        "ctx",
        "declarer",
        "delivery",
        "fast_publish",
        "flow_backlog",
        "flow_told",
        "number",
        "publisher",
        "transactions",
    )

    def __init__(self, conn: ChannelConnection, number: int) -> None:
        self.conn = conn
        self.ctx = conn.ctx
        self.number = number
        self.counted_user: str | None = None  # the user its worker's census counts it under
        self.closing = False
        self.busy = False
        self.backlog: deque[tuple[int, memoryview]] = UNMADE
        # Publishes (and what follows them) kept while the connection is
        # flow-blocked on a queue over capacity (shm/flow.py); made when kept.
        self.flow_backlog: deque[tuple[int, memoryview]] = UNMADE
        self.flow_told = True  # the last channel.flow active= we sent (send_flow)
        self.declarer = declarer = Declarer(conn, number)
        self.transactions = transactions = Transactions(self, conn)
        self.delivery = delivery = DeliveryBook(self, conn, transactions, declarer.resolve_queue)
        self.publisher = publisher = Publisher(self, conn, transactions, delivery)
        transactions.publisher = publisher
        transactions.settle = delivery.settle
        # The hot paths, bound once: the connection hands a whole publish
        # to fast_publish (workers/connection.py), handle() the rest.
        self.fast_publish = publisher.fast_publish
        self._on_publish = publisher.on_publish
        self._on_header = publisher.on_header
        self._on_body = publisher.on_body
        self._acknowledge = delivery.acknowledge
        self._ack_each = delivery.ack_each

    @property
    def publish_count(self) -> int:
        """Messages this channel published (it is a "publisher")."""
        return self.publisher.publish_count

    def acks_from_bridge(self, tags: list[int]) -> bool:
        """basic.ack of each of `tags` from a protocol bridge in this worker
        (an MQTT client's PUBACKs of one read), settled together where its
        frames would be handled at once; False where they would wait or
        fail (busy, flow, closing, mid-publish): then they go as frames."""
        if (
            self.busy
            or self.closing
            or self.conn.flow_blocked
            or self.flow_backlog
            or self.publisher.state != IDLE
        ):
            return False
        delivery = self.delivery
        try:
            if (
                tags
                and delivery.transactions.tx is None
                and tags == [*islice(delivery.unacked, len(tags))]
            ):
                # The oldest deliveries, in order (a subscriber's PUBACKs): as
                # one multiple ack, a run of one queue's entries one C call.
                delivery.settle(tags[-1], True, None, 80)
            else:
                self._ack_each(tags)
        except errors.ChannelError as exc:
            self.fail(exc)
        return True

    def keep(self, ftype: int, payload: memoryview, first: bool = False) -> None:
        """A frame kept in the backlog while busy (at its head: one to try
        again first); the backlog is made by its first frame (workers/unmade.py)."""
        if self.backlog is UNMADE:
            self.backlog = deque()
        (self.backlog.appendleft if first else self.backlog.append)((ftype, payload))

    def handle(self, ftype: int, payload: memoryview) -> None:
        if self.busy:
            self.keep(ftype, payload)
            return
        if (self.conn.flow_blocked or self.flow_backlog) and self._keep_for_flow(ftype, payload):
            return
        if self.closing:
            # After we sent channel.close only close/close-ok matter.
            if ftype == framing.FRAME_METHOD and framing.method_index(payload) in (
                C.Channel.Close.index,
                C.Channel.CloseOk.index,
            ):
                self._method(framing.decode_method(payload))
            return
        try:
            if ftype == framing.FRAME_METHOD:
                state = self.publisher.state
                if state != IDLE:  # a method amid a message's content frames
                    raise out_of_order(state)
                index = framing.method_index(payload)
                if index == framing.PUBLISH:
                    self._on_publish(payload)
                elif index == framing.ACK:
                    tag, bits = framing.decode_ack(payload)
                    self._acknowledge(tag, bool(bits & 1), None, 80)
                elif index == framing.NACK:
                    tag, bits = framing.decode_ack(payload)
                    self._acknowledge(tag, bool(bits & 1), bool(bits & 2), 120)
                elif index == framing.REJECT:
                    tag, bits = framing.decode_ack(payload)
                    self._acknowledge(tag, False, bool(bits & 1), 90)
                elif index == framing.ACCESS_REQUEST:
                    self.conn.write(framing.encode_access_request_ok(self.number))
                elif self.conn.protocol == amqp_0_8.PROTOCOL:  # (its basic.consume)
                    self._method(framing.decode_method(amqp_0_8.consume(payload)))  # type: ignore[arg-type]
                else:
                    self._method(framing.decode_method(payload))
            elif ftype == framing.FRAME_HEADER:
                self._on_header(payload)
            elif ftype == framing.FRAME_BODY:
                self._on_body(payload)
            else:
                raise errors.ConnectionError_(  # (rabbit_reader's unexpected_frame)
                    errors.UNEXPECTED_FRAME,
                    f"type {ftype}, {framing.payload_snippet(bytes(payload))}",
                )
        except errors.ChannelError as exc:
            if not exc.class_id and ftype == framing.FRAME_METHOD:  # as RabbitMQ: the method's
                exc.class_id, exc.method_id = divmod(framing.method_index(payload), 0x10000)
            self.fail(exc)

    def _method(self, method: Any) -> None:
        entry = HANDLERS.get(type(method))
        if entry is None:
            raise errors.ConnectionError_(
                errors.COMMAND_INVALID, "unimplemented method", *divmod(method.index, 0x10000)
            )
        part, handler = entry
        result = handler(self if part is None else getattr(self, part), method)
        if result is not None:
            self._run_async(result, method)

    def _run_async(self, coro: Coroutine[Any, Any, None], method: Any) -> None:
        """Hold the channel's later frames until `coro` (a scheduler round
        trip) is done: replies must go out in order."""
        self.busy = True
        task = self.ctx.loop.create_task(coro)
        task.add_done_callback(lambda t: self._async_done(t, method))

    def _async_done(self, task: asyncio.Task[None], method: Any) -> None:
        self.busy = False
        device_gate.shut(self.conn)  # (outside a read: an MQTT device's checks again)
        exc = task.exception() if not task.cancelled() else None  # retrieved, even if unused
        if self.conn.closed:
            return
        if isinstance(exc, RemoteError):
            exc = errors.ChannelError(
                exc.reply_code, exc.reply_text, *divmod(method.index, 0x10000)
            )
        if isinstance(exc, errors.ChannelError):
            if not exc.class_id:
                exc.class_id, exc.method_id = divmod(method.index, 0x10000)
            self.fail(exc)
        elif isinstance(exc, errors.ConnectionError_):
            self.conn.fail(exc)
            return
        elif exc is not None:
            log.error("connection %x: internal error", self.conn.id, exc_info=exc)
            self.conn.fail(
                errors.ConnectionError_(
                    errors.INTERNAL_ERROR,
                    f"{type(exc).__name__}: {exc}",
                    *divmod(method.index, 0x10000),
                )
            )
            return
        self.resume()

    def _keep_for_flow(self, ftype: int, payload: memoryview) -> bool:
        """While the connection is flow-blocked, keep a new publish, and every
        frame after one kept, for later. Other methods pass, and acks always
        do: consumers on a blocked connection keep acking (an ack never falls
        inside a message's frames, so it cannot overtake a half-kept one)."""
        if self.closing:
            return False
        if ftype == framing.FRAME_METHOD and self.publisher.state == IDLE:
            index = framing.method_index(payload)
            if index in _NEVER_KEPT or (index != framing.PUBLISH and not self.flow_backlog):
                return False
            if ALARM_PENDING in self.conn.flow_blocked:
                self.conn.blocks.alarm_felt()  # a publish under the alarm (RabbitMQ's should_block)
        elif not self.flow_backlog:
            return False  # the rest of a message whose publish was accepted
        made(self, "flow_backlog").append((ftype, payload))
        self.conn.blocks.flow_held(len(payload))
        return True

    def release_flow(self) -> None:
        """The connection is no longer flow-blocked: handle what was kept, in
        order, until it is all done or the connection blocks again."""
        kept, self.flow_backlog = self.flow_backlog, UNMADE
        released = 0
        while kept and not self.conn.closed:
            ftype, payload = kept.popleft()
            released += len(payload)
            self._handle_later(ftype, payload)
            if self.flow_backlog:  # blocked again: the rest stays behind it
                self.flow_backlog.extend(kept)
                break
        self.conn.held_bytes -= released
        self.conn.flush_confirms(self.publisher)

    def resume(self) -> None:
        while self.backlog and not self.busy and not self.conn.closed:
            ftype, payload = self.backlog.popleft()
            self._handle_later(ftype, payload)
        if not self.backlog:
            # Drained: its deque goes (its block of 64 slots; a channel kept
            # a frame behind one declare, and held the block for its life).
            self.backlog = UNMADE
        if not self.conn.closed:
            self.conn.flush_confirms(self.publisher)

    def _handle_later(self, ftype: int, payload: memoryview) -> None:
        """A frame kept back (a scheduler round trip, flow control), handled
        outside the connection's read: what the read's guard does for an
        error (close the connection, 541 for a bug) is done here (found by
        perf/fuzz.py: a kept frame out of order escaped to the loop)."""
        device_gate.shut(self.conn)  # (outside a read: an MQTT device's checks again)
        try:
            self.handle(ftype, payload)
        except errors.ConnectionError_ as exc:
            self.conn.fail(exc)
        except framing.FrameError as exc:
            code, text, class_id, method_id = (
                exc.reply_code,
                exc.reply_text,
                exc.class_id,
                exc.method_id,
            )
            self.conn.fail(errors.ConnectionError_(code, text, class_id, method_id))
        except Exception as exc:
            log.exception("connection %x: internal error", self.conn.id)
            self.conn.fail(errors.ConnectionError_(errors.INTERNAL_ERROR, type(exc).__name__))

    def fail(self, exc: errors.AMQPError) -> None:
        """A channel exception: close this channel, keep the connection."""
        self.release()
        self.closing = True
        self.backlog.clear()
        self.conn.write(
            framing.encode_method(
                self.number,
                C.Channel.Close(
                    reply_code=exc.reply_code,
                    reply_text=errors.fit_shortstr(exc.reply_text),
                    class_id=exc.class_id,
                    method_id=exc.method_id,
                ),
            )
        )

    def describe(self) -> dict[str, Any]:
        """What list_channels / list_consumers show of this channel."""
        publisher, delivery, tx = self.publisher, self.delivery, self.transactions.tx
        confirm = publisher.confirm
        return {
            "number": self.number,
            "transactional": tx is not None,
            "confirm": confirm,
            "consumer_count": len(delivery.consumers),
            "messages_unacknowledged": len(delivery.unacked),
            "messages_unconfirmed": publisher.publish_seq - publisher.confirm_sent
            if confirm
            else 0,
            "messages_uncommitted": len(tx.publishes) if tx is not None else 0,
            "acks_uncommitted": len(tx.settles) if tx is not None else 0,
            "prefetch_count": delivery.prefetch_count,
            "global_prefetch_count": delivery.global_prefetch,
            # Counts since it opened, kept anyway: the management API's
            # message_stats and their rates (broker/management/shapes.py).
            "counts": {
                "publish": publisher.publish_count,
                "confirm": publisher.confirm_sent,
                "drop_unroutable": publisher.unroutable[False],
                "return_unroutable": publisher.unroutable[True],
                "deliver_get": delivery.next_tag - 1,
                "ack": delivery.acked,
            },
            "consumers": [
                {
                    "consumer_tag": c.tag.decode(errors="replace"),
                    "queue": self.ctx.shared.table.name(c.qid).decode(errors="replace"),
                    "ack_required": not c.no_ack,
                    "exclusive": c.exclusive,
                    "prefetch_count": delivery.prefetch_count,
                    "active": True,
                    "arguments": {},
                }
                for c in delivery.consumers.values()
            ],
        }

    def release(self) -> asyncio.Future[ipc.Counted] | None:
        """Cancel consumers, roll back an open transaction and requeue unacked
        messages (close or crash); the reply queue's delete, if it had one."""
        deleting = self.delivery.release()
        self.transactions.rollback()
        self.delivery.requeue_all()
        self.publisher.release()
        # Publishes kept by flow control are dropped with the channel, like
        # the unconfirmed publishes of a channel that closes.
        self.conn.held_bytes -= sum(len(payload) for _ftype, payload in self.flow_backlog)
        self.flow_backlog.clear()
        return deleting

    def _channel_close(self, method: C.Channel.Close) -> None:
        self.conn.flush_confirms(self.publisher, force=True)
        deleting = self.release()
        close_ok = framing.encode_method(self.number, C.Channel.CloseOk())
        if deleting is None:
            self.conn.write(close_ok)
        else:  # after the reply queue's delete (workers/reply_to.py)
            reply_to.answer_later(self.ctx.loop, self.conn, deleting, close_ok)
        if self.closing:
            # The client's channel.close crossed ours: answered, as RabbitMQ
            # does, and the channel stays until the client's close-ok for
            # ours arrives (that frame is part of the handshake, not one on
            # a closed channel).
            return
        self.conn.forget_channel(self.number, by_client=True)

    def _channel_close_ok(self, method: C.Channel.CloseOk) -> None:
        self.conn.forget_channel(self.number)

    def _channel_open(self, method: C.Channel.Open) -> None:
        raise errors.ConnectionError_(errors.CHANNEL_ERROR, "second 'channel.open' seen", 20, 10)

    def send_flow(self, active: bool) -> None:
        """Tell a client that obeys channel.flow to stop (or resume)
        publishing on this channel; once per change."""
        if active == self.flow_told or self.closing:
            return
        self.flow_told = active
        self.conn.write(framing.encode_method(self.number, C.Channel.Flow(active=active)))

    def _channel_flow_ok(self, method: C.Channel.FlowOk) -> None:
        pass  # the client's answer to send_flow: nothing to do


# Methods that pass a channel's flow-control backlog: acks (consumers on a
# blocked connection keep acking) and the close handshake.
_NEVER_KEPT = frozenset(
    (framing.ACK, framing.NACK, framing.REJECT, C.Channel.Close.index, C.Channel.CloseOk.index)
)


def _basic_get(book: DeliveryBook, method: C.Basic.Get) -> None:
    Getter(book).basic_get(method)  # (a Getter holds only the book)


# Each method's handler: the part of the channel that handles it (None: the
# channel itself) and its function, one table for every channel. A table of
# bound methods per channel was 2.7 KiB, an eighth of what an idle MQTT
# client holds (docs/benchmarks.md, "An idle connection's memory again").
HANDLERS: dict[type, tuple[str | None, _Handler]] = {
    C.Channel.Close: (None, Channel._channel_close),
    C.Channel.CloseOk: (None, Channel._channel_close_ok),
    C.Channel.FlowOk: (None, Channel._channel_flow_ok),
    C.Channel.Open: (None, Channel._channel_open),
    C.Channel.Flow: ("delivery", DeliveryBook.channel_flow),
    C.Basic.Qos: ("delivery", DeliveryBook.basic_qos),
    C.Basic.Consume: ("delivery", DeliveryBook.basic_consume),
    C.Basic.Cancel: ("delivery", DeliveryBook.basic_cancel),
    C.Basic.Get: ("delivery", _basic_get),
    C.Basic.Recover: ("delivery", DeliveryBook.basic_recover),
    C.Basic.RecoverAsync: ("delivery", DeliveryBook.basic_recover),
    C.Confirm.Select: ("publisher", Publisher.confirm_select),
    C.Tx.Select: ("transactions", Transactions.tx_select),
    C.Tx.Commit: ("transactions", Transactions.tx_commit),
    C.Tx.Rollback: ("transactions", Transactions.tx_rollback),
    C.Queue.Declare: ("declarer", Declarer.queue_declare),
    C.Queue.Bind: ("declarer", Declarer.queue_bind),
    C.Queue.Unbind: ("declarer", Declarer.queue_bind),
    C.Exchange.Declare: ("declarer", Declarer.exchange_declare),
    C.Exchange.Delete: ("declarer", Declarer.exchange_delete),
    C.Exchange.Bind: ("declarer", Declarer.exchange_bind),
    C.Exchange.Unbind: ("declarer", Declarer.exchange_bind),
    C.Queue.Delete: ("declarer", Declarer.queue_delete),
    C.Queue.Purge: ("declarer", Declarer.queue_purge),
}
