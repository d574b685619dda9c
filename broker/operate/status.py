"""`shoal status`: what a running broker's processes and queues are doing,
read from its shared-memory segment (no connection to the broker needed)."""

from __future__ import annotations

import json
import os
import socket
import time
from typing import Any

from shoal.broker.amqp.definitions import Definitions, Op
from shoal.broker.cluster import cluster_verbs as cluster_control
from shoal.broker.observe.cluster_view import cluster_status
from shoal.broker.scheduler.introspect import socket_path
from shoal.shm import counters, memory, stats
from shoal.shm.arena import arena_usage
from shoal.shm.catalog import CatalogReader
from shoal.shm.message_files import MessageFileTable
from shoal.shm.processes import Header, Role, role_name, slots
from shoal.shm.queues import SharedQueues
from shoal.shm.segment import Segment
from shoal.shm.stream_words import StreamBounds, StreamWords


def snapshot(seg: Segment) -> dict[str, Any]:
    header = Header(seg)
    now = time.monotonic_ns()
    processes = []
    for slot in slots(seg):
        role = slot.role()
        if not role:
            continue
        entry: dict[str, Any] = {
            "role": role_name(role),
            "pid": slot.pid(),
            "ready": slot.ready(),
            "connections": slot.connections(),
        }
        if role == Role.WORKER:
            worker_counters = stats.read(seg, slot.index)
            beat = slot.heartbeat_ns()
            used, blocks = arena_usage(seg, slot.index)
            entry.update(
                index=slot.index,
                alarms=_alarm_names(slot.alarms()),
                incarnation=slot.incarnation(),
                heartbeat_age_s=round((now - beat) / 1e9, 3) if beat else None,
                published=worker_counters[stats.RECEIVED],
                delivered=sum(worker_counters[i] for i in stats.DELIVERED),
                mqtt_connections=worker_counters[stats.MQTT_CONNECTIONS],
                arena_used_bytes=used,
                arena_live_blocks=blocks,
            )
        if role == Role.SCHEDULER:
            entry["lost_wakeups_rescued"] = slot.rescues()
        processes.append(entry)
    shared = SharedQueues(seg)
    stream_words = StreamWords(seg)
    definitions = Definitions()
    for op in CatalogReader(seg, Op).poll()[1]:
        definitions.apply(op)
    vhosts = {vhost_id: name for name, vhost_id in definitions.vhost_ids.items()}
    queues = []
    priority_queues = shared.catalog.priority_levels()
    for vhost_id, name, qid in sorted(shared.catalog.scan()):
        levels = priority_queues.get(qid)
        c = counters.read(shared, qid)
        queues.append(
            {
                "vhost": vhosts.get(vhost_id, str(vhost_id)),
                "name": name.decode(errors="replace"),
                "uid": shared.table.uid(qid),  # a durable queue's (0: transient or exclusive)
                "type": c.kind,
                "messages_ready": c.ready,
                "messages_unacked": c.unacked,
                "consumers": c.consumers,
                "published": c.published,
                "head": c.head,
                "tail": c.tail,
                "max_priority": levels.max_priority if levels else 0,
                "bytes": c.bytes,
                "capacity": c.capacity,
                "flow": counters.FLOW_NAMES.get(c.flow, "?"),
                "blocked_publishers": c.blocked_publishers,
                "max_length": _limit(c.max_length),
                "max_length_bytes": _limit(c.max_bytes),
                "overflow": counters.OVERFLOW_NAMES.get(c.overflow),
                "priority_levels_used": sorted(levels.by_level) if levels else [],
                "stream": None if c.stream is None else _stream(c.stream, stream_words.writer(qid)),
            }
        )
    marks = memory.configured(seg)
    totals = stats.totals(seg)
    segments = MessageFileTable(seg, 0)
    live = [(slot, segments.live(slot)) for slot in segments.all_claimed()]
    return {
        "segment": seg.path,
        "segment_allocated_bytes": seg.allocated_bytes(),
        # The broker-wide resource alarms (shm/memory.py): publishers are
        # blocked while any is raised.
        "alarms": _alarm_names(memory.broker_alarms(seg)),
        "arena_high_watermark_bytes": marks.high,
        "arena_low_watermark_bytes": marks.low,
        "disk_free_limit_bytes": marks.disk_free_limit,
        "disk_free_bytes": memory.disk_free(seg),
        "epoch": header.epoch(),  # this start's number (the data directory's)
        # The message store (workers/persist.py, shm/message_files.py).
        "store": {
            "loaded": header.loaded(),
            "segments": len(live),
            "live_entries": sum(n for _slot, n in live),
            "syncs": totals[stats.STORE_SYNCS],
            "synced_records": totals[stats.STORE_SYNCED_RECORDS],
            "written_bytes": totals[stats.STORE_WRITTEN_BYTES],
        },
        "processes": processes,
        "queues": queues,
    }


_ALARM_NAMES = ((memory.ALARM_MEMORY, "memory"), (memory.ALARM_DISK, "disk"))


def _stream(bounds: StreamBounds, writer: int | None) -> dict[str, int | None]:
    """A stream queue's offsets (docs/streams.md) and the IO worker that
    writes it (None: not opened yet)."""
    return {
        "writer": writer,
        "first_offset": bounds.first,
        "last_offset": bounds.next - 1,  # -1: nothing written yet
        "next_offset": bounds.next,
        "last_chunk_offset": bounds.last_chunk,
        "bytes": bounds.bytes,
        "segments": bounds.segments,
    }


def _alarm_names(bits: int) -> list[str]:
    return [name for bit, name in _ALARM_NAMES if bits & bit]


def _limit(word: int) -> int | None:
    """A length limit as the queue record holds it (limit + 1, 0: none)."""
    return word - 1 if word else None


def render(snap: dict[str, Any]) -> str:
    alarms = snap["alarms"]
    lines = [
        f"segment {snap['segment']} ({snap['segment_allocated_bytes']} bytes allocated)",
        "alarms: " + (", ".join(f"low on {name}: publishers blocked" for name in alarms) or "none"),
        f"disk: {snap['disk_free_bytes']} bytes free, limit {snap['disk_free_limit_bytes']}"
        " (the data and runtime directories' file systems)",
        "message store: {segments} message files, {live_entries} live entries; {syncs} syncs made "
        "{synced_records} records durable, {written_bytes} bytes written".format(**snap["store"]),
        "",
    ]
    lines.append(
        f"{'ROLE':<12}{'INDEX':>6}{'PID':>9}{'READY':>7}{'CONNS':>7}{'MQTT':>6}{'ARENA BYTES':>13}"
    )
    for p in snap["processes"]:
        lines.append(
            f"{p['role']:<12}{p.get('index', ''):>6}{p['pid']:>9}{'yes' if p['ready'] else 'no':>7}"
            f"{p['connections']:>7}{p.get('mqtt_connections', ''):>6}"
            f"{p.get('arena_used_bytes', ''):>13}"
        )
    lines += ["", f"{'QUEUE':<32}{'READY':>10}{'UNACKED':>10}{'CONSUMERS':>11}{'FLOW':>10}"]
    for q in snap["queues"]:
        lines.append(
            f"{q['name'][:31]:<32}{q['messages_ready']:>10}{q['messages_unacked']:>10}"
            f"{q['consumers']:>11}{q['flow'] if q['capacity'] else '':>10}"
        )
        if q["stream"] is not None:
            lines.append(
                "  stream: offsets {first_offset}..{last_offset}, {bytes} bytes in "
                "{segments} segments".format(**q["stream"])
            )
    return "\n".join(lines)


def main(runtime_dir: str, as_json: bool) -> int:
    path = os.path.join(runtime_dir, "shoal.shm")
    cluster = cluster_status(runtime_dir)
    try:
        seg = Segment.attach(path)
    except (OSError, ValueError) as exc:
        if cluster is None:
            print(f"shoal status: no running broker at {runtime_dir}: {exc}")
            return 1
        # A follower runs no broker: its cluster view is its status.
        text = cluster_control.render(cluster)
        print(json.dumps({"cluster": cluster}, indent=2) if as_json else text)
        return 0
    snap = snapshot(seg)
    if cluster is not None:
        snap["cluster"] = cluster
    text = render(snap) + ("\n" + cluster_control.render(cluster) if cluster is not None else "")
    print(json.dumps(snap, indent=2) if as_json else text)
    return 0


def query_consumers(runtime_dir: str, timeout: float = 10.0) -> dict[str, Any]:
    """Ask the scheduler's control socket (broker/scheduler/introspect.py)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        sock.connect(socket_path(runtime_dir))
        sock.sendall(b"consumers\n")
        chunks = []
        while chunk := sock.recv(1 << 16):
            chunks.append(chunk)
    answer: dict[str, Any] = json.loads(b"".join(chunks))
    return answer


def render_consumers(answer: dict[str, Any]) -> str:
    lines = []
    for q in answer["queues"]:
        extra = []
        if q["max_priority"]:
            extra.append(f"max priority {q['max_priority']}")
        if q["single_active_consumer"]:
            extra.append("single active consumer")
        lines.append(
            f"queue '{q['name']}' in vhost '{q['vhost']}': {q['messages_ready']} ready, "
            f"{q['messages_unacked']} unacked" + "".join(f", {e}" for e in extra)
        )
        if not q["consumers"]:
            lines.append("  (no consumers)")
            continue
        lines.append(
            f"  {'WORKER':>6} {'TAG':<24} {'STATE':<15}{'PRIO':>5} {'POINTER':>9}"
            f"{'CREDIT':>8}{'UNACKED':>9}  SELECTOR"
        )
        for c in q["consumers"]:
            state = c["state"] + ("*" if c.get("active") else "")
            pointer = c.get("pointer", "?")
            if isinstance(pointer, dict):  # one per priority level: the highest's
                pointer = f"p{max(pointer, key=int)}:{pointer[max(pointer, key=int)]}"
            credit = c.get("credit", "?")
            lines.append(
                f"  {c['worker']:>6} {str(c.get('tag', c['cid']))[:24]:<24} {state:<15}"
                f"{c.get('priority', ''):>5} {pointer:>9}"
                f"{'-' if credit is None else credit:>8}{c.get('unacked', '?'):>9}"
                f"  {c.get('selector') or ''}"
            )
            if c.get("offset") is not None:
                lines.append(f"{'':>9}stream offset {c['offset']}, lag {c.get('lag', '?')}")
    if answer["missing_workers"]:
        lines.append(f"no answer from workers {answer['missing_workers']}")
    return "\n".join(lines)


def consumers_main(runtime_dir: str, as_json: bool) -> int:
    try:
        answer = query_consumers(runtime_dir)
    except OSError as exc:
        print(f"shoal status: no scheduler answering at {runtime_dir}: {exc}")
        return 1
    print(json.dumps(answer, indent=2) if as_json else render_consumers(answer))
    return 0
