"""A follower's side of replication: connect to the leader, say what this
node has, apply what the leader sends (store/mirror.py) and acknowledge
each mark once it is written and synced (issue 29)."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable

from shoal.broker.cluster import protocol as P
from shoal.broker.cluster import tcp
from shoal.store import mirror

log = logging.getLogger("shoal.cluster")


class LeaderRefused(Exception):
    """The leader said no (wrong secret, or it is no longer the leader)."""


class Receiver:
    """One connection to one leader; `run()` returns when it ends."""

    def __init__(
        self,
        me: P.Identity,
        on_welcome: Callable[[], None] = lambda: None,
        on_caught_up: Callable[[], None] = lambda: None,
    ) -> None:
        self.me = me
        self.mirror = mirror.Mirror(me.root)
        # The mirror is not thread-safe and its operations run on threads:
        # a cancel of run() does not stop a thread in the middle of _apply,
        # and closing the mirror's descriptors under it would let its writes
        # land in whatever file reuses those numbers next (a failover opens
        # the data directory's files right after). The close waits for it.
        self._mirror_lock = threading.Lock()
        self.acked = 0  # the last mark acknowledged
        self.caught_up = False  # acknowledged at least one mark on this connection
        self.last_ack = 0.0
        self.leader = ""
        # Called on a thread: when the leader accepted this follower (its copy
        # is about to change), and at the first mark (the copy is whole again).
        self.on_welcome = on_welcome
        self.on_caught_up = on_caught_up

    async def run(self, host: str, port: int) -> None:
        # What this node has, before connecting: with a big data directory
        # the listing (a CRC-32 of every file) takes a while, and the leader
        # gives a follower a bounded time to say hello. Nothing changes the
        # copy meanwhile: only this receiver writes it.
        files = await asyncio.to_thread(mirror.listing, self.me.root)
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), 5)
        tcp.keep_alive(writer.get_extra_info("socket"))
        frames = P.FrameReader()
        try:
            writer.write(P.frame(self.me.hello(files)))
            while True:
                try:
                    data = await asyncio.wait_for(reader.read(1 << 20), P.SILENCE)
                except TimeoutError:
                    # The leader sends a heartbeat every second: this
                    # connection died without a FIN. Connect again.
                    raise ConnectionError(
                        f"nothing from the leader for {P.SILENCE:.0f} s"
                    ) from None
                if not data:
                    return
                messages = frames.feed(data)
                if messages:
                    mark = await asyncio.to_thread(self._apply, messages)
                    if mark and not self.caught_up:
                        # The first mark comes after the whole catch-up: the
                        # copy is whole before the leader counts it in sync.
                        await asyncio.to_thread(self.on_caught_up)
                    if mark:
                        writer.write(P.frame(P.Ack(mark)))
                        self.acked = mark
                        self.caught_up = True
                        self.last_ack = time.monotonic()
        finally:
            writer.close()
            await self._close_mirror()

    async def _close_mirror(self) -> None:
        """Close the mirror once no thread applies to it, also when run() is
        cancelled (again) meanwhile: the wait is one apply's writes and sync."""
        closing = asyncio.ensure_future(asyncio.to_thread(self._close_locked))
        cancelled = False
        while not closing.done():
            try:
                await asyncio.shield(closing)
            except asyncio.CancelledError:
                cancelled = True
        if cancelled:
            raise asyncio.CancelledError

    def _close_locked(self) -> None:
        with self._mirror_lock:
            self.mirror.close()

    def _apply(self, messages: list[P.Message]) -> int:
        """Apply a run of operations; sync and return the last mark among
        them (0: none)."""
        with self._mirror_lock:
            return self._apply_locked(messages)

    def _apply_locked(self, messages: list[P.Message]) -> int:
        mark = 0
        m = self.mirror
        for message in messages:
            if isinstance(message, P.Append):
                m.append(message.path, message.offset, message.data, message.sync)
            elif isinstance(message, P.Mark):
                mark = message.seq
            elif isinstance(message, P.Truncate):
                m.truncate(message.path, message.size)
            elif isinstance(message, P.Reset):
                m.reset(message.path)
            elif isinstance(message, P.Commit):
                m.commit(message.path)
            elif isinstance(message, P.Delete):
                m.delete(message.path)
            elif isinstance(message, P.Welcome):
                self.leader = message.leader
                self.on_welcome()
                log.info("following %s", message.leader)
            elif isinstance(message, P.Refused):
                raise LeaderRefused(message.reason)
        if mark:
            m.mark()
        return mark
