"""A randomised nemesis, as Jepsen runs one (issue 38): confirming publishers
and acking consumers run while faults of every kind follow one another in
an order drawn from a seed; after each fault heals, confirms must resume
within the liveness target (2 x TTL + 5 s), and at the end the history
checker (tests/cluster/history.py) must find nothing.

Three queues take the load at once: a classic durable queue, a quorum queue
and a stream (tests/cluster/history.py KINDS). CI runs a short one: one
fault of each kind (SHOAL_NEMESIS_FAULTS unset or 0); a long one is

    SHOAL_NEMESIS_FAULTS=200 SHOAL_NEMESIS_SEED=7 \\
        .venv/bin/python -m pytest -q -s --cluster -m cluster tests/cluster/test_nemesis.py

Each run prints its seed, every fault with how long confirms stopped, and
the verdict.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import time
from collections.abc import Callable

import psutil
import pytest

from tests.broker_process import wait_for
from tests.cluster.etcd_server import EtcdServer
from tests.cluster.faultproxy import FaultProxy
from tests.cluster.history import KINDS, History, run_history
from tests.cluster.nodes import ClusterNode, in_sync, leader_of

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(7200)]

TTL = 2
TARGET = 2 * TTL + 5  # s: confirms again after a fault heals (issue 38)


def test_a_random_mix_of_faults_loses_nothing_and_confirms_resume_in_time(
    three_nodes: Callable[..., list[ClusterNode]], etcd: EtcdServer
) -> None:
    seed = int(os.environ.get("SHOAL_NEMESIS_SEED") or time.time_ns() % 1_000_000)
    faults = int(os.environ.get("SHOAL_NEMESIS_FAULTS", "0"))  # 0: one of each kind
    rng = random.Random(seed)
    print(f"\nnemesis seed {seed}, {faults or 'one of each kind of'} faults, lease TTL {TTL} s")
    nodes = three_nodes(ttl=TTL, proxied=True)
    histories: list[History] = []
    windows: list[tuple[str, float]] = []

    def confirmed() -> int:
        with histories[0].lock:
            return len(histories[0].confirmed)

    def resumed(name: str) -> None:
        """The fault healed: wait for the next confirm, within the target."""
        healed, before = time.monotonic(), confirmed()
        wait_for(
            lambda: confirmed() > before,
            TARGET,
            f"confirms again within {TARGET} s after {name}",
            interval=0.05,
        )
        windows.append((name, time.monotonic() - healed))

    def back_in_sync(ns: list[ClusterNode]) -> None:
        """A link fault healed: every follower in sync again within 10 s
        (issue 38's target), under load."""
        in_sync(ns, 3, 10)

    def kill_leader(ns: list[ClusterNode]) -> None:
        leader = leader_of(ns, 60)
        leader.kill()
        leader_of([n for n in ns if n is not leader], TTL + 3)
        leader.start()

    def kill_follower(ns: list[ClusterNode]) -> None:
        leader = leader_of(ns, 60)
        follower = rng.choice([n for n in ns if n is not leader])
        follower.kill()
        follower.start()

    def pause_leader(ns: list[ClusterNode]) -> None:
        """The whole node stopped (a VM paused) until another node leads."""
        leader = leader_of(ns, 60)
        leader.signal_group(signal.SIGSTOP)
        try:
            leader_of([n for n in ns if n is not leader], TTL + 3)
        finally:
            leader.signal_group(signal.SIGCONT)

    def pause_agent(ns: list[ClusterNode]) -> None:
        """The leader's agent alone stopped, its broker running on."""
        leader = leader_of(ns, 60)
        assert leader.proc is not None
        os.kill(leader.proc.pid, signal.SIGSTOP)
        try:
            leader_of([n for n in ns if n is not leader], TTL + 3)
        finally:
            os.kill(leader.proc.pid, signal.SIGCONT)

    def pause_broker(ns: list[ClusterNode]) -> None:
        """The leader's broker alone stopped (its processes, SIGSTOP), its
        agent renewing the lease on: no confirms meanwhile, and they resume
        after SIGCONT."""
        leader = leader_of(ns, 60)
        assert leader.proc is not None
        agent = leader.proc.pid
        broker = [p for p in leader.family() if p.pid != agent]
        for p in broker:
            with contextlib.suppress(psutil.Error):
                p.suspend()
        try:
            time.sleep(rng.uniform(1, 6))  # the fault's length
        finally:
            for p in broker:
                with contextlib.suppress(psutil.Error):
                    p.resume()

    def partition_leader(ns: list[ClusterNode]) -> None:
        """The leader's replication links hang for a few seconds, no FIN."""
        leader = leader_of(ns, 60)
        assert leader.proxy is not None
        leader.proxy.hang()
        time.sleep(rng.uniform(1, 6))  # the fault's length
        leader.proxy.heal()
        back_in_sync(ns)

    def pause_etcd(ns: list[ClusterNode]) -> None:
        etcd.pause()
        time.sleep(rng.uniform(0.5, 1.5 * TTL))  # the fault's length
        etcd.resume()

    def proxy_of_leader(ns: list[ClusterNode]) -> FaultProxy:
        proxy = leader_of(ns, 60).proxy
        assert proxy is not None
        return proxy

    def slow_links(ns: list[ClusterNode]) -> None:
        """The leader's replication links slow (each chunk delayed)."""
        proxy = proxy_of_leader(ns)
        proxy.delay(rng.uniform(0.05, 0.5))
        time.sleep(rng.uniform(1, 6))  # the fault's length
        proxy.heal()
        back_in_sync(ns)

    def one_way_cut(ns: list[ClusterNode]) -> None:
        """One direction of the leader's replication links stops (the
        followers' acks, or the leader's data and heartbeats)."""
        proxy = proxy_of_leader(ns)
        proxy.cut(rng.choice(["forward", "back"]))
        time.sleep(rng.uniform(1, 6))  # the fault's length
        proxy.heal()
        back_in_sync(ns)

    def reset_links(ns: list[ClusterNode]) -> None:
        """Every replication connection to the leader reset (RST) at once."""
        proxy_of_leader(ns).reset()
        back_in_sync(ns)

    def slow_disk(ns: list[ClusterNode]) -> None:
        """Every sync of the leader's disk slowed for a few seconds."""
        leader = leader_of(ns, 60)
        leader.disk(f"slow {rng.uniform(0.1, 0.5):.2f}")
        time.sleep(rng.uniform(1, 6))  # the fault's length
        leader.disk("")

    def failing_disk(ns: list[ClusterNode]) -> None:
        """The leader's disk fails (EIO) until another node leads."""
        leader = leader_of(ns, 60)
        leader.disk("eio")
        try:
            leader_of([n for n in ns if n is not leader], TARGET)
        finally:
            leader.disk("")

    def full_follower_disk(ns: list[ClusterNode]) -> None:
        """A follower's disk is full (ENOSPC) for a few seconds."""
        leader = leader_of(ns, 60)
        follower = rng.choice([n for n in ns if n is not leader])
        follower.disk("enospc")
        time.sleep(rng.uniform(1, 6))  # the fault's length
        follower.disk("")

    kinds = [
        kill_leader,
        kill_follower,
        pause_leader,
        pause_agent,
        pause_broker,
        partition_leader,
        pause_etcd,
        slow_links,
        one_way_cut,
        reset_links,
        slow_disk,
        failing_disk,
        full_follower_disk,
    ]
    faults = faults or len(kinds)
    order = [kinds[i % len(kinds)] for i in range(faults)]
    rng.shuffle(order)

    def act(ns: list[ClusterNode]) -> None:
        fault = order.pop()
        started = time.monotonic()
        fault(ns)
        resumed(fault.__name__)
        print(
            f"  {fault.__name__}: {time.monotonic() - started:.1f} s, "
            f"confirms again {windows[-1][1]:.1f} s after it healed"
        )

    history = run_history(nodes, len(order), act, histories, kinds=tuple(KINDS))
    problems = history.problems()
    counts = ", ".join(
        f"{h.kind} {len(h.confirmed)} confirmed / {len(h.deliveries)} deliveries"
        for h in (history, *history.others)
    )
    print(
        f"nemesis seed {seed}: {counts}; longest wait for confirms after a fault "
        f"{max(w for _, w in windows):.1f} s; verdict: {problems or 'nothing found'}"
    )
    assert problems == []
