"""CPU microseconds per message per stage, in the IO workers of a live broker.

    python bench/stages.py                         # this tree's broker (the installed shoal)
    python bench/stages.py --build fdfec91         # a commit, installed by bench/guard.py
    python bench/stages.py --load confirm --seconds 8 --raw out/

A fresh broker (`--workers 2`) carries a `shoal perf` load (1 -> 1, 64 B,
prefetch 500, multi-ack 100; `--load confirm` adds confirms, window 200);
while it runs, py-spy samples every IO worker and psutil reads their CPU
time over the same window. The messages consumed in that window divide the
CPU time, and each stage gets its share of the samples: a sample belongs to
the innermost frame on its stack that a STAGES rule names (else "event loop,
syscalls, other"). Stages are named by function, so the same table reads
the same at any commit whose functions kept their names; the rules list the
old names too.

py-spy comes from PyPI (`pip install py-spy`); it samples from outside the
process (ptrace-free on Linux with --nonblocking), so the workers run as in
production.
"""

from __future__ import annotations

import argparse
import collections
import json
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.compare import perf_command  # noqa: E402
from bench.guard import Build, install, started  # noqa: E402

LOADS = {
    "1to1": ("--size", "64", "--prefetch", "500", "--multi-ack", "100"),
    "confirm": ("--size", "64", "--confirm", "200", "--prefetch", "500", "--multi-ack", "100"),
    "4to4": ("--producers", "4", "--consumers", "4", "--size", "64", "--prefetch", "500",
             "--multi-ack", "100"),
    "persist": ("--size", "64", "--persistent", "--confirm", "200", "--prefetch", "500",
                "--multi-ack", "100"),
}  # fmt: skip

# (stage, function names): the innermost matching frame of a sample names its
# stage. Names are py-spy's "Class.method (file)" without the line; a rule
# matches a function name exactly or, ending in ".", a prefix.
STAGES: list[tuple[str, tuple[str, ...]]] = [
    (
        "stats and metrics",
        (
            "Stats.",
            "WorkerStats.",
            "Ticker.",
            "flush_stats",
            "_stats_tick",
            "report_stats",
            "sample_memory",
            "_tick",
        ),
    ),
    (
        "permission check",
        (
            "Access.",
            "ConnectionAccess.",
            "PublishAccess.",
            "may_publish",
            "check_publish",
            "check_user_id",
        ),
    ),
    (
        "route",
        (
            "Publisher._route",
            "Publishing._route",
            "Channel._route",
            "Routes.",
            "RouteCache.",
            "QueueCatalog.lookup",
            "SharedQueues.lookup",
            "Catalog.lookup",
            "reply_to.rewrite",
            "rewrite",
            "sender_selected",
            "Exchanges.",
        ),
    ),
    (
        "persist or page out decision",
        (
            "to_store",
            "times_for",
            "Pager.",
            "records.",
            "reserve",
            "Persister.",
            "Persist.",
            "Streams.refresh",
            "StreamWaits.",
            "MessageStore.",
        ),
    ),
    (
        "notify (wake-ups, scheduler IPC)",
        (
            "Waker.",
            "Link.",
            "Worker._notify",
            "Worker._on_scheduler_message",
            "wake",
            "Notifier.",
            "update_interest",
        ),
    ),
    (
        "ack / settle",
        (
            "DeliveryBook.acknowledge",
            "DeliveryBook.settle",
            "DeliveryBook._finish",
            "Delivery._acknowledge",
            "Delivery._settle",
            "Delivery._finish",
            "SharedQueues.ack",
            "SharedQueues.settle",
            "Channel._on_ack",
            "decode_ack",
            "Arena.free",
            "free_message",
            "release_generation",
            "QueueTable.release_generation",
            "_on_ack",
            "settle",
        ),
    ),
    (
        "deliver (acquire, build, write)",
        (
            "pull",
            "DeliveryBook.",
            "Delivery.",
            "Consumer.",
            "encode_deliver",
            "encode_content",
            "SharedQueues.acquire",
            "read_message",
            "Connection.flush",
            "deliver",
        ),
    ),
    (
        "append (arena, queue log)",
        (
            "Ingest.put",
            "Publisher.append",
            "Publisher._complete",
            "Publishing._append",
            "Publishing._complete",
            "SharedQueues.enqueue",
            "SharedQueues.append",
            "Arena.alloc",
            "write_message",
            "release_hold",
            "message_size",
            "Channel._append",
            "Channel._complete",
            "_append",
            "_complete",
            "fast_publish",
            "Publisher.fast_publish",
            "Publishing.fast_publish",
            "Channel.fast_publish",
        ),
    ),
    (
        "read and parse frames",
        (
            "FrameReader.",
            "Connection.data_received",
            "Connection._data_received",
            "Connection._dispatch",
            "decode_publish",
            "decode_content_header",
            "_shortstr",
            "properties_ok",
            "Channel.handle",
            "_on_channel_frame",
            "Connection._on_channel_frame",
        ),
    ),
]
OTHER = "event loop, syscalls, other"


def stage_of(frames: list[str]) -> str:
    for frame in reversed(frames):
        name = frame.split(" (", 1)[0]
        short = name.rsplit(".", 1)[-1]
        for stage, rules in STAGES:
            for rule in rules:
                if rule.endswith("."):
                    if name.startswith(rule):
                        return stage
                elif name == rule or short == rule:
                    return stage
    return OTHER


def workers_of(port: int) -> list[psutil.Process]:
    """The IO workers of the broker on `port` (their titles say so: setproctitle)."""
    out = []
    for proc in psutil.process_iter(["cmdline"]):
        title = " ".join(proc.info["cmdline"] or [])
        if "io-worker" in title and f"(port {port})" in title:
            out.append(proc)
    return out


def measure(build: Build, load: str, seconds: float, raw: Path | None) -> dict[str, Any]:
    warmup = 2.0
    with started(build, 2) as uri:
        port = int(uri.rsplit(":", 1)[1].strip("/"))
        workers = workers_of(port)
        cmd = perf_command(uri, LOADS[load], seconds + 2.0, warmup)
        perf = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, text=True)
        time.sleep(warmup + 1.0)  # into perf's measured window (bounded by perf's own)
        tmp = Path(tempfile.mkdtemp(prefix="shoal-stages-"))
        cpu0 = {w.pid: sum(w.cpu_times()[:2]) for w in workers}
        spies = [
            subprocess.Popen(
                [
                    shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy"),
                    "record",
                    "-p",
                    str(w.pid),
                    "-d",
                    str(int(seconds)),
                    "-r",
                    "250",
                    "-f",
                    "raw",
                    "--nonblocking",
                    "-o",
                    str(tmp / f"{w.pid}.txt"),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            for w in workers
        ]
        t0 = time.monotonic()
        for spy in spies:
            spy.wait(seconds + 30)
        elapsed = time.monotonic() - t0
        cpu = {w.pid: sum(w.cpu_times()[:2]) - cpu0[w.pid] for w in workers}
        out, _ = perf.communicate(timeout=seconds + 60)
        result = json.loads(out.strip().splitlines()[-1])
    rate = float(result["consumed_rate"])
    messages = rate * elapsed
    stages: dict[str, float] = collections.defaultdict(float)
    per_worker = {}
    for w in workers:
        path = tmp / f"{w.pid}.txt"
        counts: dict[str, int] = collections.Counter()
        total = 0
        if path.exists():
            for line in path.read_text().splitlines():
                if not line.strip():
                    continue
                stack, n = line.rsplit(" ", 1)
                counts[stage_of(stack.split(";"))] += int(n)
                total += int(n)
        if raw is not None and path.exists():
            raw.mkdir(parents=True, exist_ok=True)
            shutil.copy(path, raw / f"{build.commit}-{load}-worker{w.pid}.txt")
        us = cpu[w.pid] / messages * 1e6
        per_worker[w.pid] = us
        for stage, n in counts.items():
            stages[stage] += us * n / max(total, 1)
    shutil.rmtree(tmp, ignore_errors=True)
    return {"rate": rate, "stages": dict(stages), "workers_us": per_worker}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--build", action="append", default=[], help='commit or "tree"; repeatable')
    p.add_argument("--load", default="1to1", choices=sorted(LOADS))
    p.add_argument("--seconds", type=float, default=8.0)
    p.add_argument("--rounds", type=int, default=1, help="alternating; the table has medians")
    p.add_argument("--raw", type=Path, default=None, help="keep py-spy's raw samples here")
    opts = p.parse_args()
    builds = [Build(ref, ref) for ref in (opts.build or ["tree"])]
    for build in builds:
        install(build)
    results: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
    for _ in range(opts.rounds):
        for build in builds:
            results[build.commit].append(measure(build, opts.load, opts.seconds, opts.raw))
    names = [*[s for s, _ in STAGES][::-1], OTHER]
    head = "| stage | " + " | ".join(f"{b.commit} µs/msg" for b in builds) + " |"
    print(head)
    print("|---|" + "---:|" * len(builds))

    def med(values: list[float]) -> float:
        values = sorted(values)
        return values[len(values) // 2]

    for name in names:
        cells = [f"{med([r['stages'].get(name, 0.0) for r in results[b.commit]]):.2f}"
                 for b in builds]  # fmt: skip
        print(f"| {name} | " + " | ".join(cells) + " |")
    totals = [f"{med([sum(r['stages'].values()) for r in results[b.commit]]):.2f}" for b in builds]
    print("| **total (both workers)** | " + " | ".join(totals) + " |")
    rates = [f"{med([r['rate'] for r in results[b.commit]]):,.0f}" for b in builds]
    print("| consumed msg/s | " + " | ".join(rates) + " |")
    return 0


if __name__ == "__main__":
    threading.excepthook = lambda args: None
    sys.exit(main())
