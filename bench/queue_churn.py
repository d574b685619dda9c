"""Queue churn: what a queue's life costs a client, as RPC clients and MQTT
sessions live it (a reply queue per call, a queue per subscription).

Each cycle, on one pika connection: queue.declare (server-named, exclusive),
queue.bind to amq.topic, basic.consume, basic.cancel, queue.delete. Per
method the median and p90 of its round trip over --cycles cycles, after
--warmup unmeasured ones; the brokers side by side in one run (Shoal, LavinMQ,
RabbitMQ, each fresh, started once), rounds alternating their order.

Shoal runs with its default --max-queues unless --shoal-args says otherwise
(`--shoal-args "--max-queues 65536"`: a broker sized for many sessions).

    python bench/queue_churn.py [--brokers shoal,lavinmq,rabbitmq] [--cycles 500] [--rounds 3]
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import pika

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare import machine_info, shoal_revision
from peers import Broker, add_lavinmq_tools_argument, start_brokers

METHODS = ("declare", "bind", "consume", "cancel", "delete")


def churn(uri: str, cycles: int, warmup: int) -> dict[str, list[float]]:
    """The round trips of `cycles` measured cycles, in seconds, by method."""
    conn = pika.BlockingConnection(pika.URLParameters(uri))
    try:
        ch = conn.channel()
        times: dict[str, list[float]] = {m: [] for m in METHODS}
        for i in range(warmup + cycles):
            t0 = time.perf_counter()
            queue = ch.queue_declare("", exclusive=True).method.queue
            t1 = time.perf_counter()
            ch.queue_bind(queue, "amq.topic", routing_key=f"churn.{i}")
            t2 = time.perf_counter()
            tag = ch.basic_consume(queue, lambda *_: None, auto_ack=True)
            t3 = time.perf_counter()
            ch.basic_cancel(tag)
            t4 = time.perf_counter()
            ch.queue_delete(queue)
            t5 = time.perf_counter()
            if i >= warmup:
                for method, (a, b) in zip(
                    METHODS, ((t0, t1), (t1, t2), (t2, t3), (t3, t4), (t4, t5)), strict=True
                ):
                    times[method].append(b - a)
        return times
    finally:
        with contextlib.suppress(Exception):
            conn.close()


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))]


def report(results: dict[str, list[dict[str, list[float]]]], opts: argparse.Namespace) -> str:
    lines = [
        f"queue churn, {opts.cycles} cycles x {opts.rounds} rounds "
        f"({datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC, Shoal {shoal_revision()}"
        + (f", Shoal with `{opts.shoal_args}`" if opts.shoal_args else "")
        + ")",
        *machine_info(),
        "",
        "| broker | " + " | ".join(f"{m} p50 / p90 µs" for m in METHODS) + " | cycle p50 µs |",
        "|---|" + "---|" * (len(METHODS) + 1),
    ]
    for name, rounds in results.items():
        cells = []
        for method in METHODS:
            values = [v for r in rounds for v in r[method]]
            cells.append(f"{quantile(values, 0.5) * 1e6:.0f} / {quantile(values, 0.9) * 1e6:.0f}")
        cycle = [sum(r[m][i] for m in METHODS) for r in rounds for i in range(len(r[METHODS[0]]))]
        per_round = [
            statistics.median(sum(r[m][i] for m in METHODS) for i in range(len(r[METHODS[0]])))
            for r in rounds
        ]
        cells.append(
            f"{quantile(cycle, 0.5) * 1e6:.0f} (rounds "
            + ", ".join(f"{v * 1e6:.0f}" for v in per_round)
            + ")"
        )
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--brokers", default="shoal,lavinmq,rabbitmq", help="comma list")
    p.add_argument("--cycles", type=int, default=500, help="measured cycles per round")
    p.add_argument("--warmup", type=int, default=50, help="unmeasured cycles per round")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--workers", type=int, default=2, help="Shoal IO workers (default 2)")
    p.add_argument("--shoal-args", default="", help="extra arguments for Shoal")
    add_lavinmq_tools_argument(p)
    opts = p.parse_args()
    keys = [k for k in opts.brokers.split(",") if k]
    with contextlib.ExitStack() as stack:
        brokers: list[Broker] = start_brokers(stack, keys, opts)
        live = [b for b in brokers if b.target.uri]
        results: dict[str, list[dict[str, Any]]] = {b.name: [] for b in live}
        for round_no in range(opts.rounds):
            order = live[round_no % len(live) :] + live[: round_no % len(live)] if live else []
            for broker in order:
                times = churn(broker.target.uri, opts.cycles, opts.warmup)
                results[broker.name].append(times)
                cycle = statistics.median(
                    sum(times[m][i] for m in METHODS) for i in range(opts.cycles)
                )
                print(
                    f"round {round_no} {broker.name}: cycle p50 {cycle * 1e6:.0f} µs",
                    file=sys.stderr,
                )
        for broker in brokers:
            if not broker.target.uri:
                print(f"{broker.name}: not measured: {broker.target.unavailable}", file=sys.stderr)
    print(report(results, opts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
