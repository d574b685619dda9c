"""The management API's limits and parameters, as RabbitMQ 3.10's: vhost
limits (`/api/vhost-limits[/V[/NAME]]`), user limits
(`/api/user-limits[/U[/NAME]]`), runtime parameters (`/api/parameters`:
the vhost limits are RabbitMQ's `vhost-limits` component, the shovels its
`shovel` one, shovels_api.py; Shoal has no federation), global parameters
and operator policies (none), so that `rabbitmqadmin list parameters |
vhost_limits | operator_policies` and tools that read them work."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from shoal.broker.management import shovels_api
from shoal.broker.management.http import (
    BACKEND,
    check_vhost,
    error,
    listing,
    node_name,
    path_name,
    path_vhost,
    read_body,
    require_admin,
    visible_vhosts,
)


def _vhost_limit_rows(request: web.Request, vhost: str | None) -> list[dict[str, Any]]:
    limits = request.app[BACKEND].current().vhost_limits
    vhosts = [vhost] if vhost is not None else visible_vhosts(request)
    return [{"vhost": v, "value": limits[v]} for v in vhosts if limits.get(v)]


async def vhost_limits(request: web.Request) -> web.Response:
    vhost = path_vhost(request) if "vhost" in request.match_info else None
    if vhost is not None:
        check_vhost(request, vhost)
    return listing(request, _vhost_limit_rows(request, vhost))


async def vhost_limit(request: web.Request) -> web.Response:
    """PUT {"value": N} sets one limit, DELETE clears it (administrators)."""
    require_admin(request)
    vhost, name = path_vhost(request), path_name(request)
    check_vhost(request, vhost)
    value = await _value(request)
    await request.app[BACKEND].control(
        {"op": "set_vhost_limits", "vhost": vhost, "limits": {name: value}}
    )
    return web.Response(status=204)


async def user_limits(request: web.Request) -> web.Response:
    require_admin(request)
    users = request.app[BACKEND].current().users
    wanted = path_name(request, "user") if "user" in request.match_info else None
    rows = [
        {"user": u.user, "value": u.limits}
        for u in users.values()
        if u.limits and wanted in (None, u.user)
    ]
    return listing(request, rows)


async def user_limit(request: web.Request) -> web.Response:
    require_admin(request)
    user, name = path_name(request, "user"), path_name(request)
    if user not in request.app[BACKEND].current().users:
        return error(404, "Object Not Found", "Not Found")
    value = await _value(request)
    await request.app[BACKEND].control(
        {"op": "set_user_limits", "user": user, "limits": {name: value}}
    )
    return web.Response(status=204)


async def _value(request: web.Request) -> int:
    """A PUT's {"value": N}; a DELETE's -1 (RabbitMQ's "no limit")."""
    if request.method == "DELETE":
        return -1
    value = (await read_body(request)).get("value")
    if not isinstance(value, int) or isinstance(value, bool):
        raise web.HTTPBadRequest(
            text='{"error":"bad_request","reason":"value must be an integer"}',
            content_type="application/json",
        )
    return value


async def parameters(request: web.Request) -> web.Response:
    """Runtime parameters: the vhost limits are RabbitMQ's `vhost-limits`."""
    component = request.match_info.get("component")
    vhost = path_vhost(request) if "vhost" in request.match_info else None
    if vhost is not None:
        check_vhost(request, vhost)
    rows = shovels_api.parameter_rows(request, component, vhost)
    if component in (None, "vhost-limits"):
        rows += [
            {
                "vhost": r["vhost"],
                "component": "vhost-limits",
                "name": "limits",
                "value": r["value"],
            }
            for r in _vhost_limit_rows(request, vhost)
        ]
    return listing(request, rows)


async def global_parameters(request: web.Request) -> web.Response:
    require_admin(request)
    config = request.app[BACKEND].config
    return listing(request, [{"name": "cluster_name", "value": config.cluster_name or node_name()}])


async def operator_policies(request: web.Request) -> web.Response:
    return listing(request, [])  # Shoal has none: user policies only


def routes(r: web.UrlDispatcher) -> None:
    r.add_get("/api/vhost-limits", vhost_limits)
    r.add_get("/api/vhost-limits/{vhost}", vhost_limits)
    for method in ("PUT", "DELETE"):
        r.add_route(method, "/api/vhost-limits/{vhost}/{name}", vhost_limit)
        r.add_route(method, "/api/user-limits/{user}/{name}", user_limit)
    r.add_get("/api/user-limits", user_limits)
    r.add_get("/api/user-limits/{user}", user_limits)
    r.add_get("/api/parameters", parameters)
    r.add_get("/api/parameters/{component}", parameters)
    r.add_get("/api/parameters/{component}/{vhost}", parameters)
    r.add_get("/api/global-parameters", global_parameters)
    r.add_get("/api/operator-policies", operator_policies)
    r.add_get("/api/operator-policies/{vhost}", operator_policies)
