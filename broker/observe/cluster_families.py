"""The Prometheus families of a cluster node's view (broker/cluster/node.py
writes it to cluster.json; `shoal status` shows the same). A leader's
metrics process serves them beside the broker's families; a follower, which
runs no broker, serves them alone from its agent (broker/cluster/follower_metrics.py),
so that every node of a cluster answers a scrape."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client.core import GaugeMetricFamily, InfoMetricFamily, Metric


def cluster_families(view: dict[str, Any]) -> Iterator[Metric]:
    """The node's role and leader, the in-sync set's size, whether its own
    copy is whole (a follower), and on the leader each follower's state
    and lag in bytes and seconds."""
    info = InfoMetricFamily("shoal_cluster_node", "This node's place in its cluster")
    info.add_metric([], {"node": view["node"], "role": view["role"], "leader": view["leader"]})
    yield info
    yield GaugeMetricFamily(
        "shoal_cluster_in_sync_nodes",
        "Nodes that hold every confirmed write: the leader and its in-sync followers",
        value=len(view["isr"]),
    )
    if "caught_up" in view:  # a follower's own view
        yield GaugeMetricFamily(
            "shoal_cluster_caught_up",
            "1 once this follower's copy is whole (it may then become leader)",
            value=1 if view["caught_up"] else 0,
        )
    in_sync = GaugeMetricFamily(
        "shoal_cluster_follower_in_sync",
        "1 if the follower is in the in-sync set",
        labels=["follower"],
    )
    lag_bytes = GaugeMetricFamily(
        "shoal_cluster_follower_lag_bytes",
        "Bytes sent to the follower that it has not acknowledged yet",
        labels=["follower"],
    )
    lag_seconds = GaugeMetricFamily(
        "shoal_cluster_follower_lag_seconds",
        "Age of the oldest write the follower has not acknowledged",
        labels=["follower"],
    )
    for f in view.get("followers", []):
        in_sync.add_metric([f["node"]], 1 if f["in_sync"] else 0)
        lag_bytes.add_metric([f["node"]], f["lag_bytes"])
        lag_seconds.add_metric([f["node"]], f["lag_seconds"])
    yield from (in_sync, lag_bytes, lag_seconds)
