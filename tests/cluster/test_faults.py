"""Faults a deployment's network and etcd bring, under confirming publishers
and acking consumers (issue 38): after each heals, confirms resume within
the liveness target (2 x TTL + 5 s), and nothing confirmed is lost."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pika
import pytest

from tests.broker_process import wait_for
from tests.cluster.etcd_server import EtcdCluster, EtcdServer
from tests.cluster.faultproxy import FaultProxy
from tests.cluster.history import History, run_history
from tests.cluster.nodes import ClusterNode, acking, in_sync, kill_the_leader, leader_of

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
    that forgot the flows: both followers stop acknowledging (they stay in
    the recorded in-sync set: with min-isr 1, dropping both would confirm
    nothing), then reconnect and are back in sync within 10 s of the heal,
    under load. The leader's death afterwards fails over to one of them."""
    nodes = three_nodes(proxied=True)
    rejoined: list[float] = []

    def act(ns: list[ClusterNode]) -> None:
        leader = leader_of(ns, 60)
        assert leader.proxy is not None
        leader.proxy.hang()
        hung = time.monotonic()
        try:
            wait_for(
                lambda: not acking(leader.status()),
                12,
                "the followers to stop acknowledging",
                interval=0.05,
            )
            time.sleep(max(0.0, hung + 12 - time.monotonic()))  # the fault's length
        finally:
            leader.proxy.heal()
        healed = time.monotonic()
        in_sync(ns, 3, 10)
        rejoined.append(time.monotonic() - healed)
        rejoined.append(kill_the_leader(ns, 2 + 3))  # a failover: at most TTL + 3 s

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


def test_a_second_failover_right_after_the_first_finds_an_in_sync_node(
    three_nodes: Callable[..., list[ClusterNode]],
) -> None:
    """The leader dies; the node that wins next dies too, before the third
    could catch up from it (the links to it hang). The third, and the first
    once restarted, hold every confirmed write, and the in-sync set still
    names them (a new leader starts from the set it won with, not from
    itself alone), so one of them leads within TTL + 3 s of the second
    death, without the second coming back (issue 38, 8)."""
    ttl = 2
    nodes = three_nodes(ttl=ttl, proxied=True)
    took: list[float] = []

    def act(ns: list[ClusterNode]) -> None:
        first = leader_of(ns, 60)
        rest = [n for n in ns if n is not first]
        for n in rest:  # whoever wins next: no follower reaches it
            assert n.proxy is not None
            n.proxy.hang()
        first.kill()
        second = wait_for(
            lambda: next((n for n in rest if n.role == "leader"), None),
            ttl + 3,
            "a node to win the first election",
            interval=0.05,
        )
        second.kill()
        killed = time.monotonic()
        for n in rest:
            assert n.proxy is not None
            n.proxy.heal()
        first.start()
        others = [first, *(n for n in rest if n is not second)]
        wait_for(
            lambda: next((n for n in others if n.alive() and n.role == "leader"), None),
            ttl + 3,
            "an in-sync node to win the second election",
            interval=0.05,
        )
        took.append(time.monotonic() - killed)
        second.start()  # back as a follower

    history = run_history(nodes, 1, act)
    assert history.problems() == []
    print(f"second failover {took[0]:.1f} s after the second leader's death")


def test_a_slow_disk_on_the_leader_slows_confirms_and_loses_nothing(
    three_nodes: Callable[..., list[ClusterNode]],
) -> None:
    """Every sync of the leader's disk takes 0.3 s for 6 s: group commit
    keeps confirms coming (fewer, larger batches), no node fences or fails
    over, and nothing is lost."""
    nodes = three_nodes()
    histories: list[History] = []
    during: list[int] = []

    def act(ns: list[ClusterNode]) -> None:
        leader = leader_of(ns, 60)
        leader.disk("slow 0.3")
        try:
            before = len(histories[0].confirmed)
            time.sleep(6)  # the fault's length, not a synchronisation
            during.append(len(histories[0].confirmed) - before)
        finally:
            leader.disk("")
        assert leader.role == "leader", leader.log()[-3000:]
        confirms_resume(histories[0], 2)

    history = run_history(nodes, 1, act, histories)
    assert history.problems() == []
    assert during[0] > 0, "no confirm while the disk was slow"
    print(f"{during[0]} confirms in 6 s of a slow disk")


@pytest.mark.parametrize("fault", ["eio", "enospc"])
def test_a_failing_disk_on_the_leader_hands_the_leadership_to_a_healthy_node(
    three_nodes: Callable[..., list[ClusterNode]], fault: str
) -> None:
    """The leader's disk fails (EIO on every write and sync) or is full
    (ENOSPC on every write): the IO worker whose write or sync failed exits
    (nothing it wrote since may be confirmed), its broker stops, and the
    agent gives the leadership up and stands aside, so a follower leads and
    confirms resume within 2 x TTL + 5 s. Once the disk is back, the node
    catches up as a follower."""
    ttl = 2
    nodes = three_nodes(ttl=ttl)
    histories: list[History] = []
    took: list[float] = []

    def act(ns: list[ClusterNode]) -> None:
        leader = leader_of(ns, 60)
        leader.disk(fault)
        failed = time.monotonic()
        try:
            leader_of([n for n in ns if n is not leader], 2 * ttl + 5)
            took.append(time.monotonic() - failed)
            confirms_resume(histories[0], ttl)
        finally:
            leader.disk("")

    history = run_history(nodes, 1, act, histories)
    assert history.problems() == []
    print(f"a healthy node led {took[0]:.1f} s after the leader's disk failed")


@pytest.mark.parametrize("fault", ["enospc", "eio"])
def test_a_full_or_failing_disk_on_a_follower_drops_it_and_confirms_go_on(
    three_nodes: Callable[..., list[ClusterNode]], fault: str
) -> None:
    """A follower's disk is full (ENOSPC on every write) or fails (EIO): it
    cannot acknowledge, the leader drops it from the in-sync set (the other
    follower remains) and confirms go on; once the disk is back it catches
    up and is back in sync."""
    nodes = three_nodes()
    histories: list[History] = []

    def act(ns: list[ClusterNode]) -> None:
        leader = leader_of(ns, 60)
        follower = next(n for n in ns if n is not leader)
        follower.disk(fault)
        try:
            wait_for(
                lambda: len(leader.status().get("isr", [])) == 2,
                30,
                "the follower with a full disk to leave the in-sync set",
                interval=0.05,
            )
            confirms_resume(histories[0], 2)
            assert leader.role == "leader"
        finally:
            follower.disk("")

    history = run_history(nodes, 1, act, histories)
    assert history.problems() == []


def test_a_three_member_etcd_loses_a_member_then_its_leader_and_shoal_keeps_leading(
    three_nodes: Callable[..., list[ClusterNode]], tmp_path: Path
) -> None:
    """etcd of three members, at its default timings, under the default
    lease (5 s). One member is blackholed behind a proxy (the nodes reach it
    no more; the other members still do), then etcd's own leader is killed:
    a majority answers throughout, so Shoal's leader keeps its lease (the
    keep-alive moves to a member that answers, and etcd's next leader keeps
    the lease) and confirms go on."""
    ttl = 5
    etcd3 = EtcdCluster(tmp_path / "etcd3").start()
    front = FaultProxy(etcd3.members[0].client_port).start()
    try:
        urls = [f"http://127.0.0.1:{front.port}", *(m.url for m in etcd3.members[1:])]
        nodes = three_nodes(ttl=ttl, etcd_urls=",".join(urls))
        histories: list[History] = []

        def act(ns: list[ClusterNode]) -> None:
            leader = leader_of(ns, 60)
            front.hang()
            watch_until = time.monotonic() + ttl
            while time.monotonic() < watch_until:
                assert leader.role == "leader", leader.log()[-3000:]
                confirms_resume(histories[0], ttl)
            etcd3.leader().kill()
            watch_until = time.monotonic() + 2 * ttl
            while time.monotonic() < watch_until:
                assert leader.role == "leader", leader.log()[-3000:]
                confirms_resume(histories[0], ttl)

        history = run_history(nodes, 1, act, histories)
        assert history.problems() == []
    finally:
        front.stop()
        etcd3.stop()


@pytest.mark.parametrize("ttl", [5, 15])
def test_a_failover_takes_at_most_the_lease_and_three_seconds(
    three_nodes: Callable[..., list[ClusterNode]], ttl: int
) -> None:
    """kill -9 of the leader under the default lease (5 s) and a long one
    (15 s): another node serves within TTL + 3 s, and nothing is lost."""
    nodes = three_nodes(ttl=ttl)
    took: list[float] = []

    def act(ns: list[ClusterNode]) -> None:
        took.append(kill_the_leader(ns, ttl + 3))

    history = run_history(nodes, 1, act)
    assert history.problems() == []
    print(f"TTL {ttl} s: failover {took[0]:.1f} s")
