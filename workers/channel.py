"""One AMQP channel: publish assembly, consumers, acknowledgements, and the
channel-level methods. Sans IO: it writes through its Connection."""

from __future__ import annotations

import asyncio
import logging
import os
from collections import deque
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

from pamqp import commands as C

from broker import ipc
from broker.amqp import errors as E
from broker.amqp.routing import EXCHANGE_TYPES
from broker.amqp.selector import Selector, SelectorError, compile_selector
from shm import stats as S
from shm.arena import (
    message_size,
    read_message,
    release_hold,
    write_message,
)
from shm.queues import FULL, OVER_CAPACITY, REJECTED, Message
from shm.stats import (
    DELIVERED_CONSUME_AUTO_ACK,
    DELIVERED_CONSUME_MANUAL_ACK,
    RECEIVED_CONFIRM,
    REDELIVERED,
    ROUTED,
    SIZE_BUCKETS,
    SIZE_SUM,
    UNROUTABLE_DROPPED,
    UNROUTABLE_RETURNED,
    size_bucket,
)
from workers import framing as F
from workers.consumer import Consumer, update_interest
from workers.context import RemoteError
from workers.levels import Levels
from workers.memory_guard import ALARM_PENDING

log = logging.getLogger("shoal.worker")

if TYPE_CHECKING:
    from workers.connection import Connection

# Publish assembly states
IDLE, EXPECT_HEADER, EXPECT_BODY = 0, 1, 2
RETRY_DELAY = 0.005  # seconds between retries while a queue or the arena is full
# Fault injection for the tests: declaring a queue of this name raises inside
# the worker, to show a bug costs its own client only (541 INTERNAL_ERROR).
_FAULT_QUEUE = os.environ.get("SHOAL_FAULT_INTERNAL_QUEUE", "").encode()


class Pending:
    """A message being assembled from its publish, header and body frames."""

    __slots__ = (
        "block",
        "body",
        "body_off",
        "body_size",
        "exchange",
        "header",
        "levelled",
        "mandatory",
        "qids",
        "received",
        "rejected",
        "routing_key",
    )

    def __init__(self, exchange: bytes, routing_key: bytes, mandatory: bool) -> None:
        self.exchange = exchange
        self.routing_key = routing_key
        self.mandatory = mandatory
        self.header = b""
        self.body_size = 0
        self.received = 0
        self.qids: list[int] = []
        self.block = 0
        self.body_off = 0
        self.body: bytearray | None = None  # only for unroutable messages
        # Logs the scheduler chose for a priority level (LEVEL replies): final.
        self.levelled: set[int] | None = None
        self.rejected = False  # a queue refused it (x-overflow reject-publish)


class Transaction:
    """What a transactional channel has done since its last commit/rollback:
    whole messages (routed, held, not yet appended) and acknowledgements."""

    __slots__ = ("publishes", "settles")

    def __init__(self) -> None:
        self.publishes: list[Pending] = []
        self.settles: list[tuple[int, bool, bool | None, int]] = []


class Channel:
    __slots__ = (
        "backlog",
        "busy",
        "closing",
        "confirm",
        "confirm_held",
        "confirm_high",
        "confirm_sent",
        "conn",
        "consumers",
        "ctx",
        "flow_active",
        "flow_backlog",
        "flow_told",
        "global_prefetch",
        "global_prefetch_size",
        "last_queue",
        "next_tag",
        "number",
        "pending",
        "prefetch_count",
        "prefetch_size",
        "publish_count",
        "publish_seq",
        "state",
        "stats",
        "tx",
        "unacked",
        "unacked_bytes",
    )

    def __init__(self, conn: Connection, number: int) -> None:
        self.conn = conn
        self.ctx = conn.ctx
        self.number = number
        self.state = IDLE
        self.pending: Pending | None = None
        self.consumers: dict[bytes, Consumer] = {}
        # delivery tag -> (consumer or None for basic.get, qid, seq, body bytes)
        self.unacked: dict[int, tuple[Consumer | None, int, int, int]] = {}
        self.next_tag = 1
        # basic.qos: per consumer (global=false) and per channel (global=true),
        # in messages and in body bytes.
        self.prefetch_count = 0
        self.prefetch_size = 0
        self.global_prefetch = 0
        self.global_prefetch_size = 0
        self.unacked_bytes = 0
        self.confirm = False
        self.publish_seq = 0
        self.publish_count = 0  # messages this channel published (it is a "publisher")
        self.flow_told = True  # the last channel.flow active= we sent (send_flow)
        self.stats = conn.ctx.stats.v  # this worker's counters (shm/stats.py)
        self.confirm_high = 0
        self.confirm_sent = 0
        # Confirms held until this channel's own consumer has been handed the
        # message (Connection.flush_confirms): RabbitMQ's order.
        self.confirm_held = False
        self.flow_active = True
        self.closing = False
        self.busy = False
        self.backlog: deque[tuple[int, memoryview]] = deque()
        # Publishes (and what follows them) kept while the connection is
        # flow-blocked on a queue over capacity (shm/flow.py).
        self.flow_backlog: deque[tuple[int, memoryview]] = deque()
        self.last_queue = b""
        self.tx: Transaction | None = None

    # ------------------------------------------------------------- dispatch
    def handle(self, ftype: int, payload: memoryview) -> None:
        if self.busy:
            self.backlog.append((ftype, payload))
            return
        if (self.conn.flow_blocked or self.flow_backlog) and self._keep_for_flow(ftype, payload):
            return
        if self.closing:
            # After we sent channel.close only close/close-ok matter.
            if ftype == F.FRAME_METHOD and F.method_index(payload) in (
                C.Channel.Close.index,
                C.Channel.CloseOk.index,
            ):
                self._method(F.decode_method(payload))
            return
        try:
            if ftype == F.FRAME_METHOD:
                if self.state == EXPECT_HEADER:
                    raise E.ConnectionError_(
                        E.UNEXPECTED_FRAME,
                        "expected content header for class 60, "
                        "got non content header frame instead",
                        60,
                        40,
                    )
                if self.state == EXPECT_BODY:
                    raise E.ConnectionError_(
                        E.UNEXPECTED_FRAME,
                        "expected content body, got non content body frame instead",
                        60,
                        40,
                    )
                index = F.method_index(payload)
                if index == F.PUBLISH:
                    self._on_publish(payload)
                elif index == F.ACK:
                    tag, bits = F.decode_ack(payload)
                    self._acknowledge(tag, bool(bits & 1), None, 80)
                elif index == F.NACK:
                    tag, bits = F.decode_ack(payload)
                    self._acknowledge(tag, bool(bits & 1), bool(bits & 2), 120)
                elif index == F.REJECT:
                    tag, bits = F.decode_ack(payload)
                    self._acknowledge(tag, False, bool(bits & 1), 90)
                else:
                    self._method(F.decode_method(payload))
            elif ftype == F.FRAME_HEADER:
                self._on_header(payload)
            elif ftype == F.FRAME_BODY:
                self._on_body(payload)
            else:
                raise E.ConnectionError_(E.FRAME_ERROR, f"unexpected frame type {ftype} on channel")
        except E.ChannelError as exc:
            self.fail(exc)

    def _method(self, method: Any) -> None:
        handler = _HANDLERS.get(type(method))
        if handler is None:
            raise E.ConnectionError_(
                E.COMMAND_INVALID, "unimplemented method", *divmod(method.index, 0x10000)
            )
        result = handler(self, method)
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
        if self.conn.closed:
            return
        exc = task.exception() if not task.cancelled() else None
        if isinstance(exc, RemoteError):
            exc = E.ChannelError(exc.reply_code, exc.reply_text, *divmod(method.index, 0x10000))
        if isinstance(exc, E.ChannelError):
            self.fail(exc)
        elif isinstance(exc, E.ConnectionError_):
            self.conn.fail(exc)
            return
        elif exc is not None:
            log.error("connection %x: internal error", self.conn.id, exc_info=exc)
            self.conn.fail(
                E.ConnectionError_(
                    E.INTERNAL_ERROR,
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
        if ftype == F.FRAME_METHOD and self.state == IDLE:
            index = F.method_index(payload)
            if index in _NEVER_KEPT or (index != F.PUBLISH and not self.flow_backlog):
                return False
            if ALARM_PENDING in self.conn.flow_blocked:
                self.conn.alarm_felt()  # a publish under the alarm (RabbitMQ's should_block)
        elif not self.flow_backlog:
            return False  # the rest of a message whose publish was accepted
        self.flow_backlog.append((ftype, payload))
        self.conn.flow_held(len(payload))
        return True

    def release_flow(self) -> None:
        """The connection is no longer flow-blocked: handle what was kept, in
        order, until it is all done or the connection blocks again."""
        kept, self.flow_backlog = self.flow_backlog, deque()
        released = 0
        while kept and not self.conn.closed:
            ftype, payload = kept.popleft()
            released += len(payload)
            self.handle(ftype, payload)
            if self.flow_backlog:  # blocked again: the rest stays behind it
                self.flow_backlog.extend(kept)
                break
        self.conn.held_bytes -= released
        self.conn.flush_confirms(self)

    def suspend_retry(self, payload: memoryview | None, ftype: int = 0) -> None:
        """Back-pressure: a queue or the arena is full. Keep the frame, stop
        reading the socket, and try again shortly."""
        if payload is not None:
            self.backlog.appendleft((ftype, payload))
        self.busy = True
        self.conn.hold_reading(self)
        self.ctx.loop.call_later(RETRY_DELAY, self._retry)

    def _retry(self) -> None:
        if self.conn.closed:
            return
        self.busy = False
        if self.pending is not None and self.state == IDLE and self.pending.qids:
            self._complete()  # retry appending a finished message
            if self.busy:
                return
        self.conn.release_reading(self)
        self.resume()

    def resume(self) -> None:
        while self.backlog and not self.busy and not self.conn.closed:
            ftype, payload = self.backlog.popleft()
            self.handle(ftype, payload)
        self.conn.flush_confirms(self)

    # ------------------------------------------------------------- publish
    def _on_publish(self, payload: memoryview) -> None:
        exchange, routing_key, mandatory, immediate = F.decode_publish(payload)
        if immediate:
            raise E.ConnectionError_(E.NOT_IMPLEMENTED, "immediate=true", 60, 40)
        # Routed once the content header is in: a headers exchange needs it.
        self.pending = Pending(exchange, routing_key, mandatory)
        self.state = EXPECT_HEADER

    def fast_publish(self, method: memoryview, header: memoryview, body: memoryview) -> bool:
        """A whole message in three frames, for an idle channel, to a queue.

        Returns False, having changed nothing, whenever the general path is
        needed (errors, unroutable, a body in several frames, a full arena):
        the caller then feeds the frames one by one.
        """
        if self.state != IDLE or self.busy or self.closing or len(header) < 14:
            return False
        if self.conn.flow_blocked or self.flow_backlog:
            return False  # handle() keeps it (flow control, resource alarms)
        class_id, body_size = F.decode_content_header(header)
        if body_size != len(body) or class_id != 60:
            return False
        exchange, routing_key, mandatory, immediate = F.decode_publish(method)
        ctx = self.ctx
        if immediate or body_size > ctx.config.max_message_size:
            return False
        raw_header = bytes(header)
        try:
            qids = self._route(exchange, routing_key, raw_header)
        except E.AMQPError:
            return False  # the general path raises it again, in order
        if not qids:
            return False
        block = ctx.arena.alloc(message_size(exchange, routing_key, raw_header, body_size))
        if block is None:
            return False  # the general path waits for room (and counts it)
        start = write_message(ctx.seg, block, exchange, routing_key, raw_header, body_size)
        ctx.seg.buf[start : start + body_size] = body
        pending = self.pending = Pending(exchange, routing_key, mandatory)
        pending.header = raw_header
        pending.body_size = pending.received = body_size
        pending.qids = qids
        pending.block = block
        self._complete()
        return True

    def _route(self, exchange: bytes, routing_key: bytes, raw_header: bytes) -> list[int]:
        """qids a message reaches (the default exchange: the queue named by
        the routing key). Raises ChannelError for a missing exchange."""
        conn = self.conn
        if not exchange:
            qid = self.ctx.store.lookup(routing_key, conn.vhost_id)
            return [] if qid is None else [qid]
        return list(
            self.ctx.routes.route(conn.vhost, conn.vhost_id, exchange, routing_key, raw_header)
        )

    def _on_header(self, payload: memoryview) -> None:
        pending = self.pending
        if self.state != EXPECT_HEADER or pending is None:
            raise E.ConnectionError_(
                E.UNEXPECTED_FRAME, "expected method frame, got non method frame instead"
            )
        class_id, body_size = F.decode_content_header(payload)
        if class_id != 60:
            raise E.ConnectionError_(
                E.UNEXPECTED_FRAME,
                f"expected content header for class 60, got one for class {class_id} instead",
                60,
                40,
            )
        limit = self.ctx.config.max_message_size
        if body_size > limit:
            self.state = IDLE
            self.pending = None
            raise E.ChannelError(
                E.PRECONDITION_FAILED,
                f"message size {body_size} is larger than configured max size {limit}",
                60,
                40,
            )
        if not pending.header:
            pending.header = bytes(payload)
            pending.body_size = body_size
            try:
                pending.qids = self._route(pending.exchange, pending.routing_key, pending.header)
            except E.ChannelError:
                self.pending = None  # its body frames are dropped by the closing channel
                raise
        if pending.qids:
            size = message_size(pending.exchange, pending.routing_key, pending.header, body_size)
            block = self.ctx.arena.alloc(size)
            if block is None:
                self.ctx.guard.arena_full()
                self.suspend_retry(payload, F.FRAME_HEADER)
                return
            pending.block = block
            pending.body_off = write_message(
                self.ctx.seg,
                block,
                pending.exchange,
                pending.routing_key,
                pending.header,
                body_size,
            )
        else:
            pending.body = bytearray()
        if body_size == 0:
            self.state = IDLE
            self._complete()
        else:
            self.state = EXPECT_BODY

    def _on_body(self, payload: memoryview) -> None:
        pending = self.pending
        if self.state != EXPECT_BODY or pending is None:
            raise E.ConnectionError_(
                E.UNEXPECTED_FRAME, "expected method frame, got non method frame instead"
            )
        n = len(payload)
        if pending.received + n > pending.body_size:
            raise E.ConnectionError_(
                E.FRAME_ERROR, "content body is larger than the size in its content header"
            )
        if pending.body is not None:
            pending.body += payload
        else:
            start = pending.body_off + pending.received
            self.ctx.seg.buf[start : start + n] = payload
        pending.received += n
        if pending.received == pending.body_size:
            self.state = IDLE
            self._complete()

    def _complete(self) -> None:
        """Append the finished message to its queues, then confirm it (or,
        in a transaction, keep it for tx.commit)."""
        pending = self.pending
        assert pending is not None
        routed = bool(pending.qids)  # _append consumes the list
        if self.tx is not None:
            if pending.qids or pending.mandatory:
                self.tx.publishes.append(pending)
        elif pending.qids:
            missing = self._assign_levels(pending)
            if missing is not None:
                self._make_level(pending, *missing)
                return
            if not self._append(pending):
                self.suspend_retry(None)
                return
        elif pending.mandatory:
            self._return(pending)
        self.pending = None
        self.publish_count += 1
        # Statistics (shm/stats.py): RECEIVED is derived at flush time.
        stats = self.stats
        if routed:
            stats[ROUTED] += 1
        else:
            stats[UNROUTABLE_RETURNED if pending.mandatory else UNROUTABLE_DROPPED] += 1
        size = pending.body_size
        stats[SIZE_SUM] += size
        stats[SIZE_BUCKETS if size <= 100 else SIZE_BUCKETS + size_bucket(size)] += 1
        if self.confirm:
            stats[RECEIVED_CONFIRM] += 1
            self.publish_seq += 1
            if pending.rejected:
                self._nack_publish()
            else:
                self.confirm_high = self.publish_seq

    def _consumes(self, qid: int) -> bool:
        """Whether one of this channel's consumers on `qid` can take a
        message now. RabbitMQ's queue hands a message to such a consumer
        before it confirms it, so the client sees basic.deliver before
        basic.ack; clients that publish with confirms and then wait for the
        delivery (aiormq's own tests) rely on that order when the connection
        breaks between the two."""
        return any(c.qid == qid and c.wants_work() for c in self.consumers.values())

    def _nack_publish(self) -> None:
        """A queue refused the message (x-overflow reject-publish): basic.nack
        it, after acking the publishes before it (acks are cumulative)."""
        self.conn.flush_confirms(self, force=True)
        self.confirm_high = self.confirm_sent = self.publish_seq
        self.conn.write(
            F.encode_method(
                self.number,
                C.Basic.Nack(delivery_tag=self.publish_seq, multiple=False, requeue=False),
            )
        )

    def _assign_levels(self, pending: Pending) -> tuple[int, int] | None:
        """Point each priority queue among the message's queues at the log of
        the message's priority (workers/levels.py). Returns (queue, level)
        of one whose level has no log yet: the scheduler must make it."""
        priority_queues = self.ctx.store.priority_levels()
        if not priority_queues:
            return None
        qids = pending.qids
        priority = -1  # parsed from the header once, if a priority queue needs it
        for i, qid in enumerate(qids):
            levels = priority_queues.get(qid)
            if levels is None or (pending.levelled is not None and qid in pending.levelled):
                continue
            if priority < 0:
                priority = F.message_priority(pending.header)
            level = min(priority, levels.max_priority)
            target = levels.by_level.get(level)
            if target is None:
                return qid, level
            qids[i] = target
        return None

    def _make_level(self, pending: Pending, qid: int, level: int) -> None:
        """Ask the scheduler for a level's log; the channel (and the socket)
        waits, so later publishes keep their order behind this one."""
        self.busy = True
        self.conn.hold_reading(self, reason=None)  # a round trip: not "blocked"
        reply = self.ctx.request(ipc.Level(qid, level))

        def made(reply: asyncio.Future[Any]) -> None:
            if self.conn.closed:
                return
            self.busy = False
            exc = reply.exception() if not reply.cancelled() else None
            if exc is not None or reply.cancelled():
                log.error("connection %x: no priority level log", self.conn.id, exc_info=exc)
                self.conn.fail(
                    E.ConnectionError_(E.INTERNAL_ERROR, "no log for a priority level", 60, 40)
                )
                return
            self._use_level(pending, qid, reply.result()[0])
            self._complete()
            if not self.busy:
                self.conn.release_reading(self)
                self.resume()

        reply.add_done_callback(made)

    @staticmethod
    def _use_level(pending: Pending, qid: int, target: int) -> None:
        """The scheduler's answer: the level's log (with no slot free, a
        lower level's, maybe the queue's own), or -1 if the queue was
        deleted (the append then finds it gone and drops the message)."""
        if target >= 0 and qid in pending.qids:
            pending.qids[pending.qids.index(qid)] = target
            if pending.levelled is None:
                pending.levelled = set()
            pending.levelled.add(target)

    def _append(self, pending: Pending) -> bool:
        """Append a routed message to each of its queues, then drop the
        publisher's HOLD. False if a queue is full: `pending.qids` keeps the
        queues still to do, and the caller retries later."""
        ctx = self.ctx
        block = pending.block
        publish = ctx.store.publish
        while pending.qids:
            qid = pending.qids[0]
            outcome = publish(qid, block, pending.body_size, ctx.slot)
            if outcome:
                if outcome == FULL:
                    return False
                if outcome == REJECTED:
                    pending.rejected = True
                elif outcome == OVER_CAPACITY:
                    # This connection's next publishes wait (shm/flow.py).
                    self.conn.flow_block(*ctx.store.flow_queue(qid))
            pending.qids.pop(0)
            if self.confirm and self.consumers and not self.confirm_held:
                self.confirm_held = self._consumes(qid)
        release_hold(ctx.seg, block)
        return True

    def _return(self, pending: Pending) -> None:
        method = C.Basic.Return(
            reply_code=312,
            reply_text="NO_ROUTE",
            exchange=pending.exchange.decode(),
            routing_key=pending.routing_key.decode(errors="replace"),
        )
        frames = [F.encode_method(self.number, method)]
        frames += F.encode_content(
            self.number, pending.header, bytes(pending.body or b""), self.conn.frame_max
        )
        self.conn.write_many(frames)

    # ------------------------------------------------------------ delivery
    def can_deliver(self) -> bool:
        return self.flow_active and not self.closing and self.conn.can_deliver()

    def deliver(
        self,
        consumer: Consumer,
        qid: int,
        seq: int,
        block: int,
        redelivered: bool,
        out: list[bytes],
    ) -> None:
        """Deliver entry `seq` of log `qid` (the consumer's queue, or one of
        its priority levels), acquired by `consumer`, into `out`."""
        self._send(consumer, qid, seq, read_message(self.ctx.seg, block), redelivered, out)

    def deliver_copy(
        self, consumer: Consumer, message: Message, redelivered: bool, out: list[bytes]
    ) -> None:
        """A browser's delivery: a copy, nothing acquired; acking its tag
        settles nothing (seq -1)."""
        self._send(consumer, consumer.qid, -1, message, redelivered, out)

    def _send(
        self,
        consumer: Consumer,
        qid: int,
        seq: int,
        message: Message,
        redelivered: bool,
        out: list[bytes],
    ) -> None:
        exchange, routing_key, header, body = message
        tag = self.next_tag
        self.next_tag = tag + 1
        stats = self.stats
        if redelivered:
            stats[REDELIVERED] += 1
        if consumer.no_ack:
            stats[DELIVERED_CONSUME_AUTO_ACK] += 1
            if seq >= 0:
                self.ctx.store.settle_taken(qid, seq)
        else:
            stats[DELIVERED_CONSUME_MANUAL_ACK] += 1
            size = len(body)
            self.unacked[tag] = (consumer, qid, seq, size)
            consumer.unacked += 1
            consumer.unacked_bytes += size
            self.unacked_bytes += size
        out.append(
            F.encode_deliver(
                self.number, consumer.tag_sstr, tag, redelivered, exchange, routing_key
            )
        )
        out += F.encode_content(self.number, header, body, self.conn.frame_max)

    def _acknowledge(self, tag: int, multiple: bool, requeue: bool | None, method_id: int) -> None:
        if self.tx is not None:
            self.tx.settles.append((tag, multiple, requeue, method_id))  # applied on commit
        else:
            self._settle(tag, multiple, requeue, method_id)

    def _settle(self, tag: int, multiple: bool, requeue: bool | None, method_id: int) -> None:
        """Ack (requeue None), or nack/reject (requeue True/False); `method_id`
        (ack 80, reject 90, nack 120) goes into the close of an unknown tag."""
        unacked = self.unacked
        if multiple:
            tags = [t for t in unacked if t <= tag] if tag else list(unacked)
        elif tag in unacked:
            tags = [tag]
        else:
            tags = []
        if not tags and (tag or not multiple):
            raise E.ChannelError(
                E.PRECONDITION_FAILED, f"unknown delivery tag {tag}", 60, method_id
            )
        if requeue is None:
            self.stats[S.ACKNOWLEDGED] += len(tags)
        touched: set[Consumer] = set()
        for t in tags:
            consumer, qid, seq, size = unacked.pop(t)
            self._finish(qid, seq, requeue)
            self.unacked_bytes -= size
            if consumer is not None:
                consumer.unacked -= 1
                consumer.unacked_bytes -= size
                touched.add(consumer)
        if self.global_prefetch or self.global_prefetch_size:
            touched.update(self.consumers.values())  # channel-wide credit came back
        for consumer in touched:
            update_interest(self.ctx, consumer)

    def _finish(self, qid: int, seq: int, requeue: bool | None) -> None:
        if seq < 0:
            return  # a browser's copy: nothing was taken from the queue
        if requeue:
            self.ctx.store.requeue(qid, seq)
        else:
            self.ctx.store.settle(qid, seq)

    def requeue_all(self) -> None:
        for consumer, qid, seq, _size in self.unacked.values():
            self._finish(qid, seq, True)
            if consumer is not None:
                consumer.unacked = consumer.unacked_bytes = 0
        self.unacked.clear()
        self.unacked_bytes = 0

    # -------------------------------------------------------- lifecycle
    def fail(self, exc: E.AMQPError) -> None:
        """A channel exception: close this channel, keep the connection."""
        self.release()
        self.closing = True
        self.backlog.clear()
        self.conn.write(
            F.encode_method(
                self.number,
                C.Channel.Close(
                    reply_code=exc.reply_code,
                    reply_text=exc.reply_text[:255],
                    class_id=exc.class_id,
                    method_id=exc.method_id,
                ),
            )
        )

    def release(self) -> None:
        """Cancel consumers, roll back an open transaction and requeue unacked
        messages (close or crash)."""
        for consumer in self.consumers.values():
            self._drop_consumer(consumer)
        self.consumers.clear()
        self._rollback()
        self.requeue_all()
        pending = self.pending
        if pending is not None and pending.block and pending.body is None:
            # A half-received message was never appended anywhere.
            release_hold(self.ctx.seg, pending.block)
        # Publishes kept by flow control are dropped with the channel, like
        # the unconfirmed publishes of a channel that closes.
        self.conn.held_bytes -= sum(len(payload) for _ftype, payload in self.flow_backlog)
        self.flow_backlog.clear()
        self.pending = None
        self.state = IDLE

    def _drop_consumer(self, consumer: Consumer) -> None:
        if not consumer.cancelled:
            consumer.cancelled = True
            self.ctx.send(ipc.Cancel(consumer.cid))
        self.ctx.consumers.pop(consumer.cid, None)

    # ------------------------------------------------------ method handlers
    def _channel_close(self, method: C.Channel.Close) -> None:
        self.conn.flush_confirms(self, force=True)
        self.release()
        self.conn.write(F.encode_method(self.number, C.Channel.CloseOk()))
        if self.closing:
            # The client's channel.close crossed ours: answered, as RabbitMQ
            # does, and the channel stays until the client's close-ok for
            # ours arrives (that frame is part of the handshake, not one on
            # a closed channel).
            return
        self.conn.forget_channel(self.number)

    def _channel_close_ok(self, method: C.Channel.CloseOk) -> None:
        self.conn.forget_channel(self.number)

    def _channel_open(self, method: C.Channel.Open) -> None:
        raise E.ConnectionError_(E.CHANNEL_ERROR, "second 'channel.open' seen", 20, 10)

    def send_flow(self, active: bool) -> None:
        """Tell a client that obeys channel.flow to stop (or resume)
        publishing on this channel; once per change."""
        if active == self.flow_told or self.closing:
            return
        self.flow_told = active
        self.conn.write(F.encode_method(self.number, C.Channel.Flow(active=active)))

    def _channel_flow_ok(self, method: C.Channel.FlowOk) -> None:
        pass  # the client's answer to send_flow: nothing to do

    def _channel_flow(self, method: C.Channel.Flow) -> None:
        self.flow_active = bool(method.active)
        self.conn.write(F.encode_method(self.number, C.Channel.FlowOk(active=method.active)))
        for consumer in self.consumers.values():
            update_interest(self.ctx, consumer)

    def _basic_qos(self, method: C.Basic.Qos) -> None:
        # Applied to live consumers too (as LavinMQ does): Celery relies on it.
        # global=true limits the channel as a whole (RabbitMQ 3.x semantics,
        # which 4.x denies by default); both limits may be set at once.
        if method.global_:
            self.global_prefetch = method.prefetch_count
            self.global_prefetch_size = method.prefetch_size
        else:
            self.prefetch_count = method.prefetch_count
            self.prefetch_size = method.prefetch_size
        self.conn.write(F.encode_method(self.number, C.Basic.QosOk()))
        for consumer in self.consumers.values():
            update_interest(self.ctx, consumer)

    def _confirm_select(self, method: C.Confirm.Select) -> None:
        if self.tx is not None:
            raise E.ChannelError(
                E.PRECONDITION_FAILED, "cannot switch from tx to confirm mode", 85, 10
            )
        self.confirm = True
        if not method.nowait:
            self.conn.write(F.encode_method(self.number, C.Confirm.SelectOk()))

    def _tx_select(self, method: C.Tx.Select) -> None:
        if self.confirm:
            raise E.ChannelError(
                E.PRECONDITION_FAILED, "cannot switch from confirm to tx mode", 90, 10
            )
        if self.tx is None:
            self.tx = Transaction()
        self.conn.write(F.encode_method(self.number, C.Tx.SelectOk()))

    def _tx_commit(self, method: C.Tx.Commit) -> Coroutine[Any, Any, None]:
        if self.tx is None:
            raise E.ChannelError(E.PRECONDITION_FAILED, "channel is not transactional", 90, 20)
        tx, self.tx = self.tx, Transaction()
        return self._commit(tx)

    async def _commit(self, tx: Transaction) -> None:
        """Publishes first, in order, then acknowledgements; the channel's
        later frames wait (busy) until commit-ok is sent."""
        todo = list(tx.publishes)
        try:
            while todo:
                pending = todo[0]
                missing = self._assign_levels(pending) if pending.qids else None
                if missing is not None:
                    reply = await self.ctx.request(ipc.Level(*missing))
                    self._use_level(pending, missing[0], reply[0])
                    if self.conn.closed or self.closing:
                        return
                    continue
                if not pending.qids:
                    self._return(pending)  # mandatory and unroutable
                elif not self._append(pending):
                    await asyncio.sleep(RETRY_DELAY)  # a queue is full: back-pressure
                    if self.conn.closed or self.closing:
                        return
                    continue
                todo.pop(0)
        finally:
            # Closed mid-commit: what was not appended is dropped, as at a rollback.
            for pending in todo:
                if pending.qids and pending.body is None:
                    release_hold(self.ctx.seg, pending.block)
        for tag, multiple, requeue, method_id in tx.settles:
            self._settle(tag, multiple, requeue, method_id)
        self.conn.write(F.encode_method(self.number, C.Tx.CommitOk()))

    def _tx_rollback(self, method: C.Tx.Rollback) -> None:
        if self.tx is None:
            raise E.ChannelError(E.PRECONDITION_FAILED, "channel is not transactional", 90, 30)
        self._rollback()
        self.tx = Transaction()
        self.conn.write(F.encode_method(self.number, C.Tx.RollbackOk()))

    def _rollback(self) -> None:
        """Forget the transaction's publishes (their bodies are freed) and
        acknowledgements (the messages stay unacknowledged)."""
        if self.tx is None:
            return
        for pending in self.tx.publishes:
            if pending.qids and pending.body is None:
                release_hold(self.ctx.seg, pending.block)
        self.tx.publishes.clear()
        self.tx.settles.clear()

    def _resolve_queue(self, name: str, class_method: tuple[int, int]) -> tuple[bytes, int]:
        raw = name.encode() if name else self.last_queue
        if not raw:
            raise E.ChannelError(E.NOT_FOUND, "no previously declared queue", *class_method)
        qid = self.ctx.store.lookup(raw, self.conn.vhost_id)
        if qid is None:
            raise E.ChannelError(
                E.NOT_FOUND,
                E.no_queue(raw.decode(errors="replace"), self.conn.vhost),
                *class_method,
            )
        owner = self.ctx.store.exclusive_owner(qid)
        if owner is not None and owner != self.conn.id:
            raise E.ChannelError(
                E.RESOURCE_LOCKED,
                E.locked_queue(raw.decode(errors="replace"), self.conn.vhost),
                *class_method,
            )
        return raw, qid

    async def _queue_declare(self, method: C.Queue.Declare) -> None:
        name = method.queue.encode()
        if _FAULT_QUEUE and name == _FAULT_QUEUE:
            raise RuntimeError("injected fault")
        if name.startswith(b"amq.") and not method.passive:
            raise E.ChannelError(
                E.ACCESS_REFUSED,
                f"queue name '{method.queue}' contains reserved prefix 'amq.*'",
                50,
                10,
            )
        owner = self.conn.id if method.exclusive else 0
        _qid, qname, ready, consumers = await self.ctx.request(
            ipc.Declare(
                vhost=self.conn.vhost,
                name=name,
                passive=method.passive,
                durable=method.durable,
                exclusive=method.exclusive,
                auto_delete=method.auto_delete,
                owner=owner,
                conn_id=self.conn.id,
                arguments=dict(method.arguments or {}),
            )
        )
        self.last_queue = qname
        if not method.nowait:
            self.conn.write(
                F.encode_method(
                    self.number,
                    C.Queue.DeclareOk(
                        queue=qname.decode(), message_count=ready, consumer_count=consumers
                    ),
                )
            )

    async def _queue_delete(self, method: C.Queue.Delete) -> None:
        name = method.queue.encode() if method.queue else self.last_queue
        conn = self.conn
        conn.queue_delete_started()  # its consumers' basic.cancel follow the delete-ok
        try:
            count = await self.ctx.request(
                ipc.Delete(conn.vhost, name, method.if_unused, method.if_empty, conn.id)
            )
            if not method.nowait:
                conn.write(F.encode_method(self.number, C.Queue.DeleteOk(message_count=count)))
        finally:
            conn.queue_delete_done()

    async def _queue_purge(self, method: C.Queue.Purge) -> None:
        name = method.queue.encode() if method.queue else self.last_queue
        count = await self.ctx.request(ipc.Purge(self.conn.vhost, name, self.conn.id))
        if not method.nowait:
            self.conn.write(F.encode_method(self.number, C.Queue.PurgeOk(message_count=count)))

    # ---------------------------------------------------- exchanges, bindings
    def _exchange_declare(self, method: C.Exchange.Declare) -> Coroutine[Any, Any, None]:
        if not method.exchange:
            raise E.ChannelError(
                E.ACCESS_REFUSED, "operation not permitted on the default exchange", 40, 10
            )
        if not method.passive and method.exchange_type not in EXCHANGE_TYPES:
            raise E.ConnectionError_(
                E.COMMAND_INVALID, f"unknown exchange type '{method.exchange_type}'", 40, 10
            )
        return self._definitions_rpc(
            method,
            C.Exchange.DeclareOk(),
            ipc.ExchangeDeclare(
                vhost=self.conn.vhost,
                name=method.exchange,
                exchange_type=method.exchange_type,
                passive=method.passive,
                durable=method.durable,
                auto_delete=method.auto_delete,
                internal=method.internal,
                arguments=dict(method.arguments or {}),
            ),
        )

    def _exchange_delete(self, method: C.Exchange.Delete) -> Coroutine[Any, Any, None]:
        name = method.exchange
        if not name:
            raise E.ChannelError(
                E.ACCESS_REFUSED, "operation not permitted on the default exchange", 40, 20
            )
        if name.startswith("amq."):
            raise E.ChannelError(
                E.ACCESS_REFUSED,
                f"deletion of system exchange '{name}' in vhost '{self.conn.vhost}' not allowed",
                40,
                20,
            )
        return self._definitions_rpc(
            method,
            C.Exchange.DeleteOk(),
            ipc.ExchangeDelete(self.conn.vhost, name, method.if_unused),
        )

    def _exchange_bind(
        self, method: C.Exchange.Bind | C.Exchange.Unbind
    ) -> Coroutine[Any, Any, None]:
        unbind = isinstance(method, C.Exchange.Unbind)
        for name in (method.source, method.destination):
            if not name:
                raise E.ChannelError(
                    E.ACCESS_REFUSED,
                    "operation not permitted on the default exchange",
                    *divmod(method.index, 0x10000),
                )
        return self._definitions_rpc(
            method,
            C.Exchange.UnbindOk() if unbind else C.Exchange.BindOk(),
            (ipc.Unbind if unbind else ipc.Bind)(
                vhost=self.conn.vhost,
                source=method.source,
                kind="e",
                dest=method.destination,
                routing_key=method.routing_key,
                arguments=dict(method.arguments or {}),
                conn_id=self.conn.id,
            ),
        )

    def _queue_bind(self, method: C.Queue.Bind | C.Queue.Unbind) -> Coroutine[Any, Any, None]:
        unbind = isinstance(method, C.Queue.Unbind)
        class_method = divmod(method.index, 0x10000)
        if not method.exchange:
            raise E.ChannelError(
                E.ACCESS_REFUSED, "operation not permitted on the default exchange", *class_method
            )
        queue = method.queue
        routing_key = method.routing_key
        if not queue:
            # The spec's shortcuts: the channel's last declared queue, and
            # its name as routing key when both are empty.
            if not self.last_queue:
                raise E.ChannelError(E.NOT_FOUND, "no previously declared queue", *class_method)
            queue = self.last_queue.decode()
            if not routing_key:
                routing_key = queue
        return self._definitions_rpc(
            method,
            C.Queue.UnbindOk() if unbind else C.Queue.BindOk(),
            (ipc.Unbind if unbind else ipc.Bind)(
                vhost=self.conn.vhost,
                source=method.exchange,
                kind="q",
                dest=queue,
                routing_key=routing_key,
                arguments=dict(method.arguments or {}),
                conn_id=self.conn.id,
            ),
        )

    async def _definitions_rpc(self, method: Any, ok: Any, request: ipc.Request) -> None:
        """A definitions change or check, decided by the scheduler; it has
        journaled the change before it replies, so publishes after the -ok
        route through it (shm/catalog.py). Sent when the coroutine runs, as
        the channel's turn comes."""
        await self.ctx.request(request)
        if not getattr(method, "nowait", False):
            self.conn.write(F.encode_method(self.number, ok))

    async def _basic_consume(self, method: C.Basic.Consume) -> None:
        name, qid = self._resolve_queue(method.queue, (60, 20))
        tag = (method.consumer_tag or "").encode() or b"amq.ctag-" + os.urandom(11).hex().encode()
        if tag in self.consumers:
            raise E.ConnectionError_(
                E.NOT_ALLOWED, f"attempt to reuse consumer tag '{tag.decode()}'", 60, 20
            )
        args = method.arguments or {}
        priority = args.get("x-priority", 0)
        if not isinstance(priority, int) or isinstance(priority, bool):
            raise _invalid_consumer_argument("x-priority", priority)
        browse, auto_close = (
            _flag_argument(args, name) for name in ("x-filter-no-consume", "x-filter-auto-close")
        )
        selector = _selector_argument(args)
        ctx = self.ctx
        consumer = Consumer(
            ctx.next_cid(),
            tag,
            self,
            qid,
            name,
            method.no_ack,
            method.exclusive,
            priority,
            acquiring=not browse,
            auto_close=auto_close,
            wanted=None if selector is None else selector.matches,
            selector=None if selector is None else selector.text,
            levels=Levels(ctx.store, qid) if qid in ctx.store.priority_levels() else None,
        )
        # Registered as not interested: no delivery may overtake consume-ok.
        consumer.interested = False
        self.consumers[tag] = consumer
        ctx.consumers[consumer.cid] = consumer
        try:
            registered = await ctx.request(
                ipc.Consume(
                    cid=consumer.cid,
                    qid=qid,
                    priority=priority,
                    acquiring=consumer.acquiring,
                    exclusive=method.exclusive,
                    interested=False,  # no delivery may overtake consume-ok
                    conn_id=self.conn.id,
                )
            )
        except BaseException:
            consumer.cancelled = True
            self.consumers.pop(tag, None)
            ctx.consumers.pop(consumer.cid, None)
            raise
        if registered:
            consumer.since = registered[0]
        if consumer.cancelled:
            return
        if not method.nowait:
            self.conn.write(
                F.encode_method(self.number, C.Basic.ConsumeOk(consumer_tag=tag.decode()))
            )
        update_interest(ctx, consumer)

    def _basic_cancel(self, method: C.Basic.Cancel) -> None:
        tag = method.consumer_tag or ""
        consumer = self.consumers.pop(tag.encode(), None)
        if consumer is not None:
            self._drop_consumer(consumer)
        if not method.nowait:
            self.conn.write(F.encode_method(self.number, C.Basic.CancelOk(consumer_tag=tag)))

    def cancel_from_server(self, consumer: Consumer) -> None:
        """An auto-close browser reached the end of its queue."""
        self._drop_consumer(consumer)
        self.consumer_gone(consumer)

    def consumer_gone(self, consumer: Consumer) -> None:
        """The scheduler cancelled this consumer (its queue was deleted)."""
        self.consumers.pop(consumer.tag, None)
        consumer.cancelled = True
        self.ctx.consumers.pop(consumer.cid, None)
        if self.conn.capabilities.get("consumer_cancel_notify"):
            self.conn.write_cancel(
                self,
                F.encode_method(
                    self.number, C.Basic.Cancel(consumer_tag=consumer.tag.decode(), nowait=True)
                ),
            )

    def _basic_get(self, method: C.Basic.Get) -> None:
        # A one-message temporary subscription: acquire from the head.
        _name, qid = self._resolve_queue(method.queue, (60, 70))
        ctx = self.ctx
        logs = ctx.store.logs(qid)  # highest priority first
        for log_qid in logs:
            got = ctx.store.acquire(log_qid, 0)
            if got.__class__ is not int:
                break
        else:
            ctx.stats.v[S.GET_EMPTY] += 1
            self.conn.write(F.encode_method(self.number, C.Basic.GetEmpty()))
            return
        seq, block, redelivered = got  # type: ignore[misc]
        v = ctx.stats.v
        v[S.DELIVERED_GET_AUTO_ACK if method.no_ack else S.DELIVERED_GET_MANUAL_ACK] += 1
        if redelivered:
            v[S.REDELIVERED] += 1
        exchange, routing_key, header, body = read_message(ctx.seg, block)
        tag = self.next_tag
        self.next_tag += 1
        if method.no_ack:
            ctx.store.settle_taken(log_qid, seq)
        else:
            self.unacked[tag] = (None, log_qid, seq, len(body))
            self.unacked_bytes += len(body)
        ready = ctx.store.ready(qid)
        frames = [
            F.encode_method(
                self.number,
                C.Basic.GetOk(
                    delivery_tag=tag,
                    redelivered=redelivered,
                    exchange=exchange.decode(),
                    routing_key=routing_key.decode(errors="replace"),
                    message_count=ready,
                ),
            )
        ]
        frames += F.encode_content(self.number, header, body, self.conn.frame_max)
        self.conn.write_many(frames)

    def _basic_recover(self, method: C.Basic.Recover | C.Basic.RecoverAsync) -> None:
        if method.requeue:
            self.requeue_all()
        else:
            self._redeliver_in_place()
        for consumer in self.consumers.values():
            update_interest(self.ctx, consumer)
        if isinstance(method, C.Basic.Recover):
            self.conn.write(F.encode_method(self.number, C.Basic.RecoverOk()))

    def _redeliver_in_place(self) -> None:
        """recover(requeue=false), as the spec says (RabbitMQ answers 540):
        each unacknowledged message goes again, redelivered, under a new
        tag, to the consumer that had it; messages from basic.get, or of a
        consumer since cancelled, are requeued instead."""
        ctx = self.ctx
        out: list[bytes] = []
        for tag in sorted(self.unacked):
            consumer, qid, seq, size = self.unacked.pop(tag)
            self.unacked_bytes -= size
            if consumer is not None:
                consumer.unacked -= 1
                consumer.unacked_bytes -= size
            if seq < 0:
                continue  # a browser's copy: there is nothing to redeliver
            block = None
            if consumer is not None and not consumer.cancelled:
                block = ctx.store.held_block(qid, seq)
            if consumer is None or block is None:
                self._finish(qid, seq, True)
                continue
            self.deliver(consumer, qid, seq, block, True, out)
        if out:
            self.conn.write_many(out)


def _invalid_consumer_argument(name: str, value: object) -> E.ChannelError:
    return E.ChannelError(
        E.PRECONDITION_FAILED, f"invalid arg '{name}' for consumer: {value!r}", 60, 20
    )


def _flag_argument(args: dict[str, Any], name: str) -> bool:
    """A boolean consume argument (absent: false)."""
    value = args.get(name, False)
    if not isinstance(value, bool):
        raise _invalid_consumer_argument(name, value)
    return value


def _selector_argument(args: dict[str, Any]) -> Selector | None:
    """x-filter-jms-selector, compiled; an empty one selects everything."""
    text = args.get("x-filter-jms-selector")
    if text is None:
        return None
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    if not isinstance(text, str):
        raise _invalid_consumer_argument("x-filter-jms-selector", text)
    try:
        selector = compile_selector(text)
    except SelectorError as exc:
        raise E.ChannelError(E.PRECONDITION_FAILED, str(exc), 60, 20) from None
    return selector if text.strip() else None


# Methods that pass a channel's flow-control backlog: acks (consumers on a
# blocked connection keep acking) and the close handshake.
_NEVER_KEPT = frozenset((F.ACK, F.NACK, F.REJECT, C.Channel.Close.index, C.Channel.CloseOk.index))

_Handler = Callable[[Channel, Any], Coroutine[Any, Any, None] | None]
_HANDLERS: dict[type, _Handler] = {
    C.Channel.Close: Channel._channel_close,
    C.Channel.CloseOk: Channel._channel_close_ok,
    C.Channel.FlowOk: Channel._channel_flow_ok,
    C.Channel.Open: Channel._channel_open,
    C.Channel.Flow: Channel._channel_flow,
    C.Basic.Qos: Channel._basic_qos,
    C.Basic.Consume: Channel._basic_consume,
    C.Basic.Cancel: Channel._basic_cancel,
    C.Basic.Get: Channel._basic_get,
    C.Basic.Recover: Channel._basic_recover,
    C.Basic.RecoverAsync: Channel._basic_recover,
    C.Confirm.Select: Channel._confirm_select,
    C.Tx.Select: Channel._tx_select,
    C.Tx.Commit: Channel._tx_commit,
    C.Tx.Rollback: Channel._tx_rollback,
    C.Queue.Declare: Channel._queue_declare,
    C.Queue.Bind: Channel._queue_bind,
    C.Queue.Unbind: Channel._queue_bind,
    C.Exchange.Declare: Channel._exchange_declare,
    C.Exchange.Delete: Channel._exchange_delete,
    C.Exchange.Bind: Channel._exchange_bind,
    C.Exchange.Unbind: Channel._exchange_bind,
    C.Queue.Delete: Channel._queue_delete,
    C.Queue.Purge: Channel._queue_purge,
}
