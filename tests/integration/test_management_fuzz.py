"""Random requests over every route of the management API: names that
exist and names that cannot (long, a NUL, %2F), bodies of every JSON type
in the fields RabbitMQ's API reads, bodies that are not JSON. The API
answers each with a status a client can act on (the health checks' 503
included, as RabbitMQ's) and never with a 500; nothing is logged as a
failed request, and the broker serves on."""

from __future__ import annotations

import json
import random
import re
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

from aiohttp import web

from shoal.broker.management import api, ui
from tests.broker_process import Broker
from tests.integration.test_management import http, start_managed

REQUESTS = 1500
ADMIN = "fuzz-admin"  # the fuzzing's own login: never a name it sends
KEYS = [
    "tags", "password", "password_hash", "hashing_algorithm", "configure", "write", "read",
    "durable", "auto_delete", "arguments", "type", "internal", "routing_key", "payload",
    "payload_encoding", "properties", "count", "ackmode", "encoding", "truncate", "pattern",
    "definition", "priority", "apply-to", "value", "component", "max-connections",
    "max-queues", "name", "vhost", "destination", "destination_type", "users", "exchange",
    "description", "default_queue_type", "tracing", "src-uri", "dest-uri", "src-queue",
    "dest-queue", "reason", "requeue", "limit", "user", "node",
]  # fmt: skip
NAMES = [
    "%2F", "x", "fz", "amq.direct", "amq.topic", "nope", "a%00b", "%E9", "..", "%2Fx",
    "q" * 300, "127.0.0.1%3A1234%20-%3E%20x", "liveness", "alarms", "virtual-hosts",
    "port-listener", "5672", "protocol-listener", "amqp", "certificate-expiration", "1",
    "days", "node-is-quorum-critical", "shovel", "federation-upstream",
]  # fmt: skip
QUERIES = [
    "page=0", "page=x&page_size=1000", "columns=name", "sort=x&sort_reverse=true",
    "lengths_age=5&lengths_incr=x", "msg_rates_age=-1", "name=.*&use_regex=true",
    "disable_stats=true", "if-empty=true&if-unused=true",
]  # fmt: skip


def api_routes() -> list[tuple[str, str]]:
    """(method, path pattern) of every /api route the UI and the API add."""
    app = web.Application()
    ui.routes(app)
    api.routes(app)
    found = []
    for route in app.router.routes():
        info = route.resource.get_info() if route.resource is not None else {}
        path = info.get("formatter") or info.get("path")
        if path and path.startswith("/api") and route.method != "HEAD":
            found.append((route.method, path))
    return found


def value(rng: random.Random, depth: int = 0) -> Any:
    roll = rng.randrange(10)
    if roll < 4 or depth > 2:
        return rng.choice(
            [None, True, 0, -1, 2**64, 1.5, "", "x", "guest", "/", "direct", "queue",
             "ack_requeue_true", "base64", "classic", "stream", "administrator", ".*", "a" * 300]
        )  # fmt: skip
    if roll < 7:
        return [value(rng, depth + 1) for _ in range(rng.randrange(3))]
    return {rng.choice(KEYS): value(rng, depth + 1) for _ in range(rng.randrange(4))}


def test_random_requests_get_no_server_error(broker_factory: Callable[..., Broker]) -> None:
    broker = start_managed(broker_factory)
    assert (
        http(broker, "PUT", f"/users/{ADMIN}", {"password": "fz", "tags": "administrator"})[0]
        == 201
    )
    perms = {"configure": ".*", "write": ".*", "read": ".*"}
    assert http(broker, "PUT", f"/permissions/%2F/{ADMIN}", perms)[0] == 201
    routes = api_routes()
    assert len(routes) > 80
    rng = random.Random(5)
    port = broker.management_port  # type: ignore[attr-defined]
    statuses: dict[int, int] = {}
    server_errors = []
    for _ in range(REQUESTS):
        method, pattern = rng.choice(routes)
        path = re.sub(r"\{[^}]+\}", lambda _m: rng.choice(NAMES), pattern)
        if rng.random() < 0.3:
            path += "?" + rng.choice(QUERIES)
        data = None
        if method in ("PUT", "POST", "DELETE") and rng.random() < 0.9:
            roll = rng.random()
            if roll < 0.75:
                fields = {rng.choice(KEYS): value(rng) for _ in range(rng.randrange(6))}
                data = json.dumps(fields if rng.random() < 0.8 else value(rng)).encode()
            else:
                data = rng.choice([b"{", b"\xff\xfe", b"[1,", b"null"])
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}{path}",
            data=data,
            method=method,
            headers={"Content-Type": "application/json"},
        )
        request.add_unredirected_header("Authorization", "Basic ZnV6ei1hZG1pbjpmeg==")
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                status = response.status
        except urllib.error.HTTPError as exc:
            status = exc.code
            health = path.startswith("/api/health/") and status == 503
            if status >= 500 and not health:
                server_errors.append((method, path, data, status, exc.read()[:200]))
        statuses[status] = statuses.get(status, 0) + 1
    assert not server_errors, server_errors[:5]
    assert statuses.get(401, 0) < REQUESTS // 10, statuses  # the admin stayed one
    assert "Error handling request" not in broker.log()
    assert http(broker, "GET", "/overview")[0] == 200  # guest is left alone too


SECTIONS = {
    "users": ["name", "password", "password_hash", "hashing_algorithm", "tags", "limits"],
    "vhosts": ["name", "description", "tags", "default_queue_type", "metadata", "limits"],
    "permissions": ["user", "vhost", "configure", "write", "read"],
    "topic_permissions": ["user", "vhost", "exchange", "write", "read"],
    "queues": ["name", "vhost", "durable", "auto_delete", "arguments", "type"],
    "exchanges": ["name", "vhost", "type", "durable", "auto_delete", "internal", "arguments"],
    "bindings": ["source", "vhost", "destination", "destination_type", "routing_key", "arguments"],
    "policies": ["name", "vhost", "pattern", "apply-to", "definition", "priority"],
    "parameters": ["name", "vhost", "component", "value"],
    "global_parameters": ["name", "value"],
}


def test_random_definitions_are_imported_or_refused(broker_factory: Callable[..., Broker]) -> None:
    """Definitions files of random shape (every section, fields of every
    JSON type): each import is done or refused with 400, none is a server
    error or a traceback in the scheduler (tags that were not names were)."""
    broker = start_managed(broker_factory)
    rng = random.Random(3)
    statuses: dict[int, int] = {}
    for _ in range(400):
        body: dict[str, Any] = {}
        for section in rng.sample(list(SECTIONS), rng.randrange(1, 4)):
            fields = SECTIONS[section]
            body[section] = [
                {f: value(rng) for f in rng.sample(fields, rng.randrange(len(fields) + 1))}
                for _ in range(rng.randrange(1, 3))
            ]
            for entry in body[section]:  # (guest keeps its password and rights)
                if entry.get("name") == "guest" or entry.get("user") == "guest":
                    entry["name"] = entry["user"] = "other"
        path = rng.choice(["/definitions", "/definitions/%2F"])
        status, _reply = http(broker, "POST", path, body)
        statuses[status] = statuses.get(status, 0) + 1
    assert set(statuses) <= {200, 201, 204, 400, 404}, statuses
    assert statuses.get(400, 0) > 50 and statuses.get(204, 0) > 5, statuses
    log = broker.log()
    assert "Traceback" not in log and "Error handling request" not in log
