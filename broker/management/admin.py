"""The management API's broker-wide handlers: overview, nodes, whoami,
vhosts, users, permissions, topic permissions, policies, definitions and
health checks (docs/access.md)."""

from __future__ import annotations

import platform
import sys
from typing import Any

from aiohttp import web

from shoal.broker import VERSION
from shoal.broker.amqp import access
from shoal.broker.amqp.definitions_json import RABBIT_VERSION as RABBITMQ_VERSION
from shoal.broker.config import Config
from shoal.broker.management import nodes_api, shapes
from shoal.broker.management.http import (
    BACKEND,
    RATES,
    check_vhost,
    error,
    listing,
    node_name,
    path_name,
    path_vhost,
    per_vhost,
    read_body,
    require_admin,
    scoped,
    visible_vhosts,
)
from shoal.broker.management.objects import connection_rows
from shoal.broker.management.rates import requested_age
from shoal.shm import processes

SAMPLE_RETENTION = {"global": [600, 3600, 28800, 86400], "basic": [600, 3600], "detailed": [600]}


def client_listeners(config: Config) -> list[tuple[str, int]]:
    """The client listeners, by RabbitMQ's protocol names, and their ports."""
    return [
        (protocol, port)
        for protocol, port, on in (
            ("amqp", config.port, config.plain_listener),
            ("amqp/ssl", config.tls_port, bool(config.tls_port)),
            ("mqtt", config.mqtt_port, bool(config.mqtt_port)),
            ("mqtt/ssl", config.mqtts_port, config.mqtts_listening()),
            ("http/web-mqtt", config.mqtt_ws_port, bool(config.mqtt_ws_port)),
        )
        if on
    ]


async def overview(request: web.Request) -> web.Response:
    backend = request.app[BACKEND]
    queues = await per_vhost(request, "list_queues", None)
    connections = await connection_rows(request)
    channels = await scoped(request, "list_channels")
    consumers = await scoped(request, "list_consumers")
    exchanges = await per_vhost(request, "list_exchanges", None)
    config = backend.config
    age = requested_age(request.query)
    listeners = [
        {
            "node": node_name(),
            "protocol": protocol,
            "ip_address": address,
            "port": port,
            "socket_opts": {},
        }
        for protocol, port in client_listeners(config)
        for address in config.bind
    ]
    return web.json_response(
        {
            # RabbitMQ's version numbers, which tools compare: what Shoal
            # is compatible with (the product's own version follows).
            "management_version": RABBITMQ_VERSION,
            "rabbitmq_version": RABBITMQ_VERSION,
            "product_name": "Shoal",
            "product_version": VERSION,
            "cluster_name": config.cluster_name or node_name(),
            "node": node_name(),
            "object_totals": {
                "queues": len(queues),
                "exchanges": len(exchanges),
                "connections": len(connections),
                "channels": len(channels),
                "consumers": len(consumers),
            },
            "queue_totals": {
                **request.app[RATES].queue_totals(age),
                "messages": sum(q["messages"] for q in queues),
                "messages_ready": sum(q["messages_ready"] for q in queues),
                "messages_unacknowledged": sum(q["messages_unacknowledged"] for q in queues),
            },
            "message_stats": request.app[RATES].overview(age),
            "churn_rates": request.app[RATES].churn(age),
            "listeners": listeners,
            "contexts": nodes_api.contexts(config),
            # What RabbitMQ 3.10's web UI reads before it shows a page
            # (www/js/global.js setup_global_vars).
            "rates_mode": "basic",
            "sample_retention_policies": SAMPLE_RETENTION,
            "exchange_types": nodes_api.EXCHANGE_TYPES,
            "disable_stats": False,
            "enable_queue_totals": False,
            "statistics_db_event_queue": 0,
            # RabbitMQ's fields, for the tools that read them: Shoal runs on
            # Python, and the web UI shows `python_version` (www/SHOAL.md).
            "erlang_version": f"none (Python {platform.python_version()})",
            "erlang_full_version": f"Shoal {VERSION} on Python {sys.version.split()[0]}",
            "python_version": platform.python_version(),
        }
    )


async def whoami(request: web.Request) -> web.Response:
    tags = request.app[BACKEND].current().users[request["user"]].tags
    return web.json_response({"name": request["user"], "tags": tags})


async def vhosts(request: web.Request) -> web.Response:
    names = visible_vhosts(request)
    return listing(request, await _vhost_objects(request, names))


async def _vhost_objects(request: web.Request, names: list[str]) -> list[dict[str, Any]]:
    """Vhosts as RabbitMQ shows them: their limits, their queues' messages
    and rates, their connections' bytes."""
    definitions = request.app[BACKEND].current()
    connections = await connection_rows(request)
    age = requested_age(request.query)
    return [
        {
            "name": v,
            "description": "",
            "tags": [],
            "metadata": {"description": "", "tags": []},
            "tracing": v in definitions.tracing,
            "limits": definitions.vhost_limits.get(v, {}),
            **shapes.vhost_fields(
                request.app[RATES],
                definitions.vhost_ids.get(v, -1),
                node_name(),
                [c for c in connections if c.get("vhost") == v],
                age,
            ),
        }
        for v in names
    ]


async def vhost(request: web.Request) -> web.StreamResponse:
    name = path_vhost(request)
    backend = request.app[BACKEND]
    if request.method == "GET":
        check_vhost(request, name)
        return web.json_response((await _vhost_objects(request, [name]))[0])
    require_admin(request)
    if request.method == "PUT":
        body = await read_body(request)
        created = name not in backend.current().vhost_ids
        if created:
            await backend.control({"op": "add_vhost", "vhost": name})
            # As RabbitMQ's API does: whoever creates a vhost may use it at
            # once (a client's next call declares a queue in it as that user).
            await backend.control(
                {"op": "set_permissions", "vhost": name, "user": request["user"]}
                | dict.fromkeys(("configure", "write", "read"), ".*")
            )
        tracing = body.get("tracing")
        if isinstance(tracing, bool):  # (absent: as it was)
            await backend.control({"op": "trace_on" if tracing else "trace_off", "vhost": name})
        return web.Response(status=201 if created else 204)
    await backend.control({"op": "delete_vhost", "vhost": name})
    return web.Response(status=204)


def _user_row(record: Any) -> dict[str, Any]:
    return {
        "name": record.user,
        "password_hash": record.password_hash,
        "hashing_algorithm": record.hashing_algorithm,
        "tags": record.tags,
        "limits": record.limits,
    }


async def users(request: web.Request) -> web.Response:
    require_admin(request)
    return listing(request, [_user_row(u) for u in request.app[BACKEND].current().users.values()])


async def user(request: web.Request) -> web.StreamResponse:
    require_admin(request)
    name = path_name(request)
    backend = request.app[BACKEND]
    existing = backend.current().users.get(name)
    if request.method == "GET":
        if existing is None:
            return error(404, "Object Not Found", "Not Found")
        return web.json_response(_user_row(existing))
    if request.method == "DELETE":
        await backend.control({"op": "delete_user", "user": name})
        return web.Response(status=204)
    body = await read_body(request)
    tags = body.get("tags", [])
    fields: dict[str, Any] = {"user": name, "tags": tags}
    if "password" in body:
        fields["password"] = str(body["password"])
    elif "password_hash" in body:
        fields["password_hash"] = str(body["password_hash"])
        fields["hashing_algorithm"] = str(body.get("hashing_algorithm") or access.SHA256)
    if existing is None:
        await backend.control({"op": "add_user", **fields})
        return web.Response(status=201)
    if "password" in fields:
        await backend.control(
            {"op": "change_password", "user": name, "password": fields["password"]}
        )
    await backend.control({"op": "set_user_tags", "user": name, "tags": tags})
    return web.Response(status=204)


async def users_bulk_delete(request: web.Request) -> web.Response:
    """POST /api/users/bulk-delete {"users": [...]}: RabbitMQ's, in order,
    stopping at the first name that is not a user (those before it stay
    deleted), with its error bodies."""
    require_admin(request)
    body = await read_body(request)
    names = body.get("users")
    if not isinstance(names, list):
        return error(400, "bad_request", "[{key_missing,users}]")
    backend = request.app[BACKEND]
    for name in names:
        if str(name) not in backend.current().users:
            return web.json_response(
                {"error": "bad_request", "reason": ["no_such_user", str(name)]}, status=400
            )
        await backend.control({"op": "delete_user", "user": str(name)})
    return web.Response(status=204)


async def permissions(request: web.Request) -> web.Response:
    """/api/permissions, /api/vhosts/V/permissions, /api/users/U/permissions."""
    require_admin(request)
    rows = [_permission_row(p) for p in request.app[BACKEND].current().permissions.values()]
    info = request.match_info
    if "vhost" in info:
        rows = [r for r in rows if r["vhost"] == info["vhost"]]
    if "name" in info:
        rows = [r for r in rows if r["user"] == info["name"]]
    return listing(request, rows)


def _permission_row(p: Any) -> dict[str, Any]:
    return {
        "user": p.user,
        "vhost": p.vhost,
        "configure": p.configure,
        "write": p.write,
        "read": p.read,
    }


async def permission(request: web.Request) -> web.StreamResponse:
    require_admin(request)
    vhost, name = path_vhost(request), path_name(request, "user")
    backend = request.app[BACKEND]
    if request.method == "GET":
        found = backend.current().permissions.get((vhost, name))
        if found is None:
            return error(404, "Object Not Found", "Not Found")
        return web.json_response(_permission_row(found))
    if request.method == "DELETE":
        await backend.control({"op": "clear_permissions", "vhost": vhost, "user": name})
        return web.Response(status=204)
    body = await read_body(request)
    created = (vhost, name) not in backend.current().permissions
    await backend.control(
        {
            "op": "set_permissions",
            "vhost": vhost,
            "user": name,
            **{k: str(body.get(k, "")) for k in ("configure", "write", "read")},
        }
    )
    return web.Response(status=201 if created else 204)


async def topic_permissions(request: web.Request) -> web.Response:
    """/api/topic-permissions, and one user's or one vhost's
    (/api/users/U/topic-permissions, /api/vhosts/V/topic-permissions)."""
    require_admin(request)
    definitions = request.app[BACKEND].current()
    info = request.match_info
    if "name" in info and path_name(request) not in definitions.users:
        return error(404, "Object Not Found", "Not Found")
    if "vhost" in info:
        check_vhost(request, path_vhost(request))
    rows = [
        {"user": p.user, "vhost": p.vhost, "exchange": p.exchange, "write": p.write, "read": p.read}
        for named in definitions.topic_permissions.values()
        for p in named.values()
        if ("name" not in info or p.user == path_name(request))
        and ("vhost" not in info or p.vhost == path_vhost(request))
    ]
    return listing(request, rows)


async def cluster_name(request: web.Request) -> web.Response:
    """The UI's header shows it; set with --cluster-name (no runtime change:
    a standalone Shoal is its own cluster)."""
    config = request.app[BACKEND].config
    if request.method == "PUT":
        return error(400, "bad_request", "the cluster name is set with --cluster-name")
    return web.json_response({"name": config.cluster_name or node_name()})


async def feature_flags(request: web.Request) -> web.Response:
    """RabbitMQ's feature flags gate what a mixed-version cluster may use;
    Shoal has none to enable: every behaviour it has is on. The UI lists
    the empty set."""
    require_admin(request)
    return listing(request, [])


async def policies(request: web.Request) -> web.Response:
    vhost = path_vhost(request) if "vhost" in request.match_info else None
    if vhost is not None:
        check_vhost(request, vhost)
    vhosts = [vhost] if vhost is not None else visible_vhosts(request)
    rows: list[dict[str, Any]] = []
    for v in vhosts:
        rows += await request.app[BACKEND].rows("list_policies", vhost=v)
    return listing(request, rows)


async def policy(request: web.Request) -> web.StreamResponse:
    if not {"administrator", "policymaker"} & request["tags"]:
        return error(401, "not_authorized", "Not policymaker user")
    vhost, name = path_vhost(request), path_name(request)
    check_vhost(request, vhost)  # a policymaker changes the vhosts it has access to only
    backend = request.app[BACKEND]
    if request.method == "GET":
        for row in await backend.rows("list_policies", vhost=vhost):
            if row["name"] == name:
                return web.json_response(row)
        return error(404, "Object Not Found", "Not Found")
    if request.method == "DELETE":
        await backend.control({"op": "clear_policy", "vhost": vhost, "name": name})
        return web.Response(status=204)
    body = await read_body(request)
    existed = name in backend.current().policies.get(vhost, {})
    await backend.control(
        {
            "op": "set_policy",
            "vhost": vhost,
            "name": name,
            "pattern": str(body.get("pattern", "")),
            "definition": body.get("definition") or {},
            "priority": int(body.get("priority", 0)),
            "apply_to": str(body.get("apply-to", "all")),
        }
    )
    return web.Response(status=204 if existed else 201)


async def definitions(request: web.Request) -> web.StreamResponse:
    require_admin(request)
    backend = request.app[BACKEND]
    if request.method == "GET":
        answer = await backend.control({"op": "export_definitions"})
        return web.json_response(answer["definitions"])
    body = await read_body(request)
    await backend.control({"op": "import_definitions", "definitions": body})
    return web.Response(status=204)


async def health(request: web.Request) -> web.Response:
    check = request.match_info["check"]
    backend = request.app[BACKEND]
    config = backend.config
    failed = ""
    if check in ("alarms", "local-alarms"):
        failed = backend.alarms()
    elif check == "port-listener":
        port = int(request.match_info.get("arg", "0") or 0)
        if port not in {p for _protocol, p in client_listeners(config)}:
            failed = f"No active listener on port {port}"
    elif check == "protocol-listener":
        protocol = request.match_info.get("arg", "")
        protocol = {"amqps": "amqp/ssl", "mqtts": "mqtt/ssl"}.get(protocol, protocol)
        if protocol not in {name for name, _port in client_listeners(config)}:
            failed = f"No active listener for protocol {protocol}"
    elif check == "virtual-hosts":
        # RabbitMQ's answers whether every vhost's processes run on the node;
        # here every vhost is served by the scheduler and the IO workers.
        if processes.not_serving(backend.seg):
            down = sorted(backend.current().vhosts)
            body = {
                "status": "failed",
                "reason": "Some virtual hosts are down",
                "virtual-hosts": down,
            }
            return web.json_response(body, status=503)
    elif check not in ("node-is-quorum-critical", "node-is-mirror-sync-critical"):
        return error(404, "Object Not Found", "Not Found")
    if failed:
        return web.json_response({"status": "failed", "reason": failed}, status=503)
    return web.json_response({"status": "ok"})
