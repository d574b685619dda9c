"""The PromQL queries of a Grafana dashboard JSON file, and the substitution of
Grafana's variables that makes them plain PromQL (for tests that run them
against Prometheus directly). Standard library only: no SDK needed.

    from grafana.queries import dashboard_queries, substitute
    for title, ref, expr in dashboard_queries("grafana/dashboards/shoal-overview.json"):
        promql = substitute(expr, cluster="shoal@host")
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from os import PathLike
from typing import Any

# What Grafana would put in for its built-in variables, for a direct query.
BUILTINS = {
    "__rate_interval": "1m",
    "__range": "5m",
    "__interval": "30s",
}
ENDPOINT = "aggregated"  # the hidden $endpoint variable's value when /metrics is scraped

# $name, ${name} and ${name:format}; a name is a whole identifier, so
# $__range never matches the start of $__range_s.
_VARIABLE = re.compile(r"\$\{(\w+)(?::[^}]*)?\}|\$(\w+)")


def _panels(items: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for panel in items:
        yield panel
        yield from _panels(panel.get("panels") or [])  # a collapsed row holds its panels


def dashboard_queries(path: str | PathLike[str]) -> list[tuple[str, str, str]]:
    """(panel title, refId, expr) of every target of every panel, rows'
    nested panels included, in the order of the file."""
    with open(path, encoding="utf-8") as f:
        dashboard = json.load(f)
    out = []
    for panel in _panels(dashboard.get("panels") or []):
        for target in panel.get("targets") or []:
            out.append(
                (
                    panel.get("title") or "",
                    target.get("refId") or "",
                    target.get("expr") or "",
                )
            )
    return out


def substitute(expr: str, cluster: str, namespace: str = "") -> str:
    """`expr` with Grafana's variables filled in: $__rate_interval=1m,
    $__range=5m, $__interval=30s, $rabbitmq_cluster=`cluster`,
    $namespace=`namespace`, $endpoint=aggregated (also in the ${...} forms).
    Other variables are left as they are."""
    values = dict(BUILTINS)
    values.update(rabbitmq_cluster=cluster, namespace=namespace, endpoint=ENDPOINT)

    def fill(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        return values.get(name, match.group(0))

    return _VARIABLE.sub(fill, expr)
