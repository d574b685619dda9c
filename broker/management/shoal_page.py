"""Shoal's own page in the management UI (issue 27, item 3): what RabbitMQ's
pages have no place for. GET /api/shoal answers one JSON document; the UI's
extension point (GET /api/extensions names js/shoal.js) adds the "Shoal"
tab, whose template (js/tmpl/shoal.ejs) shows it. Both files live in
extension/ beside this module, not in www/, which stays RabbitMQ's as
vendored.

Everything but the stream consumers' offsets is read from the shared-memory
segment, as `shoal status` reads it (broker/operate/status.py): the process
table (per IO worker: connections, channels, consumers, arena), the queue
table (paged-out counts, stream bounds) and the header (watermarks,
alarms). The consumers' offsets are only known to the IO workers that serve
them, so for those the page asks the scheduler's control socket what
`shoal status --consumers` asks (broker/scheduler/introspect.py), and only
when there is a stream queue at all: that request goes to every worker.

Seen by users tagged administrator or monitoring, as RabbitMQ's node
pages are."""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path
from typing import Any

import psutil
from aiohttp import web

from shoal.broker.management.http import BACKEND, RATES, node_name, sees_all
from shoal.broker.observe.cluster_view import cluster_status
from shoal.broker.scheduler.introspect import socket_path
from shoal.shm import counters, memory, stats
from shoal.shm.arena import arena_usage
from shoal.shm.message_files import MessageFileTable
from shoal.shm.processes import Header, Role, role_name, slots, worker_slots
from shoal.shm.queues import SharedQueues
from shoal.shm.segment import Segment
from shoal.shm.stream_words import StreamWords

EXTENSION = Path(__file__).parent / "extension"
CONSUMERS_TIMEOUT = 10.0  # the scheduler waits 2 s for each worker (REPLY_TIMEOUT)
ALARM_NAMES = ((memory.ALARM_MEMORY, "memory"), (memory.ALARM_DISK, "disk"))
STANDALONE_NOTE = (
    "Shoal runs on one node: there is no cluster yet, hence no other node, "
    "no node roles and no replication lag. This node holds every queue itself."
)

CLUSTER_NOTE = (
    "The leader runs the broker and ships every durable write to its followers; "
    "a confirm waits until every in-sync node has it (docs/cluster.md). "
    "Replication lag: bytes of the leader's files a follower has not yet written."
)

# pid -> (monotonic seconds, CPU seconds) at the previous request: a
# worker's CPU use is the difference between two requests (psutil's
# cpu_percent would block, or need its own handle kept per process).
_cpu_seen: dict[int, tuple[float, float]] = {}


async def shoal(request: web.Request) -> web.Response:
    if not sees_all(request):  # administrator or monitoring, as RabbitMQ's /api/nodes
        return web.json_response(
            {"error": "not_authorized", "reason": "Not monitor user"}, status=401
        )
    backend = request.app[BACKEND]
    seg = backend.seg
    shared = request.app[RATES].shared  # the sampler's reader (owner 0: never acquires)
    vhosts = {vhost_id: name for name, vhost_id in backend.current().vhost_ids.items()}
    queues = [
        (vhosts.get(vhost_id, str(vhost_id)), name.decode(errors="replace"), qid)
        for vhost_id, name, qid in sorted(shared.catalog.scan())
    ]
    paging_dir = os.path.join(backend.config.data_path(), "paging")
    paging_files = await asyncio.to_thread(_paging_files, paging_dir)
    streams = _streams(seg, shared, queues)
    if streams:
        await _stream_consumers(backend.runtime_dir, streams)
    workers = _io_workers(seg, paging_files)
    arena_total = sum(w["arena_bytes"] for w in workers)
    marks = memory.configured(seg)
    return web.json_response(
        {
            "node": node_name(),
            "cluster": _cluster(backend.config.runtime_path()),
            "io_workers": workers,
            "arena": {
                "used_bytes": sum(w["arena_used_bytes"] for w in workers),
                "total_bytes": arena_total,
                "high_watermark_bytes": marks.high * len(workers),
                "low_watermark_bytes": marks.low * len(workers),
                "segment_allocated_bytes": seg.allocated_bytes(),
                "alarms": _alarm_names(memory.broker_alarms(seg)),
            },
            "streams": streams,
            "paging": _paging(shared, queues, paging_files, paging_dir, seg),
            "message_store": _message_store(seg),
            "processes": _other_processes(seg),
        }
    )


def _cluster(runtime_dir: str) -> dict[str, Any]:
    """This node's cluster as its agent last wrote it (broker/cluster/node.py,
    observe/cluster_view.py): the leader (which runs the broker answering
    here), then each follower it serves, with whether it is in sync and how
    far behind it is; standalone, this node alone."""
    view = cluster_status(runtime_dir)
    if view is None:
        return {
            "mode": "standalone",
            "nodes": [
                {
                    "name": node_name(),
                    "role": "standalone",
                    "in_sync": None,
                    "replication_lag": None,
                    "lag_seconds": None,
                }
            ],
            "note": STANDALONE_NOTE,
        }
    nodes = [
        {
            "name": f"shoal@{view['node']}",
            "role": view["role"],
            "in_sync": view["node"] in view.get("isr", []),
            "replication_lag": 0,
            "lag_seconds": 0.0,
        }
    ]
    nodes += [
        {
            "name": f"shoal@{f['node']}",
            "role": "follower",
            "in_sync": f["in_sync"],
            "replication_lag": f["lag_bytes"],
            "lag_seconds": f["lag_seconds"],
        }
        for f in view.get("followers", [])
    ]
    return {
        "mode": "cluster",
        "name": view.get("name", ""),
        "leader": view.get("leader", ""),
        "in_sync_set": view.get("isr", []),
        "nodes": nodes,
        "note": CLUSTER_NOTE,
    }


def _io_workers(seg: Segment, paging_files: list[tuple[int, int, int]]) -> list[dict[str, Any]]:
    """One row per IO worker of the process table."""
    now_ns, now = time.monotonic_ns(), time.monotonic()
    arena_bytes = seg.layout.limits.arena_bytes
    rows: list[dict[str, Any]] = []
    for slot in worker_slots(seg):
        index, pid = slot.index, slot.pid()
        words = stats.read(seg, index)
        used, blocks = arena_usage(seg, index)
        beat = slot.heartbeat_ns()
        mine = [size for worker, _qid, size in paging_files if worker == index]
        rows.append(
            {
                "index": index,
                "pid": pid,
                "incarnation": slot.incarnation(),
                "ready": slot.ready(),
                "retiring": slot.retiring(),
                "heartbeat_age_s": round((now_ns - beat) / 1e9, 3) if beat else None,
                "alarms": _alarm_names(slot.alarms()),
                # Counted by the acceptor when it hands a socket over, so a
                # connection still in its handshake counts too.
                "connections": slot.connections(),
                "channels": words[stats.CHANNELS],
                "consumers": words[stats.CONSUMERS],
                "publishers": words[stats.PUBLISHERS],
                "published": words[stats.RECEIVED],
                "delivered": sum(words[i] for i in stats.DELIVERED),
                "arena_used_bytes": used,
                "arena_live_blocks": blocks,
                "arena_bytes": arena_bytes,
                "paging_files": len(mine),
                "paging_file_bytes": sum(mine),
                **_process_use(pid, now),
            }
        )
    for gone in _cpu_seen.keys() - {row["pid"] for row in rows}:  # replaced workers'
        del _cpu_seen[gone]
    return rows


def _process_use(pid: int, now: float) -> dict[str, Any]:
    """CPU seconds, CPU use since the previous request (None on the first)
    and resident memory of a process; None where it cannot be read."""
    if pid <= 0:  # not started yet (psutil's process 0 is the kernel's)
        return {"cpu_seconds": None, "cpu_percent": None, "rss_bytes": None}
    try:
        process = psutil.Process(pid)
        times = process.cpu_times()
        rss = process.memory_info().rss
    except psutil.Error:
        return {"cpu_seconds": None, "cpu_percent": None, "rss_bytes": None}
    cpu = times.user + times.system
    seen = _cpu_seen.get(pid)
    _cpu_seen[pid] = (now, cpu)
    percent = None
    if seen is not None and now > seen[0]:
        percent = round(100 * (cpu - seen[1]) / (now - seen[0]), 1)
    return {"cpu_seconds": round(cpu, 2), "cpu_percent": percent, "rss_bytes": rss}


def _streams(
    seg: Segment, shared: SharedQueues, queues: list[tuple[str, str, int]]
) -> list[dict[str, Any]]:
    """The stream queues' durable bounds (shm/stream_words.py)."""
    words = StreamWords(seg)
    rows: list[dict[str, Any]] = []
    for vhost, name, qid in queues:
        c = counters.read(shared, qid)
        if c.stream is None:
            continue
        bounds = c.stream
        rows.append(
            {
                "vhost": vhost,
                "name": name,
                "writer": words.writer(qid),  # the IO worker that appends (None: none yet)
                "first_offset": bounds.first,
                "last_offset": bounds.next - 1,  # -1: nothing written yet
                "next_offset": bounds.next,
                "messages": bounds.next - bounds.first,
                "segments": bounds.segments,
                "bytes": bounds.bytes,
                "consumers": [],
            }
        )
    return rows


async def _stream_consumers(runtime_dir: str, streams: list[dict[str, Any]]) -> None:
    """Each stream's consumers, with the offset each will be sent next and
    its lag (offsets written but not yet sent to it), from `shoal status
    --consumers`' request. Where the scheduler does not answer, the streams
    say why instead."""
    try:
        answer = await _ask_consumers(runtime_dir)
    except (OSError, TimeoutError, ValueError) as exc:
        for stream in streams:
            stream["consumers_error"] = f"the scheduler did not answer: {exc!r}"
        return
    by_queue = {(q["vhost"], q["name"]): q for q in answer.get("queues", [])}
    for stream in streams:
        queue = by_queue.get((stream["vhost"], stream["name"]))
        for c in queue["consumers"] if queue else []:
            stream["consumers"].append(
                {
                    "tag": c.get("tag"),
                    "worker": c.get("worker"),
                    "connection": c.get("connection"),  # the worker's id of it, hex
                    "channel": c.get("channel"),
                    "offset": c.get("offset"),  # None: not started yet
                    "lag": c.get("lag"),
                    "unacked": c.get("unacked"),
                    "credit": c.get("credit"),
                }
            )
        if answer.get("missing_workers"):
            stream["missing_workers"] = answer["missing_workers"]


async def _ask_consumers(runtime_dir: str) -> dict[str, Any]:
    reader, writer = await asyncio.wait_for(
        asyncio.open_unix_connection(socket_path(runtime_dir), limit=256 << 20),
        CONSUMERS_TIMEOUT,
    )
    try:
        writer.write(b"consumers\n")
        await writer.drain()
        line = await asyncio.wait_for(reader.readline(), CONSUMERS_TIMEOUT)
    finally:
        writer.close()
    answer: dict[str, Any] = json.loads(line)
    return answer


def _paging_files(directory: str) -> list[tuple[int, int, int]]:
    """(worker, qid, bytes) of each paging file (workers/pager.py names them
    `<worker>-<qid>-<n>`); none while the directory does not exist."""
    files: list[tuple[int, int, int]] = []
    try:
        entries = list(os.scandir(directory))
    except FileNotFoundError:
        return []
    for entry in entries:
        parts = entry.name.split("-")
        if len(parts) != 3 or not all(p.isdigit() for p in parts):
            continue
        try:
            size = entry.stat().st_size
        except FileNotFoundError:  # paged back in and removed meanwhile
            continue
        files.append((int(parts[0]), int(parts[1]), size))
    return files


def _paging(
    shared: SharedQueues,
    queues: list[tuple[str, str, int]],
    files: list[tuple[int, int, int]],
    directory: str,
    seg: Segment,
) -> dict[str, Any]:
    """The queues with messages in paging files (their Q_PAGED_OUT word) or
    paging files on disk, and the totals."""
    on_disk: dict[int, list[int]] = {}
    for _worker, qid, size in files:
        on_disk.setdefault(qid, []).append(size)
    rows: list[dict[str, Any]] = []
    for vhost, name, qid in queues:
        paged_out = shared.table.paged_out(qid)
        sizes = on_disk.get(qid, [])
        if not paged_out and not sizes:
            continue
        c = counters.read(shared, qid)
        rows.append(
            {
                "vhost": vhost,
                "name": name,
                "messages_paged_out": paged_out,
                "messages_in_memory": c.ready - paged_out,  # ready ones, in its log
                "memory_bytes": c.bytes,  # bodies in the arenas, ready and unacked
                "paging_files": len(sizes),
                "paging_file_bytes": sum(sizes),
            }
        )
    limits = seg.layout.limits
    return {
        "directory": directory,
        "queue_window": limits.queue_capacity,  # a log's cells: more go to disk
        "spill_above_arena_bytes": limits.arena_bytes // 2,  # workers/pager.py
        "queues": rows,
        "messages_paged_out": sum(r["messages_paged_out"] for r in rows),
        "paging_file_bytes": sum(size for _w, _q, size in files),
    }


def _message_store(seg: Segment) -> dict[str, Any]:
    """The persistent messages' store (workers/persist.py), as `shoal status`."""
    totals = stats.totals(seg)
    segments = MessageFileTable(seg, 0)
    live = [segments.live(slot) for slot in segments.all_claimed()]
    return {
        "loaded": Header(seg).loaded(),
        "segments": len(live),
        "live_entries": sum(live),
        "syncs": totals[stats.STORE_SYNCS],
        "synced_records": totals[stats.STORE_SYNCED_RECORDS],
        "written_bytes": totals[stats.STORE_WRITTEN_BYTES],
    }


def _other_processes(seg: Segment) -> list[dict[str, Any]]:
    """The processes that are not IO workers: supervisor, acceptor,
    scheduler, metrics, management."""
    rows: list[dict[str, Any]] = []
    for slot in slots(seg):
        role = slot.role()
        if not role or role == Role.WORKER:
            continue
        rows.append(
            {
                "role": role_name(role),
                "pid": slot.pid(),
                # The supervisor serves nothing, so never says it is ready.
                "ready": None if role == Role.SUPERVISOR else slot.ready(),
            }
        )
    return rows


def _alarm_names(bits: int) -> list[str]:
    return [name for bit, name in ALARM_NAMES if bits & bit]


async def _script(request: web.Request) -> web.FileResponse:
    return web.FileResponse(EXTENSION / "shoal.js")


async def _template(request: web.Request) -> web.FileResponse:
    return web.FileResponse(EXTENSION / "shoal.ejs")


def routes(router: web.UrlDispatcher) -> None:
    """Before the UI's static /js/ route (api.py), which would answer 404."""
    router.add_get("/api/shoal", shoal)
    router.add_get("/js/shoal.js", _script)
    router.add_get("/js/tmpl/shoal.ejs", _template)
