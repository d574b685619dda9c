"""The producer process: batches of templated publishes, optionally with confirms."""

from __future__ import annotations

import asyncio
import collections
import time
from typing import Any

from pamqp import commands

from shoal.perf.config import PerfConfig, Window
from shoal.perf.connection import AmqpConnection
from shoal.perf.stats import Histogram
from shoal.perf.wire import (
    BASIC_ACK,
    BASIC_NACK,
    FRAME_METHOD,
    U32,
    KeyedTemplate,
    ProtocolError,
    PublishTemplate,
    build_publish_template,
    parse_confirm,
)

# Target bytes per producer write: large enough that per-write overhead is amortised
# over hundreds of small messages, small enough to keep latency samples meaningful.
BATCH_BYTES = 32 * 1024


# --- publisher confirms -----------------------------------------------------------


class ConfirmTracker:
    """Counts unconfirmed publishes and measures confirm latency.

    Tags are assigned per batch, so each batch remembers its tag range and send time.
    ``low`` is the highest tag below which everything is settled; tags settled out of
    order by non-multiple acks wait in ``singles`` until ``low`` catches up.
    """

    __slots__ = ("acked", "batches", "low", "nacked", "next_tag", "singles")

    def __init__(self) -> None:
        self.next_tag = 1
        self.low = 0
        self.singles: set[int] = set()
        self.batches: collections.deque[tuple[int, int, int]] = collections.deque()
        self.acked = 0
        self.nacked = 0

    @property
    def outstanding(self) -> int:
        return self.next_tag - 1 - self.low - len(self.singles)

    def sent(self, count: int, send_ns: int) -> None:
        first = self.next_tag
        self.next_tag += count
        self.batches.append((first, self.next_tag - 1, send_ns))

    def settle(
        self, tag: int, multiple: bool, ack: bool, now_ns: int, hist: Histogram | None
    ) -> int:
        """Apply one Basic.Ack/Nack; returns how many publishes it settled."""
        before = self.low + len(self.singles)
        if tag >= self.next_tag:
            raise ProtocolError(f"confirm for unpublished tag {tag}")
        if multiple:
            if tag > self.low:
                self.singles = {t for t in self.singles if t > tag}
                self._advance(tag, now_ns, hist)
        elif tag > self.low and tag not in self.singles:
            self.singles.add(tag)
        new_low = self.low
        while new_low + 1 in self.singles:
            new_low += 1
            self.singles.discard(new_low)
        if new_low > self.low:
            self._advance(new_low, now_ns, hist)
        settled = self.low + len(self.singles) - before
        if ack:
            self.acked += settled
        else:
            self.nacked += settled
        return settled

    def _advance(self, new_low: int, now_ns: int, hist: Histogram | None) -> None:
        # Out-of-order single acks are timed when ``low`` passes them: a slight
        # overestimate for a rare case, in exchange for O(1) bookkeeping per batch.
        batches = self.batches
        low = self.low
        while batches:
            first, last, send_ns = batches[0]
            count = min(last, new_low) - max(first, low + 1) + 1
            if count > 0 and hist is not None:
                hist.record((now_ns - send_ns) // 1000, count)
            if last > new_low:
                break
            batches.popleft()
        self.low = new_low


# --- producer ---------------------------------------------------------------------


class Producer(AmqpConnection):
    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(loop)
        self.confirms: ConfirmTracker | None = None
        self.confirm_hist = Histogram()
        self.window: Window | None = None
        self.published = 0
        self.acked = 0
        self.nacked = 0
        self.blocked_events = 0
        self.index = 0  # this producer's number (setup), for its dedup keys
        self.keyed: KeyedTemplate | None = None

    def _on_frame(
        self, frame_type: int, channel: int, buf: bytes | bytearray, start: int, end: int
    ) -> None:
        if frame_type == FRAME_METHOD and self.confirms is not None:
            method = U32.unpack_from(buf, start)[0]
            if method in (BASIC_ACK, BASIC_NACK):
                tag, multiple = parse_confirm(buf, start)
                now = time.monotonic_ns()
                window = self.window
                in_window = window is not None and window.warm_ns <= now < window.end_ns
                is_ack = method == BASIC_ACK
                settled = self.confirms.settle(
                    tag, multiple, is_ack, now, self.confirm_hist if in_window else None
                )
                if in_window:
                    if is_ack:
                        self.acked += settled
                    else:
                        self.nacked += settled
                self._wake()
                return
        super()._on_frame(frame_type, channel, buf, start, end)

    def _slow_frame(self, buf: bytes | bytearray, start: int, end: int) -> None:
        was_blocked = self.blocked
        super()._slow_frame(buf, start, end)
        if self.blocked and not was_blocked:
            self.blocked_events += 1

    async def setup(self, cfg: PerfConfig, index: int = 0) -> None:
        self.index = index
        if cfg.confirm:
            await self.rpc(commands.Confirm.Select(), commands.Confirm.SelectOk)
            self.confirms = ConfirmTracker()

    async def run(self, cfg: PerfConfig, window: Window) -> dict[str, Any]:
        self.window = window
        template = build_publish_template(
            "" if cfg.fanout else cfg.queue,
            cfg.size,
            exchange=cfg.exchange(),
            persistent=cfg.persistent,
            frame_max=self.frame_max,
            dedup_key=cfg.dedup != "off",
        )
        self.keyed = KeyedTemplate(template, self.index) if cfg.dedup != "off" else None
        batch = max(1, BATCH_BYTES // len(template.message(0)))
        if cfg.rate:
            # About 5 ms worth of messages per write keeps a capped rate smooth.
            batch = max(1, min(batch, cfg.rate // 200))
        stop_handle = self.loop.call_later(
            max(0.0, (window.end_ns - time.monotonic_ns()) / 1e9), self._wake
        )
        try:
            await self._publish_loop(cfg, window, template, batch)
        finally:
            stop_handle.cancel()
        confirms = self.confirms
        result: dict[str, Any] = {
            "role": "producer",
            "published": self.published,
            "blocked_events": self.blocked_events,
            "error": self.error if self.lost else None,
        }
        if confirms is not None:
            result.update(
                acked=self.acked,
                nacked=self.nacked,
                confirm_hist=self.confirm_hist.to_wire(),
            )
        return result

    async def _publish_loop(
        self, cfg: PerfConfig, window: Window, template: PublishTemplate, batch: int
    ) -> None:
        assert self.transport is not None
        write = self.transport.write
        message = template.message
        confirms = self.confirms
        window_size = cfg.confirm
        rate = cfg.rate
        sent_total = 0
        end_ns = window.end_ns
        warm_ns = window.warm_ns
        while not self.lost:
            now = time.monotonic_ns()
            if now >= end_ns:
                return
            if self.write_paused or self.blocked:
                await self.wait_event()
                continue
            count = batch
            if confirms is not None:
                count = min(count, window_size - confirms.outstanding)
                if count <= 0:
                    await self.wait_event()
                    continue
            if rate:
                due_ns = window.start_ns + int(sent_total * 1e9 / rate)
                if now < due_ns:
                    # libuv timers have 1 ms resolution; a shorter sleep returns at once
                    # and would turn the wait into a busy loop.
                    await asyncio.sleep(max(0.001, min(due_ns - now, end_ns - now) / 1e9))
                    continue
            keyed = self.keyed
            write(message(now) * count if keyed is None else keyed.batch(now, sent_total, count))
            sent_total += count
            if confirms is not None:
                confirms.sent(count, now)
            if now >= warm_ns:
                self.published += count
            # Let the loop read confirms and flow-control frames between writes.
            await asyncio.sleep(0)
