"""The publish lane (workers/lane.py, workers/_wire.c scan), the delivery run
(workers/_wire.c deliver_run) and publishers' pacing (workers/pacing.py)
against the Python paths they replace, on
a real segment with a Connection over a fake transport: the same records in
the same order, the same counts and confirms, and everything the lane may
not take left to Python in its place."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from pamqp import commands as C
from pamqp import frame as pamqp_frame
from pamqp.body import ContentBody as Body
from pamqp.header import ContentHeader

from shoal.broker.amqp import access
from shoal.broker.amqp import definitions as D
from shoal.shm import layout as L
from shoal.shm import stats
from shoal.shm.arena import read_message, read_tag, record_bytes
from shoal.shm.queues import SharedQueues
from shoal.store import messages, records
from shoal.workers import pacing
from shoal.workers.consumer import Consumer
from shoal.workers.context import WorkerContext
from shoal.workers.lane import ROTATING, PublishLane
from shoal.workers.pull import pull
from tests.unit.test_connection import Client, worker_context


@pytest.fixture
def big_ctx(tmp_path: Path) -> Iterator[WorkerContext]:
    """A context whose queues hold a few thousand messages."""
    yield from worker_context(
        tmp_path,
        L.Limits(max_workers=1, max_queues=64, queue_capacity=1 << 13, arena_bytes=4 << 20),
    )


def publish(
    channel: int,
    body: bytes,
    routing_key: str = "q",
    exchange: str = "",
    props: C.Basic.Properties | None = None,
    mandatory: bool = False,
) -> bytes:
    props = props or C.Basic.Properties()
    return (
        pamqp_frame.marshal(
            C.Basic.Publish(exchange=exchange, routing_key=routing_key, mandatory=mandatory),
            channel,
        )
        + pamqp_frame.marshal(ContentHeader(0, len(body), props), channel)
        + pamqp_frame.marshal(Body(body), channel)
    )


def queue_bodies(ctx: WorkerContext, qid: int) -> list[bytes]:
    """The bodies in log `qid`, head to tail (not acquired)."""
    shared = ctx.shared
    out = []
    head, tail = shared.table.word(qid, L.Q_HEAD), shared.table.word(qid, L.Q_TAIL)
    for seq in range(head, tail):
        cell = ctx.seg.layout.log(qid) + (seq & shared.mask) * L.CELL_SIZE
        word = ctx.seg.atomic.load(cell)
        if word & L.STATE_MASK != L.S_AVAILABLE:
            continue
        out.append(read_message(ctx.seg, ctx.seg.atomic.load(cell + 8))[3])
    return out


def opened(ctx: WorkerContext, *queues: bytes) -> tuple[Client, list[int]]:
    shared = SharedQueues(ctx.seg)
    qids = []
    for qid, name in enumerate(queues):
        shared.create(qid, name, 0, 0)
        qids.append(qid)
    client = Client(ctx)
    client.open()
    client.method(1, C.Channel.Open())
    client.received()
    return client, qids


TAKEN: dict[int, int] = {}  # publishes each connection's lane took (by id)


@pytest.fixture(autouse=True)
def lane_counted(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    yield from counting_lanes(monkeypatch)


def counting_lanes(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Count what each lane takes: PublishLane.account sees each run."""
    original = PublishLane.account

    def account(self: PublishLane) -> int:
        key = id(self.conn)
        TAKEN[key] = TAKEN.get(key, 0) + self.lane.n
        return original(self)

    monkeypatch.setattr(PublishLane, "account", account)
    TAKEN.clear()
    yield


def lane_taken(client: Client) -> int:
    return TAKEN.get(id(client.conn), 0)


def counting(client: Client) -> Client:
    assert client.conn.publish_lane is not None
    return client


def test_a_run_of_publishes_goes_through_the_lane_into_the_same_records(
    big_ctx: WorkerContext,
) -> None:
    client, (qid,) = opened(big_ctx, b"q")
    counting(client)
    props = C.Basic.Properties(content_type="text/plain", headers={"n": 1}, delivery_mode=1)
    bodies = [b"m%05d" % i for i in range(2000)]
    data = b"".join(publish(1, body, props=props) for body in bodies)
    # Reads cut anywhere: the lane takes whole publishes, the rest waits.
    for at in range(0, len(data), 7001):
        client.send(data[at : at + 7001])
    assert queue_bodies(big_ctx, qid) == bodies
    assert lane_taken(client) > 1900, "the lane took the run after its first message"
    v = big_ctx.stats.v
    assert v[stats.ROUTED] == 2000 and v[stats.SIZE_SUM] == sum(map(len, bodies))
    assert v[stats.SIZE_BUCKETS] == 2000  # every body is at most 100 bytes
    # Each record is what the Python writer writes: exchange, key, header, body.
    first = read_message(big_ctx.seg, big_ctx.seg.atomic.load(big_ctx.seg.layout.log(qid) + 8))
    assert first[:2] == (b"", b"q") and first[2] == ContentHeader(0, 6, props).marshal()
    assert big_ctx.shared.table.word(qid, L.Q_READY) == 2000
    assert big_ctx.shared.table.word(qid, L.Q_BYTES) == sum(map(len, bodies))


def test_lane_publishes_are_confirmed_in_order(big_ctx: WorkerContext) -> None:
    client, _qids = opened(big_ctx, b"q")
    counting(client)
    client.method(1, C.Confirm.Select())
    assert [type(f) for _c, f in client.received()] == [C.Confirm.SelectOk]
    # The first read goes through Python (the lane is set up by it and
    # armed from the next read on); the next ones through the lane.
    for n in range(3):
        client.send(b"".join(publish(1, b"x%d" % i) for i in range(500)))
        acks = [f for _c, f in client.received()]
        assert [(type(f), f.delivery_tag, f.multiple) for f in acks] == [
            (C.Basic.Ack, 500 * (n + 1), True)
        ]
    assert lane_taken(client) == 1000
    assert big_ctx.stats.v[stats.RECEIVED_CONFIRM] == 1500
    assert big_ctx.stats.v[stats.ROUTED] == 1500


def test_what_the_lane_cannot_take_goes_to_python_in_its_place(big_ctx: WorkerContext) -> None:
    """Another routing key, an expiration, a reply-to, CC, an unroutable
    mandatory message and a frame of another kind on the channel, in the
    middle of a run: each queue still gets its messages in publish order,
    the unroutable one comes back, and the lane takes the run again."""
    client, (q, other) = opened(big_ctx, b"q", b"other")
    counting(client)
    frames, want_q, want_other = [], [], []
    for i in range(300):
        body = b"%d" % i
        if i % 50 == 7:
            frames.append(publish(1, body, routing_key="other"))
            want_other.append(body)
        elif i % 50 == 11:
            frames.append(publish(1, body, props=C.Basic.Properties(expiration="60000")))
            want_q.append(body)
        elif i % 50 == 13:
            frames.append(publish(1, body, props=C.Basic.Properties(reply_to="r")))
            want_q.append(body)
        elif i % 50 == 17:
            cc = C.Basic.Properties(headers={"CC": ["other"]})
            frames.append(publish(1, body, props=cc))
            want_q.append(body)
            want_other.append(body)
        elif i % 50 == 19:
            frames.append(publish(1, body, routing_key="nowhere", mandatory=True))
        elif i % 50 == 23:
            frames.append(pamqp_frame.marshal(C.Basic.Qos(prefetch_count=5), 1))
            frames.append(publish(1, body))
            want_q.append(body)
        else:
            frames.append(publish(1, body))
            want_q.append(body)
    client.send(publish(1, b"first"))  # sets the lane up
    want_q.insert(0, b"first")
    # Reads of about ten messages: in each the lane takes the run up to the
    # first message it leaves (the rest of that read goes to Python).
    for at in range(0, len(frames), 10):
        client.send(b"".join(frames[at : at + 10]))
    assert queue_bodies(big_ctx, q) == want_q
    assert queue_bodies(big_ctx, other) == want_other
    replies = [type(f) for _c, f in client.received()]
    assert replies.count(C.Basic.Return) == 6 and replies.count(C.Basic.QosOk) == 6
    assert lane_taken(client) > 150


def test_the_lane_stops_at_a_queue_that_is_gone(big_ctx: WorkerContext) -> None:
    """After its queue is deleted (the catalog generation moves), the lane
    no longer takes the channel's publishes: they are routed again, and go
    nowhere (a mandatory one comes back)."""
    client, (qid,) = opened(big_ctx, b"q")
    counting(client)
    client.send(publish(1, b"a"))
    client.send(b"".join(publish(1, b"a") for _ in range(9)))
    assert lane_taken(client) == 9
    SharedQueues(big_ctx.seg).remove(qid)
    client.send(b"".join(publish(1, b"b", mandatory=True) for _ in range(3)))
    assert [type(f) for _c, f in client.received()].count(C.Basic.Return) == 3
    assert lane_taken(client) == 9


def test_a_persistent_message_without_a_store_stays_in_the_lane(
    big_ctx: WorkerContext,
) -> None:
    """Without a message store (no data directory here) delivery mode 2 is
    only a flag: the lane takes it (with one, the next test: it takes it
    with its record)."""
    client, (qid,) = opened(big_ctx, b"q")
    counting(client)
    persistent = C.Basic.Properties(delivery_mode=2)
    client.send(publish(1, b"p0", props=persistent))
    client.send(b"".join(publish(1, b"p%d" % i, props=persistent) for i in range(1, 20)))
    assert queue_bodies(big_ctx, qid) == [b"p%d" % i for i in range(20)]
    assert lane_taken(client) == 19


@pytest.fixture
def store_ctx(tmp_path: Path) -> Iterator[WorkerContext]:
    """big_ctx with a message store (workers/persist.py) in tmp_path."""
    for ctx in worker_context(
        tmp_path,
        L.Limits(max_workers=1, max_queues=64, queue_capacity=1 << 13, arena_bytes=4 << 20),
    ):
        dirs = [str(tmp_path / sub) for sub in ("msgs", "paging", "streams")]
        for sub in dirs:
            os.makedirs(sub)
        ctx.open_store(*dirs)
        yield ctx


def test_a_persistent_run_goes_in_with_the_records_python_would_write(
    store_ctx: WorkerContext,
) -> None:
    """Persistent messages to a durable queue, with a message store: after
    the first (Python's record path, which teaches the lane), the lane takes
    the run with their PUBLISH records. Each message is tagged with its
    record's place, each record is byte for byte what Queue.publish_durable
    writes, the message file counts every entry, and the confirms wait for
    the records' sync."""
    ctx = store_ctx
    shared = SharedQueues(ctx.seg)
    shared.create(0, b"q", L.QF_DURABLE, 0, uid=7)
    client = Client(ctx)
    client.open()
    client.method(1, C.Channel.Open())
    client.method(1, C.Confirm.Select())
    client.received()
    counting(client)
    persistent = C.Basic.Properties(delivery_mode=2, headers={"h": 1})
    bodies = [b"p%04d" % i for i in range(1500)]
    persist = ctx.persist
    assert persist is not None
    for n in range(3):
        client.send(
            b"".join(publish(1, b, props=persistent) for b in bodies[500 * n : 500 * (n + 1)])
        )
        acks = [(f.delivery_tag, f.multiple) for _c, f in client.received()]
        if acks:  # only if the sync thread was done before this read's end
            assert persist.synced >= persist.next_index, "confirmed before the sync"
        ctx.loop.run_until_complete(persist.durable(persist.next_index))
        acks += [(f.delivery_tag, f.multiple) for _c, f in client.received()]
        assert acks == [(500 * (n + 1), True)], "confirmed once synced, once"
    assert lane_taken(client) == 1000
    assert queue_bodies(ctx, 0) == bodies
    # The message file: one PUBLISH record per message, in order, each the
    # Python writer's bytes, at the offset its message's tag names.
    message_file = persist.message_file
    assert message_file is not None
    _file, payloads, skipped = records.open_records(
        message_file.writer.file.path, messages.MESSAGE_FILE_MAGIC, messages.VERSION
    )
    _file.close()
    # (The file is still open: the zeros written past its records end it.)
    assert (skipped is None or skipped.reason == records.ZERO_TAIL) and len(payloads) == 1500
    offset = records.HEADER_SIZE
    log = ctx.seg.layout.log(0)
    for seq, payload in enumerate(payloads):
        block = ctx.seg.atomic.load(log + (seq & shared.mask) * L.CELL_SIZE + 8)
        assert read_tag(ctx.seg, block) == (message_file.slot, message_file.check, offset)
        size = len(payload) - 24  # the record's head: b"P", 1, uid, level, epoch, seq
        want = messages.encode_publish_one(
            7, 0, persist.epoch, seq, record_bytes(ctx.seg, block, size)
        )
        assert payload == want
        offset += records.RECORD_OVERHEAD + len(payload)
    assert persist.table.live(message_file.slot) == 1500
    assert ctx.stats.v[stats.STORE_SYNCED_RECORDS] == 1500


def consume(ctx: WorkerContext, client: Client, qid: int, no_ack: bool) -> Consumer:
    delivery = client.conn.channels[1].delivery
    consumer = Consumer(1, b"ctag", delivery, qid, b"q", no_ack, False, 0)
    delivery.consumers[b"ctag"] = consumer
    ctx.consumers[1] = consumer
    return consumer


@pytest.mark.parametrize("no_ack", [True, False])
def test_a_delivery_run_sends_what_one_by_one_delivery_sent(
    big_ctx: WorkerContext, no_ack: bool
) -> None:
    """deliver_run's frames are deliver_frames' for each entry, in order,
    with consecutive tags; a redelivered entry in the middle goes through
    Python (flagged, in its place); without acks the entries are deleted,
    with acks booked in the channel's unacked dict."""
    client, (qid,) = opened(big_ctx, b"q")
    client.send(b"".join(publish(1, b"m%d" % i) for i in range(600)))
    shared = big_ctx.shared
    # Entry 100 was delivered before and came back: redelivered.
    cell = big_ctx.seg.layout.log(qid) + 100 * L.CELL_SIZE
    word = big_ctx.seg.atomic.load(cell)
    big_ctx.seg.atomic.store(cell, word | L.FLAG_REDELIVERED)
    consumer = consume(big_ctx, client, qid, no_ack)
    delivery = client.conn.channels[1].delivery
    delivery.prefetch_count = 0
    for _ in range(20):
        pull(big_ctx, consumer)
        client.conn.flush()
        if not shared.table.word(qid, L.Q_READY):
            break
    delivers = [(f, ch) for ch, f in client.received() if isinstance(f, C.Basic.Deliver)]
    assert [f.delivery_tag for f, _ch in delivers] == list(range(1, 601))
    assert [f.redelivered for f, _ch in delivers] == [i == 100 for i in range(600)]
    assert all(f.consumer_tag == "ctag" and f.routing_key == "q" for f, _ch in delivers)
    if no_ack:
        assert shared.table.word(qid, L.Q_UNACKED) == 0 and shared.table.word(qid, L.Q_HEAD) == 600
        assert big_ctx.stats.v[stats.DELIVERED_CONSUME_AUTO_ACK] == 600
    else:
        assert shared.table.word(qid, L.Q_UNACKED) == 600 and len(delivery.unacked) == 600
        assert delivery.unacked[600] == (consumer, qid, 599, 4)
        assert consumer.unacked == 600 and consumer.unacked_bytes == delivery.unacked_bytes
        client.method(1, C.Basic.Ack(delivery_tag=600, multiple=True))
        assert shared.table.word(qid, L.Q_UNACKED) == 0 and shared.table.word(qid, L.Q_HEAD) == 600


def drain(ctx: WorkerContext, qid: int, count: int) -> None:
    """A consumer elsewhere takes `count` entries from the head (no-ack)."""
    shared = ctx.shared
    for _ in range(count):
        got = shared.acquire(qid, 0)
        assert got.__class__ is tuple
        shared.settle_taken(qid, got[0])  # type: ignore[index]


def test_a_publisher_is_paced_while_consumers_drain_its_backlog(
    big_ctx: WorkerContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    """workers/pacing.py: past PACE_HIGH ready messages in a queue with
    consumers, the publisher's reads are held (no connection.blocked) until
    the consumers take it below PACE_LOW; consumers that take nothing for
    PACE_PATIENCE release it, and the queue is left unpaced."""
    monkeypatch.setattr(pacing, "PACE_HIGH", 400)
    monkeypatch.setattr(pacing, "PACE_LOW", 200)
    client, (qid,) = opened(big_ctx, b"q")
    big_ctx.shared.table.set_consumer_count(qid, 1, 1)  # a consumer takes turns
    client.send(publish(1, b"first"))  # sets the lane up
    client.send(b"".join(publish(1, b"m") for _ in range(300)))
    assert not client.transport.paused, "300 ready: under PACE_HIGH"
    client.send(b"".join(publish(1, b"m") for _ in range(200)))
    pacer = client.conn.pacer
    assert client.transport.paused and pacer.qid == qid, "501 ready: held"
    assert [type(f) for _c, f in client.received()] == [], "held quietly: no connection.blocked"
    drain(big_ctx, qid, 150)
    pacer._look()
    assert client.transport.paused, "351 ready, draining: still held"
    drain(big_ctx, qid, 200)
    pacer._look()
    assert not client.transport.paused and pacer.qid < 0, "151 ready: released"
    # Held again, and the consumers stop: after PACE_PATIENCE it lets go and
    # leaves the queue unpaced.
    client.send(b"".join(publish(1, b"m") for _ in range(300)))
    assert client.transport.paused
    monkeypatch.setattr(pacing, "PACE_PATIENCE", 0.0)
    pacer._look()
    assert not client.transport.paused and qid in pacer.unpaced
    client.send(b"".join(publish(1, b"m") for _ in range(10)))
    assert not client.transport.paused, "unpaced: its consumers do not drain it"


def test_a_paced_connection_stops_growing_its_receive_window(
    big_ctx: WorkerContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first hold fixes the connection's receive buffer at PACED_RCVBUF,
    so that the kernel stops autotuning it (and the client's send buffer
    behind it) into megabytes of messages that no queue holds yet."""
    monkeypatch.setattr(pacing, "PACE_HIGH", 400)
    monkeypatch.setattr(pacing, "PACE_LOW", 200)
    client, (qid,) = opened(big_ctx, b"q")
    with socket.socket() as sock:
        autotuned = sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)
        monkeypatch.setattr(
            client.transport, "get_extra_info", lambda name: sock if name == "socket" else None
        )
        big_ctx.shared.table.set_consumer_count(qid, 1, 1)
        client.send(publish(1, b"first"))
        client.send(b"".join(publish(1, b"m") for _ in range(300)))
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF) == autotuned, "not paced yet"
        client.send(b"".join(publish(1, b"m") for _ in range(200)))
        assert client.transport.paused
        # Linux doubles what it is given, for its own bookkeeping.
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF) == 2 * pacing.PACED_RCVBUF


def test_a_queue_without_consumers_is_never_paced(
    big_ctx: WorkerContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pacing, "PACE_HIGH", 400)
    client, (qid,) = opened(big_ctx, b"q")
    client.send(publish(1, b"first"))
    for _ in range(3):
        client.send(b"".join(publish(1, b"m") for _ in range(1000)))
    assert big_ctx.shared.table.ready(qid) > pacing.PACE_HIGH
    assert not client.transport.paused


def rotation(names: list[bytes], rounds: int) -> bytes:
    """`rounds` publishes to each queue of `names` in turn, the bodies counting rounds."""
    return b"".join(
        publish(1, b"%d" % n, routing_key=name.decode()) for n in range(rounds) for name in names
    )


def test_the_lane_knows_every_queue_a_publisher_rotates_over(big_ctx: WorkerContext) -> None:
    """A publisher that sends each message to the next of several queues
    (500 quiet connections over 250 queues do): once Python has routed one
    message to each, the lane takes them all, in each queue's order."""
    names = [b"r%d" % i for i in range(5)]
    client, qids = opened(big_ctx, *names)
    for name in names:  # one read each: each teaches the lane its place
        client.send(publish(1, b"first", routing_key=name.decode()))
    assert client.conn.publish_lane is not None
    assert client.conn.publish_lane.lane.routes == 5
    rounds = 40
    client.send(rotation(names, rounds))
    assert lane_taken(client) == rounds * len(names)
    for qid in qids:
        assert queue_bodies(big_ctx, qid) == [b"first"] + [b"%d" % n for n in range(rounds)]


def test_a_run_over_more_queues_than_its_list_holds_stops_and_loses_nothing(
    tmp_path: Path,
) -> None:
    """A read that rotates over 70 queues: the run's list of queues grows
    from the lane's own few to its 64 and stops at the 65th queue (the rest
    of the read goes on after it); every queue gets its messages, in order."""
    limits = L.Limits(max_workers=1, max_queues=128, queue_capacity=1 << 10, arena_bytes=4 << 20)
    for ctx in worker_context(tmp_path, limits):
        names = [b"many%d" % i for i in range(70)]
        client, qids = opened(ctx, *names)
        for name in names:  # one read each: each teaches the lane its place
            client.send(publish(1, b"first", routing_key=name.decode()))
        assert client.conn.publish_lane is not None
        before = lane_taken(client)
        client.send(rotation(names, 3))
        assert lane_taken(client) - before >= 64
        for qid in qids:
            assert queue_bodies(ctx, qid) == [b"first", b"0", b"1", b"2"]


def test_a_lane_run_counts_once_then_takes_the_watch_of_each_queue_it_appended_to(
    big_ctx: WorkerContext,
) -> None:
    """A read that the lane takes into three queues, each watched by the
    scheduler (shm/ARCHITECTURE.md 2b, 7): after it every queue counts its
    entries (READY, PUBLISHED, CHANGES), has its watch taken and its bit
    set for the scheduler; the slot's tally is clear. A queue the read did
    not touch keeps its watch."""
    names = [b"w0", b"w1", b"w2", b"idle"]
    client, qids = opened(big_ctx, *names)
    for name in names[:3]:  # one read each: each teaches the lane its place
        client.send(publish(1, b"first", routing_key=name.decode()))
    seg, a = big_ctx.seg, big_ctx.seg.atomic
    waker = big_ctx.shared.waker
    assert waker is not None
    waker.flush_deferred()
    waker.drain(seg.layout.limits.max_queues)  # the first reads' wake-ups
    for qid in qids:
        a.store(seg.layout.queue(qid) + L.Q_WATCH, L.WATCH_SCHEDULER)
    before = lane_taken(client)
    client.send(rotation(names[:3], 30))
    assert lane_taken(client) - before == 90
    for qid in qids[:3]:
        assert big_ctx.shared.table.ready(qid) == 31
        assert big_ctx.shared.table.word(qid, L.Q_PUBLISHED) == 31
        assert big_ctx.shared.table.word(qid, L.Q_CHANGES) == 31
        assert a.load(seg.layout.queue(qid) + L.Q_WATCH) == 0
    assert a.load(seg.layout.queue(qids[3]) + L.Q_WATCH) == L.WATCH_SCHEDULER
    waker.flush_deferred()
    assert sorted(waker.drain(seg.layout.limits.max_queues)) == qids[:3]
    assert a.load(big_ctx.slot + L.P_TALLY_QUEUE) == 0


@pytest.fixture
def two_users_ctx(tmp_path: Path) -> Iterator[WorkerContext]:
    yield from two_users_context(tmp_path)


def two_users_context(tmp_path: Path) -> Iterator[WorkerContext]:
    """guest, and `limited`, who may publish to amq.direct only; queue r0
    is bound to amq.direct with key r0."""
    yield from worker_context(
        tmp_path,
        L.Limits(max_workers=1, max_queues=64, queue_capacity=1 << 13, arena_bytes=4 << 20),
        [
            D.UserSet("limited", access.hash_password("limited"), access.SHA256, [], {}),
            D.PermissionSet("/", "limited", ".*", r"^amq\.direct$", ".*"),
            D.Bound("/", "amq.direct", "q", "r0", "r0", {}),
        ],
    )


def logged_in(ctx: WorkerContext, user: str) -> Client:
    client = Client(ctx)
    client.send(b"AMQP\x00\x00\x09\x01")
    client.method(0, C.Connection.StartOk(mechanism="PLAIN", response=f"\0{user}\0{user}"))
    client.method(0, C.Connection.TuneOk(channel_max=100, frame_max=131072, heartbeat=0))
    client.method(0, C.Connection.Open(virtual_host="/"))
    client.method(1, C.Channel.Open())
    frames = [type(f) for _ch, f in client.received()]
    assert frames[-2:] == [C.Connection.OpenOk, C.Channel.OpenOk]
    return client


def test_a_connection_takes_the_places_another_one_learnt_where_it_may_publish(
    two_users_ctx: WorkerContext,
) -> None:
    """Publishers that rotate over many queues (the 500 quiet connections
    over 250 queues): a place one connection's lane learnt is every rotating
    lane's on that worker, once ROTATING places of its own made it one, but
    only where that connection's user may publish."""
    ctx = two_users_ctx
    names = [b"r%d" % i for i in range(5)]
    _, qids = opened(ctx, *names)
    teacher = logged_in(ctx, "guest")
    for name in names:
        teacher.send(publish(1, b"first", routing_key=name.decode()))
    teacher.send(publish(1, b"first", routing_key="r0", exchange="amq.direct"))
    assert teacher.conn.publish_lane is not None and teacher.conn.publish_lane.lane.routes == 6

    learner = logged_in(ctx, "guest")
    own = names[5 - ROTATING :]
    for name in own:  # Python, and the lane set up: a rotating publisher's
        learner.send(publish(1, b"second", routing_key=name.decode()))
    rounds = 20
    learner.send(rotation(names, rounds))
    assert learner.conn.publish_lane is not None and learner.conn.publish_lane.lane.routes == 6
    assert lane_taken(learner) == rounds * len(names)
    for qid, name in zip(qids, names, strict=True):
        later = [b"%d" % n for n in range(rounds)]
        assert (
            queue_bodies(ctx, qid)
            == [b"first"] * (1 + (name == b"r0")) + ([b"second"] if name in own else []) + later
        )

    limited = logged_in(ctx, "limited")
    limited.send(publish(1, b"third", routing_key="r0", exchange="amq.direct"))
    limited.send(publish(1, b"x", routing_key="r0", exchange="amq.direct") * 3)
    assert lane_taken(limited) == 3
    lane = limited.conn.publish_lane
    assert lane is not None and lane.lane.routes == 1  # not the default exchange's five
    assert set(lane.known) == {(b"amq.direct", b"r0")}


def test_a_lane_with_a_place_or_three_of_its_own_takes_no_others(big_ctx: WorkerContext) -> None:
    """1,000 devices each publishing to a topic of its own: every lane taking
    every other lane's place is work of lanes x places (over a second of one
    worker's loop for issue 41's fan-in). A lane that learnt fewer than
    ROTATING places itself keeps to those, and still takes their publishes."""
    names = [b"d%d" % i for i in range(12)]
    _, qids = opened(big_ctx, *names)
    devices = []
    for name in names:
        device = logged_in(big_ctx, "guest")
        device.send(publish(1, b"first", routing_key=name.decode()))
        devices.append(device)
    for device, name in zip(devices, names, strict=True):
        device.send(publish(1, b"again", routing_key=name.decode()) * 3)
        publish_lane = device.conn.publish_lane
        assert publish_lane is not None
        assert set(publish_lane.known) == {(b"", name)}
        assert publish_lane.lane.routes == 1
        assert lane_taken(device) == 3
    for qid in qids:
        assert queue_bodies(big_ctx, qid) == [b"first"] + [b"again"] * 3


def test_publishers_are_counted_once_each_whichever_path_takes_their_publishes(
    big_ctx: WorkerContext,
) -> None:
    """The statistics' publishers (workers/census.py): a channel counts
    once from its first publish on, through the lane in C as in Python,
    and not after it closed."""
    client, _ = opened(big_ctx, b"q")
    client.send(publish(1, b"first"))
    client.send(publish(1, b"second") * 2)
    assert big_ctx.census.publishers == 1
    client.method(2, C.Channel.Open())
    client.received()
    client.send(publish(2, b"third"))
    taken = lane_taken(client)
    client.send(publish(2, b"fourth") * 3)
    assert lane_taken(client) == taken + 3  # (in C)
    assert (big_ctx.census.publishers, big_ctx.census.channels) == (2, 2)
    client.method(1, C.Channel.Close(reply_code=200, reply_text="", class_id=0, method_id=0))
    client.send(publish(2, b"fifth") * 3)
    assert (big_ctx.census.publishers, big_ctx.census.channels) == (1, 1)
