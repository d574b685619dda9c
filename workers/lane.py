"""A connection's publish lane: a run of publishes that need nothing but
routing goes into its queue without Python per message.

Each read of a publishing connection used to cost every message its trip
through `Publisher.fast_publish` (workers/publish.py): about 5 µs of Python
where the C work (split, copy, append) is a fraction of one. The lane moves
that run into `workers/_wire.c` `scan`: once fast_publish has put a message
into its queue with nothing but routing (`offer`), the lane remembers the
channel, exchange, routing key and queue, and `scan` takes each later whole
publish to the same place itself (the block allocated, the record written,
the entry appended, through shm's C API), counting what it took. After the
read, `account` does for the run what `Publisher._account` does for one
message (statistics, confirm numbers) and what `Arena.alloc` does after an
allocation (cursor, fill, the memory guard's high mark).

The lane takes only what the Python path would have put straight into that
queue: the same channel, exchange and routing key; no immediate, expiration,
reply-to, CC or BCC; a body within the size limit; a queue with no length
limit or capacity, with room, not paging. Anything else stays an item for
Python, and the lane is off for the rest of the read so that the channel's
frames keep their order (scan: `lane_stops`).

A persistent message for a durable queue goes in with its PUBLISH record
while the read has a store window (`arm`: the message store's open message
file, Persister.store_window): `scan` tags it, counts its entry in the
message file, appends it and frames its record, in Queue.publish_durable's
order (workers/ingest.py); `account` hands the run's records to the store
as one write (Persister.add_run), and a confirming channel's confirms wait
for its sync. Without a window (no message file yet, or it is full) such a
message is Python's.

A place one lane learnt is offered to every lane of the worker
(workers/lane_places.py): `arm` adds those this connection may publish to, so
a publisher rotating over many queues routes in Python only what no
connection on its worker has sent there yet. Only a lane that learnt
ROTATING places itself takes them: every lane taking every place is work
of lanes x places, and a worker with 1,000 devices each publishing to its
own topic spent over a second of its loop on it (issue 41's fan-in with one
worker: deliveries held 1 s after the devices started).

What `arm` checks before each read, because it decides whether the cached
route still holds: the connection open and not blocked, the channel the same
one and idle (nothing pending, no transaction, no flow backlog), the queue
table and the exchanges unchanged since `offer` (generation and version),
the permission still there, no paging files, and for a confirming channel no
consumer of its own (its confirms may wait for that delivery: RabbitMQ's
deliver-before-ack order, `Publisher._consumes`). After a change of the
queue table or the exchanges, anywhere, a lane with a few places checks
each again (`_still_routed`: its queue still plain and where the lane holds
it, its route still that queue alone, the write still permitted) and keeps
them if all hold; else, as a lane with many places does, it forgets them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from shoal.broker.amqp.errors import AMQPError
from shoal.broker.config import Config
from shoal.shm._atomic import Atomic
from shoal.shm.arena import release_hold
from shoal.shm.stats import CONFIRMED, RECEIVED_CONFIRM, ROUTED, SIZE_BUCKETS, SIZE_SUM
from shoal.shm.wake import Waker
from shoal.workers._wire import Lane, stat_places
from shoal.workers.census import Census
from shoal.workers.channel_state import IDLE, Confirms, LanePublisher
from shoal.workers.connection_access import ConnectionAccess
from shoal.workers.handshake import OPEN
from shoal.workers.ingest import AppendContext
from shoal.workers.lane_places import LanePlaces
from shoal.workers.route_touch import lane_signature
from shoal.workers.routes import Routes
from shoal.workers.unmade import made

_NO_PAGE_OUT = 1 << 62
# Where Lane.mqtt_read and DeviceRead count a run as `account` and lane_run
# do (workers/_lane_account.h, _lane_device.h).
stat_places(ROUTED, SIZE_SUM, SIZE_BUCKETS, RECEIVED_CONFIRM, CONFIRMED)
# The places a lane learns from its own channel's publishes before it takes
# those other lanes learnt: a publisher rotating over many queues gets there
# in as many messages routed in Python; one sending to a place or three, as
# most do, never pays for the worker's other places.
ROTATING = 4
# The most places a lane checks again after a change of the definitions or
# the queues (PublishLane._still_routed) rather than forgetting them.
RECHECK_MAX = 8


class LaneContext(AppendContext, Protocol):
    """What the lane uses of its worker: appending (its runs go into their
    queues in C), and what decides whether a place may take a run (routing,
    the limits, the scheduler's wake-ups)."""

    @property
    def config(self) -> Config: ...
    @property
    def routes(self) -> Routes: ...
    @property
    def waker(self) -> Waker: ...
    @property
    def lane_places(self) -> LanePlaces: ...

    @property
    def census(self) -> Census: ...  # (a new publisher: workers/census.py)


class LaneConnection(Protocol):
    """What the lane uses of its connection (workers/connection.py)."""

    state: int
    vhost: str
    vhost_id: int
    access: ConnectionAccess
    flow_blocked: dict[int, int]
    confirm_channels: set[Confirms]

    @property
    def channels(self) -> Mapping[int, object]: ...
    @property
    def ctx(self) -> LaneContext: ...


class PublishLane:
    """One connection's lane (a `_wire.Lane`) and what decides its use."""

    __slots__ = (
        "absorbed",
        "catalog_gen",
        "conn",
        "ctx",
        "known",
        "lane",
        "learnt_here",
        "max_body",
        "names",
        "places",
        "publisher",
        "routes_version",
        "stores",
        "window",
        "window_at",
    )

    def __init__(self, conn: LaneConnection) -> None:
        self.conn = conn
        self.ctx = ctx = conn.ctx
        self.lane = Lane(ctx.seg.atomic)
        self.publisher: LanePublisher | None = None
        # The places it knows: (exchange, routing key) -> qid, and what the
        # lane holds of each one's queue: (queue, ring, mask, store uid).
        self.known: dict[tuple[bytes, bytes], int] = {}
        self.places: dict[tuple[bytes, bytes], tuple[int, int, int, int]] = {}
        # The queue names each known place's route had when the lane last
        # looked (Routes.entry_names; the default exchange's: its key),
        # where it knows them: a change that touches none of them and
        # none of its queues leaves the place as it is (_untouched).
        self.names: dict[tuple[bytes, bytes], tuple[bytes, ...]] = {}
        # How many of them it learnt from its own publishes (offer).
        self.learnt_here = 0
        # How many of the worker's learnt places (ctx.lane_places) it has looked at.
        self.absorbed = 0
        # Whether a known place's persistent messages go to the message
        # store, and the store window of the last read that had one.
        self.stores = False
        self.window = (0, 0, 0, 0, 0, 0)  # Persister.window
        self.window_at = 0  # its `reserved` then
        self.catalog_gen = -1
        self.routes_version = -1
        self.max_body = 0

    @staticmethod
    def usable(ctx: LaneContext) -> bool:
        """Whether this worker's segment has the plain Atomic (the crash
        tests interpose on the Python steps: no lane there)."""
        return ctx.seg.atomic.__class__ is Atomic

    def offer(
        self, publisher: LanePublisher, exchange: bytes, routing_key: bytes, qid: int
    ) -> None:
        """fast_publish put a message with nothing but routing into `qid`,
        its only queue, with no deduplication and no transaction: the
        channel's next publishes to the same place may go in C. The lane
        knows up to 1,024 places per channel (a publisher rotating over
        many queues keeps them all)."""
        place = (exchange, routing_key)
        if publisher is self.publisher and self.known.get(place) == qid:
            return
        ctx = self.ctx
        shared, routes = ctx.shared, ctx.routes
        if (
            qid not in shared.catalog.plain_queues()
            or shared.catalog.dedup_now
            or routes.dedup_exchanges
        ):
            return
        if exchange and not routes.cached(self.conn.vhost_id, exchange, routing_key):
            return  # a route through a headers exchange depends on each message
        if (
            publisher is not self.publisher
            or shared.catalog.catalog_generation() != self.catalog_gen
            or routes.version != self.routes_version
            or self.max_body != ctx.config.max_message_size
        ):
            self._configure(publisher)
        queue, ring, mask, _owner = shared.acquire_args(qid)
        # Its persistent messages go to the message store, if it keeps them.
        store_uid = shared.table.uid(qid) if ctx.persist is not None else 0
        if self.lane.add(exchange, routing_key, queue, ring, mask, qid, store_uid):
            self.known[place] = qid
            self.places[place] = (queue, ring, mask, store_uid)
            # (the lane's generations are the current ones: the route just taken's)
            names = routes.entry_names(self.conn.vhost_id, exchange, routing_key)
            if not exchange:
                self.names[place] = (routing_key,)
            elif names is not None:
                self.names[place] = names
            self._sign()
            self.learnt_here += 1
            self.stores = self.stores or bool(store_uid)
            learnt = (self.conn.vhost_id, exchange, routing_key, qid, queue, ring, mask, store_uid)
            ctx.lane_places.learn(self.catalog_gen, self.routes_version, learnt)

    def _configure(self, publisher: LanePublisher) -> None:
        """The lane for `publisher`'s channel, knowing no route yet."""
        ctx = self.ctx
        seg, arena = ctx.seg, ctx.arena
        self.lane.configure(
            publisher.number,
            ctx.slot,
            ctx.config.max_message_size,
            arena.base,
            arena.end,
            arena.hot_end,
            arena.hot_live,
            seg.layout.arenas,
            seg.layout.limits.arena_bytes,
        )
        self.publisher = publisher
        self.known.clear()
        self.places.clear()
        self.names.clear()
        self.learnt_here = 0
        self.absorbed = 0
        self.stores = False
        self.catalog_gen = ctx.shared.catalog.catalog_generation()
        self.routes_version = ctx.routes.version
        self.max_body = ctx.config.max_message_size

    def clear(self) -> None:
        self.lane.clear()
        self.known.clear()
        self.places.clear()
        self.names.clear()
        self.learnt_here = 0
        self.absorbed = 0
        self.stores = False
        self.publisher = None

    def arm(self) -> Lane | None:
        """The lane for this read's scan, if it may take publishes now. Call
        after the connection's ConnectionAccess.refresh (its routes synced).
        An MQTT device's DeviceRead checks the same conditions in C
        (workers/_lane_device.h): a condition added here goes there too."""
        publisher = self.publisher
        if publisher is None or not self.known:
            return None
        conn = self.conn
        if conn.state != OPEN or conn.flow_blocked:
            return None
        channel = publisher.channel
        if conn.channels.get(publisher.number) is not channel or channel.closing:
            self.clear()
            return None
        if publisher.state != IDLE or publisher.pending is not None or channel.busy:
            return None
        if channel.flow_backlog or publisher.transactions.tx is not None:
            return None
        if publisher.confirm and (publisher.delivery.consumers or publisher.confirm_held):
            return None
        ctx = self.ctx
        # The connection has replayed what the scheduler journaled since its
        # last read (ConnectionAccess.refresh, just before): the exchanges
        # and the permissions are as of now.
        if (
            ctx.shared.catalog.catalog_generation() != self.catalog_gen
            or ctx.routes.version != self.routes_version
        ) and not self._still_routed():
            self.clear()  # a route changed: Python routes the next ones
            return None
        if self.max_body != ctx.config.max_message_size:
            self.clear()
            return None
        if self.learnt_here >= ROTATING and len(ctx.lane_places.learnt) != self.absorbed:
            self._take_places()
        pager = ctx.pager
        if pager is not None and pager.files:
            return None
        arena = ctx.arena
        lane = self.lane
        lane.arm(
            arena.cursor,
            arena.used,
            arena.high,
            _NO_PAGE_OUT if pager is None else pager.arena_high,
        )
        if self.stores:  # a route whose persistent messages the store keeps
            persist = ctx.persist
            assert persist is not None
            window = persist.window
            if window is not None:  # (slot, check, epoch, limit, header size, live word)
                self.window_at = reserved = persist.reserved
                slot, check, epoch, limit, header, live = self.window = window
                lane.store_window(slot, check, epoch, reserved, limit, header, live)
        return lane

    def _still_routed(self) -> bool:
        """After a change of the definitions (exchanges, bindings,
        permissions) or of the queues, anywhere: whether every place the
        lane knows still routes to its queue alone, as the lane holds it,
        and may be published to. Then the lane keeps its places under the
        new generations. Forgetting them cost each publisher two reads
        through Python's path per change (one routed, one to learn the
        place again): a fleet whose devices reconnect, each SUBSCRIBE and
        each clean session's end a change, kept few of its reads in C. A
        lane that knows many places (a rotating publisher) is cleared."""
        known = self.known
        if not known or len(known) > RECHECK_MAX:
            return False
        ctx, conn = self.ctx, self.conn
        shared, routes = ctx.shared, ctx.routes
        catalog = shared.catalog
        catalog_gen = catalog.catalog_generation()  # (before: a change during shows next time)
        routes.sync()
        routes_version = routes.version  # (the same: one journaled during the checks fails them)
        if catalog.dedup_now or routes.dedup_exchanges:
            return False
        if self._untouched(catalog_gen):
            if catalog.dedup_now:  # (a deduplicating queue came with the changes)
                return False
            self.catalog_gen = catalog_gen
            self.routes_version = routes_version
            self._sign()
            return True
        plain = catalog.plain_queues()
        vhost, vhost_id, access = conn.vhost, conn.vhost_id, conn.access
        persist = ctx.persist
        places, names = self.places, self.names
        for place, qid in known.items():
            exchange, routing_key = place
            if qid not in plain or not access.may_publish(exchange, routing_key):
                return False
            queue, ring, mask, _owner = shared.acquire_args(qid)
            store_uid = shared.table.uid(qid) if persist is not None else 0
            if places.get(place) != (queue, ring, mask, store_uid):
                return False
            if not exchange:  # the default exchange: the queue its key names
                if catalog.lookup(routing_key, vhost_id) != qid:
                    return False
                names[place] = (routing_key,)
                continue
            try:
                qids = routes.route(vhost, vhost_id, exchange, routing_key, b"")
            except AMQPError:
                return False
            route_names = routes.entry_names(vhost_id, exchange, routing_key)
            if qids != (qid,) or route_names is None:
                return False  # (another queue, none, or a headers exchange on the way)
            names[place] = route_names
        if routes.version != routes_version:
            return False
        self.catalog_gen = catalog_gen
        self.routes_version = routes_version
        self._sign()
        return True

    def _sign(self) -> None:
        """What its places depend on, for a device's read after a change
        elsewhere (workers/route_touch.py), where it knows each place's
        names: the places as just checked. (Lane.add drops it: a place
        learnt from another lane, without names, leaves it unsigned.)"""
        known, names = self.known, self.names
        if known and len(names) == len(known):
            self.lane.sign(lane_signature(self.conn.vhost_id, known, names))

    def _untouched(self, catalog_gen: int) -> bool:
        """Whether no change since the lane's generations (the definitions
        replayed just before: Routes.sync) can touch a place it knows: each
        place's route the same cached entry (no binding or exchange change
        touched it), none of the queues changed since (the catalog's change
        ring) its queue or named as its route's names are, and its publish
        permitted. A fleet's reconnects (a SUBSCRIBE's queue and binding, a
        clean session's end: changes of other keys and queues) then cost
        each device's next read this look, not every check again. False:
        _still_routed looks at everything (a place whose names it does not
        know, a ring that cannot tell)."""
        known, names = self.known, self.names
        if len(names) != len(known):
            return False
        changes = self.ctx.shared.catalog.changed_since(self.catalog_gen, catalog_gen)
        if changes is None:
            return False
        changed, changed_names = changes
        conn, routes = self.conn, self.ctx.routes
        vhost_id, access = conn.vhost_id, conn.access
        for place, qid in known.items():
            if qid in changed:
                return False
            exchange, routing_key = place
            route_names = names[place]
            if exchange and routes.entry_names(vhost_id, exchange, routing_key) is not route_names:
                return False
            if changed_names and any((vhost_id, name) in changed_names for name in route_names):
                return False
            if not access.may_publish(exchange, routing_key):
                return False
        return True

    def _take_places(self) -> None:
        """The places this worker's other lanes learnt since the last look
        (workers/lane_places.py) that this connection may publish to."""
        ctx = self.ctx
        places = ctx.lane_places
        if not places.valid_for(self.catalog_gen, self.routes_version):
            return  # learnt before a change: the next offer starts them again
        shared, routes = ctx.shared, ctx.routes
        if shared.catalog.dedup_now or routes.dedup_exchanges:
            return
        learnt = places.learnt
        start, self.absorbed = self.absorbed, len(learnt)
        vhost_id, access, known, lane = self.conn.vhost_id, self.conn.access, self.known, self.lane
        plain = shared.catalog.plain_queues()
        for vhost, exchange, routing_key, qid, queue, ring, mask, store_uid in learnt[start:]:
            place = (exchange, routing_key)
            if (
                vhost != vhost_id
                or place in known
                or qid not in plain
                or not access.may_publish(exchange, routing_key)
            ):
                continue
            if not lane.add(exchange, routing_key, queue, ring, mask, qid, store_uid):
                return  # it keeps as many as it can
            known[place] = qid
            self.places[place] = (queue, ring, mask, store_uid)
            self.stores = self.stores or bool(store_uid)

    def account(self) -> list[tuple[int, int, int, bytes]]:
        """After a scan with the lane armed: what it took, as fast_publish's
        `_account` and `Arena.alloc` would have counted it one by one, and
        the wake-ups its appends took. Returns [(qid, messages, watcher,
        exchange)] of the routes it appended through. Lane.mqtt_read counts
        the same in C (workers/_lane_account.h): a count added here goes
        there too."""
        n, body_bytes, buckets, cursor, used, touched, gone, records, stored, first_stored = (
            self.lane.take()
        )
        ctx = self.ctx
        arena = ctx.arena
        arena.cursor = cursor
        if not n:
            return touched
        arena.used = used
        arena.dirty = True
        if used > arena.high and arena.on_high is not None:
            arena.on_high(used)
        persist = ctx.persist
        record = -1
        if records is not None:  # the run's PUBLISH records, from window_at on
            assert persist is not None
            record = persist.add_run(records, stored, self.window_at)
        if gone is not None:  # its queue was deleted under the append
            qid, seq, block, gone_stored = gone
            if ctx.shared.take_back(qid, seq, block) and gone_stored:
                persist.uncount(self.window[0])  # type: ignore[union-attr]  # as publish_durable
            release_hold(ctx.seg, block)
        waker = ctx.waker
        publisher = self.publisher
        assert publisher is not None
        exchanges = publisher.exchange_counts
        for qid, count, watcher, exchange in touched:
            if watcher:  # the watch its scan took after the counters (shm/wake.py)
                waker.wake(qid, watcher)
            counted = exchanges.get(exchange)  # one addition per route and run
            if counted is None:
                counted = exchanges[exchange] = [0, 0]
            counted[0] += count
            counted[1] += count  # every lane publish is routed
        if not publisher.publish_count:
            ctx.census.first_publish(publisher)  # a new publisher (the statistics count them)
        publisher.publish_count += n
        stats = publisher.stats
        stats[ROUTED] += n
        stats[SIZE_SUM] += body_bytes
        if buckets is None:  # every body at most 100 bytes
            stats[SIZE_BUCKETS] += n
        else:
            for i, count in enumerate(buckets):
                if count:
                    stats[SIZE_BUCKETS + i] += count
        if publisher.confirm:
            stats[RECEIVED_CONFIRM] += n
            if record >= 0:  # confirms from the first stored message on wait for the sync
                seq = publisher.publish_seq + first_stored
                made(publisher, "unsynced").append((seq, record, False))
                persist.wait(publisher)  # type: ignore[union-attr]  # records: a store
            publisher.publish_seq += n
            publisher.confirm_high = publisher.publish_seq
            self.conn.confirm_channels.add(publisher)
        return touched
