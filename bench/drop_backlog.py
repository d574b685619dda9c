"""How long queue.purge and queue.delete of a queue with a backlog take.

One queue is filled with COUNT 8-byte transient messages (raw publishes,
no consumer), purged, filled again and deleted; the round trip of each
method is printed. The broker handles both in one process (Shoal: the
scheduler, which serves nothing else meanwhile), so this is also how long
every other declare, bind and consumer change waits behind them:

    python bench/drop_backlog.py --port 5672 --count 1000000
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import pika
from pamqp import commands as C
from pamqp import frame as F
from pamqp.body import ContentBody
from pamqp.header import ContentHeader

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.fanout_handshakes import raw_open

QUEUE = "drop-backlog"


def fill(port: int, count: int, channel: pika.adapters.blocking_connection.BlockingChannel) -> None:
    s = raw_open(port)
    one = (
        F.marshal(C.Basic.Publish(exchange="", routing_key=QUEUE), 1)
        + F.marshal(ContentHeader(0, 8, C.Basic.Properties()), 1)
        + F.marshal(ContentBody(b"12345678"), 1)
    )
    for _ in range(count // 1000):
        s.sendall(one * 1000)
    deadline = time.monotonic() + 120
    while channel.queue_declare(QUEUE, passive=True).method.message_count < count // 1000 * 1000:
        if time.monotonic() > deadline:
            raise TimeoutError("the queue never held every message")
        time.sleep(0.1)  # (polling the count, bounded)
    s.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--count", type=int, default=1_000_000)
    args = ap.parse_args()
    conn = pika.BlockingConnection(pika.URLParameters(f"amqp://guest:guest@127.0.0.1:{args.port}/"))
    ch = conn.channel()
    ch.queue_declare(QUEUE)
    fill(args.port, args.count, ch)
    t0 = time.perf_counter()
    ch.queue_purge(QUEUE)
    purge_s = time.perf_counter() - t0
    fill(args.port, args.count, ch)
    t0 = time.perf_counter()
    ch.queue_delete(QUEUE)
    delete_s = time.perf_counter() - t0
    print(f"{args.count} messages: purge {purge_s * 1000:.0f} ms, delete {delete_s * 1000:.0f} ms")
    conn.close()


if __name__ == "__main__":
    main()
