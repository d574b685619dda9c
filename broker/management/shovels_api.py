"""The management API's shovel endpoints, as RabbitMQ 3.10's with the
rabbitmq_shovel_management plugin:

- runtime parameters: `PUT|DELETE|GET /api/parameters/{component}/{vhost}/{name}`
  (a shovel is set as `{"value": {...}}`; 201 new, 204 replaced, 400 with
  RabbitMQ's "Validation failed" text);
- the shovels' status: `GET /api/shovels[/{vhost}]` and
  `/api/shovels/vhost/{vhost}/{name}` (the shovel process's rows,
  broker/shovel/link.py), `DELETE /api/shovels/vhost/{vhost}/{name}` (clears
  its parameter) and `DELETE .../restart`.

The listing of every parameter (`GET /api/parameters[/{component}[/{vhost}]]`)
is limits_api.py's, which adds the vhost limits."""

from __future__ import annotations

import asyncio
import html
from typing import Any

from aiohttp import web

from shoal.broker.amqp.shovel_definition import COMPONENT
from shoal.broker.management.backend import ControlError
from shoal.broker.management.http import (
    BACKEND,
    check_vhost,
    error,
    listing,
    path_name,
    path_vhost,
    read_body,
    visible_vhosts,
)
from shoal.broker.shovel import shovel_socket


def parameter_rows(
    request: web.Request, component: str | None, vhost: str | None
) -> list[dict[str, Any]]:
    """The runtime parameters the user may see, in RabbitMQ's shape
    (value first)."""
    parameters = request.app[BACKEND].current().parameters
    vhosts = [vhost] if vhost is not None else visible_vhosts(request)
    return [
        {"value": value, "vhost": v, "component": c, "name": name}
        for v in vhosts
        for (c, name), value in parameters.get(v, {}).items()
        if component in (None, c)
    ]


def _require_policymaker(request: web.Request) -> web.Response | None:
    if not {"administrator", "policymaker"} & request["tags"]:
        return error(401, "not_authorized", "Not policymaker user")
    return None


async def parameter(request: web.Request) -> web.StreamResponse:
    """One runtime parameter: GET, PUT {"value": ...}, DELETE."""
    refused = _require_policymaker(request)
    if refused is not None:
        return refused
    component, vhost, name = (
        path_name(request, "component"),
        path_vhost(request),
        path_name(request),
    )
    check_vhost(request, vhost)
    backend = request.app[BACKEND]
    existing = backend.current().parameters.get(vhost, {})
    if request.method == "GET":
        if (component, name) not in existing:
            return error(404, "Object Not Found", "Not Found")
        return web.json_response(
            {
                "value": existing[(component, name)],
                "vhost": vhost,
                "component": component,
                "name": name,
            }
        )
    if request.method == "DELETE":
        if (component, name) not in existing:
            return error(404, "Object Not Found", "Not Found")
        await backend.control(
            {"op": "clear_parameter", "vhost": vhost, "component": component, "name": name}
        )
        return web.Response(status=204)
    body = await read_body(request)
    if "value" not in body:
        return error(400, "bad_request", "[{key_missing,value}]")
    request_op = {
        "op": "set_parameter",
        "vhost": vhost,
        "component": component,
        "name": name,
        "value": body["value"],
    }
    try:
        await backend.control(request_op)
    except ControlError as exc:
        # RabbitMQ escapes the reason's HTML (its <<"...">> terms too).
        return error(400, "bad_request", html.escape(exc.text, quote=False))
    return web.Response(status=204 if (component, name) in existing else 201)


async def _status_rows(request: web.Request, vhost: str | None) -> list[dict[str, Any]]:
    runtime_dir = request.app[BACKEND].runtime_dir
    try:
        rows = await asyncio.to_thread(shovel_socket.status, runtime_dir, vhost)
    except OSError:
        rows = []  # no shovel process (--no-shovels, or restarting): none running
    visible = set(visible_vhosts(request))
    return sorted((r for r in rows if r["vhost"] in visible), key=lambda r: (r["vhost"], r["name"]))


async def shovels(request: web.Request) -> web.Response:
    vhost = path_vhost(request) if "vhost" in request.match_info else None
    if vhost is not None:
        check_vhost(request, vhost)
    return listing(request, await _status_rows(request, vhost))


async def shovel(request: web.Request) -> web.StreamResponse:
    """GET (the vhost's list, as RabbitMQ's), DELETE: the shovel's parameter."""
    vhost, name = path_vhost(request), path_name(request)
    check_vhost(request, vhost)
    rows = await _status_rows(request, vhost)
    if request.method == "GET":
        return listing(request, rows)
    refused = _require_policymaker(request)
    if refused is not None:
        return refused
    if not any(r["name"] == name for r in rows):
        return error(404, "Object Not Found", "Not Found")
    await request.app[BACKEND].control(
        {"op": "clear_parameter", "vhost": vhost, "component": COMPONENT, "name": name}
    )
    return web.Response(status=204)


async def restart(request: web.Request) -> web.StreamResponse:
    refused = _require_policymaker(request)
    if refused is not None:
        return refused
    vhost, name = path_vhost(request), path_name(request)
    check_vhost(request, vhost)
    runtime_dir = request.app[BACKEND].runtime_dir
    try:
        found = await asyncio.to_thread(shovel_socket.restart, runtime_dir, vhost, name)
    except OSError:
        found = False
    if not found:
        return error(404, "Object Not Found", "Not Found")
    return web.Response(status=204)


def routes(r: web.UrlDispatcher) -> None:
    for method in ("GET", "PUT", "DELETE"):
        r.add_route(method, "/api/parameters/{component}/{vhost}/{name}", parameter)
    r.add_get("/api/shovels", shovels)
    r.add_get("/api/shovels/{vhost}", shovels)
    for method in ("GET", "DELETE"):
        r.add_route(method, "/api/shovels/vhost/{vhost}/{name}", shovel)
    r.add_delete("/api/shovels/vhost/{vhost}/{name}/restart", restart)
