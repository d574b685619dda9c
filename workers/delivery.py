"""A channel's deliveries: its consumers (basic.consume, basic.cancel, the
server's cancel), basic.get, credit (basic.qos) and the unacknowledged
messages it owns (ack, nack, reject, recover, requeue on close)."""

from __future__ import annotations

import logging
import random
from asyncio import Future
from collections import deque
from collections.abc import Callable, Iterable

from pamqp import commands as C

from shoal.broker import ipc
from shoal.broker.amqp import dead_letter_rules, errors, field_table, properties
from shoal.broker.amqp.definitions import server_generated
from shoal.shm import stats
from shoal.shm.arena import read_message
from shoal.shm.queue_table import QueueFlag
from shoal.shm.queues import Message
from shoal.shm.stats import DELIVERED_CONSUME_AUTO_ACK, DELIVERED_CONSUME_MANUAL_ACK, REDELIVERED
from shoal.store.stream_segments import StreamMessage
from shoal.workers import consume_args, framing, reply_to, timeouts
from shoal.workers._wire import ack_run, deliver_frames, deliver_run
from shoal.workers.channel_state import (
    ChannelConnection,
    ChannelCore,
    DeliveryContext,
    Transactional,
)
from shoal.workers.connection_access import READ
from shoal.workers.consumer import Consumer
from shoal.workers.pull import drop_watch, start, take_ready, update_interest
from shoal.workers.send_bound import bound_unsent
from shoal.workers.unmade import UNMADE, UNMADE_SET, made_set

log = logging.getLogger("shoal.worker")

_ALL_TAGS = (1 << 64) - 1  # a multiple ack of tag 0: every delivery

# The declarer's resolve_queue (workers/declare.py): the queue a consume or
# a get names, checked for a permission.
ResolveQueue = Callable[[str, tuple[int, int], str], tuple[bytes, int]]


class DeliveryBook:
    """The delivery side of a channel: its consumers, basic.get, and the
    only owner of credit and unacked counts. Consumers (workers/consumer.py)
    see their channel through it (DeliveryChannel)."""

    __slots__ = (
        "acked",
        "channel",
        "conn",
        "consumers",
        "ctx",
        "delivery_marks",
        "flow_active",
        "gets",
        "global_prefetch",
        "global_prefetch_size",
        "next_tag",
        "no_ack_held",
        "number",
        "prefetch_count",
        "prefetch_size",
        "reply_queue",
        "resolve_queue",
        "stats",
        "timed_out_tags",
        "transactions",
        "unacked",
        "unacked_bytes",
    )

    def __init__(
        self, channel: ChannelCore, conn: ChannelConnection, tx: Transactional, find: ResolveQueue
    ) -> None:
        self.channel, self.conn, self.transactions, self.resolve_queue = channel, conn, tx, find
        self.ctx: DeliveryContext = conn.ctx
        self.number = channel.number
        self.stats = conn.ctx.stats.v  # this worker's counters (shm/stats.py)
        self.consumers: dict[bytes, Consumer] = {}
        # delivery tag -> (consumer or None for basic.get, qid, seq, body bytes)
        self.unacked: dict[int, tuple[Consumer | None, int, int, int]] = {}
        self.gets = 0  # of them, basic.get's (no credit: RabbitMQ's limiter ignores them)
        self.next_tag = 1
        # basic.qos: per consumer (global=false) and per channel (global=true),
        # in messages and in body bytes.
        self.prefetch_count = self.prefetch_size = 0
        self.global_prefetch = self.global_prefetch_size = 0
        self.no_ack_held = False  # (basic_qos)
        self.unacked_bytes = 0
        self.acked = 0  # messages acknowledged on this channel (its message_stats)
        self.flow_active = True  # the client's channel.flow
        # Direct reply-to (workers/reply_to.py): the queue this channel's
        # reply consumer reads (b"": none).
        self.reply_queue = b""
        # Consumer timeouts (workers/timeouts.py): delivery tags marked with the time once
        # a second, and tags requeued by a timeout (their late acks are ignored).
        self.delivery_marks: deque[tuple[int, float]] = UNMADE
        self.timed_out_tags: set[int] = UNMADE_SET

    def wants_work(self, consumer: Consumer) -> bool:
        """Consumer.wants_work, in one call on the delivery path."""
        return (
            not consumer.cancelled
            and ((consumer.no_ack and not self.no_ack_held) or self.has_credit(consumer))
            and self.flow_active
            and not self.channel.closing
            and self.conn.can_deliver()
        )

    def has_credit(self, consumer: Consumer) -> bool:
        """basic.qos credit of an acknowledging consumer. A byte limit admits
        one more message while the unacknowledged bytes are below it (the
        next message's size is not known before it is acquired), so it may be
        exceeded by one message."""
        if self.prefetch_count and consumer.unacked >= self.prefetch_count:
            return False
        if self.global_prefetch and len(self.unacked) - self.gets >= self.global_prefetch:
            return False
        if self.prefetch_size and consumer.unacked_bytes >= self.prefetch_size:
            return False
        return not (self.global_prefetch_size and self.unacked_bytes >= self.global_prefetch_size)

    def credit_room(self, consumer: Consumer) -> int:
        """How many messages the consumer may take now without a check per
        message: its room under the prefetch counts (1 under a byte limit,
        which only the next message's size can decide). Call after
        wants_work() said it may take one."""
        if consumer.no_ack:
            return 1 << 30
        if self.prefetch_size or self.global_prefetch_size:
            return 1
        room = self.prefetch_count - consumer.unacked if self.prefetch_count else 1 << 30
        if self.global_prefetch:
            room = min(room, self.global_prefetch - len(self.unacked) + self.gets)
        return room

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
        its priority levels), acquired by `consumer`, into `out`: its frames
        built in C from shared memory (workers/_wire.c), unless its header
        changes (x-shoal-id, x-delivery-count) or the firehose copies it."""
        if consumer.stamp or redelivered or self.conn.access.tracing:
            self._send(consumer, qid, seq, read_message(self.ctx.seg, block), redelivered, out)
            return
        tag = self.next_tag
        self.next_tag = tag + 1
        frames, size = deliver_frames(
            self.ctx.atomic,
            block,
            self.number,
            consumer.tag_sstr,
            tag,
            False,
            self.conn.frame_max,
        )
        out.append(frames)
        if consumer.no_ack:
            self.stats[DELIVERED_CONSUME_AUTO_ACK] += 1
            self.ctx.shared.settle_taken(qid, seq)  # after the copy: this frees the block
        else:
            self.stats[DELIVERED_CONSUME_MANUAL_ACK] += 1
            self.unacked[tag] = (consumer, qid, seq, size)
            consumer.unacked += 1
            consumer.unacked_bytes += size
            self.unacked_bytes += size

    def deliver_run(
        self, consumer: Consumer, qid: int, limit: int, out: list[bytes]
    ) -> tuple[int, int, int, int, int] | None:
        """Up to `limit` deliveries of a plain consumer's run in one C call
        (workers/_wire.c deliver_run: acquired, frames built into one
        buffer, deleted at once without acks or booked as unacked). Returns
        (delivered, status, a, b, c): RUN_FULL, RUN_EMPTY (a: the changes
        value for DONE) or RUN_ENTRY (an entry acquired for `deliver`: seq
        a, block b, redelivered c); None where the shared queues' atomics are not
        the plain Atomic (the caller delivers one by one)."""
        shared = self.ctx.shared
        args = shared.run_args(qid)
        if args is None or consumer.stamp or self.conn.access.tracing:
            return None  # (the firehose: one by one, each traced in _send)
        no_ack = consumer.no_ack
        frames, count, consumer.pointer, next_tag, body_bytes, status, a, b, c = deliver_run(
            args,
            consumer.pointer,
            limit,
            self.number,
            consumer.tag_sstr,
            self.next_tag,
            self.conn.frame_max,
            no_ack,
            None if no_ack else self.unacked,
            consumer,
            qid,
        )
        if count:
            out.append(frames)  # type: ignore[arg-type]  # bytes when count
            self.next_tag = next_tag
            if no_ack:
                self.stats[DELIVERED_CONSUME_AUTO_ACK] += count
                shared.drained(qid)
            else:
                self.stats[DELIVERED_CONSUME_MANUAL_ACK] += count
                consumer.unacked += count
                consumer.unacked_bytes += body_bytes
                self.unacked_bytes += body_bytes
        return count, status, a, b, c

    def deliver_copy(
        self, consumer: Consumer, message: Message, redelivered: bool, out: list[bytes]
    ) -> None:
        """A browser's delivery: a copy, nothing acquired; acking its tag
        settles nothing (seq -1)."""
        self._send(consumer, consumer.qid, -1, message, redelivered, out)

    def deliver_stream(self, consumer: Consumer, message: StreamMessage, out: list[bytes]) -> None:
        """A stream consumer's delivery: a copy from the stream's files;
        acking its tag only returns credit (seq -1)."""
        _offset, exchange, routing_key, header, body, _filter = message
        self._send(consumer, consumer.qid, -1, (exchange, routing_key, header, body), False, out)  # type: ignore[arg-type]

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
        if self.conn.access.tracing and (firehose := self.ctx.firehose) is not None:
            firehose.delivered(self.conn, self.number, consumer.queue_name, redelivered, message)
        if consumer.stamp and seq >= 0:
            header = properties.add_header(header, self._entry_id(qid, seq))
        if redelivered and seq >= 0 and (count := self.delivery_count(qid, seq, False)):
            header = properties.with_header(header, b"x-delivery-count", field_table.long(count))
        tag = self.next_tag
        self.next_tag = tag + 1
        worker_stats = self.stats
        if redelivered:
            worker_stats[REDELIVERED] += 1
        if consumer.no_ack:
            worker_stats[DELIVERED_CONSUME_AUTO_ACK] += 1
            if seq >= 0:
                self.ctx.shared.settle_taken(qid, seq)
        else:
            worker_stats[DELIVERED_CONSUME_MANUAL_ACK] += 1
            size = len(body)
            self.unacked[tag] = (consumer, qid, seq, size)
            consumer.unacked += 1
            consumer.unacked_bytes += size
            self.unacked_bytes += size
        out.append(
            framing.encode_deliver(
                self.number, consumer.tag_sstr, tag, redelivered, exchange, routing_key
            )
        )
        out += framing.encode_content(self.number, header, body, self.conn.frame_max)

    def delivery_count(self, qid: int, seq: int, get: bool) -> int | None:
        """The x-delivery-count header's value for entry `seq` of log `qid`:
        None for a log whose deliveries are not counted, and for a first
        delivery to a consumer (RabbitMQ 3.10's quorum queues put 0 in a
        basic.get's only)."""
        shared = self.ctx.shared
        if not shared.table.delivery_limit(qid):
            return None
        count = shared.delivery_count(qid, seq)
        return count if count or (get and shared.table.flags(qid) & QueueFlag.QUORUM) else None

    def _entry_id(self, qid: int, seq: int) -> bytes:
        """The x-shoal-id header entry of log `qid`'s entry `seq`: this broker
        start, the slot and its generation, the seq; a redelivery of the same
        entry (after a requeue or a lost connection) carries the same id."""
        ctx = self.ctx
        value = f"{ctx.epoch:x}.{qid:x}.{ctx.shared.table.generation(qid):x}.{seq:x}"
        return properties.string_entry(b"x-shoal-id", value.encode())

    def acknowledge(self, tag: int, multiple: bool, requeue: bool | None, method_id: int) -> None:
        tx = self.transactions.tx
        if tx is not None:
            self._hold(tx.held, tag, multiple, method_id)
            tx.settles.append((tag, multiple, requeue, method_id))  # applied on commit
        else:
            self.settle(tag, multiple, requeue, method_id)

    def _hold(self, held: set[int], tag: int, multiple: bool, method_id: int) -> None:
        """A transaction's ack, nack or reject takes its tags now (as
        collect_acks): one not outstanding is 406 at once, not at commit;
        basic.recover leaves taken tags alone."""
        unacked = self.unacked
        if multiple and not tag:
            held.update(unacked)
            return
        if tag not in unacked or tag in held:
            if tag in self.timed_out_tags:
                return  # (its consumer's timeout requeued it: settle says so)
            raise errors.ChannelError(
                errors.PRECONDITION_FAILED, f"unknown delivery tag {tag}", 60, method_id
            )
        if not multiple:
            held.add(tag)
            return
        for t in unacked:  # in delivery order: tags only grow
            if t > tag:
                break
            held.add(t)

    def settle(self, tag: int, multiple: bool, requeue: bool | None, method_id: int) -> None:
        """Ack (requeue None), or nack/reject (requeue True/False); `method_id`
        (ack 80, reject 90, nack 120) goes into the close of an unknown tag."""
        unacked = self.unacked
        if multiple and tag and tag not in unacked and tag not in self.timed_out_tags:
            # RabbitMQ's collect_acks looks for the tag itself, multiple or not
            # (only 0 means "all"): settled nothing, the channel closes.
            raise errors.ChannelError(
                errors.PRECONDITION_FAILED, f"unknown delivery tag {tag}", 60, method_id
            )
        touched: set[Consumer] = set()
        acked = 0
        if multiple and requeue is None and unacked:
            acked = self._ack_run(tag, touched)
        if multiple:
            if tag:
                tags = []
                for t in unacked:  # in delivery order: tags only grow
                    if t > tag:
                        break
                    tags.append(t)
            else:
                tags = list(unacked)
        elif tag in unacked:
            tags = [tag]
        else:
            tags = []
        if not tags and tag in self.timed_out_tags:
            self.timed_out_tags.discard(tag)  # requeued by its consumer's timeout
            return
        if not tags and not acked and (tag or not multiple):
            raise errors.ChannelError(
                errors.PRECONDITION_FAILED, f"unknown delivery tag {tag}", 60, method_id
            )
        if requeue is None:
            self._ack_tags(tags, touched)
        else:
            for t in tags:
                consumer, qid, seq, _size = self._take(t)
                self._finish(qid, seq, requeue)
                if consumer is not None:
                    touched.add(consumer)
        self._credit_back(touched)

    def ack_each(self, tags: list[int]) -> None:
        """basic.ack of each of `tags` (none multiple), as their frames in
        a row would be: a protocol bridge's acks (an MQTT client's PUBACKs
        of one read), settled together."""
        unacked = self.unacked
        if self.transactions.tx is not None or any(t not in unacked for t in tags):
            for tag in tags:  # (the rare cases, one by one: as the frames would be)
                self.acknowledge(tag, False, None, 80)
            return
        touched: set[Consumer] = set()
        self._ack_tags(tags, touched)
        self._credit_back(touched)

    def _ack_tags(self, tags: list[int], touched: set[Consumer]) -> None:
        """Acks, the common case, in one loop: each entry deleted by one C
        call; blocked publishers looked at once per queue after."""
        unacked = self.unacked
        self.stats[stats.ACKNOWLEDGED] += len(tags)
        self.acked += len(tags)
        shared = self.ctx.shared
        by_queue: dict[int, list[int]] = {}
        size_sum = 0
        for t in tags:
            consumer, qid, seq, size = unacked.pop(t)
            if seq >= 0:  # (a browser's copy took nothing from the queue)
                seqs = by_queue.get(qid)
                if seqs is None:
                    seqs = by_queue[qid] = []
                seqs.append(seq)
            size_sum += size
            if consumer is None:
                self.gets -= 1
            else:
                consumer.unacked -= 1
                consumer.unacked_bytes -= size
                touched.add(consumer)
        self.unacked_bytes -= size_sum
        for qid, seqs in by_queue.items():
            shared.ack_many(qid, seqs)
            shared.drained(qid)

    def _credit_back(self, touched: set[Consumer]) -> None:
        order: Iterable[Consumer] = touched
        if self.global_prefetch or self.global_prefetch_size:
            # Channel-wide credit: to every consumer from a random one on, each with
            # an equal chance at it (rabbit_limiter's notify_queues).
            every = list(self.consumers.values())
            at = random.randrange(len(every)) if every else 0
            order = every[at:] + every[:at]
        for consumer in order:
            update_interest(self.ctx, consumer)

    def _ack_run(self, tag: int, touched: set[Consumer]) -> int:
        """A multiple ack's first run of one queue's entries in one C call
        (workers/_wire.c ack_run); settle() does the rest. Returns how many
        it acked."""
        _consumer, qid, seq, _size = next(iter(self.unacked.values()))
        shared = self.ctx.shared
        args = shared.run_args(qid) if seq >= 0 else None
        if args is None:
            return 0
        count, body_bytes, consumers, settled = ack_run(
            args, qid, self.unacked, tag or _ALL_TAGS, shared.table.uid(qid)
        )
        if settled:  # persistent messages: their SETTLE records (workers/persist.py)
            self.ctx.persist.settle_many(settled)  # type: ignore[union-attr]  # settles recorded
        if count:
            self.stats[stats.ACKNOWLEDGED] += count
            self.acked += count
            self.unacked_bytes -= body_bytes
            for consumer, n, size in consumers:
                if consumer is None:
                    self.gets -= n
                else:
                    consumer.unacked -= n
                    consumer.unacked_bytes -= size
                    touched.add(consumer)
            shared.drained(qid)
        return count

    def _finish(self, qid: int, seq: int, requeue: bool | None) -> None:
        if seq < 0:
            return  # a browser's copy: nothing was taken from the queue
        shared = self.ctx.shared
        if requeue is None:  # an ack: the common case first
            shared.settle(qid, seq)
            return
        reason = dead_letter_rules.REJECTED
        if requeue:
            limit = shared.table.delivery_limit(qid)  # quorum queues, x-delivery-limit
            if limit < 2 or shared.delivery_count(qid, seq) + 1 <= limit - 2:
                shared.requeue(qid, seq)
                return
            reason = dead_letter_rules.DELIVERY_LIMIT  # returned once too often
        block = shared.held_block(qid, seq)  # dead-lettered first (workers/dead_letter.py)
        if block is not None and not self.ctx.dead_letters.dead_letter(qid, block, reason):
            shared.requeue(qid, seq)  # at-least-once, and it found no room: kept
            return
        shared.settle(qid, seq)

    def requeue_all(self, keep: set[int] | None = None) -> None:
        """Every unacknowledged message back to its queue; but those of
        `keep` (a transaction's settled tags, basic.recover's exception)."""
        if keep:
            for tag in [t for t in self.unacked if t not in keep]:
                _consumer, qid, seq, _size = self._take(tag)
                self._finish(qid, seq, True)
            return
        for consumer, qid, seq, _size in self.unacked.values():
            self._finish(qid, seq, True)
            if consumer is not None:
                consumer.unacked = consumer.unacked_bytes = 0
        self.unacked.clear()
        self.unacked_bytes = self.gets = 0

    def _take(self, tag: int) -> tuple[Consumer | None, int, int, int]:
        """Unacked entry `tag`, out of the book and its counts."""
        entry = consumer, _qid, _seq, size = self.unacked.pop(tag)
        self.unacked_bytes -= size
        if consumer is None:
            self.gets -= 1
        else:
            consumer.unacked -= 1
            consumer.unacked_bytes -= size
        return entry

    def release(self) -> Future[ipc.Counted] | None:
        """The channel closes: consumers cancelled, the reply queue's delete
        asked (returned; unacked messages go back later: requeue_all)."""
        for consumer in self.consumers.values():
            self._drop_consumer(consumer)
        self.consumers.clear()
        return self.drop_reply_queue()

    def _drop_consumer(self, consumer: Consumer) -> None:
        drop_watch(self.ctx, consumer)  # the scheduler's again with the CANCEL
        if not consumer.cancelled:
            consumer.cancelled = True
            self.ctx.send(ipc.Cancel(consumer.cid))
        self.ctx.consumers.pop(consumer.cid, None)
        if consumer.stream is not None:
            consumer.stream.close()

    def basic_qos(self, method: C.Basic.Qos) -> None:
        # Applied to live consumers too (as LavinMQ does): Celery relies on it.
        # global=true limits the channel as a whole (RabbitMQ 3.x semantics,
        # which 4.x denies by default); both limits may be set at once.
        if method.global_:
            self.global_prefetch = method.prefetch_count
            self.global_prefetch_size = method.prefetch_size
            # rabbit_limiter: at its global limit a channel holds no-ack consumers too;
            # not MQTT's QoS 0 (the bridge's limit is a receive maximum, QoS 1 and 2).
            limited = bool(method.prefetch_count or method.prefetch_size)
            self.no_ack_held = limited and self.conn.protocol.startswith("AMQP")
        else:
            self.prefetch_count = method.prefetch_count
            self.prefetch_size = method.prefetch_size
        self.conn.write(framing.encode_method(self.number, C.Basic.QosOk()))
        for consumer in self.consumers.values():
            update_interest(self.ctx, consumer)

    async def basic_consume(self, method: C.Basic.Consume) -> None:
        if method.queue == reply_to.PSEUDO_QUEUE:
            # Direct reply-to: the channel's own reply queue, made first.
            reply_to.check_consume(self, method.no_ack)
            name = reply_to.new_name()
            await self.ctx.request(reply_to.declare_request(self.conn.vhost, name, self.conn.id))
            self.reply_queue = name
            method.queue = name.decode()
        # RabbitMQ checks no permission on direct reply-to's pseudo-queue.
        permission = "" if self.reply_queue and method.queue == self.reply_queue.decode() else READ
        name, qid = self.resolve_queue(method.queue, (60, 20), permission)
        tag = (method.consumer_tag or "").encode() or server_generated(b"amq.ctag")
        if tag in self.consumers:
            raise errors.ConnectionError_(
                errors.NOT_ALLOWED, f"attempt to reuse consumer tag '{tag.decode()}'", 60, 20
            )
        ctx = self.ctx
        consumer, args = consume_args.new_consumer(
            ctx, self, self.conn.vhost, name, qid, tag, method
        )
        ctx.routes.sync()  # the queue's arguments, for its x-consumer-timeout
        consumer.timeout_ms = timeouts.consumer_timeout_ms(
            args,
            ctx.routes.definitions.queue_arguments.get((self.conn.vhost, name.decode()), {}),
            ctx.config.consumer_timeout,
        )
        # Registered as interested at once (a consumer registered later, its INTEREST
        # sent after consume-ok, could lose a NOTIFY race to a publish that reaches the
        # scheduler first: a lower priority one served before it). No delivery
        # overtakes consume-ok: `starting` holds any NOTIFY until start() below.
        consumer.interested = consumer.wants_work()
        consumer.starting = 1
        if consumer.no_ack:
            bound_unsent(self.conn.transport)  # what it has not read waits in the queue
        self.consumers[tag] = consumer
        ctx.consumers[consumer.cid] = consumer
        ctx.timed_books.add(self)  # (its deliveries' time-outs: workers/timeouts.py)
        try:
            registered = await ctx.request(
                ipc.Consume(
                    cid=consumer.cid,
                    qid=qid,
                    priority=consumer.priority,
                    acquiring=consumer.acquiring,
                    exclusive=consumer.exclusive,
                    interested=consumer.interested,
                    conn_id=self.conn.id,
                )
            )
        except BaseException:
            consumer.cancelled = True
            self.consumers.pop(tag, None)
            ctx.consumers.pop(consumer.cid, None)
            raise
        if registered.since is not None:
            consumer.since = registered.since
        if consumer.cancelled:
            return
        if not method.nowait:
            self.conn.write(
                framing.encode_method(self.number, C.Basic.ConsumeOk(consumer_tag=tag.decode()))
            )
        start(ctx, consumer)
        update_interest(ctx, consumer)

    def basic_cancel(self, method: C.Basic.Cancel) -> reply_to.Answer | None:
        tag, deleting = method.consumer_tag or "", None
        consumer = self.consumers.pop(tag.encode(), None)
        if consumer is not None:
            take_ready(self.ctx, consumer)  # what the channel did before comes first
            self._drop_consumer(consumer)
            if consumer.queue_name == self.reply_queue:
                deleting = self.drop_reply_queue()
        frame = None if method.nowait else framing.encode_method(self.number, C.Basic.CancelOk(tag))
        if deleting is not None:  # answered after the delete (workers/reply_to.py)
            return reply_to.answer_after(self.conn, deleting, frame)
        if frame is not None:
            self.conn.write(frame)
        return None

    def time_out(self, consumer: Consumer, tags: list[int]) -> None:
        """Consumer timeout (workers/timeouts.py): requeue its unacked
        deliveries and cancel it; a client that cannot hear a server cancel
        loses the channel instead, as in RabbitMQ 3.x."""
        if not self.conn.capabilities.get("consumer_cancel_notify"):
            self.channel.fail(
                errors.ChannelError(
                    errors.PRECONDITION_FAILED,
                    f"delivery acknowledgement on channel {self.number} timed out. Timeout "
                    f"value used: {consumer.timeout_ms} ms. This timeout value can be "
                    "configured, see consumers doc guide to learn more",
                )
            )
            return
        for tag in tags:
            _consumer, qid, seq, _size = self._take(tag)
            self._finish(qid, seq, True)
            made_set(self, "timed_out_tags").add(tag)
        log.info(
            "connection %x channel %d: consumer %r timed out (%d ms), %d requeued",
            self.conn.id,
            self.number,
            consumer.tag.decode(errors="replace"),
            consumer.timeout_ms,
            len(tags),
        )
        self.consumers.pop(consumer.tag, None)
        self.cancel_from_server(consumer)

    def drop_reply_queue(self) -> Future[ipc.Counted] | None:
        """The reply consumer is gone (cancelled, or its channel closed): so is
        its queue, later replies to it unroutable once the delete is answered."""
        name, self.reply_queue = self.reply_queue, b""
        return reply_to.delete(self.ctx, self.conn.vhost, name, self.conn.id) if name else None

    def cancel_from_server(self, consumer: Consumer) -> None:
        """An auto-close browser reached the end of its queue."""
        self._drop_consumer(consumer)
        self.consumer_gone(consumer)

    def consumer_gone(self, consumer: Consumer) -> None:
        """The scheduler cancelled this consumer (its queue was deleted)."""
        drop_watch(self.ctx, consumer)
        self.consumers.pop(consumer.tag, None)
        consumer.cancelled = True
        self.ctx.consumers.pop(consumer.cid, None)
        if consumer.stream is not None:
            consumer.stream.close()
        if self.conn.capabilities.get("consumer_cancel_notify"):
            self.conn.write_cancel(
                self.channel,
                framing.encode_method(
                    self.number, C.Basic.Cancel(consumer_tag=consumer.tag.decode(), nowait=True)
                ),
            )

    def basic_recover(self, method: C.Basic.Recover | C.Basic.RecoverAsync) -> None:
        if method.requeue:
            tx = self.transactions.tx
            self.requeue_all(tx.held if tx is not None else None)
        else:
            self._redeliver_in_place()
        for consumer in self.consumers.values():
            update_interest(self.ctx, consumer)
        if isinstance(method, C.Basic.Recover):
            self.conn.write(framing.encode_method(self.number, C.Basic.RecoverOk()))

    def channel_flow(self, method: C.Channel.Flow) -> None:
        """The client stops (or resumes) this channel's deliveries."""
        self.flow_active = bool(method.active)
        self.conn.write(framing.encode_method(self.number, C.Channel.FlowOk(active=method.active)))
        for consumer in self.consumers.values():
            update_interest(self.ctx, consumer)

    def _redeliver_in_place(self) -> None:
        """recover(requeue=false), as the spec says (RabbitMQ answers 540):
        each unacknowledged message goes again, redelivered, under a new
        tag, to the consumer that had it; messages from basic.get, or of a
        consumer since cancelled, are requeued instead."""
        ctx = self.ctx
        out: list[bytes] = []
        for tag in sorted(self.unacked):
            consumer, qid, seq, _size = self._take(tag)
            if seq < 0:
                continue  # a browser's copy: there is nothing to redeliver
            block = None
            if consumer is not None and not consumer.cancelled:
                block = ctx.shared.held_block(qid, seq)
            if consumer is None or block is None:
                self._finish(qid, seq, True)
                continue
            self.deliver(consumer, qid, seq, block, True, out)
        if out:
            self.conn.write_many(out)
