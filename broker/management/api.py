"""The management API's routes (issue 16, item 6): RabbitMQ's paths, JSON
field names and status codes for what tools use (rabbitmqadmin, monitoring
scripts): overview, nodes, vhosts, users, permissions, topic permissions,
queues (declare, delete, purge, get), exchanges (declare, delete,
publish), bindings, connections (and closing one), channels, consumers,
definitions, policies, whoami, health checks.

HTTP basic auth against the broker's users (broker/amqp/access.py); the
tags mean what they mean to RabbitMQ: `administrator` may do everything,
`monitoring` sees every vhost and connection, `policymaker` manages
policies, `management` sees the vhosts it has permissions in; a user
without any of them is refused, as are `loopback_users` from another
machine. What a client could do goes over AMQP as that user (backend.py),
so RabbitMQ's access control decides it."""

from __future__ import annotations

import base64
import binascii
import json
import socket
import time
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import unquote

from aiohttp import web

from shoal.broker import VERSION
from shoal.broker.amqp import access
from shoal.broker.amqp.definitions_json import RABBIT_VERSION as RABBITMQ_VERSION
from shoal.broker.management.backend import AmqpError, Backend, ControlError

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
MANAGEMENT_TAGS = {"administrator", "monitoring", "policymaker", "management"}
BACKEND: web.AppKey[Backend] = web.AppKey("backend", Backend)
STARTED: web.AppKey[float] = web.AppKey("started", float)


def error(status: int, kind: str, reason: str) -> web.Response:
    return web.json_response({"error": kind, "reason": reason}, status=status)


@web.middleware
async def authenticate(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Basic auth, then the handler; errors as RabbitMQ's JSON."""
    backend = request.app[BACKEND]
    header = request.headers.get("Authorization", "")
    user = password = ""
    if header.startswith("Basic "):
        try:
            user, _, password = base64.b64decode(header[6:]).decode().partition(":")
        except (binascii.Error, UnicodeDecodeError):
            pass
    record = backend.current().users.get(user)
    refused = {"WWW-Authenticate": 'Basic realm="RabbitMQ Management"'}
    if record is None or not access.password_matches(
        record.password_hash, record.hashing_algorithm, password
    ):
        response = error(401, "not_authorized", "Login failed")
        response.headers.update(refused)
        return response
    if user in backend.config.loopback_users and not access.is_loopback(request.remote or ""):
        return error(401, "not_authorized", "User can only log in via localhost")
    if not MANAGEMENT_TAGS & set(record.tags):
        return error(401, "not_authorized", "Not management user")
    request["user"], request["password"], request["tags"] = user, password, set(record.tags)
    try:
        return await handler(request)
    except ControlError as exc:
        if "does not exist" in exc.text:
            return error(404, "Object Not Found", exc.text)
        return error(400, "bad_request", exc.text)
    except AmqpError as exc:
        if exc.code == 404:
            return error(404, "Object Not Found", "Not Found")
        if exc.code in (401, 403, 530):
            return error(401, "not_authorized", exc.text)
        if exc.code == 503:
            return error(503, "service_unavailable", exc.text)
        return error(400, "bad_request", exc.text)
    except (ValueError, KeyError, TypeError) as exc:
        return error(400, "bad_request", str(exc))


# ------------------------------------------------------------- helpers
def _vhost(request: web.Request) -> str:
    return unquote(request.match_info["vhost"])


def _name(request: web.Request, key: str = "name") -> str:
    return unquote(request.match_info[key])


def _is_admin(request: web.Request) -> bool:
    return "administrator" in request["tags"]


def _sees_all(request: web.Request) -> bool:
    return bool({"administrator", "monitoring"} & request["tags"])


def _require_admin(request: web.Request) -> None:
    if not _is_admin(request):
        raise web.HTTPUnauthorized(
            text=json.dumps({"error": "not_authorized", "reason": "Not administrator user"}),
            content_type="application/json",
        )


def _visible_vhosts(request: web.Request) -> list[str]:
    definitions = request.app[BACKEND].current()
    if _sees_all(request):
        return list(definitions.vhost_ids)
    user = request["user"]
    return [v for v in definitions.vhost_ids if (v, user) in definitions.permissions]


def _check_vhost(request: web.Request, vhost: str) -> None:
    if vhost not in request.app[BACKEND].current().vhost_ids:
        raise web.HTTPNotFound(
            text=json.dumps({"error": "Object Not Found", "reason": "Not Found"}),
            content_type="application/json",
        )
    if vhost not in _visible_vhosts(request):
        raise web.HTTPUnauthorized(
            text=json.dumps(
                {"error": "not_authorized", "reason": f"Access refused to vhost '{vhost}'"}
            ),
            content_type="application/json",
        )


def _listing(request: web.Request, rows: list[dict[str, Any]]) -> web.Response:
    """?columns=a,b.c and ?sort=col&sort_reverse=true, as RabbitMQ's."""
    sort = request.query.get("sort")
    if sort:
        rows = sorted(rows, key=lambda r: str(r.get(sort, "")))
        if request.query.get("sort_reverse") == "true":
            rows.reverse()
    columns = request.query.get("columns")
    if columns:
        wanted = [c.split(".")[0] for c in columns.split(",")]
        rows = [{c: r[c] for c in wanted if c in r} for r in rows]
    return web.json_response(rows)


async def _body(request: web.Request) -> dict[str, Any]:
    if not request.can_read_body:
        return {}
    try:
        body = await request.json()
    except ValueError:
        raise web.HTTPBadRequest(
            text=json.dumps({"error": "bad_request", "reason": "body is not JSON"}),
            content_type="application/json",
        ) from None
    if not isinstance(body, dict):
        raise web.HTTPBadRequest(
            text=json.dumps({"error": "bad_request", "reason": "body is not a JSON object"}),
            content_type="application/json",
        )
    return body


def _node() -> str:
    return f"shoal@{socket.gethostname()}"


async def _per_vhost(request: web.Request, op: str, vhost: str | None) -> list[dict[str, Any]]:
    backend = request.app[BACKEND]
    vhosts = [vhost] if vhost is not None else _visible_vhosts(request)
    rows: list[dict[str, Any]] = []
    for v in vhosts:
        rows += [{**row, "vhost": v} for row in await backend.rows(op, vhost=v)]
    return rows


# --------------------------------------------------------- the overview
async def overview(request: web.Request) -> web.Response:
    backend = request.app[BACKEND]
    queues = await _per_vhost(request, "list_queues", None)
    connections = await _connections(request)
    channels = await _scoped(request, "list_channels")
    consumers = await _scoped(request, "list_consumers")
    exchanges = await _per_vhost(request, "list_exchanges", None)
    config = backend.config
    listeners = [
        {"node": _node(), "protocol": "amqp", "ip_address": config.bind, "port": config.port}
    ]
    if config.tls_port:
        listeners.append(
            {
                "node": _node(),
                "protocol": "amqp/ssl",
                "ip_address": config.bind,
                "port": config.tls_port,
            }
        )
    return web.json_response(
        {
            # RabbitMQ's version numbers, which tools compare: what Shoal
            # is compatible with (the product's own version follows).
            "management_version": RABBITMQ_VERSION,
            "rabbitmq_version": RABBITMQ_VERSION,
            "product_name": "Shoal",
            "product_version": VERSION,
            "cluster_name": config.cluster_name or _node(),
            "node": _node(),
            "object_totals": {
                "queues": len(queues),
                "exchanges": len(exchanges),
                "connections": len(connections),
                "channels": len(channels),
                "consumers": len(consumers),
            },
            "queue_totals": {
                "messages": sum(q["messages"] for q in queues),
                "messages_ready": sum(q["messages_ready"] for q in queues),
                "messages_unacknowledged": sum(q["messages_unacknowledged"] for q in queues),
            },
            "message_stats": {},
            "listeners": listeners,
            "contexts": [
                {
                    "node": _node(),
                    "description": "RabbitMQ Management",
                    "port": str(config.management_port),
                }
            ],
        }
    )


async def nodes(request: web.Request) -> web.Response:
    started = request.app[STARTED]
    return web.json_response(
        [
            {
                "name": _node(),
                "type": "disc",
                "running": True,
                "uptime": int((time.monotonic() - started) * 1000),
                "partitions": [],
            }
        ]
    )


async def whoami(request: web.Request) -> web.Response:
    tags = request.app[BACKEND].current().users[request["user"]].tags
    return web.json_response({"name": request["user"], "tags": tags})


# ------------------------------------------------------ users and vhosts
async def vhosts(request: web.Request) -> web.Response:
    limits = request.app[BACKEND].current().vhost_limits
    return _listing(
        request,
        [
            {
                "name": v,
                "description": "",
                "tags": [],
                "metadata": {"description": "", "tags": []},
                "tracing": False,
                "limits": limits.get(v, {}),
            }
            for v in _visible_vhosts(request)
        ],
    )


async def vhost(request: web.Request) -> web.StreamResponse:
    name = _vhost(request)
    backend = request.app[BACKEND]
    if request.method == "GET":
        _check_vhost(request, name)
        return web.json_response({"name": name, "description": "", "tags": [], "tracing": False})
    _require_admin(request)
    if request.method == "PUT":
        if name not in backend.current().vhost_ids:
            await backend.control({"op": "add_vhost", "vhost": name})
            return web.Response(status=201)
        return web.Response(status=204)
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
    _require_admin(request)
    return _listing(request, [_user_row(u) for u in request.app[BACKEND].current().users.values()])


async def user(request: web.Request) -> web.StreamResponse:
    _require_admin(request)
    name = _name(request)
    backend = request.app[BACKEND]
    existing = backend.current().users.get(name)
    if request.method == "GET":
        if existing is None:
            return error(404, "Object Not Found", "Not Found")
        return web.json_response(_user_row(existing))
    if request.method == "DELETE":
        await backend.control({"op": "delete_user", "user": name})
        return web.Response(status=204)
    body = await _body(request)
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


async def permissions(request: web.Request) -> web.Response:
    _require_admin(request)
    definitions = request.app[BACKEND].current()
    return _listing(request, [_permission_row(p) for p in definitions.permissions.values()])


def _permission_row(p: Any) -> dict[str, Any]:
    return {
        "user": p.user,
        "vhost": p.vhost,
        "configure": p.configure,
        "write": p.write,
        "read": p.read,
    }


async def permission(request: web.Request) -> web.StreamResponse:
    _require_admin(request)
    vhost, name = _vhost(request), _name(request, "user")
    backend = request.app[BACKEND]
    if request.method == "GET":
        found = backend.current().permissions.get((vhost, name))
        if found is None:
            return error(404, "Object Not Found", "Not Found")
        return web.json_response(_permission_row(found))
    if request.method == "DELETE":
        await backend.control({"op": "clear_permissions", "vhost": vhost, "user": name})
        return web.Response(status=204)
    body = await _body(request)
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
    _require_admin(request)
    definitions = request.app[BACKEND].current()
    rows = [
        {"user": p.user, "vhost": p.vhost, "exchange": p.exchange, "write": p.write, "read": p.read}
        for named in definitions.topic_permissions.values()
        for p in named.values()
    ]
    return _listing(request, rows)


# ------------------------------------------------------------- queues
async def queues(request: web.Request) -> web.Response:
    vhost = _vhost(request) if "vhost" in request.match_info else None
    if vhost is not None:
        _check_vhost(request, vhost)
    rows = await _per_vhost(request, "list_queues", vhost)
    return _listing(request, [{**r, "node": _node()} for r in rows])


async def queue(request: web.Request) -> web.StreamResponse:
    vhost, name = _vhost(request), _name(request)
    _check_vhost(request, vhost)
    backend = request.app[BACKEND]
    if request.method == "GET":
        for row in await backend.rows("list_queues", vhost=vhost):
            if row["name"] == name:
                return web.json_response({**row, "vhost": vhost, "node": _node()})
        return error(404, "Object Not Found", "Not Found")
    user, password = request["user"], request["password"]
    if request.method == "DELETE":
        if_empty = request.query.get("if-empty") == "true"
        if_unused = request.query.get("if-unused") == "true"
        await backend.amqp(
            user,
            password,
            vhost,
            lambda ch: ch.queue_delete(name, if_unused=if_unused, if_empty=if_empty),
        )
        return web.Response(status=204)
    body = await _body(request)
    existed = any(r["name"] == name for r in await backend.rows("list_queues", vhost=vhost))
    await backend.amqp(
        user,
        password,
        vhost,
        lambda ch: ch.queue_declare(
            name,
            durable=bool(body.get("durable", True)),
            auto_delete=bool(body.get("auto_delete", False)),
            arguments=body.get("arguments") or {},
        ),
    )
    return web.Response(status=204 if existed else 201)


async def queue_contents(request: web.Request) -> web.StreamResponse:
    vhost, name = _vhost(request), _name(request)
    _check_vhost(request, vhost)
    await request.app[BACKEND].amqp(
        request["user"], request["password"], vhost, lambda ch: ch.queue_purge(name)
    )
    return web.Response(status=204)


async def queue_get(request: web.Request) -> web.Response:
    vhost, name = _vhost(request), _name(request)
    _check_vhost(request, vhost)
    body = await _body(request)
    ackmode = str(body.get("ackmode", "ack_requeue_true"))
    if ackmode not in (
        "ack_requeue_true",
        "ack_requeue_false",
        "reject_requeue_true",
        "reject_requeue_false",
    ):
        return error(400, "bad_request", f"unknown ackmode {ackmode!r}")
    truncate = body.get("truncate")
    got = await request.app[BACKEND].get(
        request["user"],
        request["password"],
        vhost,
        name,
        int(body.get("count", 1)),
        ackmode.endswith("_true"),
        str(body.get("encoding", "auto")),
        int(truncate) if truncate not in (None, "") else None,
    )
    return web.json_response(got)


# ---------------------------------------------------------- exchanges
async def exchanges(request: web.Request) -> web.Response:
    vhost = _vhost(request) if "vhost" in request.match_info else None
    if vhost is not None:
        _check_vhost(request, vhost)
    rows = await _per_vhost(request, "list_exchanges", vhost)
    return _listing(request, [{**r, "user_who_performed_action": ""} for r in rows])


async def exchange(request: web.Request) -> web.StreamResponse:
    vhost, name = _vhost(request), _name(request)
    _check_vhost(request, vhost)
    backend = request.app[BACKEND]
    if request.method == "GET":
        for row in await backend.rows("list_exchanges", vhost=vhost):
            if row["name"] == ("" if name == "amq.default" else name):
                return web.json_response({**row, "vhost": vhost})
        return error(404, "Object Not Found", "Not Found")
    user, password = request["user"], request["password"]
    if request.method == "DELETE":
        if_unused = request.query.get("if-unused") == "true"
        await backend.amqp(
            user, password, vhost, lambda ch: ch.exchange_delete(name, if_unused=if_unused)
        )
        return web.Response(status=204)
    body = await _body(request)
    existed = any(r["name"] == name for r in await backend.rows("list_exchanges", vhost=vhost))
    await backend.amqp(
        user,
        password,
        vhost,
        lambda ch: ch.exchange_declare(
            name,
            str(body.get("type", "direct")),
            durable=bool(body.get("durable", True)),
            auto_delete=bool(body.get("auto_delete", False)),
            internal=bool(body.get("internal", False)),
            arguments=body.get("arguments") or {},
        ),
    )
    return web.Response(status=204 if existed else 201)


async def exchange_publish(request: web.Request) -> web.Response:
    vhost, name = _vhost(request), _name(request)
    _check_vhost(request, vhost)
    body = await _body(request)
    payload = str(body.get("payload", ""))
    encoding = body.get("payload_encoding", "string")
    data = base64.b64decode(payload) if encoding == "base64" else payload.encode()
    properties = body.get("properties") or {}
    if not isinstance(properties, dict):
        return error(400, "bad_request", "properties must be an object")
    routed = await request.app[BACKEND].publish(
        request["user"],
        request["password"],
        vhost,
        name,
        str(body.get("routing_key", "")),
        data,
        {k: v for k, v in properties.items() if k in _PIKA_PROPERTIES},
    )
    return web.json_response({"routed": routed})


_PIKA_PROPERTIES = {
    "content_type",
    "content_encoding",
    "headers",
    "delivery_mode",
    "priority",
    "correlation_id",
    "reply_to",
    "expiration",
    "message_id",
    "timestamp",
    "type",
    "user_id",
    "app_id",
    "cluster_id",
}


# ------------------------------------------------------------ bindings
def _binding_row(row: dict[str, Any], vhost: str) -> dict[str, Any]:
    return {
        "source": row["source_name"],
        "vhost": vhost,
        "destination": row["destination_name"],
        "destination_type": row["destination_kind"],
        "routing_key": row["routing_key"],
        "arguments": row["arguments"],
        "properties_key": row["routing_key"] or "~",
    }


async def bindings(request: web.Request) -> web.Response:
    vhost = _vhost(request) if "vhost" in request.match_info else None
    if vhost is not None:
        _check_vhost(request, vhost)
    rows = await _per_vhost(request, "list_bindings", vhost)
    return _listing(request, [_binding_row(r, r["vhost"]) for r in rows])


async def binding_create(request: web.Request) -> web.StreamResponse:
    vhost = _vhost(request)
    _check_vhost(request, vhost)
    source, dest = _name(request, "source"), _name(request, "dest")
    body = await _body(request)
    key = str(body.get("routing_key", ""))
    arguments = body.get("arguments") or {}
    if request.match_info["kind"] == "q":
        work: Callable[[Any], Any] = lambda ch: ch.queue_bind(dest, source, key, arguments)  # noqa: E731
    else:
        work = lambda ch: ch.exchange_bind(dest, source, key, arguments)  # noqa: E731
    await request.app[BACKEND].amqp(request["user"], request["password"], vhost, work)
    location = f"{request.path}/{key or '~'}"
    return web.Response(status=201, headers={"Location": location})


async def binding_delete(request: web.Request) -> web.StreamResponse:
    vhost = _vhost(request)
    _check_vhost(request, vhost)
    source, dest = _name(request, "source"), _name(request, "dest")
    props = _name(request, "props")
    key = "" if props == "~" else props.split("~")[0]
    if request.match_info["kind"] == "q":
        work: Callable[[Any], Any] = lambda ch: ch.queue_unbind(dest, source, key)  # noqa: E731
    else:
        work = lambda ch: ch.exchange_unbind(dest, source, key)  # noqa: E731
    await request.app[BACKEND].amqp(request["user"], request["password"], vhost, work)
    return web.Response(status=204)


# ---------------------------------------------- connections and channels
async def _scoped(request: web.Request, op: str) -> list[dict[str, Any]]:
    """Rows of every vhost for administrators and monitoring users, else
    the user's own (RabbitMQ's rule for connections and channels)."""
    rows = await request.app[BACKEND].rows(op)
    if _sees_all(request):
        return rows
    return [r for r in rows if r.get("user") == request["user"]]


async def _connections(request: web.Request) -> list[dict[str, Any]]:
    rows = await _scoped(request, "list_connections")
    return [{**r, "node": _node(), "channels": r.get("channels", 0)} for r in rows]


async def connections(request: web.Request) -> web.Response:
    return _listing(request, await _connections(request))


async def connection(request: web.Request) -> web.StreamResponse:
    name = _name(request)
    found = [c for c in await _connections(request) if c["name"] == name]
    if not found:
        return error(404, "Object Not Found", "Not Found")
    if request.method == "GET":
        return web.json_response(found[0])
    reason = request.headers.get("X-Reason", "Closed via management plugin")
    await request.app[BACKEND].control({"op": "close_connection", "name": name, "reason": reason})
    return web.Response(status=204)


async def channels(request: web.Request) -> web.Response:
    rows = await _scoped(request, "list_channels")
    return _listing(
        request,
        [
            {
                **r,
                "node": _node(),
                "connection_details": {"name": r["connection"]},
                "state": "running",
            }
            for r in rows
        ],
    )


async def consumers(request: web.Request) -> web.Response:
    rows = await _scoped(request, "list_consumers")
    vhost = _vhost(request) if "vhost" in request.match_info else None
    return _listing(
        request,
        [
            {
                "consumer_tag": r["consumer_tag"],
                "queue": {"name": r["queue_name"], "vhost": r["vhost"]},
                "channel_details": {"name": r["channel"]},
                "ack_required": r["ack_required"],
                "exclusive": r["exclusive"],
                "prefetch_count": r["prefetch_count"],
                "active": r["active"],
                "activity_status": r["activity_status"],
                "arguments": r["arguments"],
            }
            for r in rows
            if vhost is None or r["vhost"] == vhost
        ],
    )


# --------------------------------------------------- policies, definitions
async def policies(request: web.Request) -> web.Response:
    vhost = _vhost(request) if "vhost" in request.match_info else None
    vhosts = [vhost] if vhost is not None else _visible_vhosts(request)
    rows: list[dict[str, Any]] = []
    for v in vhosts:
        rows += await request.app[BACKEND].rows("list_policies", vhost=v)
    return _listing(request, rows)


async def policy(request: web.Request) -> web.StreamResponse:
    if not {"administrator", "policymaker"} & request["tags"]:
        return error(401, "not_authorized", "Not policymaker user")
    vhost, name = _vhost(request), _name(request)
    backend = request.app[BACKEND]
    if request.method == "GET":
        for row in await backend.rows("list_policies", vhost=vhost):
            if row["name"] == name:
                return web.json_response(row)
        return error(404, "Object Not Found", "Not Found")
    if request.method == "DELETE":
        await backend.control({"op": "clear_policy", "vhost": vhost, "name": name})
        return web.Response(status=204)
    body = await _body(request)
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
    _require_admin(request)
    backend = request.app[BACKEND]
    if request.method == "GET":
        answer = await backend.control({"op": "export_definitions"})
        return web.json_response(answer["definitions"])
    body = await _body(request)
    await backend.control({"op": "import_definitions", "definitions": body})
    return web.Response(status=204)


# ------------------------------------------------------------- health
async def health(request: web.Request) -> web.Response:
    check = request.match_info["check"]
    backend = request.app[BACKEND]
    config = backend.config
    failed = ""
    if check in ("alarms", "local-alarms"):
        failed = backend.alarms()
    elif check == "port-listener":
        port = int(request.match_info.get("arg", "0") or 0)
        if port not in (config.port if config.plain_listener else 0, config.tls_port):
            failed = f"No active listener on port {port}"
    elif check == "protocol-listener":
        protocol = request.match_info.get("arg", "")
        known = {"amqp": config.plain_listener, "amqp/ssl": bool(config.tls_port)}
        if protocol in ("amqps", "amqp/ssl"):
            protocol = "amqp/ssl"
        if not known.get(protocol):
            failed = f"No active listener for protocol {protocol}"
    elif check not in ("virtual-hosts", "node-is-quorum-critical", "node-is-mirror-sync-critical"):
        return error(404, "Object Not Found", "Not Found")
    if failed:
        return web.json_response({"status": "failed", "reason": failed}, status=503)
    return web.json_response({"status": "ok"})


def routes(app: web.Application) -> None:
    r = app.router
    r.add_get("/api/overview", overview)
    r.add_get("/api/nodes", nodes)
    r.add_get("/api/whoami", whoami)
    r.add_get("/api/vhosts", vhosts)
    r.add_route("*", "/api/vhosts/{vhost}", vhost)
    r.add_get("/api/users", users)
    r.add_route("*", "/api/users/{name}", user)
    r.add_get("/api/permissions", permissions)
    r.add_route("*", "/api/permissions/{vhost}/{user}", permission)
    r.add_get("/api/topic-permissions", topic_permissions)
    r.add_get("/api/queues", queues)
    r.add_get("/api/queues/{vhost}", queues)
    r.add_route("*", "/api/queues/{vhost}/{name}", queue)
    r.add_delete("/api/queues/{vhost}/{name}/contents", queue_contents)
    r.add_post("/api/queues/{vhost}/{name}/get", queue_get)
    r.add_get("/api/exchanges", exchanges)
    r.add_get("/api/exchanges/{vhost}", exchanges)
    r.add_route("*", "/api/exchanges/{vhost}/{name}", exchange)
    r.add_post("/api/exchanges/{vhost}/{name}/publish", exchange_publish)
    r.add_get("/api/bindings", bindings)
    r.add_get("/api/bindings/{vhost}", bindings)
    r.add_post("/api/bindings/{vhost}/e/{source}/{kind:[qe]}/{dest}", binding_create)
    r.add_delete("/api/bindings/{vhost}/e/{source}/{kind:[qe]}/{dest}/{props}", binding_delete)
    r.add_get("/api/connections", connections)
    r.add_route("*", "/api/connections/{name}", connection)
    r.add_get("/api/channels", channels)
    r.add_get("/api/consumers", consumers)
    r.add_get("/api/consumers/{vhost}", consumers)
    r.add_get("/api/policies", policies)
    r.add_get("/api/policies/{vhost}", policies)
    r.add_route("*", "/api/policies/{vhost}/{name}", policy)
    r.add_route("*", "/api/definitions", definitions)
    r.add_get("/api/health/checks/{check}", health)
    r.add_get("/api/health/checks/{check}/{arg}", health)
