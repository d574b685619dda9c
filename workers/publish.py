"""A channel's publishes: assembling a message from its publish, header and
body frames (or the fast path for all three in one read), routing it,
appending it to its queues (SharedQueues.enqueue), publisher confirms and
mandatory returns, and waiting while a queue or the arena is full."""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from typing import Any

from pamqp import commands as C

from shoal.broker import ipc
from shoal.broker.amqp import errors, properties
from shoal.broker.amqp.routing import DELAY_QUEUE_PREFIX
from shoal.shm.arena import release_hold
from shoal.shm.stats import (
    CONFIRMED,
    RECEIVED_CONFIRM,
    ROUTED,
    SIZE_BUCKETS,
    SIZE_SUM,
    UNROUTABLE_DROPPED,
    UNROUTABLE_RETURNED,
    size_bucket,
)
from shoal.workers import framing, reply_to
from shoal.workers._wire import properties_ok
from shoal.workers.channel_state import (
    EXPECT_BODY,
    EXPECT_HEADER,
    IDLE,
    RETRY_DELAY,
    ChannelConnection,
    ChannelCore,
    Consumers,
    PublishContext,
    Transactional,
    not_basic_content,
    out_of_order,
)
from shoal.workers.ingest import FLOW, HELD, REJECTED_BIT, WAIT, Ingest, times_for, to_store
from shoal.workers.pager import PAGE_IN_INTERVAL
from shoal.workers.pending import Pending
from shoal.workers.unmade import UNMADE, made

log = logging.getLogger("shoal.worker")


DELAY_QUEUES = DELAY_QUEUE_PREFIX.encode()
# The content header's first flag byte: reply-to (0x0200) and headers
# (0x2000, for CC and BCC) need more than routing.
_REPLY_TO_OR_HEADERS = (properties.REPLY_TO_FLAG | 0x2000) >> 8
_REPLY_TO = properties.REPLY_TO_FLAG >> 8


class Publisher:
    """The publish side of a channel: messages assembled, routed and put
    into its queues (workers/ingest.py), then confirmed, nacked, returned
    or held back for flow."""

    __slots__ = (
        "channel",
        "confirm",
        "confirm_held",
        "confirm_high",
        "confirm_sent",
        "conn",
        "ctx",
        "delivery",
        "exchange_counts",
        "ingest",
        "number",
        "pending",
        "publish_count",
        "publish_seq",
        "state",
        "stats",
        "stream_waits",
        "transactions",
        "unroutable",
        "unsynced",
    )

    def __init__(
        self,
        channel: ChannelCore,
        conn: ChannelConnection,
        transactions: Transactional,
        delivery: Consumers,
    ) -> None:
        self.channel = channel
        self.conn = conn
        self.ctx: PublishContext = conn.ctx
        ctx = self.ctx
        self.number = channel.number
        self.transactions = transactions
        self.delivery = delivery
        self.stats = ctx.stats.v  # this worker's counters (shm/stats.py)
        self.ingest = Ingest(ctx)  # this channel's way into the queues
        self.state = IDLE
        self.pending: Pending | None = None
        self.confirm = False
        self.publish_seq = 0
        self.publish_count = 0  # messages this channel published (it is a "publisher")
        self.unroutable = [0, 0]  # its messages dropped and returned as unroutable
        # The worker's counts of its vhost's exchanges: exchange -> [in, out].
        self.exchange_counts = ctx.exchange_counts.setdefault(conn.vhost_id, {})
        self.confirm_high = 0
        self.confirm_sent = 0
        # Confirms held until this channel's own consumer has been handed the
        # message (Connection.flush_confirms): RabbitMQ's order.
        self.confirm_held = False
        # Persistent publishes whose records are not yet durable, in order:
        # (publish seq, record index, nack owed); see confirmable().
        self.unsynced: deque[tuple[int, int, bool]] = UNMADE  # (made when used)
        # Publishes to stream queues not yet durable in the streams' files,
        # in order: (publish seq, [(qid, log seq)]); see confirmable().
        self.stream_waits: deque[tuple[int, list[tuple[int, int]]]] = UNMADE

    def suspend_retry(self, payload: memoryview | None, ftype: int = 0) -> None:
        """Back-pressure: a queue or the arena is full. Keep the frame, stop
        reading the socket, and try again shortly."""
        channel = self.channel
        if payload is not None:
            channel.keep(ftype, payload, first=True)
        channel.busy = True
        self.conn.blocks.hold_reading(channel)
        self.ctx.loop.call_later(RETRY_DELAY, self._retry)

    def _rest(self) -> None:
        """This worker paged out its share for now (workers/pager.py): read no
        more until its next page-in interval (not blocked: slowed down)."""
        self.channel.busy = True
        self.conn.blocks.hold_reading(self.channel, reason=None)
        self.ctx.loop.call_later(PAGE_IN_INTERVAL, self._retry)

    def _retry(self) -> None:
        if self.conn.closed:
            return
        channel = self.channel
        channel.busy = False
        if self.pending is not None and self.state == IDLE and self.pending.qids:
            self._complete()  # retry appending a finished message
            if channel.busy:
                return
        self.conn.blocks.release_reading(channel)
        channel.resume()

    def on_publish(self, payload: memoryview) -> None:
        exchange, routing_key, mandatory, immediate = framing.decode_publish(payload)
        if immediate:
            raise errors.ConnectionError_(errors.NOT_IMPLEMENTED, "immediate=true", 60, 40)
        self.conn.access.check_publish(exchange, routing_key)
        # Routed once the content header is in: a headers exchange needs it.
        self.pending = Pending(exchange, routing_key, mandatory)
        self.state = EXPECT_HEADER

    def fast_publish(self, frame: tuple[Any, ...]) -> bool:
        """A whole message for an idle channel: a PUBLISH_WHOLE item of
        workers/_wire.c scan (the publish decoded, the properties checked,
        the body in one frame). Returns False, having changed nothing,
        whenever the general path is needed (errors, unroutable, a full
        arena): the caller then feeds the three frames one by one. A message
        using nothing beyond routing (transient or for no durable queue; no
        TTL, priority, stream, paging, transaction) goes straight into its
        queues, a persistent one for one durable queue through
        Queue.publish_durable; the others take the Pending path (_complete)."""
        channel = self.channel
        if self.state != IDLE or channel.busy or channel.closing:
            return False
        conn = self.conn
        if conn.flow_blocked or channel.flow_backlog or conn.access.tracing:
            return False  # handle() keeps it (flow control, resource alarms); the firehose
        _, _, _, _, exchange, routing_key, bits, header, body = frame
        ctx = self.ctx
        body_size = len(body)
        if bits & 2 or body_size > ctx.config.max_message_size:
            return False  # immediate, or too large: the general path refuses it
        if not conn.access.may_publish(exchange, routing_key):
            return False  # the general path refuses it
        shared = ctx.shared
        try:
            also: list[bytes] = []
            if header[12] & _REPLY_TO_OR_HEADERS:
                header = reply_to.rewrite(self.delivery, header)
                if header[12] & 0x20 and (b"\x02CC" in header or b"\x03BCC" in header):
                    header, also = properties.sender_selected(header)
                qids = self._route(exchange, routing_key, header, also)
            elif exchange:
                qids = list(
                    ctx.routes.route(conn.vhost, conn.vhost_id, exchange, routing_key, header)
                )
            else:
                qid = shared.catalog.lookup(routing_key, conn.vhost_id)
                if qid is None or routing_key.startswith(DELAY_QUEUES):
                    return False  # unroutable (a delay queue is the broker's own)
                qids = [qid]
            if not qids:
                return False
            # A message with no expiration nor delivery mode, for plain queues
            # (shm/queue_catalog.py plain_queues): no timestamp, no record, no
            # level, no stream.
            plain = not header[12] & 0x11 and shared.catalog.plain_queues().issuperset(qids)
            deduplicating = (
                ctx.routes.dedup_exchanges or (not plain and shared.catalog.dedup_now)
            ) and ctx.dedup.meets(conn.vhost_id, exchange, qids)
            tx = self.transactions.tx
            if deduplicating and tx is not None:
                return False  # checked at commit
            times = None if plain else times_for(shared, header, qids, looked=True)
        except errors.AMQPError:
            return False  # the general path raises it again, in order
        durable = not plain and header[12] & 0x10 and to_store(ctx, header, qids)
        block = ctx.arena.new_record(exchange, routing_key, header, body, times, durable)
        if block is None:
            return False  # the general path waits for room (and counts it)
        seg = ctx.seg
        mark, duplicate = None, False
        if deduplicating:
            try:
                mark, duplicate = ctx.dedup.filter(
                    conn.vhost, conn.vhost_id, exchange, header, qids
                )
            except errors.AMQPError:
                release_hold(seg, block)
                raise
            if not qids:  # a duplicate wherever it went: accepted all the same
                release_hold(seg, block)
                self._account(exchange, True, False, body_size, False, -1, None)
                return True
        rejected = False
        if tx is None and (
            plain or (not durable and times is None and not shared.catalog.priority_levels())
        ):
            done, outcome = self.ingest.put_now(
                qids,
                block,
                body_size,
                plain,
                mark,
                self._consumes
                if self.confirm and self.delivery.consumers and not self.confirm_held
                else None,
            )
            if len(qids) > 1:  # (workers/fanout_turns.py)
                conn.fanout_work += len(qids)
            if not outcome or self._outcome(outcome):  # every queue has it (its HOLD dropped)
                rejected = bool(outcome & REJECTED_BIT)
                self._account(exchange, True, False, body_size, rejected, -1, None)
                # Nothing but routing: the next ones may go in C (workers/lane.py).
                lane = conn.publish_lane
                if (
                    lane is not None
                    and len(qids) == 1
                    and not (outcome or deduplicating or also or header[12] & _REPLY_TO)
                ):
                    lane.offer(self, exchange, routing_key, qids[0])
                return True
            rejected = bool(outcome & REJECTED_BIT)
            qids = qids[done:]  # the rest through _complete
        got: int | Pending | None = None
        if (
            durable  # persistent, for one durable queue and nothing else (ingest.py)
            and tx is None
            and not (deduplicating or times or len(qids) > 1)
            and not (self.confirm and self.delivery.consumers)
        ):
            ingest, qid = self.ingest, qids[0]  # its Queue, asked straight: one call
            queue = ingest.queues.get(qid) or ingest.queue(qid)
            size = ctx.arena.last_size  # (durable: the uid of qids[0], to_store's)
            got = queue.publish_durable(block, size, body_size, durable, exchange, routing_key)
            if isinstance(got, int):
                self._account(exchange, True, False, body_size, False, got, None)
                lane = conn.publish_lane  # the next ones may go in C, records and all
                if lane is not None and not also and not header[12] & _REPLY_TO:
                    lane.offer(self, exchange, routing_key, qid)
                return True
        if not isinstance(got, Pending):  # (else put()'s reservation, its queue full)
            got = Pending(exchange, routing_key, False)
        pending = self.pending = got
        pending.mandatory = bool(bits & 1)
        pending.durable = bool(durable)
        pending.times = times
        pending.header = header
        pending.body_size = pending.received = body_size
        pending.qids = qids
        pending.block = block
        pending.rejected = rejected
        if deduplicating:
            pending.dedup, pending.deduped = mark, duplicate
        self._complete()
        return True

    def deduplicate(self, pending: Pending) -> None:
        """Check a whole routed message against its caches: the queues that
        have it already leave `pending.qids`; if none is left, its block
        goes (it is accepted all the same: confirmed, not returned)."""
        ctx, conn = self.ctx, self.conn
        pending.dedup, duplicate = ctx.dedup.filter(
            conn.vhost, conn.vhost_id, pending.exchange, pending.header, pending.qids
        )
        if duplicate:
            pending.deduped = True
            if not pending.qids:
                release_hold(ctx.seg, pending.block)

    def _route(
        self, exchange: bytes, routing_key: bytes, raw_header: bytes, also: list[bytes]
    ) -> list[int]:
        """qids a message reaches with its routing key and the keys `also`
        (CC and BCC: broker/amqp/properties.py sender_selected), all matched
        at every exchange on the way (rabbit_exchange:route); the default
        exchange: the queues named by them. Raises ChannelError for a
        missing exchange."""
        ctx, vhost_id = self.ctx, self.conn.vhost_id
        if exchange:
            route, vhost = ctx.routes.route, self.conn.vhost
            return list(route(vhost, vhost_id, exchange, routing_key, raw_header, also=also))
        qids: list[int] = []
        for key in (routing_key, *also):  # (a delay queue is the broker's own)
            qid = ctx.shared.catalog.lookup(key, vhost_id)
            if qid is not None and qid not in qids and not key.startswith(DELAY_QUEUES):
                qids.append(qid)
        return qids

    def on_header(self, payload: memoryview) -> None:
        pending = self.pending
        if self.state != EXPECT_HEADER or pending is None:
            raise out_of_order(self.state)
        class_id, body_size = framing.decode_content_header(payload)
        if class_id != 60:
            raise not_basic_content(class_id)
        limit = self.ctx.config.max_message_size
        if body_size > limit:
            self.state = IDLE
            self.pending = None
            raise errors.ChannelError(
                errors.PRECONDITION_FAILED,
                f"message size {body_size} is larger than configured max size {limit}",
                60,
                40,
            )
        if not pending.header:
            if not properties_ok(payload):
                # Properties that do not parse (workers/_wire.c): RabbitMQ
                # 3.10's answer, its channel process having crashed (measured).
                raise errors.ConnectionError_(errors.INTERNAL_ERROR, "INTERNAL_ERROR", 0, 0)
            self.conn.access.check_user_id(bytes(payload))
            try:
                pending.header = reply_to.rewrite(self.delivery, bytes(payload))
                pending.body_size = body_size
                pending.header, also = properties.sender_selected(pending.header)
                pending.qids = self._route(
                    pending.exchange, pending.routing_key, pending.header, also
                )
                if self.conn.access.tracing:
                    pending.trace = [pending.routing_key, *also]
                pending.times = times_for(
                    self.ctx.shared, pending.header, pending.qids, looked=True
                )
            except errors.ChannelError:
                self.pending = None  # its body frames are dropped by the closing channel
                raise
        if pending.qids:
            pending.durable = bool(to_store(self.ctx, pending.header, pending.qids))
            block = self.ctx.arena.new_head(
                pending.exchange,
                pending.routing_key,
                pending.header,
                body_size,
                pending.times,
                pending.durable,
            )
            if block is None:
                self.ctx.guard.arena_full()
                self.suspend_retry(payload, framing.FRAME_HEADER)
                return
            pending.block = block
        else:
            pending.body = bytearray()
        if body_size == 0:
            self.state = IDLE
            self._complete()
        else:
            self.state = EXPECT_BODY

    def on_body(self, payload: memoryview) -> None:
        pending = self.pending
        if self.state != EXPECT_BODY or pending is None:
            raise out_of_order(self.state)
        n = len(payload)
        if pending.received + n > pending.body_size:
            raise errors.ConnectionError_(
                errors.FRAME_ERROR, "content body is larger than the size in its content header"
            )
        if pending.body is not None:
            pending.body += payload
        else:
            self.ctx.seg.atomic.write_body(pending.block, pending.received, payload)
        pending.received += n
        if pending.received == pending.body_size:
            self.state = IDLE
            self._complete()

    def _complete(self) -> None:
        """Append the finished message to its queues, then confirm it (or,
        in a transaction, keep it for tx.commit)."""
        pending = self.pending
        assert pending is not None
        ctx = self.ctx
        tx = self.transactions.tx
        if pending.trace is not None and ctx.firehose is not None:
            ctx.firehose.published(self.conn, self.number, pending)
        if (ctx.routes.dedup_exchanges or ctx.shared.catalog.dedup_now) and (
            pending.dedup is None and tx is None and pending.qids
        ):
            self.deduplicate(pending)  # (in a transaction: at commit)
        routed = bool(pending.qids) or pending.deduped  # append consumes the list
        if tx is not None:
            if pending.qids or pending.mandatory:
                tx.keep(pending, ctx.shared.table.incarnation)
        elif pending.qids:
            missing = self.assign_levels(pending)
            if missing is not None:
                self._make_level(pending, *missing)
                return
            if not self.append(pending):
                self.suspend_retry(None)
                return
        elif pending.mandatory and not pending.deduped:
            self.return_unroutable(pending)
        self.pending = None
        self._account(
            pending.exchange,
            routed,
            pending.mandatory,
            pending.body_size,
            pending.rejected,
            pending.record,
            pending.streams,
        )

    def _account(
        self,
        exchange: bytes,
        routed: bool,
        mandatory: bool,
        size: int,
        rejected: bool,
        record: int,
        streams: list[tuple[int, int]] | None,
    ) -> None:
        """A message is in its queues (or returned, or dropped): count it, then
        confirm it, or queue its confirm behind its record's sync or its streams' writers."""
        if not self.publish_count:
            self.ctx.census.first_publish(self)  # a new publisher (the statistics count them)
        self.publish_count += 1
        try:  # (a subscript, not .get: this is every message's path)
            counted = self.exchange_counts[exchange]
        except KeyError:
            counted = self.exchange_counts[exchange] = [0, 0]
        counted[0] += 1
        stats = self.stats  # (shm/stats.py; RECEIVED is derived at flush time)
        if routed:
            counted[1] += 1
            stats[ROUTED] += 1
        else:
            stats[UNROUTABLE_RETURNED if mandatory else UNROUTABLE_DROPPED] += 1
            self.unroutable[mandatory] += 1
        stats[SIZE_SUM] += size
        stats[SIZE_BUCKETS if size <= 100 else SIZE_BUCKETS + size_bucket(size)] += 1
        if self.confirm:
            stats[RECEIVED_CONFIRM] += 1
            self.publish_seq += 1
            if rejected:
                self._nack_publish(record)
            else:
                self.confirm_high = self.publish_seq
                if record >= 0:  # its confirm waits for its record's sync
                    made(self, "unsynced").append((self.publish_seq, record, False))
                    self.ctx.persist.wait(self)  # type: ignore[union-attr]
                if streams:  # ... or for its streams' writers
                    made(self, "stream_waits").append((self.publish_seq, streams))
                    self.ctx.streams.wait(self)  # type: ignore[union-attr]
        pager = self.ctx.pager
        if pager is not None and pager.files and pager.exhausted:
            self._rest()

    def _consumes(self, qid: int) -> bool:
        """Whether one of this channel's consumers on `qid` can take a
        message now. RabbitMQ's queue hands a message to such a consumer
        before it confirms it, so the client sees basic.deliver before
        basic.ack; clients that publish with confirms and then wait for the
        delivery (aiormq's own tests) rely on that order when the connection
        breaks between the two."""
        return any(c.qid == qid and c.wants_work() for c in self.delivery.consumers.values())

    def _nack_publish(self, record: int) -> None:
        """A queue refused the message (x-overflow reject-publish): basic.nack it
        after acking those before (cumulative), once they are durable."""
        unsynced = self.unsynced
        if unsynced or record >= 0:
            high = max(record, unsynced[-1][1] if unsynced else 0)
            made(self, "unsynced").append((self.publish_seq, high, True))
            self.confirm_high = self.publish_seq
            self.ctx.persist.wait(self)  # type: ignore[union-attr]
            return
        self.conn.flush_confirms(self, force=True)
        self.confirm_high = self.confirm_sent = self.publish_seq
        self.conn.write(
            framing.encode_method(
                self.number,
                C.Basic.Nack(delivery_tag=self.publish_seq, multiple=False, requeue=True),
            )
        )

    def assign_levels(self, pending: Pending) -> tuple[int, int] | None:
        """Point each priority queue among the message's queues at the log of
        the message's priority (workers/levels.py). Returns (queue, level)
        of one whose level has no log yet: the scheduler must make it."""
        priority_queues = self.ctx.shared.catalog.priority_levels()
        if not priority_queues:
            return None
        qids = pending.qids
        priority = -1  # parsed from the header once, if a priority queue needs it
        for i, qid in enumerate(qids):
            levels = priority_queues.get(qid)
            if levels is None or (pending.levelled is not None and qid in pending.levelled):
                continue
            if priority < 0:
                priority = framing.message_priority(pending.header)
            level = min(priority, levels.max_priority)
            target = levels.by_level.get(level)
            if target is None:
                return qid, level
            qids[i] = target
        return None

    def _make_level(self, pending: Pending, qid: int, level: int) -> None:
        """Ask the scheduler for a level's log; the channel (and the socket)
        waits, so later publishes keep their order behind this one."""
        channel = self.channel
        channel.busy = True
        self.conn.blocks.hold_reading(channel, reason=None)  # a round trip: not "blocked"
        reply = self.ctx.request(ipc.Level(qid, level))

        def made(reply: asyncio.Future[ipc.LevelLog]) -> None:
            if self.conn.closed:
                return
            channel.busy = False
            if self.pending is not pending:  # the channel was closed meanwhile: dropped
                self.conn.blocks.release_reading(channel)
                return
            exc = reply.exception() if not reply.cancelled() else None
            if exc is not None or reply.cancelled():
                log.error("connection %x: no priority level log", self.conn.id, exc_info=exc)
                self.conn.fail(
                    errors.ConnectionError_(
                        errors.INTERNAL_ERROR, "no log for a priority level", 60, 40
                    )
                )
                return
            self.use_level(pending, qid, reply.result().qid)
            self._complete()
            if not channel.busy:
                self.conn.blocks.release_reading(channel)
                channel.resume()

        reply.add_done_callback(made)

    @staticmethod
    def use_level(pending: Pending, qid: int, target: int) -> None:
        """The scheduler's answer: the level's log (with no slot free, a
        lower level's, maybe the queue's own), or -1 if the queue was
        deleted (the append then finds it gone and drops the message)."""
        if target >= 0 and qid in pending.qids:
            pending.qids[pending.qids.index(qid)] = target
            if pending.levelled is None:
                pending.levelled = set()
            pending.levelled.add(target)

    def append(self, pending: Pending) -> bool:
        """Put a routed message into its queues (workers/ingest.py); False
        if a queue is full: `pending.qids` keeps the queues still to do,
        and the caller retries later."""
        reached = (
            self._consumes
            if self.confirm and self.delivery.consumers and not self.confirm_held
            else None
        )
        if len(pending.qids) > 1:  # (workers/fanout_turns.py)
            self.conn.fanout_work += len(pending.qids)
        bits = self.ingest.put(pending, reached)
        return not bits or self._outcome(bits)

    def _outcome(self, bits: int) -> bool:
        """What a put's outcome bits (workers/ingest.py) mean for this
        channel: flow for a queue over its capacity, confirms held for its
        own consumer. False if the put waits for room."""
        if bits & FLOW:
            # This connection's next publishes wait (shm/flow.py).
            ingest, conn = self.ingest, self.conn
            for qid in ingest.over_capacity:
                conn.blocks.flow_block(*ingest.shared.table.flow_queue(qid))
            ingest.over_capacity.clear()
        if bits & HELD:
            self.confirm_held = True
        return not bits & WAIT

    def return_unroutable(self, pending: Pending) -> None:
        """basic.return of a mandatory message that reached no queue."""
        method = C.Basic.Return(
            reply_code=312,
            reply_text="NO_ROUTE",
            exchange=pending.exchange.decode(),
            routing_key=pending.routing_key.decode(errors="replace"),
        )
        if self.confirm:  # earlier publishes' confirms first, as RabbitMQ flushes per method
            self.conn.flush_confirms(self)
        body = bytes(pending.body or b"")
        frames = [framing.encode_method(self.number, method)]
        frames += framing.encode_content(self.number, pending.header, body, self.conn.frame_max)
        self.conn.write_many(frames)

    def confirm_select(self, method: C.Confirm.Select) -> None:
        if self.transactions.tx is not None:
            raise errors.ChannelError(
                errors.PRECONDITION_FAILED, "cannot switch from tx to confirm mode", 85, 10
            )
        self.confirm = True
        if not method.nowait:
            self.conn.write(framing.encode_method(self.number, C.Confirm.SelectOk()))

    # ------------------------------------------------------------ confirms
    def confirmable(self) -> int:
        """The publish seq up to which confirms may go now: confirm_high,
        unless a persistent publish at or below it waits for its record's
        sync (workers/persist.py). A nack owed behind such publishes is
        sent once they are durable (acks are cumulative)."""
        high = self.confirm_high
        unsynced = self.unsynced
        if not unsynced and not self.stream_waits:
            return high  # the common case: nothing waits for a disk
        if unsynced:
            synced = self.ctx.persist.synced  # type: ignore[union-attr]  # set when used
            while unsynced and unsynced[0][1] < synced:
                seq, _record, nack = unsynced.popleft()
                if nack:
                    self._send_nack(seq)
            if unsynced:
                high = min(high, unsynced[0][0] - 1)
        waits = self.stream_waits
        if waits:
            synced_seq = self.ctx.streams.words.synced_seq  # type: ignore[union-attr]
            while waits and all(synced_seq(qid) > seq for qid, seq in waits[0][1]):
                waits.popleft()
            if waits:
                high = min(high, waits[0][0] - 1)
        return high

    def synced(self) -> bool:
        """Records became durable: send the confirms they allow; True while
        some still wait (workers/persist.py Confirming). Nothing once the
        server has closed the channel (it only waits for close-ok)."""
        if self.channel.closing:
            self.unsynced.clear()
            self.stream_waits.clear()
            return False
        self.conn.flush_confirms(self)
        return bool(self.unsynced or self.stream_waits)

    def _send_nack(self, seq: int) -> None:
        """basic.nack publish `seq`, after acking those before it."""
        if seq - 1 > self.confirm_sent:
            self.stats[CONFIRMED] += seq - 1 - self.confirm_sent
            # Cumulative, even for one (Connection.flush_confirms says why).
            self.conn.write(framing.encode_ack(self.number, seq - 1, True))
        self.confirm_sent = seq
        self.conn.write(
            framing.encode_method(
                self.number, C.Basic.Nack(delivery_tag=seq, multiple=False, requeue=True)
            )
        )

    def release(self) -> None:
        """The channel closes: a message half received, or waiting for room
        in a full queue, is dropped; confirms still waiting for a sync are
        never sent."""
        pending = self.pending
        if pending is not None and pending.block and pending.body is None:
            self.ingest.drop(pending)
        self.unsynced.clear()
        self.stream_waits.clear()
        if self.ctx.persist is not None:
            self.ctx.persist.waiting.discard(self)
        self.pending = None
        self.state = IDLE
