"""An IO worker process: one uvloop event loop serving AMQP connections.

Post-fork only: the loop is created here, never in the supervisor.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import time
from typing import Any

import uvloop
from setproctitle import setproctitle

from broker.config import Config
from broker.ipc import Link, Msg
from shm import layout as L
from shm import memory
from shm import stats as S
from shm.segment import Segment
from workers.connection import Connection
from workers.consumer import pull
from workers.context import WorkerContext
from workers.memory_guard import ALARM

HEARTBEAT_INTERVAL = 1.0

log = logging.getLogger("shoal.worker")


class Worker:
    def __init__(
        self,
        config: Config,
        seg: Segment,
        index: int,
        incarnation: int,
        efd: int,
        sched_sock: socket.socket,
        handoff_sock: socket.socket,
    ) -> None:
        self.config = config
        self.seg = seg
        self.index = index
        self.incarnation = incarnation
        self.efd = efd
        self.sched_sock = sched_sock
        self.handoff_sock = handoff_sock
        self.loop = uvloop.new_event_loop()
        asyncio.set_event_loop(self.loop)
        self.ctx = WorkerContext(config, seg, index, incarnation, efd, self.loop)
        self.stopping = False

    def run(self) -> int:
        loop, ctx = self.loop, self.ctx
        ctx.attach_link(Link(self.sched_sock, loop, self._on_scheduler_message))
        ctx.hello()
        self.handoff_sock.setblocking(False)
        loop.add_reader(self.handoff_sock.fileno(), self._on_handoff)
        loop.add_signal_handler(signal.SIGTERM, self._graceful_stop)
        loop.add_signal_handler(signal.SIGINT, self._fast_stop)
        a, slot = ctx.atomic, ctx.slot
        a.store(slot + L.P_PID, os.getpid())
        a.store(slot + L.P_INCARNATION, self.incarnation)
        self._tick()
        self._flush_stats()
        self._poll_alarms()
        a.store(slot + L.P_READY, 1)
        try:
            loop.run_forever()
        finally:
            a.store(slot + L.P_READY, 0)
            self._flush_stats(again=False)
        return 0

    def _flush_stats(self, again: bool = True) -> None:
        """Store this worker's statistics for the metrics process (shm/stats.py)."""
        ctx = self.ctx
        v = ctx.stats.v
        channels = [ch for conn in ctx.connections for ch in conn.channels.values()]
        v[S.CHANNELS] = len(channels)
        v[S.CONSUMERS] = len(ctx.consumers)
        v[S.PUBLISHERS] = sum(1 for ch in channels if ch.publish_count)
        capacity = memory_ = disk = 0
        for conn in ctx.connections:
            if conn.flow_blocked:
                if ALARM in conn.flow_blocked:
                    memory_ += "memory" in conn.alarm_reason
                    disk += "disk" in conn.alarm_reason
                capacity += any(qid >= 0 for qid in conn.flow_blocked)
        v[S.BLOCKED_CAPACITY], v[S.BLOCKED_MEMORY], v[S.BLOCKED_DISK] = capacity, memory_, disk
        ctx.stats.flush()
        if again:
            self.loop.call_later(S.FLUSH_INTERVAL, self._flush_stats)

    def _tick(self) -> None:
        self.ctx.heartbeat(time.monotonic_ns())
        self.ctx.arena.trim()
        self.loop.call_later(HEARTBEAT_INTERVAL, self._tick)

    def _poll_alarms(self) -> None:
        self.ctx.guard.poll()
        self.loop.call_later(memory.POLL_INTERVAL, self._poll_alarms)

    def _on_handoff(self) -> None:
        for _ in range(64):
            try:
                _msg, fds, _flags, _addr = socket.recv_fds(self.handoff_sock, 64, 16)
            except BlockingIOError:
                return
            if not fds:
                return
            for fd in fds:
                self._adopt(fd)

    def _adopt(self, fd: int) -> None:
        sock = socket.socket(fileno=fd)
        if self.stopping:
            sock.close()
            self.ctx.count(L.P_CONNECTIONS, -1)
            return
        sock.setblocking(False)

        async def adopt() -> None:
            try:
                await self.loop.connect_accepted_socket(lambda: Connection(self.ctx), sock)
            except OSError:
                sock.close()
                self.ctx.count(L.P_CONNECTIONS, -1)

        self.loop.create_task(adopt())

    def _on_scheduler_message(self, message: list[Any]) -> None:
        try:
            self._dispatch(message)
        except Exception:
            log.exception("failed to handle scheduler message %r", message)

    def _dispatch(self, message: list[Any]) -> None:
        kind = message[0]
        ctx = self.ctx
        if kind == Msg.NOTIFY:
            consumer = ctx.consumers.get(message[1])
            if consumer is not None:
                pull(ctx, consumer)
        elif kind == Msg.REPLY:
            ctx.on_reply(message[1], message[2], message[3])
        elif kind == Msg.CONSUMER_GONE:
            consumer = ctx.consumers.get(message[1])
            if consumer is not None:
                consumer.channel.consumer_gone(consumer)
        elif kind == Msg.RESYNC:
            ctx.hello()
        elif kind == Msg.UNBLOCK:
            for conn in list(ctx.connections):
                conn.flow_unblock(message[1])
        elif kind == Msg.INSPECT:
            ctx.send(Msg.CONSUMERS, message[1], [c.inspect() for c in ctx.consumers.values()])

    def _graceful_stop(self) -> None:
        if self.stopping:
            return
        self.stopping = True
        self.ctx.closing = True
        self.loop.remove_reader(self.handoff_sock.fileno())
        for conn in list(self.ctx.connections):
            conn.shutdown()
        self.loop.create_task(self._wait_and_exit())

    async def _wait_and_exit(self) -> None:
        deadline = time.monotonic() + self.config.graceful_timeout
        while self.ctx.connections and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        for conn in list(self.ctx.connections):
            if conn.transport is not None:
                conn.transport.abort()
        self.loop.stop()

    def _fast_stop(self) -> None:
        self.loop.stop()


def run_worker(
    config: Config,
    seg: Segment,
    index: int,
    incarnation: int,
    efd: int,
    sched_sock: socket.socket,
    handoff_sock: socket.socket,
) -> int:
    setproctitle(f"shoal: io-worker {index} (port {config.port})")
    # Fault injection for tests of the supervisor's crash-loop back-off.
    if os.environ.get("SHOAL_FAULT_WORKER_BOOT") == str(index):
        raise RuntimeError(f"injected boot failure of io-worker {index}")
    return Worker(config, seg, index, incarnation, efd, sched_sock, handoff_sock).run()
