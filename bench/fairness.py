"""Fairness under load: how evenly one queue's identical consumers share its messages.

N consumer processes, each a pika ``BlockingConnection`` with ``basic.qos`` prefetch
10 that acknowledges every message on its own, consume one queue while the main
process publishes M small messages into it (one pika ``BlockingConnection``). Each
run counts the messages each consumer got; its share is that count over M (a fair
share is 1/N). The report gives, per run, the least and the greatest share, and over
all runs the least, the median and the greatest share of any consumer, and the
standard deviation of the shares.

    python bench/fairness.py --start-shoal --consumers 4 --runs 20
    python bench/fairness.py --start-shoal --consumers 16 --runs 20 --load 3
    python bench/fairness.py --uri amqp://guest:guest@127.0.0.1:5672/ --consumers 4

``--start-shoal`` runs a broker on a free port for the duration (``--workers`` IO
workers, default 2); ``--uri`` targets a running broker (RabbitMQ, say). ``--load N``
adds CPU contention that is the same for every broker: N processes, each busy 5 ms
then asleep 2 ms, for as long as the runs last. ``--json`` prints every run's counts
as one JSON object instead of the table.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import multiprocessing
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pika
import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.compare import started_rabbitmq  # noqa: E402
from shoal.broker.cli import local_command  # noqa: E402
from shoal.broker.scheduler.notify import SWEEP_INTERVAL  # noqa: E402
from shoal.shm import stats  # noqa: E402
from shoal.shm.segment import Segment  # noqa: E402

PREFETCH = 10
BODY_SIZE = 32  # the message's number in publish order, zero-padded
RUN_TIMEOUT_S = 300.0  # one run: every message consumed within this, or the run fails
START_TIMEOUT_S = 30.0
LOAD_BUSY_S = 0.005
LOAD_IDLE_S = 0.002


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def amqp_ready(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2.0) as sock:
            sock.sendall(b"AMQP\x00\x00\x09\x01")
            return sock.recv(1)[:1] == b"\x01"
    except OSError:
        return False


class BrokerWatch:
    """What the Shoal we started has used so far: CPU seconds (all its
    processes) and scheduler notifications (consumer turns)."""

    def __init__(self, pid: int, runtime: str) -> None:
        self.root = psutil.Process(pid)
        self.seg = Segment.attach(os.path.join(runtime, "shoal.shm"))

    def cpu(self) -> float:
        total = 0.0
        for p in [self.root, *self.root.children(recursive=True)]:
            with contextlib.suppress(psutil.Error):
                t = p.cpu_times()
                total += t.user + t.system
        return total

    def notifications(self) -> int:
        # The scheduler publishes its counters once a second (SWEEP_INTERVAL).
        time.sleep(SWEEP_INTERVAL + 0.1)
        return stats.totals(self.seg)[stats.NOTIFICATIONS]


@contextlib.contextmanager
def started_shoal(workers: int) -> Iterator[tuple[str, BrokerWatch]]:
    port = free_port()
    runtime = tempfile.mkdtemp(prefix="shoal-fairness-")
    cmd = local_command(port, workers, runtime)
    with open(Path(runtime) / "broker.log", "wb") as log:
        proc = subprocess.Popen(
            cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not amqp_ready(port):
            if proc.poll() is not None or time.monotonic() > deadline:
                tail = (Path(runtime) / "broker.log").read_text(errors="replace")[-2000:]
                raise SystemExit(f"Shoal did not start:\n{tail}")
            time.sleep(0.1)
        yield f"amqp://guest:guest@127.0.0.1:{port}/", BrokerWatch(proc.pid, runtime)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            pass
        # The broker's children share its session; make sure none outlives it.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        if proc.poll() is None:
            proc.wait(5)
        shutil.rmtree(runtime, ignore_errors=True)


def _hog(stop: Any) -> None:
    while not stop.is_set():
        until = time.perf_counter() + LOAD_BUSY_S
        while time.perf_counter() < until:
            pass
        time.sleep(LOAD_IDLE_S)


@contextlib.contextmanager
def cpu_load(processes: int) -> Iterator[None]:
    """`processes` processes that compete for the CPU while the block runs."""
    ctx = multiprocessing.get_context("fork")
    stop = ctx.Event()
    hogs = [ctx.Process(target=_hog, args=(stop,), daemon=True) for _ in range(processes)]
    for p in hogs:
        p.start()
    try:
        yield
    finally:
        stop.set()
        for p in hogs:
            p.join(5)
            if p.is_alive():
                p.kill()
                p.join(5)


def consume(
    uri: str,
    queue: str,
    index: int,
    counts: Any,
    owners: Any,
    workers: Any,
    cpu: Any,
    ready: Any,
    stop: Any,
    cpu_clock: Callable[[], float],
) -> None:
    """One consumer: its own pika connection, prefetch 10, one basic.ack per message."""
    conn = pika.BlockingConnection(pika.URLParameters(uri))
    workers[index] = int((conn._impl.server_properties or {}).get("shoal_worker", -1))
    channel = conn.channel()
    channel.basic_qos(prefetch_count=PREFETCH)

    def on_message(ch: Any, method: Any, _props: Any, body: bytes) -> None:
        owners[int(body)] = index
        counts[index] += 1
        ch.basic_ack(method.delivery_tag)

    channel.basic_consume(queue, on_message)
    ready.release()
    try:
        while not stop.is_set():
            conn.process_data_events(time_limit=0.05)
    finally:
        cpu[index] = cpu_clock()
        with contextlib.suppress(Exception):
            conn.close()


def consumer_process(*args: Any) -> None:
    """One consumer per process (the OS shares the CPU between them)."""
    consume(*args, cpu_clock=time.process_time)


def consumer_threads(first: int, threads: int, *args: Any) -> None:
    """Several consumers as threads of one process, as an application with a
    thread pool runs them: the GIL shares one CPU between them, so a thread
    handed a burst keeps it while the others wait."""
    uri, queue, counts, owners, workers, cpu, ready, stop = args
    pool = [
        threading.Thread(
            target=consume,
            args=(uri, queue, first + i, counts, owners, workers, cpu, ready, stop),
            kwargs={"cpu_clock": time.thread_time},
            daemon=True,
        )
        for i in range(threads)
    ]
    for t in pool:
        t.start()
    for t in pool:
        t.join()


def one_run(uri: str, consumers: int, messages: int, threads: bool = False) -> dict[str, Any]:
    ctx = multiprocessing.get_context("fork")
    queue = f"fairness-{uuid.uuid4().hex[:8]}"
    admin = pika.BlockingConnection(pika.URLParameters(uri))
    publisher_worker = int((admin._impl.server_properties or {}).get("shoal_worker", -1))
    channel = admin.channel()
    channel.queue_declare(queue)
    # One writer per slot: no lock needed.
    counts = ctx.Array("q", consumers, lock=False)
    owners = ctx.Array("i", messages, lock=False)  # which consumer got message n
    workers = ctx.Array("q", consumers, lock=False)
    cpu = ctx.Array("d", consumers, lock=False)
    ready = ctx.Semaphore(0)
    stop = ctx.Event()
    if threads:  # every consumer a thread of one process
        procs = [
            ctx.Process(
                target=consumer_threads,
                args=(0, consumers, uri, queue, counts, owners, workers, cpu, ready, stop),
                daemon=True,
            )
        ]
    else:
        procs = [
            ctx.Process(
                target=consumer_process,
                args=(uri, queue, i, counts, owners, workers, cpu, ready, stop),
                daemon=True,
            )
            for i in range(consumers)
        ]
    for p in procs:
        p.start()
    try:
        for _ in range(consumers):
            if not ready.acquire(timeout=START_TIMEOUT_S):
                raise RuntimeError("a consumer did not start")
        started = time.monotonic()
        for n in range(messages):
            channel.basic_publish("", queue, b"%0*d" % (BODY_SIZE, n))
        deadline = started + RUN_TIMEOUT_S
        while sum(counts) < messages:
            if time.monotonic() > deadline:
                raise RuntimeError(f"only {sum(counts)} of {messages} consumed")
            admin.process_data_events(time_limit=0.01)
        elapsed = time.monotonic() - started
    finally:
        stop.set()
        for p in procs:
            p.join(10)
            if p.is_alive():
                p.kill()
                p.join(5)
        with contextlib.suppress(Exception):
            channel.queue_delete(queue)
            admin.close()
    return {
        "counts": list(counts),
        "workers": list(workers),
        "publisher_worker": publisher_worker,
        "cpu_s": [round(c, 3) for c in cpu],
        "seconds": round(elapsed, 3),
        "mean_run": mean_run(list(owners)),
    }


def mean_run(owners: list[int]) -> float:
    """The mean length of the runs of consecutive messages (in publish order)
    that went to one consumer: 1.0 when every message went to another
    consumer than the one before, as RabbitMQ deals a backlog."""
    runs = 1 + sum(1 for a, b in itertools.pairwise(owners) if a != b)
    return round(len(owners) / runs, 3)


def within_band(counts: list[int], messages: int) -> bool:
    """Every consumer got between 0.8 and 1.2 of a fair share (20-30 % of four)."""
    fair = messages / len(counts)
    return all(0.8 * fair <= c <= 1.2 * fair for c in counts)


def summarise(runs: list[dict[str, Any]], messages: int) -> dict[str, float]:
    """Shares in per cent, over every consumer of every run."""
    shares = [100 * c / messages for run in runs for c in run["counts"]]
    return {
        "runs": len(runs),
        "runs_within_band": sum(within_band(r["counts"], messages) for r in runs),
        "min": min(shares),
        "median": statistics.median(shares),
        "max": max(shares),
        "stdev": statistics.pstdev(shares),
        "median_run_min": statistics.median(100 * min(r["counts"]) / messages for r in runs),
        "median_run_max": statistics.median(100 * max(r["counts"]) / messages for r in runs),
        "median_seconds": statistics.median(r["seconds"] for r in runs),
        "median_msgs_per_s": statistics.median(messages / r["seconds"] for r in runs),
        "median_mean_run": statistics.median(r["mean_run"] for r in runs),
        "median_broker_cpu_s": statistics.median(r.get("broker_cpu_s", 0.0) for r in runs),
        "median_turns": statistics.median(r.get("turns", 0) for r in runs),
    }


def run_line(i: int, label: str, run: dict[str, Any], messages: int) -> str:
    shares = " ".join(f"{100 * c / messages:4.1f}" for c in run["counts"])
    low, high = min(run["counts"]), max(run["counts"])
    placed = "".join(str(w) for w in run["workers"] if w >= 0)
    where = f"  workers {placed} (publisher {run['publisher_worker']})" if placed else ""
    if "broker_cpu_s" in run:
        where += f"  broker CPU {run['broker_cpu_s']:.2f} s, {run['turns']} turns"
    return (
        f"{label} run {i + 1:2d}: min {100 * low / messages:4.1f} %  "
        f"max {100 * high / messages:4.1f} %  {run['seconds']:6.2f} s  "
        f"run {run['mean_run']:4.2f}  shares {shares}{where}"
    )


def table(results: dict[tuple[str, str], list[dict[str, Any]]], messages: int) -> str:
    """One Markdown row per broker and consumer mode."""
    rows = [
        "| broker | consumers as | runs within 0.8-1.2 of fair | least share | median | "
        "greatest | stdev | per run: median least / greatest | msg/s (median) | "
        "run of messages to one consumer (median of the means) |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for (broker, mode), runs in results.items():
        s = summarise(runs, messages)
        rows.append(
            f"| {broker} | {mode} | {s['runs_within_band']} of {s['runs']} | {s['min']:.1f} % | "
            f"{s['median']:.1f} % | {s['max']:.1f} % | {s['stdev']:.2f} | "
            f"{s['median_run_min']:.1f} / {s['median_run_max']:.1f} % | "
            f"{s['median_msgs_per_s']:,.0f} | {s['median_mean_run']:.2f} |"
        )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument("--uri", help="a running broker, e.g. amqp://guest:guest@host:5672/")
    target.add_argument("--start-shoal", action="store_true", help="start Shoal on a free port")
    parser.add_argument(
        "--rabbitmq",
        action="store_true",
        help="with --start-shoal: start RabbitMQ 3.10 too and alternate runs between them",
    )
    parser.add_argument("--workers", type=int, default=2, help="Shoal's IO workers (default 2)")
    parser.add_argument("--consumers", type=int, default=4)
    parser.add_argument("--messages", type=int, default=None, help="default 1000 per consumer")
    parser.add_argument("--runs", type=int, default=20, help="runs per broker and mode")
    parser.add_argument(
        "--mode",
        choices=("processes", "threads", "both"),
        default="processes",
        help="consumers as processes (one each), as threads of one process, or both",
    )
    parser.add_argument("--load", type=int, default=0, help="CPU-bound processes to run alongside")
    parser.add_argument("--json", action="store_true", help="print every run's counts as JSON")
    ns = parser.parse_args(argv)
    if ns.rabbitmq and not ns.start_shoal:
        parser.error("--rabbitmq compares with a Shoal it starts: add --start-shoal")
    messages = ns.messages or 1000 * ns.consumers
    modes = ["processes", "threads"] if ns.mode == "both" else [ns.mode]

    results: dict[tuple[str, str], list[dict[str, Any]]] = {}
    with contextlib.ExitStack() as stack:
        brokers: list[tuple[str, str, BrokerWatch | None]] = []
        if ns.uri:
            brokers.append(("broker", ns.uri, None))
        else:
            uri, watch = stack.enter_context(started_shoal(ns.workers))
            brokers.append(("Shoal", uri, watch))
        if ns.rabbitmq:
            node = stack.enter_context(started_rabbitmq())
            if node.uri is None:
                raise SystemExit(node.unavailable)
            brokers.append(("RabbitMQ", node.uri, None))
        if ns.load:
            stack.enter_context(cpu_load(ns.load))
        for i in range(ns.runs):
            # Alternate brokers and modes within each round, the order turning
            # every round, so that background noise falls on all of them alike.
            order = [(b, m) for b in brokers for m in modes]
            shift = i % len(order)
            for (label, uri, watch), mode in order[shift:] + order[:shift]:
                if watch:
                    cpu, turns = watch.cpu(), watch.notifications()
                run = one_run(uri, ns.consumers, messages, threads=mode == "threads")
                if watch:
                    run["broker_cpu_s"] = round(watch.cpu() - cpu, 3)
                    run["turns"] = watch.notifications() - turns
                results.setdefault((label, mode), []).append(run)
                if not ns.json:
                    print(run_line(i, f"{label:8s} {mode:9s}", run, messages), flush=True)
    if ns.json:
        print(
            json.dumps(
                {
                    "consumers": ns.consumers,
                    "messages": messages,
                    "load": ns.load,
                    "results": [
                        {"broker": b, "mode": m, "runs": runs, "summary": summarise(runs, messages)}
                        for (b, m), runs in results.items()
                    ],
                }
            )
        )
        return 0
    print(
        f"\n{ns.consumers} consumers (prefetch {PREFETCH}), {messages} messages a run, "
        f"load {ns.load}, fair share {100 / ns.consumers:.2f} %\n"
    )
    print(table(results, messages))
    return 0


if __name__ == "__main__":
    sys.exit(main())
