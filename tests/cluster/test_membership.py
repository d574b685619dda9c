"""Adding and removing nodes while clients run (issue 29, operations): a
fourth node with an empty data directory joins a running cluster, catches
up under load, joins the in-sync set and takes leadership over; a node is
then stopped and leaves the set. No confirmed message is lost and none
comes twice unflagged."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.broker_process import wait_for
from tests.cluster.etcd_server import EtcdServer
from tests.cluster.history import run_history
from tests.cluster.nodes import ClusterNode, in_sync, leader_of, shoal

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]


def test_a_node_joins_leads_and_another_leaves_while_clients_run(
    three_nodes: Callable[..., list[ClusterNode]], etcd: EtcdServer, tmp_path: Path
) -> None:
    nodes = three_nodes()
    joined = ClusterNode(tmp_path, "d", etcd.url)
    left: list[str] = []

    def act(ns: list[ClusterNode]) -> None:
        leader = leader_of(ns, 60)
        ns.append(joined.start())
        in_sync(ns, 4, 90)  # caught up under load
        assert joined.role == "follower"
        assert joined.status()["node"] in leader.status()["isr"]
        # The new node can lead: leadership moves to it while clients run.
        target = joined.status()["node"]
        done = shoal("ctl", "--runtime-dir", leader.runtime_dir, "transfer_leadership", target)
        assert done.returncode == 0, done.stderr
        wait_for(joined.serving, 60, "the new node to lead", interval=0.1)
        in_sync(ns, 4, 60)
        # The old leader leaves (a clean stop): the set shrinks to three.
        gone_id = leader.status()["node"]
        leader.stop()
        ns.remove(leader)
        left.append(gone_id)
        wait_for(
            lambda: gone_id not in joined.status().get("isr", [gone_id]),
            30,
            "the stopped node to leave the in-sync set",
        )

    try:
        history = run_history(nodes, 1, act)
    finally:
        joined.stop()
    assert history.problems() == []
    assert left, "the act did not run"
    print(f"{len(history.confirmed)} confirmed, reconnects {dict(history.reconnects)}")
