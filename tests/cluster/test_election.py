"""Who may campaign for leadership (broker/cluster/node.py) against a real
etcd: only a node of the recorded in-sync set whose own copy is whole."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from pathlib import Path

import pytest

from shoal.broker.cluster.etcd import Etcd
from shoal.broker.cluster.node import Node
from shoal.broker.config import Config
from shoal.store.mirror import node_id, set_in_sync
from tests.broker_process import free_port, wait_for
from tests.cluster.etcd_server import EtcdServer
from tests.cluster.nodes import ClusterNode, init_cluster, shoal

pytestmark = pytest.mark.cluster


def config(tmp: Path, etcd: EtcdServer) -> Config:
    return Config(
        data_dir=str(tmp / "data"),
        runtime_dir=str(tmp / "run"),
        cluster_etcd=(etcd.url,),
        cluster_name="election",
        cluster_port=free_port(),
        cluster_advertise=f"127.0.0.1:{free_port()}",
    )


def test_only_an_in_sync_node_with_a_whole_copy_campaigns(tmp_path: Path, etcd: EtcdServer) -> None:
    cfg = config(tmp_path, etcd)
    me = node_id(cfg.data_path())

    async def main() -> list[bool]:
        async with Etcd([etcd.url]) as client:
            node = Node(cfg)
            try:
                results = []
                await client.put("shoal/election/isr", json.dumps(["other", me]).encode())
                set_in_sync(cfg.data_path(), False)  # a copy being caught up, or wiped
                results.append(await node._campaign())
                await client.put("shoal/election/isr", json.dumps(["other"]).encode())
                set_in_sync(cfg.data_path(), True)
                results.append(await node._campaign())  # whole, but not in the set
                await client.put("shoal/election/isr", json.dumps(["other", me]).encode())
                results.append(await node._campaign())  # in the set, whole: leads
                leader = await client.get("shoal/election/leader")
                assert leader is not None and json.loads(leader.value)["node"] == me
                return results
            finally:
                await node._release()
                await node.etcd.close()

    assert asyncio.run(main()) == [False, False, True]


def test_no_node_leads_until_the_cluster_is_initialised(tmp_path: Path, etcd: EtcdServer) -> None:
    """No in-sync set in etcd (a typo in --cluster-name, etcd restored or
    wiped): not even a node with a whole copy may lead, so an empty node
    can never win and "sync" the others' data away; `shoal cluster-init`
    says the cluster is new, and then the first node leads (issue 38, 9)."""
    cfg = config(tmp_path, etcd)
    set_in_sync(cfg.data_path(), True)

    async def campaign() -> bool:
        node = Node(cfg)
        try:
            return await node._campaign()
        finally:
            await node._release()
            await node.etcd.close()

    assert asyncio.run(campaign()) is False
    first = shoal("cluster-init", "--cluster-etcd", etcd.url, "--cluster-name", "election")
    assert first.returncode == 0 and "created" in first.stdout, first.stdout + first.stderr
    again = shoal("cluster-init", "--cluster-etcd", etcd.url, "--cluster-name", "election")
    assert again.returncode == 0 and "exists already" in again.stdout
    assert asyncio.run(campaign()) is True


def test_a_second_node_on_the_same_data_directory_refuses_to_start(
    tmp_path: Path, etcd: EtcdServer
) -> None:
    init_cluster(etcd.url)
    first = ClusterNode(tmp_path, "a", etcd.url).start()
    second = ClusterNode(tmp_path, "a", etcd.url)  # the same data directory
    try:
        wait_for(lambda: first.role in ("leader", "follower"), 30, "the first node to run")
        second.start()
        assert second.proc is not None
        assert second.proc.wait(30) == 3
        assert "is in use by another broker" in second.log()
        assert first.alive()
    finally:
        second.stop()
        first.stop()


def test_a_node_that_cannot_serve_as_leader_stands_aside(tmp_path: Path, etcd: EtcdServer) -> None:
    """A node that wins but cannot listen on its cluster port gives the
    leadership back at once and holds off, so that another node leads
    meanwhile; it follows once its port is free (a CI run once waited 38 s
    on such a node winning and failing again and again)."""
    init_cluster(etcd.url)
    a = ClusterNode(tmp_path, "a", etcd.url)
    b = ClusterNode(tmp_path, "b", etcd.url)
    taken = socket.socket()
    try:
        taken.bind(("127.0.0.1", a.cluster_port))
        taken.listen()
        a.start()
        # Alone, it wins and fails twice: the second try must fail as the
        # first did, not on what the first one left open.
        wait_for(lambda: a.log().count("leader of cluster") >= 2, 30, "a to try twice")
        wait_for(lambda: a.log().count("already in use") >= 2, 10, "a's second failure")
        b.start()
        started = time.monotonic()
        wait_for(b.serving, 15, "b to lead while a cannot", interval=0.1)
        print(f"b served {time.monotonic() - started:.1f} s after its start")
        taken.close()
        wait_for(lambda: a.role == "follower" and a.status().get("caught_up"), 30, "a to follow")
        assert b.role == "leader"
        # Each failed try closed what it had opened: no try failed on the
        # replica socket's name, left behind by the one before.
        assert "shoal-replica" not in a.log()
    finally:
        taken.close()
        b.stop()
        a.stop()
