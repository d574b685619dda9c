"""A Spark driver the acceptance tests start as a separate process and kill
with SIGKILL mid-batch (tests/spark/test_spark.py): reads a queue with
format("shoal") and writes message ids to a Parquet file sink with a
checkpoint. Also the home of the SparkSession settings the tests share.

    python tests/spark/driver.py --uri URI --queue Q --checkpoint DIR --output DIR
        [--classic --spool DIR] [--max N] [--per-partition N] [--available-now]
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

CONF = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "1",
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.driver.memory": "1g",
    "spark.driver.extraJavaOptions": "-XX:+UseSerialGC -XX:TieredStopAtLevel=1",
    "spark.sql.streaming.noDataMicroBatches.enabled": "false",
    "spark.sql.session.timeZone": "UTC",
    "spark.python.worker.reuse": "true",
}


def build_session(app: str) -> Any:
    """local[2] with the research notes' settings; format "shoal" registered.
    Executors' Python workers must run this interpreter (the venv that has
    shoal.spark, pyspark and pyarrow)."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    from shoal.spark import register

    builder = SparkSession.builder.master("local[2]").appName(app)
    for key, value in CONF.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark


def stop_session(spark: Any) -> None:
    """Stop Spark and wait for its JVM to exit (it exits when its stdin
    closes), so no JVM outlives the process that started it."""
    from pyspark import SparkContext

    gateway = SparkContext._gateway
    spark.stop()
    proc = getattr(gateway, "proc", None)
    if proc is None:
        return
    try:
        gateway.shutdown()
    except Exception:
        pass
    if proc.stdin is not None:
        proc.stdin.close()
    try:
        proc.wait(30)
    except Exception:
        proc.kill()
        proc.wait(10)
    SparkContext._gateway = None
    SparkContext._jvm = None


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--uri", required=True)
    p.add_argument("--queue", required=True)
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--output", required=True)
    p.add_argument("--classic", action="store_true")
    p.add_argument("--spool")
    p.add_argument("--max", type=int, default=10_000)
    p.add_argument("--per-partition", type=int, default=5_000)
    p.add_argument("--available-now", action="store_true")
    p.add_argument("--timeout", type=float, default=300)
    args = p.parse_args()
    spark = build_session("shoal-test-driver")
    reader = (
        spark.readStream.format("shoal")
        .option("uri", args.uri)
        .option("queue", args.queue)
        .option("startingOffsets", "earliest")
        .option("maxMessagesPerTrigger", str(args.max))
        .option("messagesPerPartition", str(args.per_partition))
    )
    if args.classic:
        reader = reader.option("queueType", "classic").option("spoolLocation", args.spool)
    else:
        reader = reader.option("queueType", "stream")
    df = reader.load().selectExpr("message_id", "`offset`", "queue", "redelivered")
    writer = (
        df.writeStream.format("parquet")
        .option("checkpointLocation", args.checkpoint)
        .option("path", args.output)
    )
    if args.available_now:
        writer = writer.trigger(availableNow=True)
    query = writer.start()
    print(f"driver: query {query.id} started", flush=True)
    finished = query.awaitTermination(args.timeout)
    if not finished:
        query.stop()
    exc = query.exception()
    if exc is not None:
        print(f"driver: query failed: {exc}", file=sys.stderr, flush=True)
        sys.exit(1)
    print("driver: done", flush=True)
    stop_session(spark)


if __name__ == "__main__":
    main()
