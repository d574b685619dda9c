"""The fuzzing benchmark (issue 16, item 8): perf/fuzz.py's mutated and
random frames, at least 1M of them, from many connections at once, against
a broker started here, while a bystander publishes and consumes with
confirms. Reported: frames and time, whether any broker process died or
was replaced (crashes), whether the bystander was disturbed or lost a
message, and the IO workers' memory before, at the end, and after the
fuzzers are gone (back to baseline). docs/benchmarks.md has the numbers.

    python bench/fuzz.py [--frames 1000000] [--connections 32] [--workers 2]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from typing import Any

import psutil
from persistent import Shoal

from shoal.broker.operate.status import snapshot
from shoal.perf.fuzz import Bystander, fuzz


def processes(broker: Shoal) -> dict[str, int]:
    """role/index -> pid, from the broker's process table."""
    broker.counters()  # attaches the segment
    assert broker._seg is not None
    return {
        f"{p['role']}/{p.get('index', 0)}": p["pid"]
        for p in snapshot(broker._seg)["processes"]
        if p["pid"]
    }


def worker_rss_mb(pids: dict[str, int]) -> float:
    """The IO workers' own memory: resident pages less the shared segment's
    (RSS counts the pages of the shared-memory segment a worker has touched,
    which grow as its arena's allocation cursor moves on and are the arena's
    to give back, not a leak): RssAnon, the Python heap and native memory."""
    total = 0
    for name, pid in pids.items():
        if name.startswith("io-worker"):
            info = psutil.Process(pid).memory_info()
            total += info.rss - info.shared
    return round(total / 2**20, 1)


def worker_segment_mb(pids: dict[str, int]) -> float:
    """The shared segment's pages the IO workers have resident (summed)."""
    total = sum(
        psutil.Process(pid).memory_info().shared
        for name, pid in pids.items()
        if name.startswith("io-worker")
    )
    return round(total / 2**20, 1)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--frames", type=int, default=1_000_000)
    p.add_argument("--connections", type=int, default=32)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--rounds", type=int, default=1, help="runs of --frames in the same broker")
    ns = p.parse_args()
    broker = Shoal(ns.workers, [])
    broker.start()
    try:
        before = processes(broker)
        rss_before = worker_rss_mb(before)
        bystander = Bystander("127.0.0.1", broker.port)
        bystander.start()
        started = time.monotonic()
        rss_rounds = []
        for round_no in range(ns.rounds):
            stats = asyncio.run(
                fuzz("127.0.0.1", broker.port, ns.frames, ns.connections, ns.seed + round_no)
            )
            rss_rounds.append(worker_rss_mb(before))
        elapsed = time.monotonic() - started
        rss_end = rss_rounds[-1]
        bystander.stop.set()
        bystander.join(60)
        time.sleep(2)  # the last connections' close handshakes and lingers
        after = processes(broker)
        report: dict[str, Any] = {
            "frames": stats.frames * ns.rounds,
            "worker_rss_mb_after_each_round": rss_rounds,
            "connections": stats.connections,
            "seconds": round(elapsed, 1),
            "frames_per_second": round(stats.frames * ns.rounds / elapsed),
            "processes_replaced": sorted(k for k in before if after.get(k) != before[k]),
            "bystander_messages": bystander.sent,
            "bystander": bystander.verdict() or "undisturbed, every message once, in order",
            "worker_rss_mb": {"before": rss_before, "end": rss_end, "after": worker_rss_mb(after)},
            "worker_segment_pages_mb": worker_segment_mb(after),
            "broker_log_errors": sum(
                1
                for line in (broker.base / "broker.log").read_text(errors="replace").splitlines()
                if " ERROR " in line or "Traceback" in line
            ),
        }
    finally:
        broker.stop()
    print(json.dumps(report, indent=2))
    return 1 if report["processes_replaced"] or bystander.verdict() else 0


if __name__ == "__main__":
    raise SystemExit(main())
