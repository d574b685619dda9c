"""What the web UI's polling costs the broker, measured directly: fresh
brokers of this tree, alternating with and without the UI's requests
(bench/ui_watch.py, 'api': the Overview and Queues pages every 5 s), the
same 1 -> 1 load (shoal.perf), and the CPU seconds each broker process
spent during the run.

    python bench/ui_cost.py [--pairs 6] [--duration 6]

bench/guard.py --ui api measures the same against the reference build;
this isolates the UI's share (same build both sides) and shows where its
CPU goes."""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import ui_watch  # noqa: E402
from bench.compare import perf_command  # noqa: E402
from tests.broker_process import Broker, free_port, wait_for  # noqa: E402

LOAD = ("--size", "64", "--prefetch", "500", "--multi-ack", "100")


def cpu_seconds(processes: list[psutil.Process]) -> dict[int, tuple[str, float]]:
    seen = {}
    for proc in processes:
        try:
            times = proc.cpu_times()
            seen[proc.pid] = (proc.name(), times.user + times.system)
        except psutil.Error:
            continue
    return seen


def one(with_ui: bool, duration: float) -> tuple[float, dict[str, float]]:
    management = free_port()
    scratch = Path(tempfile.mkdtemp(prefix="shoal-ui-cost-"))
    broker = Broker(scratch, 2, ("--management-port", str(management))).start()
    try:
        wait_for(lambda: ui_watch.listening(management), 20, "the management port")
        before = cpu_seconds(broker.family())
        command = perf_command(broker.url, LOAD, duration, 2.0)
        if with_ui:
            with ui_watch.watcher("api") as watch, watch(management):
                done = subprocess.run(command, capture_output=True, text=True, check=True)
        else:
            done = subprocess.run(command, capture_output=True, text=True, check=True)
        after = cpu_seconds(broker.family())
    finally:
        broker.stop()
        shutil.rmtree(scratch, ignore_errors=True)
    report: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    spent = {
        name.split(":")[1].split("(")[0].strip(): round(after[pid][1] - t, 2)
        for pid, (name, t) in before.items()
        if pid in after
    }
    return float(report["consumed_rate"]), spent


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--pairs", type=int, default=6)
    p.add_argument("--duration", type=float, default=6.0)
    opts = p.parse_args()
    rates: dict[bool, list[float]] = {True: [], False: []}
    for pair in range(opts.pairs):
        for with_ui in (True, False) if pair % 2 == 0 else (False, True):
            rate, spent = one(with_ui, opts.duration)
            rates[with_ui].append(rate)
            print(f"{'UI open' if with_ui else 'no UI  '} {rate:>10,.0f} msg/s  CPU s: {spent}")
    ui, none = statistics.median(rates[True]), statistics.median(rates[False])
    print(f"medians: UI open {ui:,.0f} msg/s, no UI {none:,.0f} msg/s, ratio {ui / none:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
