from __future__ import annotations

import signal
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.broker_process import free_port
from tests.cluster.etcd_server import EtcdServer
from tests.cluster.faultproxy import FaultProxy
from tests.cluster.nodes import ClusterNode, init_cluster


@pytest.fixture
def etcd(tmp_path: Path) -> Iterator[EtcdServer]:
    server = EtcdServer(tmp_path)
    try:
        yield server.start()
    finally:
        server.stop()


@pytest.fixture
def three_nodes(tmp_path: Path, etcd: EtcdServer) -> Iterator[Callable[..., list[ClusterNode]]]:
    """Start nodes a, b and c on `etcd`; all stopped after the test, a
    paused one resumed first."""
    made: list[ClusterNode] = []

    proxies: list[FaultProxy] = []

    def start(
        *own_ports: str, ttl: int = 2, proxied: bool = False, etcd_urls: str = ""
    ) -> list[ClusterNode]:
        """`own_ports`: flags (--metrics-port ...) each node gets a free port
        for; `ttl`: the lease's, in seconds; `proxied`: each node advertises
        a FaultProxy in front of its cluster port (node.proxy), so that
        every replication connection to a leader passes its proxy;
        `etcd_urls`: --cluster-etcd, if not `etcd`'s own URL."""
        nodes = [
            ClusterNode(
                tmp_path,
                name,
                etcd_urls or etcd.url,
                *(x for f in own_ports for x in (f, str(free_port()))),
                ttl=ttl,
            )
            for name in ("a", "b", "c")
        ]
        made.extend(nodes)
        init_cluster(etcd_urls or etcd.url)
        for n in nodes:
            if proxied:
                n.proxy = FaultProxy(n.cluster_port).start()
                proxies.append(n.proxy)
                at = n.cmd.index("--cluster-advertise") + 1
                n.cmd[at] = f"127.0.0.1:{n.proxy.port}"
            n.start()
        return nodes

    try:
        yield start
    finally:
        # Every node is stopped even when one fails to (a CI run once left
        # two nodes running after the first one's stop raised); the first
        # failure is raised after all of them.
        failed: AssertionError | None = None
        for n in made:
            if n.alive():
                n.signal_group(signal.SIGCONT)
            try:
                n.stop()
            except AssertionError as exc:
                failed = failed or exc
        for proxy in proxies:
            proxy.stop()
        if failed is not None:
            raise failed
