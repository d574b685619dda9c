"""Count a stream queue's messages by routing key in a streaming query.

    .venv/bin/python spark/examples/count_by_routing_key.py      # against `make run`

spark.readStream.format("shoal") over the stream queue `events` (from its
first offset), grouped by the message's type property (--key routing_key
for the routing key), counts printed to the console after each micro-batch
(complete output mode). By default it stops once it has read what was there
(Trigger.AvailableNow); --continuous keeps counting as messages arrive
(Ctrl-C stops it). Run archive_stream.py first for demo messages.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from shoal.spark import local_session
from shoal.spark.options import DEFAULT_URI


def session() -> Any:
    return local_session("shoal-count", **{"spark.sql.shuffle.partitions": "2"})


def main(argv: list[str] | None = None, spark: Any = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--uri", default=DEFAULT_URI)
    p.add_argument("--queue", default="events")
    p.add_argument("--key", default="type", help="the column to count by")
    p.add_argument("--continuous", action="store_true")
    args = p.parse_args(argv)
    spark = spark or session()
    counts = (
        spark.readStream.format("shoal")
        .option("uri", args.uri)
        .option("queue", args.queue)
        .option("startingOffsets", "earliest")
        .load()
        .groupBy(args.key)
        .count()
        .orderBy(args.key)
    )
    writer = counts.writeStream.format("console").outputMode("complete")
    writer = writer.queryName(f"count_{args.queue}")
    if not args.continuous:
        writer = writer.trigger(availableNow=True)
    query = writer.start()
    query.awaitTermination()
    read = sum(p["numInputRows"] for p in query.recentProgress)
    print(f"counted {read} messages of stream '{args.queue}' by {args.key}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
