"""The connector's broker-facing logic without Spark (shoal.spark's pure-Python
classes) against a real Shoal broker: bounds, offset planning, exact range
reads, data loss, the classic-queue spool surviving a killed reader, the
browse snapshot, publishing with confirms, and the error messages."""

from __future__ import annotations

import itertools
import pickle
from pathlib import Path
from typing import Any

import pika
import pytest

from shoal.spark.bounds import stream_bounds
from shoal.spark.classic import ClassicSource, browse
from shoal.spark.errors import DataLossError, ShoalSparkError
from shoal.spark.options import Options
from shoal.spark.publish import Publisher
from shoal.spark.rows import COLUMNS, INDEX, SCHEMA_DDL, from_json, to_json
from shoal.spark.stream_reader import Range, StreamSource, read_range, share, split
from tests.broker_process import Broker, wait_for
from tests.spark.helpers import STREAM, browse_all, connect, count, drain, publish


def options(broker: Broker, **kw: str) -> Options:
    return Options.parse({"uri": broker.url, **kw})


def bodies(rows: Any) -> list[bytes]:
    return [r[INDEX["body"]] for r in rows]


def test_options_and_pure_helpers() -> None:
    o = Options.parse(
        {"queue": "a, b", "startingoffsets": '{"a": 5}', "maxmessagespertrigger": "7"}
    )
    assert o.queues == ("a", "b")
    assert o.starting_offsets == {"a": 5, "b": "earliest"}
    assert o.ending_offsets == {"a": "latest", "b": "latest"}
    assert o.max_messages_per_trigger == 7
    with pytest.raises(ShoalSparkError, match="startingOffsets"):
        Options.parse({"queue": "a", "startingOffsets": "oldest"})
    with pytest.raises(ShoalSparkError, match="not in option queue"):
        Options.parse({"queue": "a", "startingOffsets": '{"z": 1}'})
    assert Options.parse({"checkpointLocation": "/c"}).spool_location == "/c/shoal-spool"
    assert share({"a": 100, "b": 3}, 10) == {"b": 3, "a": 7}
    assert share({"a": 100, "b": 100}, 11) == {"a": 6, "b": 5}
    assert split({"a": 0, "b": 5}, {"a": 25, "b": 5}, 10) == [
        Range("a", 0, 10),
        Range("a", 10, 20),
        Range("a", 20, 25),
    ]
    assert SCHEMA_DDL.count("`") == 2 * len(COLUMNS)


def test_stream_bounds_and_offsets(broker: Broker) -> None:
    conn = connect(broker.url)
    ch = conn.channel()
    ch.queue_declare("sb", durable=True, arguments=STREAM)
    assert stream_bounds(conn.channel(), "sb") == (0, 0)
    publish(broker.url, "sb", 30)
    assert stream_bounds(conn.channel(), "sb") == (0, 30)
    publish(broker.url, "sb2", 5)
    conn.close()

    src = StreamSource(options(broker, queue="sb2,sb", maxMessagesPerTrigger="10"))
    assert src.initial_offset() == {"sb": 0, "sb2": 0}
    assert list(src.initial_offset()) == ["sb", "sb2"]  # sorted keys
    src = pickle.loads(pickle.dumps(src))  # picklable, and reconnects lazily
    assert src.latest_offset({"sb": 0, "sb2": 0}, 10) == {"sb": 5, "sb2": 5}
    assert src.latest_offset({"sb": 0, "sb2": 0}, 20) == {"sb": 15, "sb2": 5}
    assert src.latest_offset({"sb": 0, "sb2": 0}, None) == {"sb": 30, "sb2": 5}
    src.prepare_available_now()
    publish(broker.url, "sb", 10, 30)
    assert src.latest_offset({"sb": 0, "sb2": 0}, None) == {"sb": 30, "sb2": 5}
    late = StreamSource(options(broker, queue="sb,sb2", startingOffsets="latest"))
    assert late.initial_offset() == {"sb": 40, "sb2": 5}
    with pytest.raises(ShoalSparkError, match="checkpoint's queues"):
        late.latest_offset({"sb": 0}, None)
    assert src.partitions({"sb": 0, "sb2": 5}, {"sb": 40, "sb2": 5}) == [Range("sb", 0, 40)]
    src.stop()
    late.stop()


def test_range_reads_are_exact_and_repeatable(broker: Broker) -> None:
    publish(broker.url, "sr", 500)
    o = options(broker, queue="sr", prefetch="64")
    rows = list(read_range(o, Range("sr", 120, 370)))
    assert bodies(rows) == [f"m{i}".encode() for i in range(120, 370)]
    assert [r[INDEX["offset"]] for r in rows] == list(range(120, 370))
    again = list(read_range(o, Range("sr", 120, 370)))
    assert [r[: INDEX["read_time"]] for r in again] == [r[: INDEX["read_time"]] for r in rows]
    row = rows[0]
    assert row[INDEX["message_id"]] == "id-120"
    # no x-stream-offset; the publisher's x-deduplication-header
    assert row[INDEX["headers"]] == {"i": "120", "tag": "t", "x-deduplication-header": "id-120"}
    assert row[INDEX["routing_key"]] == "sr" and row[INDEX["exchange"]] == ""
    assert row[INDEX["queue"]] == "sr" and row[INDEX["redelivered"]] is False
    assert from_json(to_json(row)) == row
    assert list(read_range(o, Range("sr", 7, 7))) == []


def test_data_loss_is_an_error_or_skipped(broker: Broker) -> None:
    conn = connect(broker.url)
    ch = conn.channel()
    ch.queue_declare(
        "sl",
        durable=True,
        arguments={
            **STREAM,
            "x-max-length-bytes": 60_000,
            "x-stream-max-segment-size-bytes": 20_000,
        },
    )
    ch.confirm_delivery()
    for i in range(400):
        ch.basic_publish("", "sl", b"x" * 500, pika.BasicProperties(message_id=str(i)))

    # Retention runs once a second: wait until it has nothing left to delete
    # (the segments within x-max-length-bytes), then the first offset holds.
    def settled() -> bool:
        stream = next(q for q in broker.status()["queues"] if q["name"] == "sl")["stream"]
        return stream["first_offset"] > 0 and (stream["bytes"] <= 60_000 or stream["segments"] == 1)

    wait_for(settled, 15, "retention")
    first = stream_bounds(conn.channel(), "sl")[0]
    conn.close()
    with pytest.raises(DataLossError) as exc:
        list(read_range(options(broker, queue="sl"), Range("sl", 0, 400)))
    text = str(exc.value)
    assert "stream 'sl'" in text and "offset 0 was requested" in text
    assert f"first available was {first}" in text
    lenient = options(broker, queue="sl", failOnDataLoss="false")
    rows = list(read_range(lenient, Range("sl", 0, 400)))
    assert [r[INDEX["offset"]] for r in rows] == list(range(first, 400))
    src = StreamSource(lenient)
    assert src.latest_offset({"sl": 0}, 10) == {"sl": first + 10}
    src.stop()


def test_clear_errors(broker: Broker, tmp_path: Path) -> None:
    with pytest.raises(ShoalSparkError, match="queue 'nope' does not exist in vhost '/'"):
        StreamSource(options(broker, queue="nope")).initial_offset()
    with pytest.raises(ShoalSparkError, match="queue 'nope' does not exist in vhost '/'"):
        list(read_range(options(broker, queue="nope"), Range("nope", 0, 1)))
    bad = broker.url.replace("guest:guest", "guest:secret")
    with pytest.raises(ShoalSparkError) as exc:
        list(read_range(Options.parse({"uri": bad}), Range("x", 0, 1)))
    assert "login refused" in str(exc.value) and "secret" not in str(exc.value)
    down = f"amqp://guest:hush@127.0.0.1:{broker.port + 1 if broker.port < 65535 else 1}/"
    with pytest.raises(ShoalSparkError) as exc:
        list(read_range(Options.parse({"uri": down}), Range("x", 0, 1)))
    assert "connection refused" in str(exc.value)
    assert "guest:***@127.0.0.1" in str(exc.value) and "hush" not in str(exc.value)
    # A classic queue is refused by the stream reader, and left untouched.
    publish(broker.url, "cq", 3, stream=False)
    with pytest.raises(ShoalSparkError, match="classic queue, not a stream"):
        StreamSource(options(broker, queue="cq")).initial_offset()
    publish(broker.url, "sq", 3)
    with pytest.raises(ShoalSparkError, match="is a stream queue"):
        ClassicSource(options(broker, queue="sq", spoolLocation=str(tmp_path))).read({"sq": 0})
    with pytest.raises(ShoalSparkError, match="spoolLocation"):
        ClassicSource(options(broker, queue="cq"))
    assert browse_all(broker.url, "cq") == [(b"m0", False), (b"m1", False), (b"m2", False)]


def test_browse_snapshot_takes_nothing(broker: Broker) -> None:
    publish(broker.url, "bq", 2500, stream=False)
    rows = list(browse(options(broker, prefetch="100"), "bq"))
    assert bodies(rows) == [f"m{i}".encode() for i in range(2500)]
    assert not any(r[INDEX["redelivered"]] for r in rows)
    assert all(r[INDEX["offset"]] is None for r in rows)
    assert count(broker.url, "bq") == 2500
    got = drain(broker.url, "bq")
    assert [b for b, _p, _r in got] == [f"m{i}".encode() for i in range(2500)]
    assert not any(r for _b, _p, r in got)
    assert list(browse(options(broker), "bq")) == []


def test_classic_source_survives_a_killed_reader(broker: Broker, tmp_path: Path) -> None:
    """A reader spools and hands out batches, then dies without acking (its
    connection drops): a new reader on the same spool re-emits the orphan
    batch, drops the redelivered copies by message_id, and nothing is lost."""
    publish(broker.url, "cl", 250, stream=False)
    spool = str(tmp_path / "spool")
    o = options(broker, queue="cl", spoolLocation=spool, maxMessagesPerTrigger="100")
    a = ClassicSource(o)
    assert a.initial_offset() == {"cl": 0}
    rows0, end0 = a.read({"cl": 0})
    assert end0 == {"cl": 100} and len(rows0) == 100
    rows1, end1 = a.read(end0)  # Spark committed batch 0: its deliveries are acked
    assert end1 == {"cl": 200}
    assert a.read_between(end0, end1) == rows1  # the executor-side replay
    a._conn._impl._transport._sock.close()  # killed: no ack, no close
    a._conn = None
    # batch 0 was acked; batch 1 and the prefetched rest come back
    wait_for(lambda: count(broker.url, "cl") == 150, 10, "the unacked messages to return")

    b = pickle.loads(pickle.dumps(ClassicSource(o)))
    again, end = b.read(end0)  # Spark had not logged batch 1: re-emitted
    assert end == end1 and again == rows1
    rows2, end2 = b.read(end1)
    rows3, end3 = b.read(end2)
    assert b.duplicates_dropped == 100  # batch 1's redeliveries
    ids = [r[INDEX["message_id"]] for r in rows0 + rows1 + rows2 + rows3]
    assert sorted(ids, key=lambda i: int(i[3:])) == [f"id-{i}" for i in range(250)]
    assert end3 == {"cl": 250}
    assert b.read(end3) == ([], {"cl": 250})
    b.commit(end3)
    # Kept for the dedupe window, end to end (how many batches depends on
    # how the last messages arrived: 3, or 4 when a read's wait ended first).
    batches = b.spool.batches()
    assert batches[0][0] == 0 and batches[-1][1] == 250
    assert all(prev[1] == nxt[0] for prev, nxt in itertools.pairwise(batches))
    assert count(broker.url, "cl") == 0
    b.stop()


def test_classic_source_drops_redeliveries_by_the_broker_stamped_id(
    broker: Broker, tmp_path: Path
) -> None:
    """Messages without a message_id: the x-shoal-id header the broker puts
    on each delivery recognises the redelivered copies after a lost
    connection."""
    conn = connect(broker.url)
    ch = conn.channel()
    ch.queue_declare("nid")
    for i in range(150):
        ch.basic_publish("", "nid", f"m{i}".encode())
    conn.close()
    o = options(broker, queue="nid", spoolLocation=str(tmp_path), maxMessagesPerTrigger="100")
    a = ClassicSource(o)
    rows0, end0 = a.read({"nid": 0})
    assert all(r[INDEX["headers"]]["x-shoal-id"] for r in rows0)
    a._conn._impl._transport._sock.close()  # killed before Spark committed anything
    a._conn = None
    wait_for(lambda: count(broker.url, "nid") == 150, 10, "the unacked messages to return")
    b = ClassicSource(o)
    again, end = b.read({"nid": 0})  # the orphan batch, re-emitted from the spool
    assert end == end0 and again == rows0
    rest: list[Any] = []
    for _ in range(50):  # a read returns what has arrived: bounded retries
        more, end = b.read(end)
        rest += more
        if len(rest) >= 50:
            break
    assert b.duplicates_dropped == 100
    assert bodies(rest) == [f"m{i}".encode() for i in range(100, 150)]
    b.commit(end)
    b.read(end)
    assert count(broker.url, "nid") == 0
    b.stop()


def test_classic_available_now_budget(broker: Broker, tmp_path: Path) -> None:
    publish(broker.url, "cb", 30, stream=False)
    o = options(
        broker,
        queue="cb",
        spoolLocation=str(tmp_path),
        maxMessagesPerTrigger="20",
        dedupeWindow="0",
    )
    src = ClassicSource(o)
    src.prepare_available_now()
    publish(broker.url, "cb", 30, 30, stream=False)
    rows, end = src.read({"cb": 0})
    rows2, end2 = src.read(end)
    assert (len(rows), len(rows2)) == (20, 10)
    assert src.read(end2) == ([], end2)
    src.commit(end2)
    assert src.spool.batches() == []  # dedupeWindow 0: committed batches are not kept
    src.stop()
    assert count(broker.url, "cb") == 30


def test_publisher_confirms_and_unroutable(broker: Broker) -> None:
    conn = connect(broker.url)
    ch = conn.channel()
    ch.queue_declare("pq")
    ch.exchange_declare("px", "direct")
    ch.queue_bind("pq", "px", "k")
    conn.close()
    rows = [
        {"body": f"b{i}".encode(), "headers": {"h": str(i)}, "priority": 1, "queue": "ignored"}
        for i in range(3000)
    ]
    rows[5]["message_id"] = "own-id"
    rows[6]["headers"] = {"x-deduplication-header": "own-key"}
    o = options(broker, exchange="px", routingKey="k")
    assert Publisher(o).publish_all(iter(rows), "job:0") == 3000
    got = drain(broker.url, "pq")
    assert [b for b, _p, _r in got] == [f"b{i}".encode() for i in range(3000)]
    ids = [p.message_id for _b, p, _r in got]
    assert ids[:7] == ["job:0:0", "job:0:1", "job:0:2", "job:0:3", "job:0:4", "own-id", "job:0:6"]
    assert got[1][1].headers == {"h": "1", "x-deduplication-header": "job:0:1"}
    assert got[5][1].headers["x-deduplication-header"] == "own-id"  # the row's own id
    assert got[6][1].headers == {"x-deduplication-header": "own-key"}  # the row's own key
    assert got[1][1].delivery_mode == 2
    # routing key from the column, over the option
    Publisher(o).publish_all([{"body": "text", "routing_key": "k"}], "j2:0")
    assert [b for b, _p, _r in drain(broker.url, "pq")] == [b"text"]
    with pytest.raises(ShoalSparkError) as exc:
        Publisher(options(broker, exchange="px", routingKey="nowhere")).publish_all(
            [{"body": b"x"}] * 10, "j3:0"
        )
    assert "10 of 10 messages were returned unroutable" in str(exc.value)
    assert "exchange 'px' with routing key 'nowhere'" in str(exc.value)
    with pytest.raises(ShoalSparkError, match="exchange 'nox' does not exist in vhost '/'"):
        Publisher(options(broker, exchange="nox", routingKey="k")).publish_all(
            [{"body": b"x"}], "j4:0"
        )
    with pytest.raises(ShoalSparkError, match="no routing key"):
        Publisher(options(broker)).publish_all([{"body": b"x"}], "j5:0")
