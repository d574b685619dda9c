"""What message deduplication costs a publish (issue 26): 1 producer -> 1
consumer, publisher confirms, runs alternating, each on a fresh broker.

    python bench/dedup.py --rounds 5 [--rabbitmq] [--persistent]

Variants (shoal.perf --dedup):

    off      plain messages to a plain queue (what every other benchmark runs)
    header   every message carries a unique x-deduplication-header, to a plain
             queue: the header alone (Shoal looks at it only for a cache)
    queue    the same messages to a queue declared x-message-deduplication:
             every publish is a check-and-insert in the shared cache

RabbitMQ 3.10 from Debian has no deduplication plugin: its rows are "off" and
"header" (the same load, so the same work for the client), for scale.

Prints a Markdown table of the medians (msg/s consumed, p99 confirm latency)
and each variant's median ratio to "off" of the same round, with the spread.
"""

from __future__ import annotations

import argparse
import datetime
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.compare import (  # noqa: E402
    perf_command,
    run_perf,
    started_rabbitmq,
    started_shoal,
)

VARIANTS = ("off", "header", "queue")


def consumed(report: dict[str, Any]) -> float | None:
    value = report.get("consumed_rate")
    return float(value) if value else None


def p99(report: dict[str, Any]) -> float | None:
    value = (report.get("confirm_latency_ms") or {}).get("p99")
    return float(value) if value else None


def one(uri: str, variant: str, opts: argparse.Namespace) -> dict[str, Any]:
    args = ["--producers", "1", "--consumers", "1", "--size", str(opts.size)]
    args += ["--confirm", "256", "--prefetch", "256", "--multi-ack", "32", "--dedup", variant]
    if opts.persistent:
        args.append("--persistent")
    report = run_perf(perf_command(uri, args, opts.duration, opts.warmup), opts.duration + 60)
    if report.get("fatal"):
        raise SystemExit(f"{variant}: {report.get('errors')}")
    # Unique keys: nothing may be dropped as a duplicate, nothing refused.
    if report.get("nacked") or report["consumed"] < report["published"] * 0.8:
        raise SystemExit(f"{variant}: messages lost: {report}")
    return report


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--duration", type=float, default=8.0)
    p.add_argument("--warmup", type=float, default=2.0)
    p.add_argument("--size", type=int, default=16)
    p.add_argument("--persistent", action="store_true")
    p.add_argument("--rabbitmq", action="store_true")
    opts = p.parse_args()
    runs: dict[str, list[dict[str, Any]]] = {}
    targets = [("Shoal", v) for v in VARIANTS]
    if opts.rabbitmq:
        targets += [("RabbitMQ", "off"), ("RabbitMQ", "header")]
    for round_no in range(opts.rounds):
        order = targets if round_no % 2 == 0 else list(reversed(targets))
        for broker, variant in order:
            if broker == "Shoal":
                with started_shoal(2, ()) as target:
                    assert target.uri is not None, target.unavailable
                    report = one(target.uri, variant, opts)
            else:
                with started_rabbitmq() as target:
                    assert target.uri is not None, target.unavailable
                    report = one(target.uri, variant, opts)
            runs.setdefault(f"{broker} {variant}", []).append(report)
            print(
                f"round {round_no + 1} {broker} {variant}: {consumed(report) or 0:.0f} msg/s, "
                f"p99 {p99(report) or 0:.2f} ms",
                flush=True,
            )
            time.sleep(1)
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    print()
    print(
        f"{datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC, {platform.node()}, "
        f"commit {commit}, {opts.rounds} rounds, 1 -> 1, confirms, {opts.size} B"
        + (", persistent" if opts.persistent else "")
    )
    print()
    print("| broker, variant | msg/s (median) | ratio to off (spread) | p99 confirm ms |")
    print("|---|---:|---:|---:|")
    for name, reports in runs.items():
        broker = name.split()[0]
        base = runs[f"{broker} off"]
        ratios = [
            a / b
            for r, o in zip(reports, base, strict=True)
            if (a := consumed(r)) and (b := consumed(o))
        ]
        rates = [c for r in reports if (c := consumed(r))]
        lat = [v for r in reports if (v := p99(r))]
        cell = (
            f"{statistics.median(ratios):.2f} ({min(ratios):.2f}..{max(ratios):.2f})"
            if ratios
            else "-"
        )
        print(
            f"| {name} | {statistics.median(rates):.0f} | {cell} | "
            f"{statistics.median(lat) if lat else 0:.2f} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
