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
from collections.abc import Awaitable, Callable

from aiohttp import web

from shoal.broker.amqp import access
from shoal.broker.management import (
    admin,
    legacy_health,
    limits_api,
    nodes_api,
    objects,
    shovels_api,
    ui,
)
from shoal.broker.management.backend import AmqpError, ControlError
from shoal.broker.management.http import BACKEND, error

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
MANAGEMENT_TAGS = {"administrator", "monitoring", "policymaker", "management"}


@web.middleware
async def authenticate(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Basic auth, then the handler; errors as RabbitMQ's JSON. The web
    UI's files and /api/auth are public (ui.py)."""
    if ui.is_public(request.path):
        return await handler(request)
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


def _resource(
    router: web.UrlDispatcher, path: str, handler: Handler, methods: tuple[str, ...]
) -> None:
    """Only the methods RabbitMQ's API takes there (add_route adds no HEAD):
    a handler branches on GET and treats the rest as a change, so HEAD or
    POST must not reach it; they get 405."""
    for method in methods:
        router.add_route(method, path, handler)


def routes(app: web.Application) -> None:
    r = app.router  # add_get also answers HEAD: only for read-only handlers
    r.add_get("/api/overview", admin.overview)
    r.add_get("/api/nodes", nodes_api.nodes)
    r.add_get("/api/nodes/{name}", nodes_api.node)
    _resource(r, "/api/cluster-name", admin.cluster_name, ("GET", "PUT"))
    r.add_get("/api/feature-flags", admin.feature_flags)
    r.add_get("/api/whoami", admin.whoami)
    r.add_get("/api/vhosts", admin.vhosts)
    r.add_get("/api/vhosts/", admin.vhosts)  # the UI asks with the slash
    _resource(r, "/api/vhosts/{vhost}", admin.vhost, ("GET", "PUT", "DELETE"))
    r.add_get("/api/vhosts/{vhost}/permissions", admin.permissions)
    r.add_get("/api/users/{name}/permissions", admin.permissions)
    r.add_get("/api/users", admin.users)
    r.add_get("/api/users/", admin.users)  # the UI asks with the slash
    r.add_post("/api/users/bulk-delete", admin.users_bulk_delete)  # before /api/users/{name}
    _resource(r, "/api/users/{name}", admin.user, ("GET", "PUT", "DELETE"))
    r.add_get("/api/permissions", admin.permissions)
    _resource(r, "/api/permissions/{vhost}/{user}", admin.permission, ("GET", "PUT", "DELETE"))
    r.add_get("/api/topic-permissions", admin.topic_permissions)
    r.add_get("/api/users/{name}/topic-permissions", admin.topic_permissions)
    r.add_get("/api/vhosts/{vhost}/topic-permissions", admin.topic_permissions)
    r.add_get("/api/queues", objects.queues)
    r.add_get("/api/queues/{vhost}", objects.queues)
    _resource(r, "/api/queues/{vhost}/{name}", objects.queue, ("GET", "PUT", "DELETE"))
    r.add_delete("/api/queues/{vhost}/{name}/contents", objects.queue_contents)
    r.add_post("/api/queues/{vhost}/{name}/get", objects.queue_get)
    r.add_get("/api/exchanges", objects.exchanges)
    r.add_get("/api/exchanges/{vhost}", objects.exchanges)
    _resource(r, "/api/exchanges/{vhost}/{name}", objects.exchange, ("GET", "PUT", "DELETE"))
    r.add_post("/api/exchanges/{vhost}/{name}/publish", objects.exchange_publish)
    r.add_get("/api/bindings", objects.bindings)
    r.add_get("/api/bindings/{vhost}", objects.bindings)
    r.add_get("/api/queues/{vhost}/{queue}/bindings", objects.bindings)
    r.add_get(
        "/api/exchanges/{vhost}/{exchange}/bindings/{end:source|destination}", objects.bindings
    )
    r.add_get("/api/bindings/{vhost}/e/{source}/{kind:[qe]}/{dest}", objects.bindings)
    r.add_post("/api/bindings/{vhost}/e/{source}/{kind:[qe]}/{dest}", objects.binding_create)
    r.add_delete(
        "/api/bindings/{vhost}/e/{source}/{kind:[qe]}/{dest}/{props}", objects.binding_delete
    )
    r.add_get("/api/connections", objects.connections)
    _resource(r, "/api/connections/{name}", objects.connection, ("GET", "DELETE"))
    r.add_get("/api/connections/{name}/channels", objects.connection_channels)
    r.add_get("/api/channels", objects.channels)
    r.add_get("/api/channels/{name}", objects.channel)
    r.add_get("/api/consumers", objects.consumers)
    r.add_get("/api/consumers/{vhost}", objects.consumers)
    r.add_get("/api/policies", admin.policies)
    r.add_get("/api/policies/{vhost}", admin.policies)
    _resource(r, "/api/policies/{vhost}/{name}", admin.policy, ("GET", "PUT", "DELETE"))
    _resource(r, "/api/definitions", admin.definitions, ("GET", "POST"))
    r.add_get("/api/health/checks/{check}", admin.health)
    r.add_get("/api/health/checks/{check}/{arg}", admin.health)
    legacy_health.routes(r)
    limits_api.routes(r)
    shovels_api.routes(r)
