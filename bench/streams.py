"""Stream queues: Shoal beside RabbitMQ's streams over AMQP 0-9-1 (issue 14).

For each broker, in the same run: publish rate into a stream (1 producer,
confirms window 200, 100-byte bodies), then the consume rate of 1 consumer
reading the stream from its first offset, and of 10 consumers started at
offsets spread over the stream (each reads from its own place; none
removes anything). `shoal perf --stream` does the work for both.

    python bench/streams.py --duration 10

Prints a markdown table (docs/benchmarks.md keeps it by hand).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare import machine_info, perf_command, run_perf
from persistent import Rabbit, Shoal


def scenarios(uri: str, queue: str, opts: argparse.Namespace) -> dict[str, float]:
    base = ("--stream", "--queue", queue, "--size", str(opts.size))
    timeout = opts.duration * 6 + 120
    rates: dict[str, float] = {}
    publish: dict[str, Any] = run_perf(
        perf_command(
            uri,
            (*base, "--producers", "1", "--consumers", "0", "--confirm", "200"),
            opts.duration,
            1,
        ),
        timeout,
    )
    rates["publish"] = float(publish.get("published_rate") or 0)
    backlog = int(rates["publish"] * opts.duration)
    for consumers in (1, 10):
        offset = "first" if consumers == 1 else f"spread:{max(1, backlog)}"
        report = run_perf(
            perf_command(
                uri,
                (
                    *base,
                    *("--producers", "0", "--consumers", str(consumers)),
                    *("--stream-offset", offset, "--prefetch", "1000", "--multi-ack", "100"),
                ),
                min(opts.duration, 5),
                0.5,
            ),
            timeout,
        )
        rates[f"consume{consumers}"] = float(report.get("consumed_rate") or 0)
    return rates


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--duration", type=float, default=10.0)
    p.add_argument("--size", type=int, default=100)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--no-rabbitmq", action="store_true")
    opts = p.parse_args(argv)
    results: dict[str, dict[str, float]] = {}
    shoal = Shoal(opts.workers, ())
    try:
        shoal.start()
        results["Shoal"] = scenarios(shoal.uri, "bench-stream", opts)
    finally:
        shoal.stop()
    if not opts.no_rabbitmq:
        rabbit = Rabbit()
        try:
            rabbit.start()
            results["RabbitMQ 3.10"] = scenarios(rabbit.uri, "bench-stream", opts)
        finally:
            rabbit.stop()
    print("\n".join(machine_info()) + f"\n- Shoal IO workers: {opts.workers}\n")
    print("| broker | publish (confirms) | 1 consumer | 10 consumers (all together) |")
    print("| --- | ---: | ---: | ---: |")
    for name, r in results.items():
        print(
            f"| {name} | {r['publish']:,.0f} msg/s | {r['consume1']:,.0f} msg/s "
            f"| {r['consume10']:,.0f} msg/s |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
