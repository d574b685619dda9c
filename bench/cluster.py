"""A replicated cluster's costs (issue 29, docs/benchmarks.md):

1. persistent messages with confirms (window 200), 1 -> 1, 64 B: a standalone
   broker, a leader with one follower, a leader with two followers (msg/s and
   confirm p50/p99), alternating, each on its own machine's share of CPUs;
2. failover time: from a kill -9 of the leader to the first confirm of a
   publisher that reconnects to any node, over `--kills` kills;
3. catch-up rate: a follower stopped while `--catch-up-mb` of persistent
   messages are published, then started: from its start to its joining the
   in-sync set, and the bytes it received per second.

    python bench/cluster.py --rounds 3 --kills 10 --catch-up-mb 200 [--rabbitmq]

`--rabbitmq` adds the same load on RabbitMQ 3.10's quorum queues, on one
node and on three (bench/rabbitmq_cluster.py), in the same rounds.

Needs etcd (apt-get install etcd-server). Prints a markdown report.
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import os
import signal
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import pika

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
from compare import (  # noqa: E402
    machine_info,
    perf_command,
    run_perf,
    shoal_revision,
    started_rabbitmq,
)
from rabbitmq_cluster import rabbitmq_cluster  # noqa: E402

from tests.broker_process import Broker, wait_for  # noqa: E402
from tests.cluster.etcd_server import EtcdServer  # noqa: E402
from tests.cluster.nodes import ClusterNode, in_sync, init_cluster, leader_of  # noqa: E402

PERF = (
    "--persistent",
    "--confirm",
    "200",
    "--prefetch",
    "500",
    "--multi-ack",
    "100",
    "--size",
    "64",
)


def du(path: str) -> int:
    total = 0
    for directory, _subdirs, names in os.walk(path):
        for name in names:
            try:
                total += os.path.getsize(os.path.join(directory, name))
            except OSError:
                pass
    return total


def cluster(tmp: Path, etcd: EtcdServer, size: int, tag: str) -> list[ClusterNode]:
    nodes = [
        ClusterNode(
            tmp, f"{tag}{i}", etcd.url, "--workers", "2", "--cluster-name", tag, disk_faults=False
        )
        for i in range(size)
    ]
    init_cluster(etcd.url, tag)
    for n in nodes:
        n.start()
    leader_of(nodes, 60)
    in_sync(nodes, size, 60)
    return nodes


def throughput(opts: argparse.Namespace, tmp: Path, etcd: EtcdServer) -> list[str]:
    with contextlib.ExitStack() as stack:
        standalone = Broker(tmp / "standalone", workers=2)
        (tmp / "standalone").mkdir()
        standalone.start()
        stack.callback(standalone.stop)
        # name -> (uri, perf's extra flags)
        setups: dict[str, tuple[str, tuple[str, ...]]] = {"standalone": (standalone.url, ())}
        for followers in (1, 2):
            nodes = cluster(tmp, etcd, followers + 1, f"f{followers}-")
            for n in nodes:
                stack.callback(n.stop)
            name = f"leader + {followers} follower{'s' if followers > 1 else ''}"
            setups[name] = (leader_of(nodes).url, ())
        if opts.rabbitmq:
            # The same load on RabbitMQ's replicated queue: a quorum queue
            # with a member on each of 3 nodes (and on 1, for its own cost).
            single = stack.enter_context(started_rabbitmq())
            if single.uri is not None:
                setups["RabbitMQ 3.10, 1 node, classic queue"] = (single.uri, ())
                setups["RabbitMQ 3.10, 1 node, quorum queue"] = (single.uri, ("--quorum",))
            three = stack.enter_context(rabbitmq_cluster(3))
            setups["RabbitMQ 3.10, 3 nodes, quorum queue"] = (three[0], ("--quorum",))
        return _rounds(opts, setups)


def _rounds(opts: argparse.Namespace, setups: dict[str, tuple[str, tuple[str, ...]]]) -> list[str]:
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in setups}
    names = list(setups)
    for r in range(opts.rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            url, extra = setups[name]
            report = run_perf(
                perf_command(url, (*PERF, *extra), opts.duration, 2.0), opts.duration + 60
            )
            runs[name].append(report)
            lat = report.get("confirm_latency_ms", {})
            print(
                f"round {r + 1} {name:<38} {report.get('consumed_rate', 0):>9,.0f} msg/s "
                f"p50 {lat.get('p50', 0):.2f} p99 {lat.get('p99', 0):.2f} ms",
                file=sys.stderr,
            )
    base = statistics.median(r.get("consumed_rate", 0) for r in runs["standalone"])
    rows = [
        "| setup | msg/s (median) | / standalone | confirm p50 ms | confirm p99 ms |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, reports in runs.items():
        rate = statistics.median(r.get("consumed_rate", 0) for r in reports)
        p50 = statistics.median(r.get("confirm_latency_ms", {}).get("p50", 0) for r in reports)
        p99 = statistics.median(r.get("confirm_latency_ms", {}).get("p99", 0) for r in reports)
        rows.append(f"| {name} | {rate:,.0f} | {rate / base:.2f} | {p50:.2f} | {p99:.2f} |")
    return rows


class ConfirmClock:
    """A publisher that reconnects to any live node and stamps each confirm
    with the connection it came on (a confirm in flight at a kill must not
    count as the new leader's)."""

    def __init__(self, nodes: list[ClusterNode]) -> None:
        self.nodes = nodes
        self.stamps: list[tuple[float, int]] = []  # (when, connection number), in order
        self.connection = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.is_set():
            for n in [n for n in self.nodes if n.alive()]:
                try:
                    conn = pika.BlockingConnection(pika.URLParameters(n.url + "?socket_timeout=2"))
                    self.connection += 1
                    ch = conn.channel()
                    ch.queue_declare("clock", durable=True)
                    ch.confirm_delivery()
                    while not self.stop.is_set():
                        ch.basic_publish("", "clock", b"t", pika.BasicProperties(delivery_mode=2))
                        self.stamps.append((time.monotonic(), self.connection))
                        if len(self.stamps) % 1000 == 0:
                            ch.queue_purge("clock")  # keep the queue short
                except Exception:  # the node died: the next one
                    continue

    def first_after(self, t: float, connection: int, timeout: float = 60) -> float:
        """The first confirm after `t` on a connection opened after `connection`."""

        def found() -> float | None:
            at = bisect.bisect_right(self.stamps, (t, 1 << 62))
            return next((s for s, c in self.stamps[at:] if c > connection), None)

        return wait_for(found, timeout, "a confirm after the kill", interval=0.01)  # type: ignore[no-any-return]


def failover(opts: argparse.Namespace, tmp: Path, etcd: EtcdServer) -> list[str]:
    nodes = cluster(tmp, etcd, 3, "fo-")
    clock = ConfirmClock(nodes)
    times = []
    try:
        for i in range(opts.kills):
            in_sync(nodes, 3, 60)
            leader = leader_of(nodes, 60)
            wait_for(lambda: len(clock.stamps) > 0, 30, "confirms", interval=0.01)
            connection = clock.connection
            killed_at = time.monotonic()
            leader.kill()
            first = clock.first_after(killed_at, connection)
            times.append(first - killed_at)
            print(
                f"kill {i + 1}: {leader.name}, first confirm after {times[-1]:.2f} s",
                file=sys.stderr,
            )
            leader.start()
    finally:
        clock.stop.set()
        clock.thread.join(10)
        for n in nodes:
            n.stop()
    return [
        f"failover, kill -9 of the leader to the first confirm on the new one, {len(times)} kills "
        f"(lease TTL {nodes[0].cmd[nodes[0].cmd.index('--cluster-lease-ttl') + 1]} s): "
        f"p50 {statistics.median(times):.2f} s, max {max(times):.2f} s"
    ]


def catch_up(opts: argparse.Namespace, tmp: Path, etcd: EtcdServer) -> list[str]:
    nodes = cluster(tmp, etcd, 3, "cu-")
    try:
        leader = leader_of(nodes, 60)
        away = next(n for n in nodes if n is not leader)
        away.stop()
        before = du(away.data_dir)
        body = os.urandom(4096)
        conn = pika.BlockingConnection(pika.URLParameters(leader.url))
        ch = conn.channel()
        ch.queue_declare("backlog", durable=True)
        ch.confirm_delivery()
        for _ in range(opts.catch_up_mb * 1024 * 1024 // len(body)):
            ch.basic_publish("", "backlog", body, pika.BasicProperties(delivery_mode=2))
        conn.close()
        started = time.monotonic()
        away.start()
        in_sync(nodes, 3, 600)
        took = time.monotonic() - started
        received = du(away.data_dir) - before
    finally:
        for n in nodes:
            n.signal_group(signal.SIGCONT) if n.alive() else None
            n.stop()
    return [
        f"catch-up: a follower away while {opts.catch_up_mb} MiB of persistent 4 KiB messages "
        f"were confirmed rejoined the in-sync set {took:.1f} s after its start, "
        f"{received / took / 1e6:.0f} MB/s of its data directory's growth"
    ]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--duration", type=float, default=6.0)
    p.add_argument("--kills", type=int, default=10)
    p.add_argument("--catch-up-mb", type=int, default=200)
    p.add_argument(
        "--rabbitmq",
        action="store_true",
        help="also RabbitMQ 3.10's quorum queues, on 1 node and on a 3-node cluster",
    )
    p.add_argument("--only-throughput", action="store_true", help="skip failover and catch-up")
    opts = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="shoal-cluster-bench-") as d:
        tmp = Path(d)
        (tmp / "etcd").mkdir()
        etcd = EtcdServer(tmp / "etcd").start()
        try:
            when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
            lines = [*machine_info(), f"Shoal {shoal_revision()}, {when}", ""]
            lines += throughput(opts, tmp, etcd)
            if not opts.only_throughput:
                lines += ["", *failover(opts, tmp, etcd), *catch_up(opts, tmp, etcd)]
        finally:
            etcd.stop()
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
