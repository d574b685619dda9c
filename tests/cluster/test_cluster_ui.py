"""The web UI on a three-node cluster, in a real browser (issue 40): the
Shoal tab shows the cluster (its leader, the in-sync set, each node's role
and replication lag) and the overview lists the three nodes with their roles.

Needs etcd (--cluster) and headless Chromium with Playwright (--browser):
CI's cluster step gives both."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.broker_process import wait_for
from tests.browser import ui_driver
from tests.cluster.nodes import ClusterNode, in_sync, leader_of

pytestmark = [pytest.mark.cluster, pytest.mark.browser]


@pytest.fixture
def nodes(three_nodes: Callable[..., list[ClusterNode]]) -> list[ClusterNode]:
    return three_nodes("--management-port")


@pytest.fixture
def session(nodes: list[ClusterNode], tmp_path: Path) -> Iterator[ui_driver.UiSession]:
    from playwright.sync_api import sync_playwright

    leader = leader_of(nodes)
    in_sync(nodes, 3)
    flag = leader.cmd.index("--management-port", leader.cmd.index("--cluster-etcd"))
    port = leader.cmd[flag + 1]
    shots = Path(os.environ.get("SHOAL_UI_SCREENSHOTS") or tmp_path / "screens") / "cluster"
    shots.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as playwright:
        ui = ui_driver.UiSession(playwright, f"http://127.0.0.1:{port}/", shots)
        try:
            yield ui
        finally:
            ui.close()


def test_the_shoal_tab_and_the_overview_show_the_cluster(
    nodes: list[ClusterNode], session: ui_driver.UiSession
) -> None:
    leader = leader_of(nodes)
    names = sorted(n.status()["node"] for n in nodes)
    session.login()

    def shoal_tab_in_sync() -> ui_driver.Visit | None:
        visit = session.visit("#/shoal", "shoal")
        rows = session.page.locator("h2:text('Cluster') + div table.list tbody tr")
        cells = [rows.nth(i).locator("td").all_inner_texts() for i in range(rows.count())]
        return visit if len(cells) == 3 and all(c[2] == "yes" for c in cells) else None

    shoal = wait_for(shoal_tab_in_sync, 30, "the Shoal tab to show three nodes in sync")
    assert not shoal.errors, shoal.errors
    section = session.page.locator("h2:text('Cluster') + div").inner_text()
    assert "cluster" in section and f"{leader.status()['node']}" in section
    rows = session.page.locator("h2:text('Cluster') + div table.list tbody tr")
    cells = [rows.nth(i).locator("td").all_inner_texts() for i in range(rows.count())]
    assert sorted(c[0] for c in cells) == [f"shoal@{name}" for name in names]
    assert [c[1] for c in cells] == ["leader", "follower", "follower"]
    assert [c[2] for c in cells] == ["yes", "yes", "yes"]

    overview = session.visit("#/", "overview")
    assert not overview.errors, overview.errors
    _status, listed = next(a for p, a in overview.answers.items() if p.startswith("/api/nodes"))
    assert [n.get("cluster_role") for n in listed] == ["leader", "follower", "follower"]
    nodes_table = session.page.locator("h2:text('Nodes') + div").inner_text()
    for follower in (n for n in nodes if n is not leader):
        assert f"shoal@{follower.status()['node']}" in nodes_table, nodes_table
    roles = session.page.locator("h2:text('Nodes') + div sub.cluster-role").all_inner_texts()
    assert roles[0] == "leader" and len(roles) == 3, roles
    assert all(r.startswith("follower, in sync, lag ") for r in roles[1:]), roles
