"""Replay archived messages (Parquet files) into an exchange.

    .venv/bin/python spark/examples/replay_parquet.py            # against `make run`

Reads the files archive_stream.py wrote (/tmp/shoal-archive/events by
default) and publishes each row with df.write.format("shoal"): the body,
properties and headers as they were, to exchange amq.topic with the row's
type as routing key (--routing-key-column), publisher confirms and
`mandatory` on every message. The demo binds a queue `replayed` to amq.topic
with "#" first, so every message has a route; a message without one fails
the job ("routes to no queue"). The rows keep their message_id, so a
consumer can drop copies of messages it already saw.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from shoal.spark import local_session
from shoal.spark.options import DEFAULT_URI


def session() -> Any:
    return local_session("shoal-replay")


def main(argv: list[str] | None = None, spark: Any = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--uri", default=DEFAULT_URI)
    p.add_argument("--input", default="/tmp/shoal-archive/events")
    p.add_argument("--exchange", default="amq.topic")
    p.add_argument("--routing-key-column", default="type")
    p.add_argument("--bind-queue", default="replayed", help="'' to bind nothing")
    args = p.parse_args(argv)
    if args.bind_queue:
        import pika

        conn = pika.BlockingConnection(pika.URLParameters(args.uri))
        ch = conn.channel()
        ch.queue_declare(args.bind_queue, durable=True)
        ch.queue_bind(args.bind_queue, args.exchange, "#")
        conn.close()
    spark = spark or session()
    archived = spark.read.parquet(args.input)
    # The exchange is the option's; the routing key a column of the archive.
    rows = archived.drop("exchange").withColumn("routing_key", archived[args.routing_key_column])
    (
        rows.write.format("shoal")
        .option("uri", args.uri)
        .option("exchange", args.exchange)
        .mode("append")
        .save()
    )
    print(f"published {rows.count()} messages to exchange '{args.exchange}'")
    return 0


if __name__ == "__main__":
    sys.exit(main())
