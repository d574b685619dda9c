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
from shoal.workers.consumer import Consumer, pull
from shoal.workers.context import WorkerContext


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


def publish_frames(n: int, size: int) -> bytes:
    one = (
        pamqp_frame.marshal(C.Basic.Publish(exchange="", routing_key="bench"), 1)
        + pamqp_frame.marshal(pamqp_header.ContentHeader(body_size=size), 1)
        + pamqp_frame.marshal(ContentBody(b"x" * size), 1)
    )
    return one * n


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--messages", type=int, default=50_000)
    p.add_argument("--size", type=int, default=64)
    p.add_argument("--deliver", action="store_true")
    p.add_argument("--profile", action="store_true")
    ns = p.parse_args()
    d = tempfile.mkdtemp()
    seg = Segment.create(
        os.path.join(d, "seg"),
        layout.Limits(max_workers=1, max_queues=64, queue_capacity=1 << 17, arena_bytes=256 << 20),
    )
    loop = asyncio.new_event_loop()
    ctx = WorkerContext(Config(), seg, 0, 1, os.eventfd(0, os.EFD_NONBLOCK), loop)
    from shoal.shm.queues import QueueStore

    QueueStore(seg).create(0, b"bench", 0, 0)
    conn = Connection(ctx)
    conn.connection_made(FakeTransport())
    from shoal.workers.channel import Channel

    conn.state = 4  # OPEN
    conn.channels[1] = Channel(conn, 1)
    data = publish_frames(ns.messages, ns.size)
    chunks = [data[i : i + 65536] for i in range(0, len(data), 65536)]
    prof = cProfile.Profile() if ns.profile else None
    t0 = time.process_time()
    if prof:
        prof.enable()
    for chunk in chunks:
        conn.data_received(chunk)
    if ns.deliver:
        ch = conn.channels[1]
        consumer = Consumer(1, b"ctag", ch, 0, b"bench", True, False, 0)
        ctx.consumers[1] = consumer
        while ctx.store.word(0, layout.Q_READY):
            pull(ctx, consumer)
            conn.flush()
    if prof:
        prof.disable()
    dt = time.process_time() - t0  # CPU time: steadier than wall time on a shared machine
    print(
        f"{ns.messages} messages of {ns.size} B: {dt / ns.messages * 1e6:.2f} µs/msg "
        f"({ns.messages / dt:,.0f} msg/s){' incl. delivery' if ns.deliver else ''}"
    )
    if prof:
        pstats.Stats(prof).sort_stats("tottime").print_stats(18)
    seg.unlink()


if __name__ == "__main__":
    main()
