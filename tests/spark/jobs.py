"""Spark drivers that the tests run as separate processes (helpers.run_job),
for a SparkSession of their own: one per process, and these need settings
(or imports) that the tests' shared session must not have. Each prints one
JSON line, `result: {...}`, for the test to check.

    python tests/spark/jobs.py discover --uri URI --queue Q
        never imports shoal: format("shoal") as Spark finds it by itself
        (write, read, a temporary view and a table in SQL, a stream read of the table)
    python tests/spark/jobs.py no-shoal-workers --uri URI --queue Q
        task workers that cannot import shoal (tests/spark/daemon_without_shoal.py):
        the errors a read and a write raise
    python tests/spark/jobs.py retry --uri URI --queue Q --rows N --marker FILE
        local[2,4] (task retries): a write whose first task fails once, after
        publishing half its rows
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

# tests/spark/driver.py's settings, copied: `discover` must not import
# anything that imports shoal, nor find the repository on sys.path.
CONF = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "1",
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.driver.memory": "1g",
    "spark.driver.extraJavaOptions": "-XX:+UseSerialGC -XX:TieredStopAtLevel=1",
    "spark.sql.session.timeZone": "UTC",
}


def session(master: str, **conf: str) -> Any:
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master(master).appName("shoal-test-job")
    for key, value in {**CONF, **conf}.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def report(**result: Any) -> None:
    print("result: " + json.dumps(result), flush=True)


def discover(args: argparse.Namespace) -> None:
    spark = session("local[2]")
    uri, queue = args.uri, args.queue
    rows = spark.range(50, numPartitions=2).selectExpr(
        "cast(id as string) as body", f"'{queue}' as routing_key"
    )
    rows.write.format("shoal").option("uri", uri).mode("append").save()
    read = spark.read.format("shoal").option("uri", uri).option("queue", queue).load()
    bodies = sorted(int(r.body) for r in read.select("body").collect())
    opts = f"uri '{uri}', queue '{queue}'"
    spark.sql(f"CREATE TEMPORARY VIEW v USING shoal OPTIONS ({opts})")
    view = spark.sql("SELECT count(*) AS n FROM v").first().n
    # Spark 4 keeps no OPTIONS of a table whose provider is a Python data
    # source (SPARK-45597): they are given where the table is read.
    spark.sql(f"CREATE TABLE t USING shoal OPTIONS ({opts})")
    with_options = f"'uri' = '{uri}', 'queue' = '{queue}'"
    table = spark.sql(f"SELECT count(*) AS n FROM t WITH ({with_options})").first().n
    query = (
        spark.readStream.option("uri", uri)
        .option("queue", queue)
        .table("t")
        .writeStream.format("memory")
        .queryName("copied")
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(120)
    streamed = spark.sql("SELECT count(*) AS n FROM copied").first().n
    loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("shoal", "pyspark_shoal"))
    report(bodies=bodies, view=view, table=table, streamed=streamed, loaded=loaded)
    spark.stop()


def no_shoal_workers(args: argparse.Namespace) -> None:
    spark = session(
        "local[1]",
        **{"spark.python.daemon.module": "tests.spark.daemon_without_shoal"},
    )
    errors: dict[str, str] = {}
    try:
        spark.read.format("shoal").option("uri", args.uri).option(
            "queue", args.queue
        ).load().collect()
    except Exception as exc:
        errors["read"] = str(exc)
    try:
        spark.range(3).selectExpr("cast(id as string) as body").write.format("shoal").option(
            "uri", args.uri
        ).option("routingKey", args.queue).mode("append").save()
    except Exception as exc:
        errors["write"] = str(exc)
    report(**errors)
    spark.stop()


def retry(args: argparse.Namespace) -> None:
    from pathlib import Path

    from pyspark import TaskContext
    from pyspark.sql.datasource import DataSourceWriter
    from pyspark.sql.types import StructType

    from shoal.spark.datasource import PublishedMessage, ShoalBatchWriter, ShoalDataSource
    from shoal.spark.publish import Publisher

    marker = Path(args.marker)

    class FlakyWriter(ShoalBatchWriter):
        """The first attempt of partition 0 publishes (with confirms) the first
        half of its rows, with the ids a full attempt gives them, then fails."""

        def write(self, iterator: Any) -> PublishedMessage:
            context = TaskContext.get()
            if context is None or context.partitionId() != 0 or context.attemptNumber() != 0:
                return super().write(iterator)
            rows = [row.asDict() for row in iterator]
            half = Publisher(self.options).publish_all(rows[: len(rows) // 2], f"{self.job_id}:0")
            marker.write_text(str(half))
            raise RuntimeError(f"injected failure after publishing {half} rows")

    class FlakyShoal(ShoalDataSource):
        @classmethod
        def name(cls) -> str:
            return "shoal_flaky"

        def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
            real = super().writer(schema, overwrite)
            assert isinstance(real, ShoalBatchWriter)
            return FlakyWriter(real.options, real.job_id)

    spark = session("local[2,4]")  # a failed task is tried up to 4 times
    spark.dataSource.register(FlakyShoal)
    rows = spark.range(args.rows, numPartitions=2).selectExpr("cast(id as string) as body")
    rows.write.format("shoal_flaky").option("uri", args.uri).option("routingKey", args.queue).mode(
        "append"
    ).save()
    report(published_before_failure=int(marker.read_text()))
    spark.stop()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("job", choices=("discover", "no-shoal-workers", "retry"))
    p.add_argument("--uri", required=True)
    p.add_argument("--queue", required=True)
    p.add_argument("--rows", type=int, default=1000)
    p.add_argument("--marker")
    args = p.parse_args()
    {"discover": discover, "no-shoal-workers": no_shoal_workers, "retry": retry}[args.job](args)


if __name__ == "__main__":
    main()
