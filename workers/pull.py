"""The pull loop that serves a consumer (workers/consumer.py).

The scheduler tells a consumer that its queue has work (NOTIFY); the consumer
then pulls entries itself, acquiring each with a compare-and-swap on its state
word, until the queue gives it nothing (DONE), its credit or its connection's
write buffer runs out (INTEREST false), or it has had its turn (DONE -1,
yield): its share of what was ready when the turn began, when the queue has
other consumers (turn_quota), at most a burst. It keeps a pointer into the
queue log and skips entries others hold.
"""

from __future__ import annotations

import asyncio
from typing import Protocol

from shoal.broker import ipc
from shoal.shm import readers
from shoal.shm.queues import SharedQueues
from shoal.shm.wake import Waker
from shoal.workers._wire import (
    PULL_ENTRY,
    PULL_WATCH_LOST,
    PULL_YIELD,
    RUN_EMPTY,
    RUN_FULL,
)
from shoal.workers.consumer import Consumer, DeliveryChannel
from shoal.workers.stream_io import BURST as STREAM_BURST
from shoal.workers.stream_io import SCAN as STREAM_SCAN
from shoal.workers.stream_io import Streams, start_reading

# Deliveries per notification before yielding to other consumers of the queue
# (Qpid's MAX_ASYNC_DELIVERIES): keeps one fast consumer from starving the rest.
# Each yield is a round trip through the scheduler; a run in C delivers one
# entry in about 0.3 us, so a burst is about 0.3 ms.
BURST = 1024
# Deliveries before a queue's only consumer lets the worker's other
# connections run (no scheduler round trip): about 0.15 ms of worker time, which
# bounds what a draining backlog adds to a quiet queue's latency on the same
# worker (bench/quiet_queue.py).
LOCAL_BURST = 512
# WatchedPull.pull's answer where Python goes on: (code, a, b, c).
PullAnswer = tuple[int, int, int, int]
# Consumers with a prefetch count up to this, on a queue with others, take one
# message a turn (turn_quota).
DEAL_ONE_PREFETCH = 16


class MessageExpiry(Protocol):
    """workers/message_ttl.py, as the pull loop uses it."""

    def drop_if_expired(self, qid: int, seq: int, block: int, graceless: bool = False) -> bool: ...
    def drop_if_over_limit(self, qid: int, seq: int, block: int) -> bool: ...


class PullContext(Protocol):
    """What the pull loop uses of its worker (workers/context.py)."""

    @property
    def shared(self) -> SharedQueues: ...
    @property
    def loop(self) -> asyncio.AbstractEventLoop: ...
    @property
    def streams(self) -> Streams | None: ...
    @property
    def expiry(self) -> MessageExpiry: ...
    @property
    def waker(self) -> Waker: ...
    @property
    def index(self) -> int: ...
    @property
    def watching(self) -> dict[int, Consumer]: ...
    def send(self, message: ipc.ToScheduler) -> None: ...


def turn_quota(ready: int, consumers: int, prefetch: int = 0) -> int:
    """Deliveries a notified consumer may take before the next consumer's turn.

    The queue's only consumer takes a burst. A consumer with a small prefetch
    count (at most DEAL_ONE_PREFETCH), one of several, takes one message a
    turn: it asked for fair dispatch, and RabbitMQ deals such consumers one
    message each in turn. Handing it several at once lets whichever client
    thread the GIL runs first take a larger share: 4 pika threads with
    prefetch 10 kept within 20-30 % in 21 and 24 runs of 30 before, in 28
    and 28 with one a turn, RabbitMQ in 26 and 28 alongside the latter
    (docs/benchmarks.md). Its turns were credit-sized already, so the extra
    scheduler round trips are few.

    Otherwise a turn takes the consumer's share of the entries ready when it
    begins (at least one), so that a small backlog is still dealt round-robin
    and a large one goes out in bursts (no extra round trips where throughput
    is the point).
    """
    if consumers <= 1:
        return BURST
    if 0 < prefetch <= DEAL_ONE_PREFETCH:
        return 1
    return min(BURST, max(1, -(-ready // consumers)))


def update_interest(ctx: PullContext, consumer: Consumer) -> None:
    """Tell the scheduler when this consumer's readiness changes; not while
    it watches its queue itself (keep_interest)."""
    want = consumer.wants_work()
    if want != consumer.interested and not consumer.cancelled:
        consumer.interested = want
        if not want:
            consumer.notified = False
            if consumer.direct:
                keep_interest(ctx, consumer)
                return
            drop_watch(ctx, consumer)  # INTEREST(false) gives the scheduler the queue back
        elif consumer.interest_kept:
            consumer.interest_kept = False
            if ctx.shared.table.consumer_count(consumer.qid) == 1:
                ctx.loop.call_soon(pull, ctx, consumer)  # still the scheduler's: pull on
            else:
                # Another consumer registered (the scheduler counts it before
                # its consume-ok) and the watch's take-back is on its way: the
                # turn goes back now, with work left, so what is published
                # from here on is dealt by the scheduler (priorities).
                drop_watch(ctx, consumer)
                ctx.send(ipc.Done(consumer.cid, -1))
            return
        ctx.send(ipc.Interest(consumer.cid, want))
        if want and _pulls_at_once(ctx, consumer):
            ctx.loop.call_soon(pull, ctx, consumer)


def keep_interest(ctx: PullContext, consumer: Consumer) -> None:
    """The queue's only consumer, watching it itself (take_watch), ran out
    of credit or write room: it keeps the watch's place and the scheduler's
    NOTIFIED, with no INTEREST(false) now and no INTEREST(true) and NOTIFY
    when its credit comes back (update_interest pulls then). A consumer
    that acks every 100 of a prefetch of 500 ran out of credit at about
    every ack: two messages through the scheduler and its answers per ack.
    Its watch, if armed, is taken off Q_WATCH (a publisher that takes it
    first wakes a pull that finds no credit: nothing). The scheduler
    learns of the lost interest when it takes the watch back
    (give_back_watch) or the worker says HELLO (drop_watch)."""
    consumer.interest_kept = True
    ctx.waker.unwatch(consumer.qid, ctx.index)


def _pulls_at_once(ctx: PullContext, consumer: Consumer) -> bool:
    """Whether a consumer whose credit came back starts pulling now rather
    than after the scheduler's NOTIFY: the queue's only consumer; or one of
    several while the queue's backlog is above what the scheduler says would
    get every one of them notified (Q_EAGER_ABOVE), once at least half its
    prefetch is free: its client then has at most half its window left to
    work through. A smaller refill waits for its turn, and the acks that
    come meanwhile join it in one larger run and write. Not for a consumer
    that asked for fair dispatch (a small prefetch: turn_quota).

    4 consumers with prefetch 500 that ack every 250 waited a round trip
    through the scheduler per refill: lavinmqperf 4 -> 4 gave 715k msg/s
    consumed against 783k with this (4 alternating runs each); shoal.perf's
    4 -> 4 (acks every 100) lost 5 % when every ack pulled at once, and is
    level with the half-prefetch rule (docs/benchmarks.md). Harmless if the
    NOTIFY comes too (acquisition is by CAS; the scheduler ignores a DONE
    from a consumer it did not notify)."""
    table, qid = ctx.shared.table, consumer.qid
    if table.consumer_count(qid) == 1:
        return True
    above = table.eager_above(qid)
    if above <= 0 or table.ready(qid) <= above:
        return False
    channel = consumer.channel
    prefetch = _prefetch(channel, consumer)
    return prefetch > DEAL_ONE_PREFETCH and channel.credit_room(consumer) * 2 >= prefetch


def went_dry(ctx: PullContext, consumer: Consumer, changes: int) -> bool:
    """The queue gave the consumer nothing (its CHANGES was `changes` before
    that scan): DONE, which ends its turn; or, for a consumer that watches
    its queue itself (take_watch), its watch armed again with no message to
    anyone (shm/ARCHITECTURE.md 7b). True if work came meanwhile and the
    pull goes on."""
    consumer.notified = False
    consumer.dry_at = changes
    if consumer.direct:
        qid, waker = consumer.qid, ctx.waker
        if waker.watch(qid, ctx.index):
            # Armed, then CHANGES read (publishers: bump, then load the
            # watch): a publish after the scan is seen here or wakes us.
            if ctx.shared.table.changes(qid) == changes or not waker.unwatch(qid, ctx.index):
                return False  # idle; or a publisher took the watch: its wake comes
            consumer.notified = True
            return True
        drop_watch(ctx, consumer)  # someone else watches: the scheduler's again
    ctx.send(ipc.Done(consumer.cid, changes))
    return False


def take_watch(ctx: PullContext, consumer: Consumer) -> None:
    """The scheduler hands the consumer its queue's watch (ipc.Watch): it is
    the queue's only consumer and ran dry. Publishers now wake this worker
    (its eventfd, Worker._on_watch_wake) and a consumer that runs dry arms
    the watch again itself, so a message that arrives alone costs no round
    trip through the scheduler. A consumer that lost interest meanwhile
    ignores it: its INTEREST(false), on its way, takes the watch back."""
    if consumer.cancelled or not consumer.interested or consumer.stream is not None:
        return
    consumer.direct = True
    ctx.watching[consumer.qid] = consumer
    if went_dry(ctx, consumer, consumer.dry_at):
        pull(ctx, consumer)


def give_back_watch(ctx: PullContext, consumer: Consumer, taken: bool = False) -> None:
    """The scheduler takes the watch back (another consumer came): the DONE
    that ends this consumer's turn tells it the watch is its own again, now
    if the consumer was idle (its watch still armed, or `taken` off Q_WATCH
    by the scheduler already), else when its pull runs dry."""
    if not consumer.direct:
        return
    if consumer.interest_kept:
        drop_watch(ctx, consumer)  # its turn ends with the INTEREST(false) it kept
        ctx.send(ipc.Interest(consumer.cid, False))
        return
    if drop_watch(ctx, consumer) or taken:
        ctx.send(ipc.Done(consumer.cid, consumer.dry_at))
    else:
        # Pulling, or a publisher took the watch and its wake-up comes to a
        # consumer no longer watching: pull now, and DONE when it runs dry.
        ctx.loop.call_soon(pull, ctx, consumer)


def drop_watch(ctx: PullContext, consumer: Consumer) -> bool:
    """The consumer stops watching its queue (it lost interest, was
    cancelled, or gives the watch back). True if its watch was armed, that
    is it was idle; False if it was pulling or a publisher took it."""
    if not consumer.direct:
        return False
    consumer.direct = False
    consumer.interest_kept = False  # `interested` says what the scheduler learns next
    if ctx.watching.get(consumer.qid) is consumer:
        del ctx.watching[consumer.qid]
    return ctx.waker.unwatch(consumer.qid, ctx.index)


def start(ctx: PullContext, consumer: Consumer) -> None:
    """Its consume-ok is written: serve the NOTIFY that came before it."""
    owed = consumer.starting == 2
    consumer.starting = 0
    if owed:
        pull(ctx, consumer)


def pull(ctx: PullContext, consumer: Consumer) -> None:
    """Serve a NOTIFY: deliver until the queue, the credit or the burst ends."""
    if consumer.cancelled or not consumer.interested:
        return  # a NOTIFY that crossed our INTEREST(false) or CANCEL
    if consumer.starting:
        consumer.starting = 2  # served by start(), after consume-ok
        return
    if consumer.stream is not None:
        stream_pull(ctx, consumer)
        return
    if not consumer.acquiring:
        browse(ctx, consumer)
        return
    consumer.notified = True
    shared = ctx.shared
    qid = consumer.qid
    channel = consumer.channel
    out: list[bytes] = []
    delivered = 0  # deliveries this turn: what its quota counts
    work = 0  # entries acquired this turn, dead-lettered ones too: what bursts bound
    # (A consumer that watches its queue itself is its only one: a burst.)
    quota = (
        BURST
        if consumer.direct
        else turn_quota(
            shared.table.ready(qid), shared.table.takers(qid), _prefetch(channel, consumer)
        )
    )
    deliver = channel.deliver
    drop_if_expired = ctx.expiry.drop_if_expired
    timed = shared.seg.atomic.timed  # a message that carries times may have expired

    try:
        while True:
            if not consumer.wants_work():
                consumer.notified = False
                update_interest(ctx, consumer)
                return
            if delivered >= quota and shared.table.ready(qid):
                # Its share taken and work left: the next consumer's turn. (With
                # nothing ready the scan below reports DONE, as at any turn's end.)
                _yield(ctx, consumer)
                return
            if work >= LOCAL_BURST and (work >= BURST or shared.table.consumer_count(qid) <= 1):
                _yield(ctx, consumer)
                return
            # Read the state-change counter before scanning: anything published
            # after this read bumps it, and the scheduler compares.
            levels = consumer.levels
            taken: tuple[int, int, int, bool] | int | None
            if levels is None and consumer.wanted is None:
                # A plain consumer: a run of acquisitions up to what the checks
                # above allow, which nothing can change during the run (no
                # write happens, no other event runs), so they are made once
                # per run, not per message.
                consumer.rewind_if_released(shared)
                stop = LOCAL_BURST if work < LOCAL_BURST else BURST
                n = max(1, min(channel.credit_room(consumer), quota - delivered, stop - work))
                ran = channel.deliver_run(consumer, qid, n, out)
                if ran is not None:
                    # The run in one C call (workers/delivery.py deliver_run).
                    count, status, a, b, c = ran
                    work += count
                    delivered += count
                    if status == RUN_FULL:
                        continue
                    if status == RUN_EMPTY:
                        if went_dry(ctx, consumer, a):
                            continue  # work came while it armed its watch
                        return
                    # RUN_ENTRY: an entry the run left to Python (a
                    # redelivery, a message that may have expired, a
                    # persistent one delivered without acks), acquired.
                    work += 1
                    if deliver_taken(ctx, consumer, a, b, bool(c), out):
                        delivered += 1
                    continue
                # One by one (the crash tests' interposed atomics).
                changes_now = shared.table.changes_reader(qid)
                acquire = shared.a.acquire
                q_off, ring, mask, owner_bits = shared.acquire_args(qid)
                while n:
                    got = acquire(q_off, ring, mask, consumer.pointer, owner_bits)
                    if got.__class__ is int:
                        consumer.pointer = got
                        changes = changes_now()  # read before the scan that decides DONE
                        got = acquire(q_off, ring, mask, got, owner_bits)
                        if got.__class__ is int:
                            consumer.pointer = got
                            if went_dry(ctx, consumer, changes):
                                break  # work came while it armed its watch
                            return
                    seq, block, redelivered = got  # type: ignore[misc]
                    consumer.pointer = seq + 1
                    work += 1
                    expired = timed(block)
                    if (expired and drop_if_expired(qid, seq, block, redelivered)) or (
                        redelivered and ctx.expiry.drop_if_over_limit(qid, seq, block)
                    ):
                        # Dead-lettered instead (workers/message_ttl.py), or put back
                        # when its dead-letter target has no room: no delivery,
                        # so neither credit nor the turn's quota is used (a
                        # turn of one that yielded on it would hand the next
                        # consumer the same head, for ever). Bounded by `stop`.
                        if work >= stop:
                            break
                        continue
                    n -= 1
                    delivered += 1
                    deliver(consumer, qid, seq, block, redelivered, out)
                continue
            if levels is None:
                changes = shared.table.changes(qid)
                consumer.rewind_if_released(shared)
                if consumer.wanted is None:
                    got = shared.acquire(qid, consumer.pointer)
                else:
                    got = readers.acquire_matching(shared, qid, consumer.pointer, consumer.wanted)
                if got.__class__ is int:
                    if got < 0:  # a selector's slice of unwanted entries
                        consumer.pointer = -1 - got
                        taken = -1
                    else:
                        consumer.pointer = got
                        taken = None
                else:
                    seq, block, redelivered = got  # type: ignore[misc]
                    consumer.pointer = seq + 1
                    taken = (qid, seq, block, redelivered)
            else:
                changes = levels.changes()
                taken = levels.acquire(consumer.wanted)
            if isinstance(taken, int):
                # A selector read its slice of unwanted entries: bounded work.
                # Let the others run and go on from the pointer later (the
                # queue is not dry for this consumer yet).
                _yield(ctx, consumer)
                return
            if taken is None:
                if went_dry(ctx, consumer, changes):
                    continue  # work came while it armed its watch
                return
            log_qid, seq, block, redelivered = taken
            work += 1
            if (timed(block) and drop_if_expired(log_qid, seq, block, redelivered)) or (
                redelivered and ctx.expiry.drop_if_over_limit(log_qid, seq, block)
            ):
                continue  # dead-lettered instead, as above: bounded work, no delivery
            channel.deliver(consumer, log_qid, seq, block, redelivered, out)
            delivered += 1
    finally:
        if out:
            conn = channel.conn
            conn.write_many(out)
            if conn.confirm_timer is not None:
                conn.deliveries_written()


def deliver_taken(
    ctx: PullContext, consumer: Consumer, seq: int, block: int, redelivered: bool, out: list[bytes]
) -> bool:
    """An entry of the consumer's queue that a run in C acquired and left to
    Python (RUN_ENTRY: a redelivery, a message that may have expired, a
    persistent one delivered without acks): delivered into `out` (True), or
    dead-lettered instead, or put back when its dead-letter target has no
    room (workers/message_ttl.py): no delivery, so neither credit nor the
    turn's quota is used."""
    qid, expiry = consumer.qid, ctx.expiry
    timed = ctx.shared.seg.atomic.timed(block)  # a message that carries times may have expired
    if (timed and expiry.drop_if_expired(qid, seq, block, redelivered)) or (
        redelivered and expiry.drop_if_over_limit(qid, seq, block)
    ):
        return False
    consumer.channel.deliver(consumer, qid, seq, block, redelivered, out)
    return True


def go_on_watched(ctx: PullContext, consumer: Consumer, answer: PullAnswer) -> None:
    """A publish's wake-up of a queue's watch pulls its consumer in C
    (Worker._on_watch_wake: WatchedPull.pull_each, workers/_watched_pull.h,
    pull's plain runs for a consumer that watches its queue); this is where
    it hands the pull back to Python: in pull() from the
    start (a condition of the plain branch does not hold, or the consumer
    no longer wants work: nothing done yet), at the burst's end (_yield),
    at went_dry's watch another took, or with an entry acquired for Python
    (then pull() goes on from it)."""
    code, a, b, c = answer
    if code == PULL_YIELD:
        _yield(ctx, consumer)
        return
    if code == PULL_WATCH_LOST:
        drop_watch(ctx, consumer)  # someone else watches: the scheduler's again
        ctx.send(ipc.Done(consumer.cid, a))
        return
    if code == PULL_ENTRY:
        out: list[bytes] = []
        try:
            deliver_taken(ctx, consumer, a, b, bool(c), out)
        finally:
            if out:
                conn = consumer.channel.conn
                conn.write_many(out)
                if conn.confirm_timer is not None:
                    conn.deliveries_written()
    pull(ctx, consumer)


def _prefetch(channel: DeliveryChannel, consumer: Consumer) -> int:
    """The consumer's basic.qos message count for turn_quota: the smaller of
    its own and its channel's (global) that are set; 0 when none is, and for
    a no-ack consumer (no credit)."""
    if consumer.no_ack:
        return 0
    own, shared = channel.prefetch_count, channel.global_prefetch
    return min(own, shared) if own and shared else own or shared


# At most this many deliveries before a cancel-ok (take_ready).
CANCEL_TAKES = BURST


def take_ready(ctx: PullContext, consumer: Consumer) -> None:
    """Before a consumer's cancel-ok: deliver what is ready for it now and
    within its credit (at most CANCEL_TAKES), so that what its channel did
    before the cancel keeps its order, as in RabbitMQ: a message the channel
    published to the consumer's queue just before cancelling reaches the
    consumer, not the queue after cancel-ok. Plain consumers only (no levels,
    selector, stream or browsing), which is where a channel's publish and
    its own cancel meet."""
    if (
        consumer.cancelled
        or not consumer.acquiring
        or consumer.stream is not None
        or consumer.levels is not None
        or consumer.wanted is not None
    ):
        return
    shared, qid, channel = ctx.shared, consumer.qid, consumer.channel
    consumer.rewind_if_released(shared)
    out: list[bytes] = []
    timed = shared.seg.atomic.timed
    try:
        for _ in range(CANCEL_TAKES):
            if not consumer.wants_work():
                return
            got = shared.acquire(qid, consumer.pointer)
            if got.__class__ is int:
                consumer.pointer = got
                return
            seq, block, redelivered = got  # type: ignore[misc]
            consumer.pointer = seq + 1
            if timed(block) and ctx.expiry.drop_if_expired(qid, seq, block):
                continue
            if redelivered and ctx.expiry.drop_if_over_limit(qid, seq, block):
                continue
            channel.deliver(consumer, qid, seq, block, redelivered, out)
    finally:
        if out:
            channel.conn.write_many(out)


def _yield(ctx: PullContext, consumer: Consumer) -> None:
    """End a turn with work left. The queue's only consumer has nobody to
    yield to, so it skips the round trip through the scheduler and only lets
    the worker's other connections run first; otherwise DONE -1 hands the
    turn to the next consumer."""
    if ctx.shared.table.consumer_count(consumer.qid) <= 1:
        ctx.loop.call_soon(pull, ctx, consumer)
        return
    consumer.notified = False
    ctx.send(ipc.Done(consumer.cid, -1))


def browse(ctx: PullContext, consumer: Consumer) -> None:
    """Serve a browser: copy entries out in queue order without acquiring
    them, from its own pointer, which never moves back (releases behind it
    are not seen again). It competes with nobody, so a burst yields only to
    the worker's other connections, and running dry reports DONE so that
    the scheduler wakes it at the next change."""
    consumer.notified = True
    shared = ctx.shared
    qid = consumer.qid
    channel = consumer.channel
    out: list[bytes] = []
    delivered = looked = 0
    try:
        while True:
            if not consumer.wants_work():
                consumer.notified = False
                update_interest(ctx, consumer)
                return
            if looked >= LOCAL_BURST:
                ctx.loop.call_soon(pull, ctx, consumer)
                return
            levels = consumer.levels
            if levels is None:
                changes = shared.table.changes(qid)
                got = readers.peek(shared, qid, consumer.pointer)
                if got.__class__ is int:
                    consumer.pointer = got
                    copy = None
                else:
                    seq, message, redelivered = got  # type: ignore[misc]
                    consumer.pointer = seq + 1
                    copy = (message, redelivered)
            else:
                changes = levels.changes()
                copy = levels.peek()
            if copy is None:
                consumer.notified = False
                if consumer.auto_close:
                    channel.conn.write_many(out)
                    out = []
                    channel.cancel_from_server(consumer)
                else:
                    ctx.send(ipc.Done(consumer.cid, changes))
                return
            message, redelivered = copy
            looked += 1
            if consumer.wanted is not None and not consumer.wanted(message[2]):
                continue  # a browser with a selector: not one it wants to see
            channel.deliver_copy(consumer, message, redelivered, out)
            delivered += 1
    finally:
        if out:
            channel.conn.write_many(out)


def stream_pull(ctx: PullContext, consumer: Consumer) -> None:
    """Serve a stream consumer: deliver durable messages from its cursor
    (workers/stream_io.py) within its credit, a burst at a time; DONE with
    the stream's NEXT offset as read before reading, which the scheduler
    compares as a browser's changes value."""
    reading, streams = consumer.stream, ctx.streams
    assert reading is not None and streams is not None
    consumer.notified = True
    qid = consumer.qid
    out: list[bytes] = []
    delivered = 0
    try:
        changes = streams.words.next_offset(qid)
        if reading.cursor is None and not start_reading(streams, qid, reading):
            consumer.notified = False
            ctx.send(ipc.Done(consumer.cid, changes))
            return
        cursor = reading.cursor
        assert cursor is not None
        deliver = consumer.channel.deliver_stream
        wanted = reading.filter
        looked = 0
        while True:
            if not consumer.wants_work():
                consumer.notified = False
                update_interest(ctx, consumer)
                return
            if delivered >= STREAM_BURST or looked >= STREAM_SCAN:
                ctx.loop.call_soon(pull, ctx, consumer)
                return
            if not reading.buffer:
                reading.buffer = cursor.read_chunk(changes)
                if not reading.buffer:
                    consumer.notified = False
                    ctx.send(ipc.Done(consumer.cid, changes))
                    return
                reading.buffer.reverse()  # popped from the end
            message = reading.buffer.pop()
            if wanted is not None and not wanted.accepts(message[5]):
                looked += 1  # x-stream-filter: not one it wants (no credit used)
                continue
            deliver(consumer, message, out)
            delivered += 1
    finally:
        if out:
            consumer.channel.conn.write_many(out)
