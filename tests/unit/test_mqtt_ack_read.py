"""A subscriber's reads of PUBACKs in one C call (workers/_wire.c AckRead,
workers/_ack_read.h), against the path it stands for (Outbound.puback_run,
then the read's batch: Channel.acks_from_bridge, DeliveryBook.settle): the
same queue entries deleted, the same counts (statistics, the book, the
consumer's credit) for the same read; ids it does not know or a retained
message's settle nothing; tags that are not the oldest go to the read's
batch; and it takes nothing, leaving the read to Python's path, whenever
one of that path's conditions does not hold. A real segment, inner
Connection and DeliveryBook; the MQTT side is a stand-in."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from shoal.broker.mqtt import packets as P
from shoal.shm import layout as L
from shoal.shm import stats
from shoal.workers._wire import AckRead
from shoal.workers.context import WorkerContext
from shoal.workers.delivery import DeliveryBook
from shoal.workers.mqtt_acks import ack_read
from shoal.workers.mqtt_outbound import NOTHING_TO_ACK
from shoal.workers.pull import pull
from shoal.workers.unmade import made, made_set
from tests.unit.test_connection import Client
from tests.unit.test_lane import big_ctx, consume, opened, publish

__all__ = ["big_ctx"]  # (the fixture, used by name)

MESSAGES = 12


class Plain:
    def __init__(self) -> None:
        self.plain: list[bytes] = []


class Outbound:
    def __init__(self, unacked: dict[int, int]) -> None:
        self.unacked = unacked


class Subscriber:
    """What AckRead and data_received's PUBACK branch use of an MqttConnection."""

    def __init__(self, client: Client, unacked: dict[int, int]) -> None:
        self.closed = self.busy = False
        self.open = True
        self.acks: list[int] = []
        self.out: list[bytes] | None = None
        self.reader = P.PacketReader(1 << 20)
        self.inbound = Plain()
        self.outbound = Outbound(unacked)
        self.amqp = client.conn
        self.batches = 0

    def python_read(self, data: bytes) -> None:
        """Python's path for a read of PUBACKs: puback_run, then _end_batch."""
        from shoal.workers.mqtt_outbound import pubacks

        at, tags = pubacks(data, 0, self.outbound.unacked, NOTHING_TO_ACK)
        assert at == len(data)
        self.acks += tags
        self._end_batch()

    def _end_batch(self) -> None:  # (MqttConnection's _settle_acks, its common case)
        self.batches += 1
        tags, self.acks = self.acks, []
        if tags:
            assert self.amqp.channels[1].acks_from_bridge(tags)


def pubacks(*ids: int) -> bytes:
    return b"".join(P.encode_ack(P.MQTT_311, P.PUBACK, i) for i in ids)


def delivered(ctx: WorkerContext) -> tuple[Client, int, Any, Subscriber]:
    """MESSAGES delivered to a consumer with acks; packet id i + 100 for tag i."""
    client, (qid,) = opened(ctx, b"q")
    client.send(b"".join(publish(1, b"m%d" % i) for i in range(MESSAGES)))
    consumer = consume(ctx, client, qid, False)
    client.conn.channels[1].delivery.prefetch_count = 0
    pull(ctx, consumer)  # type: ignore[arg-type]
    client.conn.flush()
    client.received()
    delivery = client.conn.channels[1].delivery
    assert list(delivery.unacked) == list(range(1, MESSAGES + 1))
    sub = Subscriber(client, {tag + 100: tag for tag in delivery.unacked})
    return client, qid, consumer, sub


def counts(ctx: WorkerContext, qid: int, consumer: Any, sub: Subscriber) -> tuple[int, ...]:
    delivery = sub.amqp.channels[1].delivery
    return (
        ctx.shared.table.word(qid, L.Q_UNACKED),
        ctx.shared.table.word(qid, L.Q_HEAD),
        ctx.stats.v[stats.ACKNOWLEDGED],
        delivery.acked,
        delivery.unacked_bytes,
        len(delivery.unacked),
        consumer.unacked,
        consumer.unacked_bytes,
        len(sub.outbound.unacked),
    )


def test_it_settles_a_read_as_pythons_path_does(
    big_ctx: WorkerContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    client, qid, consumer, sub = delivered(big_ctx)
    credit: list[Any] = []
    delivery = client.conn.channels[1].delivery
    monkeypatch.setattr(DeliveryBook, "_credit_back", lambda _book, t: credit.append(set(t)))
    before = counts(big_ctx, qid, consumer, sub)
    sub.python_read(pubacks(101, 102, 103))
    by_python = counts(big_ctx, qid, consumer, sub)
    fast = ack_read(sub)
    assert fast is not None
    assert fast.read(pubacks(104, 105, 106), False) == 12
    by_c = counts(big_ctx, qid, consumer, sub)
    # The same changes, three acks each (the head moves past settled entries).
    first = [b - a for a, b in zip(before, by_python, strict=True)]
    assert first == [c - b for b, c in zip(by_python, by_c, strict=True)]
    assert by_c[0] == MESSAGES - 6 and by_c[1] == 6 and by_c[2] == 6
    assert list(delivery.unacked) == list(range(7, MESSAGES + 1))
    assert credit == [{consumer}, {consumer}]  # the credit back, as settle gives it
    assert sub.batches == 1  # (the C read made no batch of its own)


def test_unknown_ids_and_a_retained_messages_settle_nothing(big_ctx: WorkerContext) -> None:
    _client, qid, consumer, sub = delivered(big_ctx)
    sub.outbound.unacked[7] = NOTHING_TO_ACK
    fast = ack_read(sub)
    assert fast is not None
    before = counts(big_ctx, qid, consumer, sub)
    assert fast.read(pubacks(7, 999), False) == 8
    after = counts(big_ctx, qid, consumer, sub)
    assert after[:-1] == before[:-1] and 7 not in sub.outbound.unacked
    assert fast.read(pubacks(101), False) == 4
    assert counts(big_ctx, qid, consumer, sub)[0] == MESSAGES - 1


def test_tags_that_are_not_the_oldest_go_to_the_reads_batch(big_ctx: WorkerContext) -> None:
    client, qid, consumer, sub = delivered(big_ctx)
    fast = ack_read(sub)
    assert fast is not None
    assert fast.read(pubacks(103, 101), False) == 8  # out of order: acked one by one
    assert sub.batches == 1 and sub.acks == []
    assert list(client.conn.channels[1].delivery.unacked) == [2, *range(4, MESSAGES + 1)]
    assert counts(big_ctx, qid, consumer, sub)[0] == MESSAGES - 2


class Recorder:
    """A persist that keeps the settles it is given."""

    def __init__(self) -> None:
        self.settled: list[Any] = []

    def settle_many(self, settled: list[Any]) -> None:
        self.settled.append(list(settled))


def test_a_queue_settled_again_is_looked_up_once_until_it_records(
    big_ctx: WorkerContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a read looked up of its queue (run_args) serves the next reads
    of the same queue, until whether its settles are recorded changes (the
    store records them and the queue is durable): then it asks again, and
    ack_run gets the answer that records them (no settle left unrecorded)."""
    _client, qid, consumer, sub = delivered(big_ctx)
    shared = big_ctx.shared
    asked: list[Any] = []
    run_args = type(shared).run_args
    monkeypatch.setattr(
        type(shared), "run_args", lambda self, q: asked.append(run_args(self, q)) or asked[-1]
    )
    big_ctx.persist = recorder = Recorder()  # type: ignore[assignment]
    fast = ack_read(sub)
    assert fast is not None
    for first in (101, 103, 105):
        assert fast.read(pubacks(first, first + 1), False) == 8
    assert len(asked) == 1 and asked[0][-1] is False
    assert counts(big_ctx, qid, consumer, sub)[0] == MESSAGES - 6
    monkeypatch.setattr(shared.events, "records_settles", True)
    assert fast.read(pubacks(107), False) == 4  # not durable: the same answer
    assert len(asked) == 1
    shared.table.set_uid(qid, 7)  # durable now: its settles are recorded
    assert fast.read(pubacks(108), False) == 4
    assert len(asked) == 2 and asked[1][-1] is True
    assert counts(big_ctx, qid, consumer, sub)[0] == MESSAGES - 8
    assert recorder.settled == [] or all(recorder.settled)


def test_a_queue_with_a_capacity_releases_its_publishers_after_a_read(
    big_ctx: WorkerContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SharedQueues.drained, asked after a read that deleted entries only
    where the queue has a capacity (its first load, in C)."""
    _client, qid, consumer, sub = delivered(big_ctx)
    shared = big_ctx.shared
    drained: list[int] = []
    monkeypatch.setattr(type(shared), "drained", lambda _self, q: drained.append(q))
    fast = ack_read(sub)
    assert fast is not None
    assert fast.read(pubacks(101), False) == 4
    assert drained == []
    shared.a.store(shared.layout.queue(qid) + L.Q_CAPACITY, 1 << 20)
    assert fast.read(pubacks(102, 103), False) == 8
    assert drained == [qid]
    assert counts(big_ctx, qid, consumer, sub)[0] == MESSAGES - 3


def subscribing(ctx: WorkerContext) -> int:
    """A SUBSCRIBE of this worker's begun (a broker's header counts its
    workers: the test segment's does not until told)."""
    if not ctx.seg.atomic.load(L.H_WORKERS):
        ctx.seg.atomic.store(L.H_WORKERS, 1)
    return ctx.subscribe_barrier.begin()


def _closed(ctx: WorkerContext, sub: Subscriber) -> None:
    sub.closed = True


def _busy(ctx: WorkerContext, sub: Subscriber) -> None:
    sub.busy = True


def _settled(ctx: WorkerContext, sub: Subscriber) -> None:
    sub.acks = [1]


def _partial_packet(ctx: WorkerContext, sub: Subscriber) -> None:
    sub.reader.feed(b"\x40")


def _plain_held(ctx: WorkerContext, sub: Subscriber) -> None:
    sub.inbound.plain = [b"x"]


def _batch(ctx: WorkerContext, sub: Subscriber) -> None:
    sub.out = []


def _not_open(ctx: WorkerContext, sub: Subscriber) -> None:
    sub.open = False


def _other_outbound(ctx: WorkerContext, sub: Subscriber) -> None:
    sub.outbound = Outbound(sub.outbound.unacked)


def _channel_busy(ctx: WorkerContext, sub: Subscriber) -> None:
    sub.amqp.channels[1].busy = True


def _channel_closing(ctx: WorkerContext, sub: Subscriber) -> None:
    sub.amqp.channels[1].closing = True


def _blocked(ctx: WorkerContext, sub: Subscriber) -> None:
    sub.amqp.flow_blocked = True


def _flow_backlog(ctx: WorkerContext, sub: Subscriber) -> None:
    made(sub.amqp.channels[1], "flow_backlog").append(b"x")


def _publishing(ctx: WorkerContext, sub: Subscriber) -> None:
    sub.amqp.channels[1].publisher.state = 1  # (mid-publish: not IDLE)


def _transaction(ctx: WorkerContext, sub: Subscriber) -> None:
    sub.amqp.channels[1].delivery.transactions.tx = object()


def _timed_out(ctx: WorkerContext, sub: Subscriber) -> None:
    made_set(sub.amqp.channels[1].delivery, "timed_out_tags").add(50)


def _channel_reopened(ctx: WorkerContext, sub: Subscriber) -> None:
    channels = sub.amqp.channels
    channels[1] = type("Other", (), {})()


CHANGES: list[Callable[[WorkerContext, Subscriber], None]] = [
    _closed,
    _busy,
    _settled,
    _partial_packet,
    _plain_held,
    _batch,
    _not_open,
    _other_outbound,
    _channel_busy,
    _channel_closing,
    _blocked,
    _flow_backlog,
    _publishing,
    _transaction,
    _timed_out,
    _channel_reopened,
]


@pytest.mark.parametrize("change", CHANGES, ids=lambda c: c.__name__.strip("_"))
def test_it_takes_nothing_when_the_path_it_stands_for_would_not(
    big_ctx: WorkerContext, change: Callable[[WorkerContext, Subscriber], None]
) -> None:
    _client, qid, consumer, sub = delivered(big_ctx)
    fast = ack_read(sub)
    assert fast is not None
    change(big_ctx, sub)
    before = counts(big_ctx, qid, consumer, sub) if change is not _channel_reopened else None
    assert fast.read(pubacks(101, 102), False) == 0
    if before is not None:
        assert counts(big_ctx, qid, consumer, sub) == before
    assert 101 in sub.outbound.unacked and sub.batches == 0


def test_a_subscribe_under_way_holds_no_read_of_pubacks(big_ctx: WorkerContext) -> None:
    """A SUBSCRIBE under way holds publishes only (workers/_barrier.h): a
    subscriber's PUBACKs, which publish nothing, go on in C."""
    _client, qid, consumer, sub = delivered(big_ctx)
    fast = ack_read(sub)
    assert fast is not None
    token = subscribing(big_ctx)
    assert fast.read(pubacks(101), False) == 4
    big_ctx.subscribe_barrier.end(token)
    assert fast.read(pubacks(102, 103), False) == 8
    assert counts(big_ctx, qid, consumer, sub)[0] == MESSAGES - 3


@pytest.mark.parametrize(
    "data",
    [
        b"",
        pubacks(101)[:3],  # not whole
        b"\x40\x02\x00\x00",  # id 0: the decoder's to refuse
        b"\x40\x03\x00\x65\x10",  # 5.0's long form
        pubacks(101) + b"\x30\x05\x00\x01a\x00\x01",  # then another packet
        pubacks(*[101] * 1025),  # over 1,024 in one read
    ],
)
def test_a_read_that_is_not_only_short_pubacks_is_pythons(
    big_ctx: WorkerContext, data: bytes
) -> None:
    _client, qid, consumer, sub = delivered(big_ctx)
    fast = ack_read(sub)
    assert fast is not None
    before = counts(big_ctx, qid, consumer, sub)
    assert fast.read(data, False) == 0
    assert counts(big_ctx, qid, consumer, sub) == before


def test_bad_arguments_are_refused(big_ctx: WorkerContext, tmp_path: Path) -> None:
    with pytest.raises(TypeError):
        AckRead(1, 2, 3)
    _client, _qid, _consumer, sub = delivered(big_ctx)
    fast = ack_read(sub)
    assert fast is not None
    with pytest.raises(TypeError):
        fast.read(pubacks(101))  # type: ignore[call-arg]
