from __future__ import annotations

import signal
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.broker_process import free_port
from tests.cluster.etcd_server import EtcdServer
from tests.cluster.nodes import ClusterNode


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

    def start(*own_ports: str) -> list[ClusterNode]:
        """`own_ports`: flags (--metrics-port ...) each node gets a free port for."""
        nodes = [
            ClusterNode(
                tmp_path, name, etcd.url, *(x for f in own_ports for x in (f, str(free_port())))
            )
            for name in ("a", "b", "c")
        ]
        made.extend(nodes)
        for n in nodes:
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
        if failed is not None:
            raise failed
