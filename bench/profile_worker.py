"""Profile an IO worker's hot paths in one process, without sockets.

Builds a real segment, a WorkerContext and a Connection with a fake transport,
then feeds it N publishes (and optionally serves deliveries). Prints µs per
message and, with --profile, the top of cProfile.

    python bench/profile_worker.py --messages 50000 --size 64 [--deliver] [--profile]
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import os
import pstats
import tempfile
import time
from typing import Any

from pamqp import commands as C
from pamqp import frame as pamqp_frame
from pamqp import header as pamqp_header
from pamqp.body import ContentBody

from shoal.broker.config import Config
from shoal.shm import layout
from shoal.shm.segment import Segment
from shoal.workers.connection import Connection
from shoal.workers.consumer import Consumer
from shoal.workers.context import WorkerContext
from shoal.workers.handshake import OPEN
from shoal.workers.pull import pull


class FakeTransport:
    def __init__(self) -> None:
        self.written = 0

    def writelines(self, data: list[bytes]) -> None:
        self.written += sum(len(d) for d in data)

    def write(self, data: bytes) -> None:
        self.written += len(data)

    def get_extra_info(self, name: str) -> Any:
        return None

    def set_write_buffer_limits(self, high: int, low: int) -> None:
        pass

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def close(self) -> None:
        pass


def publish_frames(n: int, size: int, persistent: bool = False, keyed: bool = False) -> bytes:
    def one(i: int) -> bytes:
        headers = {"x-deduplication-header": f"key-{i:012d}"} if keyed else None
        props = C.Basic.Properties(delivery_mode=2 if persistent else None, headers=headers)
        return (
            pamqp_frame.marshal(C.Basic.Publish(exchange="", routing_key="bench"), 1)
            + pamqp_frame.marshal(pamqp_header.ContentHeader(0, size, props), 1)
            + pamqp_frame.marshal(ContentBody(b"x" * size), 1)
        )

    if not keyed:
        return one(0) * n
    return b"".join(one(i) for i in range(n))


class AllowAll:
    """A connection's access (workers/connection_access.py) that grants everything:
    the harness has no login."""

    tracing = False  # (the firehose off)

    def refresh(self) -> None:
        pass

    def may_publish(self, exchange: bytes, routing_key: bytes) -> bool:
        return True

    def check_publish(self, exchange: bytes, routing_key: bytes) -> None:
        pass

    def check_user_id(self, raw_header: bytes) -> None:
        pass


def ack_frame(tag: int) -> bytes:
    return pamqp_frame.marshal(C.Basic.Ack(delivery_tag=tag, multiple=True), 1)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--messages", type=int, default=50_000)
    p.add_argument("--size", type=int, default=64)
    p.add_argument("--deliver", action="store_true", help="and deliver, acked every 100")
    p.add_argument("--no-ack", action="store_true", help="with --deliver: a no-ack consumer")
    p.add_argument("--chunk", type=int, default=65536, help="bytes per socket read")
    p.add_argument(
        "--persistent",
        action="store_true",
        help="delivery mode 2 to a durable queue: the message store, fdatasync included",
    )
    p.add_argument(
        "--dedup",
        choices=("off", "header", "queue"),
        default="off",
        help="header: each message has a unique x-deduplication-header; queue: and the "
        "queue deduplicates (x-message-deduplication)",
    )
    p.add_argument("--profile", action="store_true")
    ns = p.parse_args()
    d = tempfile.mkdtemp()
    seg = Segment.create(
        os.path.join(d, "seg"),
        layout.Limits(max_workers=1, max_queues=64, queue_capacity=1 << 17, arena_bytes=256 << 20),
    )
    loop = asyncio.new_event_loop()
    config = Config(runtime_dir=os.path.join(d, "run"), data_dir=os.path.join(d, "data"))
    ctx = WorkerContext(config, seg, 0, 1, os.eventfd(0, os.EFD_NONBLOCK), loop)
    from shoal.shm.queues import SharedQueues

    flags = layout.QF_DEDUP if ns.dedup == "queue" else 0
    SharedQueues(seg).create(0, b"bench", flags, 0, uid=1 if ns.persistent else 0)
    if ns.persistent:
        dirs = [os.path.join(d, sub) for sub in ("msgs", "paging", "streams")]
        for sub in dirs:
            os.makedirs(sub)
        ctx.open_store(*dirs)
    from shoal.workers.channel import Channel

    # The publisher's connection and the consumer's (one worker serves both).
    conn, sub = Connection(ctx), Connection(ctx)
    for c in (conn, sub):
        c.connection_made(FakeTransport())
        c.access = AllowAll()  # type: ignore[assignment]
        c.state = OPEN
        c.channels[1] = Channel(c, 1)
    ch = sub.channels[1].delivery  # (the channel's delivery book, workers/delivery.py)
    ch.prefetch_count = 500
    consumer = Consumer(1, b"ctag", ch, 0, b"bench", ns.no_ack, False, 0)
    ctx.consumers[1] = consumer
    data = publish_frames(ns.messages, ns.size, ns.persistent, ns.dedup != "off")
    chunks = [data[i : i + ns.chunk] for i in range(0, len(data), ns.chunk)]
    prof = cProfile.Profile() if ns.profile else None
    acked = 0
    t0 = time.process_time()
    if prof:
        prof.enable()
    for chunk in chunks:
        conn.data_received(chunk)
        conn.flush()
        if ns.persistent:  # the store's flush at the end of the loop iteration
            loop.run_until_complete(asyncio.sleep(0))
        if ns.deliver:
            # Deliver what is ready and ack it every 100, as a consumer with
            # prefetch 500 and multi-ack 100 does.
            while ctx.shared.table.word(0, layout.Q_READY):
                pull(ctx, consumer)
                sub.flush()
                while not ns.no_ack and (
                    ch.next_tag - 1 - acked >= 100
                    or (ch.next_tag - 1 > acked and not ctx.shared.table.word(0, layout.Q_READY))
                ):
                    acked = min(acked + 100, ch.next_tag - 1)
                    sub.data_received(ack_frame(acked))
    if ns.persistent:
        persist = ctx.persist
        assert persist is not None
        loop.run_until_complete(persist.durable(persist.next_index))
    if prof:
        prof.disable()
    dt = time.process_time() - t0  # CPU time: steadier than wall time on a shared machine
    assert not conn.closed and sub.channels[1].delivery is ch, "the harness's channel was closed"
    routed = ctx.shared.table.word(0, layout.Q_PUBLISHED)
    assert routed == ns.messages, f"{routed} of {ns.messages} messages reached the queue"
    print(
        f"{ns.messages} messages of {ns.size} B: {dt / ns.messages * 1e6:.2f} µs/msg "
        f"({ns.messages / dt:,.0f} msg/s){' incl. delivery and ack' if ns.deliver else ''}"
    )
    if prof:
        pstats.Stats(prof).sort_stats("tottime").print_stats(18)
    seg.unlink()


if __name__ == "__main__":
    main()
