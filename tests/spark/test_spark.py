"""format("shoal") in Spark against a real Shoal broker: batch reads (a stream's
offset range, a classic queue's snapshot), df.write with confirms, a streaming
query into the shoal stream writer, and the two acceptance tests that kill a
Spark driver process with SIGKILL mid-batch and restart it from its checkpoint
(stream queue: every message exactly once; classic queue: none lost)."""

from __future__ import annotations

import os
import runpy
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import psutil
import pytest

from shoal.spark.options import Options
from shoal.spark.publish import Publisher
from tests.broker_process import ROOT, Broker, wait_for
from tests.spark.helpers import browse_all, connect, count, drain, publish, run_job

pytestmark = [pytest.mark.spark, pytest.mark.timeout(420)]
DRIVER = Path(__file__).with_name("driver.py")


def reader(spark: Any, broker: Broker, queue: str, **options: str) -> Any:
    r = spark.read.format("shoal").option("uri", broker.url).option("queue", queue)
    for k, v in options.items():
        r = r.option(k, v)
    return r.load()


def test_batch_reads_a_stream_range_and_snapshots_a_classic_queue(
    spark: Any, broker: Broker
) -> None:
    publish(broker.url, "s", 1000)
    df = reader(spark, broker, "s", startingOffsets='{"s": 100}', endingOffsets='{"s": 300}')
    rows = df.select("offset", "body", "message_id", "headers").collect()
    assert [r.offset for r in rows] == list(range(100, 300))
    assert rows[0].body == b"m100" and rows[0].message_id == "id-100"
    assert rows[0].headers == {"i": "100", "tag": "t", "x-deduplication-header": "id-100"}
    assert reader(spark, broker, "s").count() == 1000

    # A classic queue: a copy of every message in order; the queue untouched.
    publish(broker.url, "c", 3000, stream=False)
    before = browse_all(broker.url, "c")
    rows = reader(spark, broker, "c").select("body", "redelivered", "offset").collect()
    assert [r.body for r in rows] == [f"m{i}".encode() for i in range(3000)]
    assert not any(r.redelivered for r in rows) and all(r.offset is None for r in rows)
    assert count(broker.url, "c") == 3000
    assert browse_all(broker.url, "c") == before
    got = drain(broker.url, "c")
    assert [b for b, _p, _r in got] == [f"m{i}".encode() for i in range(3000)]
    assert not any(redelivered for _b, _p, redelivered in got)

    with pytest.raises(Exception, match="queue 'nope' does not exist in vhost '/'"):
        reader(spark, broker, "nope").collect()
    with pytest.raises(Exception, match=r"queueType=stream but \['c'\] is classic queue"):
        reader(spark, broker, "c", queueType="stream").collect()


def test_write_publishes_every_row_once_and_unroutable_fails(spark: Any, broker: Broker) -> None:
    conn = connect(broker.url)
    ch = conn.channel()
    ch.exchange_declare("out", "direct")
    for q in ("q0", "q1"):
        ch.queue_declare(q)
        ch.queue_bind(q, "out", q)
    conn.close()
    n = 20_000
    df = spark.range(n, numPartitions=4).selectExpr(
        "cast(id as string) as body",
        "concat('q', cast(id % 2 as string)) as routing_key",
        "map('n', cast(id as string)) as headers",
    )
    df.write.format("shoal").option("uri", broker.url).option("exchange", "out").mode(
        "append"
    ).save()
    got = drain(broker.url, "q0") + drain(broker.url, "q1")
    assert sorted(int(b) for b, _p, _r in got) == list(range(n))
    ids = [p.message_id for _b, p, _r in got]
    assert len(set(ids)) == n
    assert len({i.rsplit(":", 2)[0] for i in ids}) == 1  # one job id
    assert all(
        p.headers == {"n": b.decode(), "x-deduplication-header": p.message_id} for b, p, _r in got
    )

    with pytest.raises(Exception) as exc:
        spark.range(10).selectExpr("cast(id as string) as body").write.format("shoal").option(
            "uri", broker.url
        ).option("exchange", "out").option("routingKey", "nowhere").mode("append").save()
    assert "exchange 'out' with routing key 'nowhere' routes to no queue" in str(exc.value)


def test_retried_write_task_publishes_each_row_once_to_a_deduplicating_queue(
    broker: Broker, tmp_path: Path
) -> None:
    """A df.write task publishes half its rows, fails, and is retried
    (local[2,4]: tests/spark/jobs.py retry), so half of its rows are
    published twice, with the same message_id and x-deduplication-header.
    The queue deduplicates by that header (x-message-deduplication, the
    plugin's API): its consumer gets every row exactly once."""
    rows = 4000
    conn = connect(broker.url)
    conn.channel().queue_declare(
        "dedup", arguments={"x-message-deduplication": True, "x-cache-size": 2 * rows}
    )
    conn.close()
    marker = str(tmp_path / "failed")
    args = ("--uri", broker.url, "--queue", "dedup", "--rows", str(rows), "--marker", marker)
    result = run_job(tmp_path, "retry", *args)
    assert result["published_before_failure"] == rows // 4  # half of partition 0's rows
    got = drain(broker.url, "dedup")
    bodies = sorted(int(b) for b, _p, _r in got)
    copies = len(bodies) - len(set(bodies))
    assert copies == 0, f"{copies} rows were delivered twice"
    assert bodies == list(range(rows))
    assert all(p.headers["x-deduplication-header"] == p.message_id for _b, p, _r in got)


def test_streaming_query_into_the_shoal_stream_writer(
    spark: Any, broker: Broker, tmp_path: Path
) -> None:
    """Stream queue -> shoal writer (availableNow, twice on one checkpoint):
    each message copied once, with ids <query>:<batch>:<partition>:<row>."""
    publish(broker.url, "src", 700)
    conn = connect(broker.url)
    conn.channel().queue_declare("copy")
    conn.close()

    def run() -> Any:
        q = (
            spark.readStream.format("shoal")
            .option("uri", broker.url)
            .option("queue", "src")
            .option("maxMessagesPerTrigger", "300")
            .load()
            .selectExpr("body", "'copy' as routing_key")
            .writeStream.format("shoal")
            .option("uri", broker.url)
            .option("checkpointLocation", str(tmp_path / "cp"))
            .trigger(availableNow=True)
            .start()
        )
        assert q.awaitTermination(120)
        assert q.exception() is None
        return q

    first = run()
    publish(broker.url, "src", 200, 700)
    run()
    got = drain(broker.url, "copy")
    assert sorted(int(b[1:]) for b, _p, _r in got) == list(range(900))
    ids = [p.message_id for _b, p, _r in got]
    assert len(set(ids)) == 900 and ids[0].startswith(f"{first.id}:0:")
    assert {i.split(":")[1] for i in ids} == {"0", "1", "2", "3"}  # 300+300+100, then 200


# -- a Spark driver killed with SIGKILL mid-batch ----------------------------------


def start_driver(log: Path, *args: str) -> subprocess.Popen[bytes]:
    with open(log, "ab") as out:
        return subprocess.Popen(
            [sys.executable, str(DRIVER), *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
            start_new_session=True,  # its JVM and Python workers: one group to kill
        )


def session_members(sid: int) -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter():
        try:
            if os.getsid(p.pid) == sid:
                found.append(p)
        except (ProcessLookupError, PermissionError, psutil.Error):
            pass
    return found


def kill_driver(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the driver, its JVM and every Python worker at once."""
    members = session_members(proc.pid)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(10)
    _gone, alive = psutil.wait_procs(members, timeout=10)
    assert not alive, f"driver processes survived SIGKILL: {alive}"


def batch_in_flight(checkpoint: Path, committed: int) -> bool:
    """A batch's offsets are logged and its commit is not, after at least
    `committed` committed batches."""

    def ids(sub: str) -> set[int]:
        try:
            return {int(n) for n in os.listdir(checkpoint / sub) if n.isdigit()}
        except FileNotFoundError:
            return set()

    done = ids("commits")
    return len(done) >= committed and bool(ids("offsets") - done)


def finish(log: Path, *args: str) -> None:
    proc = start_driver(log, *args, "--available-now")
    try:
        rc = proc.wait(300)
    finally:
        if proc.poll() is None:
            kill_driver(proc)
    assert rc == 0, log.read_text(errors="replace")[-5000:]
    # The JVM exits once its parent's pipe closes: give it a moment.
    _gone, alive = psutil.wait_procs(session_members(proc.pid), timeout=30)
    assert not alive, f"left behind by the driver: {alive}"


class Producer(threading.Thread):
    """Publishes ids [start, stop) in chunks, pausing 0.5 s between chunks
    until told to hurry (the connector's publisher: confirms, message_id
    id-<i>)."""

    def __init__(self, url: str, queue: str, start: int, stop: int, chunk: int) -> None:
        super().__init__(daemon=True)
        self.options = Options.parse({"uri": url, "routingKey": queue})
        self.range = (start, stop, chunk)
        self.error: BaseException | None = None
        self.hurry = threading.Event()

    def run(self) -> None:
        start, stop, chunk = self.range
        try:
            for a in range(start, stop, chunk):
                rows = (
                    {"body": f"m{i}".encode(), "message_id": f"id-{i}"}
                    for i in range(a, min(a + chunk, stop))
                )
                Publisher(self.options).publish_all(rows, "unused")
                self.hurry.wait(0.5)
        except BaseException as exc:
            self.error = exc


def kill_mid_batch(
    tmp_path: Path, producer: Producer, *args: str
) -> tuple[Path, Path, Path, list[str]]:
    cp, out, log = tmp_path / "checkpoint", tmp_path / "out", tmp_path / "driver.log"
    argv = ["--checkpoint", str(cp), "--output", str(out), *args]
    proc = start_driver(log, *argv)
    try:
        wait_for(lambda: (cp / "offsets" / "0").exists(), 180, "the query's first batch", 0.05)
        producer.start()
        wait_for(lambda: batch_in_flight(cp, 2), 180, "a batch in flight", 0.005)
        producer_running = producer.is_alive()
    finally:
        kill_driver(proc)
    assert producer_running, "the producer had finished before the kill"
    producer.hurry.set()
    producer.join(120)
    assert producer.error is None, producer.error
    return cp, out, log, argv


def test_stream_query_killed_mid_batch_keeps_every_message_exactly_once(
    spark: Any, broker: Broker, tmp_path: Path
) -> None:
    total = 100_000
    publish(broker.url, "events", 20_000)
    producer = Producer(broker.url, "events", 20_000, total, 2_000)
    _cp, out, log, argv = kill_mid_batch(
        tmp_path, producer, "--uri", broker.url, "--queue", "events", "--max", "10000"
    )
    assert count(broker.url, "events") == total
    finish(log, *argv)
    df = spark.read.parquet(str(out))  # through _spark_metadata: committed files only
    rows = df.select("message_id", "offset").collect()
    assert len(rows) == total
    assert sorted(r.offset for r in rows) == list(range(total))
    assert {r.message_id for r in rows} == {f"id-{i}" for i in range(total)}


def test_classic_query_killed_mid_batch_loses_nothing(
    spark: Any, broker: Broker, tmp_path: Path
) -> None:
    total = 40_000
    publish(broker.url, "work", 10_000, stream=False)
    producer = Producer(broker.url, "work", 10_000, total, 1_000)
    spool = str(tmp_path / "spool")
    _cp, out, log, argv = kill_mid_batch(
        tmp_path,
        producer,
        *("--uri", broker.url, "--queue", "work", "--classic", "--spool", spool),
        *("--max", "4000"),
    )
    finish(log, *argv)
    rows = spark.read.parquet(str(out)).select("message_id").collect()
    ids = [r.message_id for r in rows]
    assert set(ids) == {f"id-{i}" for i in range(total)}, "a message was lost"
    duplicates = len(ids) - len(set(ids))
    print(f"classic queue after a killed driver: {len(ids)} rows, {duplicates} duplicates")
    # The kill left deliveries unacked; the broker delivered them again and
    # the restarted reader recognised them by message_id.
    assert "redelivered messages already handed to Spark" in log.read_text(errors="replace")
    assert count(broker.url, "work") == 0


def test_examples(spark: Any, broker: Broker, tmp_path: Path, capsys: Any) -> None:
    """spark/examples: archive a stream to Parquet (twice: each message once),
    replay the archive into amq.topic, count by type."""
    examples = ROOT / "spark" / "examples"

    def example(name: str, *argv: str) -> None:
        module = runpy.run_path(str(examples / f"{name}.py"), run_name="example")
        assert module["main"](["--uri", broker.url, *argv], spark) == 0

    out = str(tmp_path / "archive")
    example("archive_stream", "--output", out, "--demo", "300")
    example("archive_stream", "--output", out, "--demo", "200")
    assert "500 messages of stream 'events'" in capsys.readouterr().out
    example("replay_parquet", "--input", f"{out}/events", "--bind-queue", "replayed")
    got = drain(broker.url, "replayed")
    assert len(got) == 500 and len({p.message_id for _b, p, _r in got}) == 500
    assert {p.type for _b, p, _r in got} == {"order.created", "order.paid", "user.signup"}
    example("count_by_routing_key")
    printed = capsys.readouterr().out
    assert "counted 500 messages of stream 'events' by type" in printed
