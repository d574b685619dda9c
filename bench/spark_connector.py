"""The PySpark connector's read rate beside plain AMQP consumers (issue 14).

A stream queue is filled with `--messages` 100-byte messages (shoal perf,
confirms), then read whole three ways, each timed:

- Spark: `spark.read.format("shoal")` over offsets [0, N), `local[2]`,
  counted in Python (`df.rdd` would add a conversion: `count()` still reads
  every row through the connector's Python reader);
- pika: one BlockingConnection consumer from offset 0 (what a Python
  application uses; the connector's executors use it too);
- shoal perf: its fast consumer (the broker's own rate for one consumer).

    python bench/spark_connector.py --messages 1000000

Needs the spark extra (pip install -e '.[spark]') and Java. Prints a
markdown table (docs/benchmarks.md keeps it by hand).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import pika

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from compare import machine_info, perf_command, run_perf
from persistent import Shoal

QUEUE = "bench-connector"


def fill(uri: str, count: int) -> int:
    """Publish until the stream holds `count` messages (perf, 2 producers)."""
    while True:
        conn = pika.BlockingConnection(pika.URLParameters(uri))
        have = (
            conn.channel()
            .queue_declare(QUEUE, durable=True, arguments={"x-queue-type": "stream"})
            .method.message_count
        )
        conn.close()
        if have >= count:
            return have
        run_perf(
            perf_command(
                uri,
                (
                    *("--stream", "--queue", QUEUE, "--size", "100", "--producers", "2"),
                    *("--consumers", "0", "--confirm", "200"),
                ),
                max(2.0, (count - have) / 60_000),
                0,
            ),
            600,
        )


def pika_rate(uri: str, count: int) -> float:
    conn = pika.BlockingConnection(pika.URLParameters(uri))
    ch = conn.channel()
    ch.basic_qos(prefetch_count=1000)
    started = time.monotonic()
    deliveries = ch.consume(QUEUE, arguments={"x-stream-offset": 0}, inactivity_timeout=30)
    for seen, (method, _props, _body) in enumerate(deliveries, 1):
        if method is None:
            raise RuntimeError("pika consumer stalled")
        if seen % 500 == 0:
            ch.basic_ack(method.delivery_tag, multiple=True)
        if seen >= count:
            break
    elapsed = time.monotonic() - started
    conn.close()
    return count / elapsed


def spark_rate(uri: str, count: int) -> tuple[float, float]:
    """(rows/s of the read, seconds of the first, cold query excluded)."""
    from shoal.spark import register
    from tests.spark.driver import build_session, stop_session

    spark = build_session("shoal-bench")
    try:
        register(spark)

        def read() -> int:
            return int(
                spark.read.format("shoal")
                .option("uri", uri)
                .option("queue", QUEUE)
                .option("startingOffsets", "earliest")
                .option("endingOffsets", f'{{"{QUEUE}": {count}}}')
                .load()
                .count()
            )

        started = time.monotonic()
        read_small = (
            spark.read.format("shoal")
            .option("uri", uri)
            .option("queue", QUEUE)
            .option("endingOffsets", f'{{"{QUEUE}": 1000}}')
            .load()
            .count()
        )
        warm = time.monotonic() - started
        assert read_small == 1000
        started = time.monotonic()
        rows = read()
        elapsed = time.monotonic() - started
        assert rows == count, rows
        return count / elapsed, warm
    finally:
        stop_session(spark)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--messages", type=int, default=1_000_000)
    p.add_argument("--workers", type=int, default=2)
    opts = p.parse_args(argv)
    shoal = Shoal(opts.workers, ())
    try:
        shoal.start()
        fill(shoal.uri, opts.messages)
        rate_spark, warm = spark_rate(shoal.uri, opts.messages)
        rate_pika = pika_rate(shoal.uri, opts.messages)
        perf = run_perf(
            perf_command(
                shoal.uri,
                (
                    *("--stream", "--queue", QUEUE, "--producers", "0", "--consumers", "1"),
                    *("--stream-offset", "first", "--prefetch", "1000"),
                ),
                5,
                0.5,
            ),
            120,
        )
    finally:
        shoal.stop()
    print("\n".join(machine_info()) + f"\n- Shoal IO workers: {opts.workers}\n")
    print(f"{opts.messages:,} messages of 100 bytes in a stream queue, read whole:\n")
    print("| reader | rate |")
    print("| --- | ---: |")
    print(f'| Spark `spark.read.format("shoal")`, local[2], count() | {rate_spark:,.0f} rows/s |')
    print(f"| pika, one consumer (prefetch 1000, ack every 500) | {rate_pika:,.0f} msg/s |")
    print(f"| shoal perf, one consumer | {float(perf.get('consumed_rate') or 0):,.0f} msg/s |")
    print(f"\n(first, cold Spark query of 1,000 rows: {warm:.1f} s, not counted)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
