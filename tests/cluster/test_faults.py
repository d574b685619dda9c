"""Faults a deployment's network and etcd bring, under confirming publishers
and acking consumers (issue 38): after each heals, confirms resume within
the liveness target (2 x TTL + 5 s), and nothing confirmed is lost."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable

import pika
import pytest

from tests.broker_process import wait_for
from tests.cluster.etcd_server import EtcdServer
from tests.cluster.faultproxy import FaultProxy
from tests.cluster.history import History, run_history
from tests.cluster.nodes import ClusterNode, in_sync, leader_of

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]


def confirms_resume(history: History, ttl: float) -> float:
    """Seconds from now until the next confirm, at most 2 x TTL + 5 (the
    liveness target), else the test fails."""
    healed = time.monotonic()
    with history.lock:
        before = len(history.confirmed)
    wait_for(
        lambda: len(history.confirmed) > before,
        2 * ttl + 5,
        "confirms again within 2 x TTL + 5 s of the fault's end",
        interval=0.05,
    )
    return time.monotonic() - healed


def test_etcd_paused_for_half_a_long_lease_costs_no_failover(
    three_nodes: Callable[..., list[ClusterNode]], etcd: EtcdServer
) -> None:
    """etcd stopped (SIGSTOP) for 5 s under a lease of 10 s: the lease never
    ran out, so the leader must neither fence nor stop its broker; confirms
    resume once etcd answers again."""
    ttl = 10
    nodes = three_nodes(ttl=ttl)
    histories: list[History] = []
    waits: list[float] = []

    def act(ns: list[ClusterNode]) -> None:
        leader = leader_of(ns, 60)
        etcd.pause()
        try:
            time.sleep(5)  # the fault's length, not a synchronisation
        finally:
            etcd.resume()
        waits.append(confirms_resume(histories[0], ttl))
        # Past the time the lease would have run out without the keep-alives
        # that failed meanwhile: still the leader, still confirming.
        watch_until = time.monotonic() + ttl + 2
        while time.monotonic() < watch_until:
            assert leader.role == "leader", leader.log()[-3000:]
            waits.append(confirms_resume(histories[0], ttl))

    history = run_history(nodes, 1, act, histories)
    assert history.problems() == []
    print(
        f"confirms resumed {waits[0]:.1f} s after etcd came back; longest wait {max(waits):.1f} s"
    )


def test_replication_links_hung_for_twelve_seconds_come_back_in_sync(
    three_nodes: Callable[..., list[ClusterNode]],
) -> None:
    """The leader's replication links hang (no byte, no FIN) for 12 s, and
    afterwards only new connections pass, as after a partition or a NAT
    that forgot the flows: both followers leave the in-sync set, then
    reconnect and are back in sync within 10 s of the heal, under load. The
    leader's death afterwards fails over to one of them."""
    nodes = three_nodes(proxied=True)
    rejoined: list[float] = []

    def act(ns: list[ClusterNode]) -> None:
        leader = leader_of(ns, 60)
        assert leader.proxy is not None
        leader.proxy.hang()
        hung = time.monotonic()
        try:
            wait_for(
                lambda: len(leader.status().get("isr", [])) == 1,
                12,
                "the followers to leave the in-sync set",
                interval=0.05,
            )
            time.sleep(max(0.0, hung + 12 - time.monotonic()))  # the fault's length
        finally:
            leader.proxy.heal()
        healed = time.monotonic()
        in_sync(ns, 3, 10)
        rejoined.append(time.monotonic() - healed)
        leader.kill()
        killed = time.monotonic()
        rest = [n for n in ns if n is not leader]
        leader_of(rest, 2 + 3)  # a failover takes at most TTL + 3 s
        rejoined.append(time.monotonic() - killed)
        leader.start()  # back as a follower

    history = run_history(nodes, 1, act)
    assert history.problems() == []
    print(f"back in sync {rejoined[0]:.1f} s after the heal; failover {rejoined[1]:.1f} s")


def test_one_etcd_endpoint_blackholed_costs_no_failover(
    three_nodes: Callable[..., list[ClusterNode]], etcd: EtcdServer
) -> None:
    """The nodes know etcd by two URLs, the first through a proxy that then
    hangs (a blackholed member, the others healthy): the keep-alive moves to
    the other URL in time, so the leader stays leader and keeps confirming
    for three lease times (issue 38, 6)."""
    ttl = 3
    front = FaultProxy(etcd.client_port).start()
    try:
        nodes = three_nodes(ttl=ttl, etcd_urls=f"http://127.0.0.1:{front.port},{etcd.url}")
        histories: list[History] = []

        def act(ns: list[ClusterNode]) -> None:
            leader = leader_of(ns, 60)
            front.hang()
            watch_until = time.monotonic() + 3 * ttl
            while time.monotonic() < watch_until:
                assert leader.role == "leader", leader.log()[-3000:]
                confirms_resume(histories[0], ttl)

        history = run_history(nodes, 1, act, histories)
        assert history.problems() == []
    finally:
        front.stop()


def test_a_paused_agent_stops_its_broker_serving_before_the_lease_can_run_out(
    three_nodes: Callable[..., list[ClusterNode]],
) -> None:
    """SIGSTOP of the leader's agent alone (its broker runs on): the broker's
    IO workers close their directly connected clients before the lease can
    have run out, so no client is served by the old leader while a new one
    serves the same queues, and refuse new ones (issue 38, 7). After SIGCONT
    the agent fences and follows."""
    ttl = 2
    nodes = three_nodes(ttl=ttl)
    leader = leader_of(nodes, 60)
    in_sync(nodes, 3, 60)
    conn = pika.BlockingConnection(pika.URLParameters(leader.url + "?socket_timeout=5"))
    channel = conn.channel()
    channel.queue_declare("direct", durable=True)
    assert leader.proc is not None
    os.kill(leader.proc.pid, signal.SIGSTOP)
    paused = time.monotonic()
    try:

        def closed() -> pika.exceptions.ConnectionClosedByBroker | None:
            try:
                conn.process_data_events(time_limit=0.05)
            except pika.exceptions.ConnectionClosedByBroker as exc:
                return exc
            return None

        reason = wait_for(closed, ttl + 2, "the old leader's broker to close its client")
        assert reason.reply_code == 320
        assert time.monotonic() - paused <= ttl, "closed only after the lease may have run out"
        with pytest.raises(pika.exceptions.AMQPConnectionError):
            pika.BlockingConnection(pika.URLParameters(leader.url + "?socket_timeout=2"))
        leader_of([n for n in nodes if n is not leader], ttl + 3)
    finally:
        os.kill(leader.proc.pid, signal.SIGCONT)
    wait_for(lambda: leader.role == "follower", 60, "the paused leader to follow")
