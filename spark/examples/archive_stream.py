"""Archive a Shoal stream queue to Parquet files, exactly once.

    .venv/bin/python spark/examples/archive_stream.py            # against `make run`

Reads the stream queue `events` from its first offset with
spark.readStream.format("shoal") and appends every message to Parquet files
under /tmp/shoal-archive/events, with the offsets in a checkpoint beside
them: run it again and it goes on where it stopped, each message archived
once (the file sink and exact replay by offset). With --demo N (default
1000) it first publishes N sample messages, declaring the stream if needed;
--demo 0 archives what is there. --continuous keeps the query running
(Ctrl-C stops it); by default it stops once it has read what was there
(Trigger.AvailableNow).
"""

from __future__ import annotations

import argparse
import os
import sys
import uuid
from typing import Any

from shoal.spark import local_session
from shoal.spark.options import DEFAULT_URI


def session() -> Any:
    return local_session("shoal-archive", **{"spark.sql.session.timeZone": "UTC"})


def publish_demo(uri: str, queue: str, n: int) -> None:
    """n messages with routing keys order.created / order.paid / user.signup."""
    import pika

    from shoal.spark.options import Options
    from shoal.spark.publish import Publisher

    conn = pika.BlockingConnection(pika.URLParameters(uri))
    conn.channel().queue_declare(queue, durable=True, arguments={"x-queue-type": "stream"})
    conn.close()
    keys = ("order.created", "order.paid", "user.signup")
    rows = (
        {
            "body": f'{{"n": {i}}}',
            "routing_key": queue,
            "type": keys[i % 3],
            "content_type": "application/json",
        }
        for i in range(n)
    )
    Publisher(Options.parse({"uri": uri})).publish_all(rows, f"demo-{uuid.uuid4()}")


def main(argv: list[str] | None = None, spark: Any = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--uri", default=DEFAULT_URI)
    p.add_argument("--queue", default="events")
    p.add_argument("--output", default="/tmp/shoal-archive")
    p.add_argument("--demo", type=int, default=1000, metavar="N")
    p.add_argument("--continuous", action="store_true")
    args = p.parse_args(argv)
    if args.demo:
        publish_demo(args.uri, args.queue, args.demo)
    spark = spark or session()
    messages = (
        spark.readStream.format("shoal")
        .option("uri", args.uri)
        .option("queue", args.queue)
        .option("startingOffsets", "earliest")
        .option("maxMessagesPerTrigger", "100000")
        .load()
    )
    writer = (
        messages.writeStream.format("parquet")
        .option("path", os.path.join(args.output, args.queue))
        .option("checkpointLocation", os.path.join(args.output, f"_checkpoint-{args.queue}"))
    )
    if not args.continuous:
        writer = writer.trigger(availableNow=True)
    query = writer.start()
    query.awaitTermination()
    archived = spark.read.parquet(os.path.join(args.output, args.queue)).count()
    print(f"{archived} messages of stream '{args.queue}' in {args.output}/{args.queue}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
