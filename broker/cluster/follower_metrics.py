"""A follower's Prometheus endpoint. A follower runs no broker, so nothing
else answers on its `--metrics-port`; without this, every follower would
read as a target down. It serves the node's own cluster view (its role,
the leader, the in-sync set's size, whether its copy is whole), the same
families a leader's metrics process serves beside the broker's
(broker/observe/cluster_families.py). The leader's scrape has each
follower's lag."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import Metric

from shoal.broker import listeners
from shoal.broker.observe.cluster_families import cluster_families

# The metrics process's paths (broker/observe/metrics.py): a scrape config
# written for either role gets an answer, not a 404.
PATHS = ("/metrics", "/metrics/per-object", "/metrics/detailed")


class _View:
    def __init__(self, view: Callable[[], dict[str, Any]]) -> None:
        self.view = view

    def collect(self) -> Iterator[Metric]:
        yield from cluster_families(self.view())


class FollowerMetrics:
    def __init__(self, view: Callable[[], dict[str, Any]]) -> None:
        """`view`: the node's cluster view, as `shoal status` shows it."""
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_View(view))
        self.runner: web.AppRunner | None = None

    async def start(self, binds: Sequence[str], port: int) -> None:
        app = web.Application()
        for path in PATHS:
            app.router.add_get(path, self._scrape)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        self.runner = runner
        for sock in listeners.listen(binds, port):
            await web.SockSite(runner, sock).start()

    async def close(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()
            self.runner = None

    async def _scrape(self, request: web.Request) -> web.Response:
        return web.Response(
            body=generate_latest(self.registry), headers={"Content-Type": CONTENT_TYPE_LATEST}
        )
