"""Persistent messages: Shoal's message store beside RabbitMQ (issue 13).

Throughput of persistent messages with publisher confirms (window 200) to a
durable queue, 1 -> 1 and 4 -> 4, 64 B and 4 KiB, alternating between the
brokers; Shoal's fsyncs per second and messages per fsync (its
`shoal_store_*` counters); disk bytes per message; and the time each broker
takes to come back after `kill -9` with a backlog of persistent messages.

    python bench/persistent.py --rounds 3 --recovery 1000000

Prints a markdown report (docs/benchmarks.md keeps it by hand).
RabbitMQ is started as a private node (needs the Debian package).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pika

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare import (
    ROOT,
    amqp_ready,
    free_port,
    machine_info,
    perf_command,
    rabbit_env,
    run_perf,
    shoal_revision,
    start_rabbitmq_node,
    wait_until,
)

from shoal.broker.cli import local_command
from shoal.broker.operate.status import snapshot
from shoal.shm.segment import Segment

COMMON = ("--persistent", "--confirm", "200", "--prefetch", "500", "--multi-ack", "100")
SCENARIOS = (
    ("1 → 1, 64 B", ("--size", "64")),
    ("4 → 4, 64 B", ("--producers", "4", "--consumers", "4", "--size", "64")),
    ("1 → 1, 4 KiB", ("--size", "4096")),
    ("4 → 4, 4 KiB", ("--producers", "4", "--consumers", "4", "--size", "4096")),
)
RECOVERY_QUEUE = "recovery"
NONE = "-"


class Shoal:
    """A broker with its data directory kept across kill -9 and restart."""

    def __init__(self, workers: int, extra: Sequence[str]) -> None:
        self.port = free_port()
        self.base = Path(tempfile.mkdtemp(prefix="shoal-bench-persistent-"))
        self.runtime = str(self.base / "run")
        self.data = str(self.base / "data")
        self.cmd = local_command(self.port, workers, self.runtime, *extra, data_dir=self.data)
        self.uri = f"amqp://guest:guest@127.0.0.1:{self.port}/"
        self.proc: subprocess.Popen[bytes] | None = None
        self._seg: Segment | None = None

    def start(self) -> float:
        """Seconds until the broker answers AMQP."""
        self._seg = None
        started = time.monotonic()
        log = open(self.base / "broker.log", "ab")  # noqa: SIM115  (kept open by the child)
        self.proc = subprocess.Popen(
            self.cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        if not wait_until(lambda: amqp_ready("127.0.0.1", self.port), 600, 0.02):
            raise RuntimeError("Shoal did not start: see " + str(self.base / "broker.log"))
        return time.monotonic() - started

    def counters(self) -> dict[str, Any]:
        if self._seg is None:
            self._seg = Segment.attach(os.path.join(self.runtime, "shoal.shm"))
        return dict(snapshot(self._seg)["store"])

    def kill(self) -> None:
        assert self.proc is not None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.kill()
        shutil.rmtree(self.base, ignore_errors=True)


class Rabbit:
    def __init__(self) -> None:
        self.port = free_port()
        self.base = Path(tempfile.mkdtemp(prefix="shoal-bench-rabbit-"))
        if os.geteuid() == 0:
            with contextlib.suppress(LookupError, OSError):
                shutil.chown(self.base, "rabbitmq", "rabbitmq")
        self.env = rabbit_env(self.port, self.base)
        if os.geteuid() == 0:
            with contextlib.suppress(LookupError, OSError):
                shutil.chown(self.base / "enabled_plugins", "rabbitmq", "rabbitmq")
        self.ctl = ["rabbitmqctl", "-n", self.env["RABBITMQ_NODENAME"]]
        self.uri = f"amqp://guest:guest@127.0.0.1:{self.port}/"

    def start(self) -> float:
        started = time.monotonic()
        start_rabbitmq_node(self.env, self.ctl, self.port)
        return time.monotonic() - started

    def kill(self) -> None:
        pid = int((self.base / "rabbit.pid").read_text().strip())
        os.kill(pid, signal.SIGKILL)
        wait_until(lambda: not amqp_ready("127.0.0.1", self.port), 30, 0.1)
        time.sleep(1)  # the beam's children (epmd stays) go with it

    def stop(self) -> None:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            subprocess.run([*self.ctl, "stop"], env=self.env, capture_output=True, timeout=60)
        shutil.rmtree(self.base, ignore_errors=True)

    def data_bytes(self) -> int:
        return du(self.base / "mnesia")


def du(path: Path | str) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.stat(os.path.join(root, name)).st_blocks * 512
    return total


def ready_count(uri: str, queue: str, passive: bool = True) -> int:
    """Messages ready in `queue` (declared durable first unless `passive`)."""
    conn = pika.BlockingConnection(pika.URLParameters(uri))
    try:
        ok = conn.channel().queue_declare(queue, passive=passive, durable=True)
        return int(ok.method.message_count)
    finally:
        conn.close()


def throughput(shoal: Shoal, rabbit: Rabbit | None, opts: argparse.Namespace) -> list[str]:
    runs: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for round_no in range(opts.rounds):
        for index, (title, args) in enumerate(SCENARIOS):
            targets: list[tuple[str, Any]] = [("Shoal", shoal)]
            if rabbit is not None:
                targets.append(("RabbitMQ", rabbit))
            for name, target in targets:
                before = shoal.counters() if name == "Shoal" else None
                cmd = perf_command(target.uri, (*args, *COMMON), opts.duration, opts.warmup)
                report = run_perf(cmd, opts.duration + opts.warmup + 60)
                if before is not None:
                    after = shoal.counters()
                    report["store"] = {k: after[k] - before[k] for k in ("syncs", "synced_records")}
                runs.setdefault((name, index), []).append(report)
                print(
                    f"round {round_no + 1} {title} {name}: "
                    f"{report.get('consumed_rate', 0):.0f} msg/s consumed",
                    file=sys.stderr,
                    flush=True,
                )
                time.sleep(1)

    def med(name: str, index: int, *keys: str) -> float | None:
        values = []
        for report in runs.get((name, index), []):
            value: Any = report
            for key in keys:
                value = value.get(key) if isinstance(value, dict) else None
            if isinstance(value, int | float):
                values.append(value)
        return statistics.median(values) if values else None

    lines = [
        "| scenario | RabbitMQ msg/s | Shoal msg/s | Shoal / RabbitMQ "
        "| RabbitMQ confirm p50 / p99 ms | Shoal confirm p50 / p99 ms "
        "| Shoal fsyncs/s | Shoal msgs per fsync |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    seconds = opts.duration + opts.warmup
    for index, (title, _args) in enumerate(SCENARIOS):
        rmq = med("RabbitMQ", index, "consumed_rate")
        ours = med("Shoal", index, "consumed_rate")
        syncs = med("Shoal", index, "store", "syncs")
        records = med("Shoal", index, "store", "synced_records")

        def lat(name: str, index: int = index) -> str:
            p50 = med(name, index, "confirm_latency_ms", "p50")
            p99 = med(name, index, "confirm_latency_ms", "p99")
            return NONE if p50 is None or p99 is None else f"{p50:.1f} / {p99:.1f}"

        lines.append(
            f"| {title} | {fmt(rmq)} | {fmt(ours)} "
            f"| {f'{ours / rmq:.2f}x' if rmq and ours else NONE} | {lat('RabbitMQ')} "
            f"| {lat('Shoal')} | {fmt(syncs / seconds if syncs else None)} "
            f"| {fmt(records / syncs if syncs and records else None, 1)} |"
        )
    return lines


def fmt(value: float | None, digits: int = 0) -> str:
    return NONE if value is None else f"{value:,.{digits}f}"


def fill(uri: str, count: int, count_now: Any) -> float:
    """Publish persistent 64 B messages with confirms to RECOVERY_QUEUE until
    it holds `count`; returns the publish rate."""
    started, have = time.monotonic(), count_now()
    while have < count:
        seconds = max(2.0, min(20.0, (count - have) / 40_000))
        args = ("--consumers", "0", "--size", "64", "--queue", RECOVERY_QUEUE, *COMMON)
        run_perf(perf_command(uri, args, seconds, 0), seconds + 120)
        have = count_now()
    return have / (time.monotonic() - started)


def recovery(shoal: Shoal, rabbit: Rabbit | None, count: int, empty: dict[str, float]) -> list[str]:
    lines = [
        "| broker | messages | publish msg/s (confirms) | disk bytes / message "
        "| start after kill -9 (s) | start with nothing to recover (s) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    targets: list[tuple[str, Any]] = [("Shoal", shoal)]
    if rabbit is not None:
        targets.append(("RabbitMQ", rabbit))
    for name, target in targets:
        base_disk = du(shoal.data) if name == "Shoal" else target.data_bytes()
        ready_count(target.uri, RECOVERY_QUEUE, passive=False)
        rate = fill(target.uri, count, lambda t=target: ready_count(t.uri, RECOVERY_QUEUE))
        have = ready_count(target.uri, RECOVERY_QUEUE)
        disk = (du(shoal.data) if name == "Shoal" else target.data_bytes()) - base_disk
        target.kill()
        took = target.start()
        back = ready_count(target.uri, RECOVERY_QUEUE)
        assert back == have, f"{name}: {back} of {have} messages after the restart"
        lines.append(
            f"| {name} | {have:,} | {rate:,.0f} | {disk / have:.0f} | {took:.1f} "
            f"| {empty[name]:.1f} |"
        )
        print(f"recovery {name}: {have} in {took:.1f} s", file=sys.stderr, flush=True)
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--shoal-args", default="--queue-capacity 2097152")
    p.add_argument("--rounds", type=int, default=3, help="throughput rounds (0: skip)")
    p.add_argument("--duration", type=float, default=15.0)
    p.add_argument("--warmup", type=float, default=3.0)
    p.add_argument(
        "--recovery", type=int, default=1_000_000, help="backlog for the restart (0: skip)"
    )
    p.add_argument("--no-rabbitmq", action="store_true")
    opts = p.parse_args(argv)
    shoal = Shoal(opts.workers, shlex.split(opts.shoal_args))
    rabbit = None if opts.no_rabbitmq else Rabbit()
    empty: dict[str, float] = {}
    try:
        empty["Shoal"] = shoal.start()
        if rabbit is not None:
            empty["RabbitMQ"] = rabbit.start()
        command = shlex.join(["bench/persistent.py", *(argv or sys.argv[1:])])
        lines = [
            f"{time.strftime('%Y-%m-%d')}, Shoal at {shoal_revision()} ({opts.workers} IO "
            f"workers, `{opts.shoal_args}`), `python {command}`; medians of {opts.rounds} "
            f"rounds of {opts.duration:g} s after {opts.warmup:g} s.",
            "",
            *machine_info(),
            "",
        ]
        if opts.rounds:
            lines += [*throughput(shoal, rabbit, opts), ""]
        if opts.recovery:
            lines += recovery(shoal, rabbit, opts.recovery, empty)
        print("\n".join(lines))
    finally:
        shoal.stop()
        if rabbit is not None:
            rabbit.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
