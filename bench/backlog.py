"""A backlog far larger than memory: Shoal's paging files beside RabbitMQ (issue 13).

One producer publishes `--count` messages of `--size` bytes (transient, with
confirms, window 200) to a queue with no consumer, then one consumer drains
it (prefetch 500, multi-ack 100). Shoal runs with `--arena-mb` per IO
worker (2 x 128 MiB: 256 MiB of arenas by default); RabbitMQ 3.10 with its
defaults, in the same run. Reports publish and drain rates, the broker's
peak memory (Shoal: the proportional set size of all its processes, shared
memory counted once, and apart the pages its shared-memory segment holds;
RabbitMQ: the resident size of its beam.smp) and the peak disk use of its
data directory.

    python bench/backlog.py --count 10000000

Prints a markdown report (docs/benchmarks.md keeps it by hand).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pika
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare import machine_info, perf_command, run_perf, shoal_revision
from persistent import Rabbit, Shoal, du, ready_count

QUEUE = "backlog"


class Peak:
    """Samples a broker's memory and disk use every second."""

    def __init__(self, memory: Any, disk: Any, shared: Any) -> None:
        self.memory, self.disk, self.shared = memory, disk, shared
        self.max_memory = self.max_disk = self.max_shared = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Peak:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join(30)

    def _run(self) -> None:
        while not self._stop.wait(1.0):
            with contextlib.suppress(psutil.Error, OSError):
                self.max_memory = max(self.max_memory, self.memory())
                self.max_disk = max(self.max_disk, self.disk())
                self.max_shared = max(self.max_shared, self.shared())


def shoal_memory(shoal: Shoal) -> int:
    assert shoal.proc is not None
    root = psutil.Process(shoal.proc.pid)
    total = 0
    for p in [root, *root.children(recursive=True)]:
        with contextlib.suppress(psutil.NoSuchProcess):
            total += p.memory_full_info().pss
    return total


def shoal_shared(shoal: Shoal) -> int:
    """Bytes of shared memory the broker's segment holds (pages allocated)."""
    return os.stat(os.path.join(shoal.runtime, "shoal.shm")).st_blocks * 512


def fmt_mib(value: int) -> str:
    return f"{value / 2**20:,.0f}" if value else "-"


def rabbit_memory(rabbit: Rabbit) -> int:
    pid = int((rabbit.base / "rabbit.pid").read_text().strip())
    return int(psutil.Process(pid).memory_info().rss)


def declare(uri: str) -> None:
    """The queue, not durable (as perf declares it without --persistent)."""
    conn = pika.BlockingConnection(pika.URLParameters(uri))
    try:
        conn.channel().queue_declare(QUEUE)
    finally:
        conn.close()


def get_rest(uri: str) -> float:
    """Take what is left with basic.get (no-ack); returns the seconds taken."""
    started = time.monotonic()
    conn = pika.BlockingConnection(pika.URLParameters(uri))
    try:
        ch = conn.channel()
        while ch.basic_get(QUEUE, auto_ack=True)[0] is not None:
            pass
    finally:
        conn.close()
    return time.monotonic() - started


def run_phase(uri: str, args: tuple[str, ...], want: Any, have: Any, slice_s: float) -> float:
    """Run perf in slices until `want(have())`; returns the seconds taken."""
    started = time.monotonic()
    while not want(have()):
        run_perf(perf_command(uri, args, slice_s, 0), slice_s + 300)
    return time.monotonic() - started


def measure(
    name: str, target: Any, memory: Any, disk: Any, shared: Any, opts: argparse.Namespace
) -> str:
    have = lambda: ready_count(target.uri, QUEUE)  # noqa: E731
    declare(target.uri)
    base_disk = disk()
    common = ("--queue", QUEUE, "--size", str(opts.size))
    fill_args = ("--producers", "1", "--consumers", "0", "--confirm", "200", *common)
    drain_args = (
        "--producers", "0", "--consumers", "1", "--prefetch", "500", "--multi-ack", "100",
        *common,
    )  # fmt: skip
    with Peak(memory, lambda: disk() - base_disk, shared) as peak:
        fill_s = run_phase(target.uri, fill_args, lambda n: n >= opts.count, have, opts.slice)
        backlog = have()
        drain_s = run_phase(target.uri, drain_args, lambda n: n < 1000, have, opts.slice)
        drain_s += get_rest(target.uri)  # perf acks every 100th: the tail by basic.get
    line = (
        f"| {name} | {backlog:,} | {backlog / fill_s:,.0f} | {backlog / drain_s:,.0f} "
        f"| {peak.max_memory / 2**20:,.0f} | {fmt_mib(peak.max_shared)} "
        f"| {peak.max_disk / 2**30:,.1f} |"
    )
    print(line, file=sys.stderr, flush=True)
    return line


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--count", type=int, default=10_000_000)
    p.add_argument("--size", type=int, default=1024)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--shoal-args", default="--arena-mb 128")
    p.add_argument("--slice", type=float, default=30.0, help="seconds per perf run")
    p.add_argument("--no-rabbitmq", action="store_true")
    opts = p.parse_args(argv)
    shoal = Shoal(opts.workers, shlex.split(opts.shoal_args))
    rabbit = None if opts.no_rabbitmq else Rabbit()
    try:
        shoal.start()
        command = shlex.join(["bench/backlog.py", *(argv or sys.argv[1:])])
        lines = [
            f"{time.strftime('%Y-%m-%d')}, Shoal at {shoal_revision()} ({opts.workers} IO "
            f"workers, `{opts.shoal_args}`), `python {command}`.",
            "",
            *machine_info(),
            "",
            "| broker | backlog (messages) | publish msg/s (confirms) | drain msg/s "
            "| peak memory (MiB) | of it shared memory (MiB) | peak disk (GiB) |",
            "|---|---:|---:|---:|---:|---:|---:|",
            measure(
                "Shoal",
                shoal,
                lambda: shoal_memory(shoal),
                lambda: du(shoal.data),
                lambda: shoal_shared(shoal),
                opts,
            ),
        ]
        shoal.stop()
        if rabbit is not None:
            rabbit.start()
            lines.append(
                measure(
                    "RabbitMQ",
                    rabbit,
                    lambda: rabbit_memory(rabbit),
                    lambda: rabbit.data_bytes(),
                    lambda: 0,
                    opts,
                )
            )
        print("\n".join(lines))
    finally:
        shoal.stop()
        if rabbit is not None:
            rabbit.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
