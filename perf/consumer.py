"""The consumer process: counts, acks and times deliveries in one pass over each read."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from pamqp import commands

from shoal.perf.config import PerfConfig, Window
from shoal.perf.connection import AmqpConnection
from shoal.perf.stats import Histogram
from shoal.perf.wire import (
    BASIC_DELIVER,
    FRAME_BODY,
    FRAME_END,
    FRAME_HEADER,
    FRAME_HEADER_STRUCT,
    FRAME_METHOD,
    MAX_FRAME_SIZE,
    TIMESTAMP_BYTES,
    U32,
    U64,
    FrameHandler,
    ProtocolError,
    encode_ack,
)

# --- consumer ---------------------------------------------------------------------


class DeliveryParser:
    """The consumer's fast path: a FrameParser specialised for a delivery stream.

    One flat loop with no call per frame (a consumer sees three frames per message)
    counts Basic.Deliver frames, collects the delivery tags to ack every ``ack_every``
    deliveries, and reads each body's leading send timestamp.  Timestamps are kept as
    runs ``(sent_ns, count)`` because messages of one producer batch share one.  Any
    other frame goes to ``other``.  The caller drains ``delivered``, ``runs`` and
    ``ack_tags`` after each ``feed``.
    """

    __slots__ = (
        "_other",
        "_pending",
        "_unacked",
        "_want_timestamp",
        "ack_every",
        "ack_tags",
        "delivered",
        "runs",
    )

    def __init__(self, other: FrameHandler, ack_every: int = 0) -> None:
        self._other = other
        self._pending = bytearray()
        self._unacked = 0
        self._want_timestamp = False
        self.ack_every = ack_every
        self.ack_tags: list[int] = []
        self.delivered = 0
        self.runs: list[tuple[int, int]] = []

    def feed(self, data: bytes) -> None:
        pending = self._pending
        buf: bytes | bytearray
        if pending:
            pending += data
            buf = pending
        else:
            buf = data
        unpack_header = FRAME_HEADER_STRUCT.unpack_from
        unpack_u32 = U32.unpack_from
        unpack_u64 = U64.unpack_from
        other = self._other
        every = self.ack_every
        unacked = self._unacked
        want_timestamp = self._want_timestamp
        runs = self.runs
        run_ts = run_len = delivered = 0
        size_total = len(buf)
        offset = 0
        try:
            while size_total - offset >= 8:
                frame_type, channel, size = unpack_header(buf, offset)
                end = offset + 7 + size
                if end >= size_total:
                    if size > MAX_FRAME_SIZE:
                        raise ProtocolError(f"frame of {size} bytes")
                    break
                if buf[end] != FRAME_END:
                    raise ProtocolError(f"bad frame end 0x{buf[end]:02x} at offset {end}")
                start = offset + 7
                if frame_type == FRAME_BODY:
                    # Only a message's first body frame starts with the timestamp.
                    if want_timestamp:
                        want_timestamp = False
                        if size >= TIMESTAMP_BYTES:
                            sent_ns = unpack_u64(buf, start)[0]
                            if sent_ns == run_ts:
                                run_len += 1
                            else:
                                if run_len:
                                    runs.append((run_ts, run_len))
                                run_ts = sent_ns
                                run_len = 1
                elif frame_type == FRAME_HEADER:
                    want_timestamp = True
                elif frame_type == FRAME_METHOD and unpack_u32(buf, start)[0] == BASIC_DELIVER:
                    delivered += 1
                    want_timestamp = False
                    if every:
                        unacked += 1
                        if unacked >= every:
                            unacked = 0
                            self.ack_tags.append(unpack_u64(buf, start + 5 + buf[start + 4])[0])
                else:
                    other(frame_type, channel, buf, start, end)
                offset = end + 1
        finally:
            if run_len:
                runs.append((run_ts, run_len))
            self.delivered += delivered
            self._unacked = unacked
            self._want_timestamp = want_timestamp
            if buf is pending:
                del pending[:offset]
            elif offset < size_total:
                self._pending = bytearray(memoryview(data)[offset:])


class Consumer(AmqpConnection):
    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(loop)
        self.latency = Histogram()
        self.window: Window | None = None
        self.consumed = 0
        self.multiple_acks = True
        self.deliveries = DeliveryParser(self._on_frame)

    async def setup(self, cfg: PerfConfig, index: int = 0) -> None:
        if not cfg.no_ack:
            await self.rpc(commands.Basic.Qos(prefetch_count=cfg.prefetch), commands.Basic.QosOk)
            self.deliveries.ack_every = cfg.multi_ack
            self.multiple_acks = cfg.multi_ack > 1
        await self.rpc(
            commands.Basic.Consume(
                queue=cfg.queue_for(index),
                no_ack=cfg.no_ack,
                arguments={"x-stream-offset": cfg.stream_offset_for(index)} if cfg.stream else None,
            ),
            commands.Basic.ConsumeOk,
        )

    def data_received(self, data: bytes) -> None:
        deliveries = self.deliveries
        try:
            deliveries.feed(data)
        except ProtocolError as exc:
            self._fail(f"protocol error: {exc}")
            return
        if deliveries.ack_tags:
            if not self.closing:
                multiple = self.multiple_acks
                self._send(b"".join([encode_ack(tag, multiple) for tag in deliveries.ack_tags]))
            deliveries.ack_tags.clear()
        # Everything in one read arrived at the same instant, so one clock read and one
        # window test serve the whole chunk.
        window = self.window
        now = time.monotonic_ns()
        if window is not None and window.warm_ns <= now < window.end_ns:
            self.consumed += deliveries.delivered
            record = self.latency.record
            for sent_ns, count in deliveries.runs:
                record((now - sent_ns) // 1000, count)
        deliveries.delivered = 0
        deliveries.runs.clear()

    async def run(self, cfg: PerfConfig, window: Window) -> dict[str, Any]:
        self.window = window
        deadline = self.loop.time() + (window.end_ns - time.monotonic_ns()) / 1e9
        while not self.lost and self.loop.time() < deadline:
            await self.wait_event(deadline - self.loop.time())
        return {
            "role": "consumer",
            "consumed": self.consumed,
            "latency_hist": self.latency.to_wire(),
            "error": self.error if self.lost else None,
        }
