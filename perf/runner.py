"""One measurement: declare the queues, fork one process per producer and consumer,
start them together, collect their results and clean up.
"""

from __future__ import annotations

import asyncio
import ctypes
import multiprocessing
import multiprocessing.connection
import signal
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import uvloop
from pamqp import commands

from shoal.perf.config import (
    CONNECT_TIMEOUT_S,
    JOIN_TIMEOUT_S,
    READY_TIMEOUT_S,
    RESULT_GRACE_S,
    PerfConfig,
    Window,
)
from shoal.perf.connection import AmqpConnection, AmqpUri, connect, describe, server_name
from shoal.perf.consumer import Consumer
from shoal.perf.producer import Producer
from shoal.perf.report import summarize

# --- child processes --------------------------------------------------------------


def _die_with_parent() -> None:
    """Ask Linux to SIGKILL this child if the parent dies, so no run outlives main."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _child_main(
    role: str,
    index: int,
    cfg: PerfConfig,
    conn: multiprocessing.connection.Connection,
    go: Any,
    start_at: Any,
) -> None:
    _die_with_parent()
    # A last-resort bound in case main is stuck too; SIGALRM's default action kills.
    signal.alarm(int(cfg.warmup + cfg.duration + READY_TIMEOUT_S + 30))
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # main handles Ctrl-C and kills us
    loop = uvloop.new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        result = _run_child(loop, role, index, cfg, conn, go, start_at)
        if result is not None:
            conn.send(("result", index, result))
    except BaseException as exc:  # reported to main, which decides
        conn.send(("error", index, f"{role} {index}: {describe(exc)}"))
    finally:
        loop.close()
        conn.close()


def _run_child(
    loop: asyncio.AbstractEventLoop,
    role: str,
    index: int,
    cfg: PerfConfig,
    conn: multiprocessing.connection.Connection,
    go: Any,
    start_at: Any,
) -> dict[str, Any] | None:
    factory: type[Producer] | type[Consumer] = Producer if role == "producer" else Consumer
    uri = AmqpUri.parse(cfg.uri)
    client = loop.run_until_complete(connect(factory, uri))
    assert isinstance(client, (Producer, Consumer))
    try:
        loop.run_until_complete(asyncio.wait_for(client.setup(cfg, index), CONNECT_TIMEOUT_S))
        conn.send(("ready", 0, None))
        # Blocking here is fine: nothing is flowing until every process is ready.
        if not go.wait(READY_TIMEOUT_S + 2):
            return None
        window = Window.from_start(start_at.value, cfg.warmup, cfg.duration)
        limit = (window.end_ns - time.monotonic_ns()) / 1e9 + RESULT_GRACE_S
        cpu_before = time.process_time()
        wall_before = time.monotonic()
        result = loop.run_until_complete(asyncio.wait_for(client.run(cfg, window), limit))
        # CPU used over the run shows how much of the machine the load generator itself
        # took from the broker it measures.
        result["cpu_s"] = time.process_time() - cpu_before
        result["wall_s"] = time.monotonic() - wall_before
        return result
    finally:
        loop.run_until_complete(client.close())


# --- orchestration ----------------------------------------------------------------


async def _declare_queue(cfg: PerfConfig) -> str:
    client = await connect(AmqpConnection, AmqpUri.parse(cfg.uri))
    try:
        durable = cfg.persistent or cfg.stream or cfg.quorum
        # Auto-delete cleans up after a killed run; with no consumer it would never
        # trigger, and a durable queue is meant to outlive connections.
        auto_delete = not durable and cfg.consumers > 0 and cfg.queue_generated
        arguments: dict[str, Any] | None = None
        if cfg.stream or cfg.quorum:
            arguments = {"x-queue-type": "stream" if cfg.stream else "quorum"}
        if cfg.dedup == "queue":
            arguments = {"x-message-deduplication": True}
        if cfg.fanout:
            await client.rpc(
                commands.Exchange.Declare(
                    exchange=cfg.exchange(), exchange_type="fanout", durable=durable
                ),
                commands.Exchange.DeclareOk,
            )
        for queue in cfg.queues():
            await client.rpc(
                commands.Queue.Declare(
                    queue=queue, durable=durable, auto_delete=auto_delete, arguments=arguments
                ),
                commands.Queue.DeclareOk,
            )
            if cfg.fanout:
                await client.rpc(
                    commands.Queue.Bind(queue=queue, exchange=cfg.exchange()),
                    commands.Queue.BindOk,
                )
        return server_name(client.server_properties)
    finally:
        await client.close()


async def _delete_queue(cfg: PerfConfig) -> None:
    client = await connect(AmqpConnection, AmqpUri.parse(cfg.uri))
    try:
        for queue in cfg.queues():
            await client.rpc(commands.Queue.Delete(queue=queue), commands.Queue.DeleteOk)
        if cfg.fanout:
            await client.rpc(
                commands.Exchange.Delete(exchange=cfg.exchange()), commands.Exchange.DeleteOk
            )
    finally:
        await client.close()


def _run_async(coro: Any, timeout: float) -> Any:
    loop = uvloop.new_event_loop()
    try:
        return loop.run_until_complete(asyncio.wait_for(coro, timeout))
    finally:
        loop.close()


@dataclass
class _Child:
    role: str
    process: Any
    reader: multiprocessing.connection.Connection
    ready: bool = False
    result: dict[str, Any] | None = None
    error: str | None = None


def _start_children(cfg: PerfConfig, go: Any, start_at: Any) -> list[_Child]:
    ctx = multiprocessing.get_context("fork")
    children: list[_Child] = []
    roles = ["consumer"] * cfg.consumers + ["producer"] * cfg.producers
    for index, role in enumerate(roles):
        reader, writer = ctx.Pipe(duplex=False)
        process = ctx.Process(
            target=_child_main,
            args=(role, index, cfg, writer, go, start_at),
            name=f"shoal-perf-{role}-{index}",
            daemon=True,
        )
        process.start()
        writer.close()
        children.append(_Child(role, process, reader))
    return children


def _collect(children: list[_Child], until: Callable[[_Child], bool], deadline: float) -> None:
    """Read messages from children until ``until`` holds for all, or the deadline."""
    open_readers = {c.reader: c for c in children if not until(c) and c.error is None}
    while open_readers:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            for child in open_readers.values():
                child.error = child.error or f"{child.role} timed out"
            return
        for reader in multiprocessing.connection.wait(list(open_readers), remaining):
            assert isinstance(reader, multiprocessing.connection.Connection)
            child = open_readers[reader]
            try:
                kind, _, payload = reader.recv()
            except (EOFError, OSError):
                child.error = child.error or f"{child.role} exited without a result"
                del open_readers[reader]
                continue
            if kind == "ready":
                child.ready = True
            elif kind == "result":
                child.result = payload
            else:
                child.error = payload
            if until(child) or child.error is not None:
                del open_readers[reader]


def _reap(children: list[_Child]) -> None:
    deadline = time.monotonic() + JOIN_TIMEOUT_S
    for child in children:
        child.process.join(max(0.0, deadline - time.monotonic()))
    for child in children:
        if child.process.is_alive():
            child.process.kill()
            child.process.join(1.0)
        child.reader.close()


def run_perf(cfg: PerfConfig) -> dict[str, Any]:
    """Run one measurement and return the aggregated report (see ``summarize``)."""
    overall_deadline = time.monotonic() + cfg.warmup + cfg.duration + 25.0
    errors: list[str] = []
    try:
        server = _run_async(_declare_queue(cfg), CONNECT_TIMEOUT_S + 5)
    except Exception as exc:  # any failure here means "cannot run"
        return {
            "config": asdict(cfg),
            "errors": [f"setup failed: {describe(exc)}"],
            "fatal": True,
        }
    ctx = multiprocessing.get_context("fork")
    go = ctx.Event()
    start_at = ctx.Value("d", 0.0, lock=False)
    children = _start_children(cfg, go, start_at)
    try:
        ready_deadline = min(time.monotonic() + READY_TIMEOUT_S, overall_deadline)
        _collect(children, lambda c: c.ready, ready_deadline)
        errors.extend(c.error for c in children if c.error)
        if not errors:
            # A short lead lets every child reach its loop before the clock starts.
            start_at.value = time.monotonic() + 0.05
            go.set()
            run_deadline = min(
                start_at.value + cfg.warmup + cfg.duration + RESULT_GRACE_S, overall_deadline
            )
            _collect(children, lambda c: c.result is not None, run_deadline)
            errors.extend(c.error for c in children if c.error)
            errors.extend(
                f"{c.role}: {c.result['error']}"
                for c in children
                if c.result and c.result.get("error")
            )
    finally:
        _reap(children)
        if cfg.queue_generated:
            try:
                _run_async(_delete_queue(cfg), 3.0)
            except Exception as exc:  # cleanup must not hide the result
                errors.append(f"queue delete failed: {describe(exc)}")
    report = summarize(cfg, [c.result for c in children if c.result is not None])
    report["server"] = server
    report["errors"] = errors
    report["fatal"] = bool(errors) and not any(c.result for c in children)
    return report
