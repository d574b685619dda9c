"""What the management API's handlers share (api.py has the routes): the
app's keys, RabbitMQ's error bodies, the names in the path, what a user's
tags let it see, and the listings' ?columns= and ?sort=."""

from __future__ import annotations

import json
import re
from typing import Any

from aiohttp import web

from shoal.broker import node_name as shoal_node_name
from shoal.broker.management.backend import Backend
from shoal.broker.management.rates import Rates
from shoal.broker.management.shapes import ChannelRates, DataRates, ExchangeRates

BACKEND: web.AppKey[Backend] = web.AppKey("backend", Backend)
STARTED: web.AppKey[float] = web.AppKey("started", float)
RATES: web.AppKey[Rates] = web.AppKey("rates", Rates)
DATA_RATES: web.AppKey[DataRates] = web.AppKey("data_rates", DataRates)
CHANNEL_RATES: web.AppKey[ChannelRates] = web.AppKey("channel_rates", ChannelRates)
EXCHANGE_RATES: web.AppKey[ExchangeRates] = web.AppKey("exchange_rates", ExchangeRates)
MAX_PAGE_SIZE = 500  # RabbitMQ's


def error(status: int, kind: str, reason: str) -> web.Response:
    return web.json_response({"error": kind, "reason": reason}, status=status)


def path_vhost(request: web.Request) -> str:
    return request.match_info["vhost"]  # aiohttp has percent-decoded it (%2F: "/")


def path_name(request: web.Request, key: str = "name") -> str:
    return request.match_info[key]


def is_admin(request: web.Request) -> bool:
    return "administrator" in request["tags"]


def sees_all(request: web.Request) -> bool:
    return bool({"administrator", "monitoring"} & request["tags"])


def require_admin(request: web.Request) -> None:
    if not is_admin(request):
        raise web.HTTPUnauthorized(
            text=json.dumps({"error": "not_authorized", "reason": "Not administrator user"}),
            content_type="application/json",
        )


def visible_vhosts(request: web.Request) -> list[str]:
    definitions = request.app[BACKEND].current()
    if sees_all(request):
        return list(definitions.vhost_ids)
    user = request["user"]
    return [v for v in definitions.vhost_ids if (v, user) in definitions.permissions]


def check_vhost(request: web.Request, vhost: str) -> None:
    if vhost not in request.app[BACKEND].current().vhost_ids:
        raise web.HTTPNotFound(
            text=json.dumps({"error": "Object Not Found", "reason": "Not Found"}),
            content_type="application/json",
        )
    if vhost not in visible_vhosts(request):
        raise web.HTTPUnauthorized(
            text=json.dumps(
                {"error": "not_authorized", "reason": f"Access refused to vhost '{vhost}'"}
            ),
            content_type="application/json",
        )


def listing(request: web.Request, rows: list[dict[str, Any]]) -> web.Response:
    """?columns=a,b.c and ?sort=col&sort_reverse=true, and with ?page= the
    management UI's pagination (page_size, name, use_regex), as RabbitMQ's."""
    sort = request.query.get("sort")
    if sort:
        rows = sorted(rows, key=lambda r: str(r.get(sort, "")))
        if request.query.get("sort_reverse") == "true":
            rows.reverse()
    columns = request.query.get("columns")
    if "page" in request.query:  # filtered by name before the columns are picked
        page = _page(request, rows)
        page["items"] = _columns(page["items"], columns)
        return web.json_response(page)
    return web.json_response(_columns(rows, columns))


def _columns(rows: list[dict[str, Any]], columns: str | None) -> list[dict[str, Any]]:
    if not columns:
        return rows
    wanted = [c.split(".")[0] for c in columns.split(",")]
    return [{c: r[c] for c in wanted if c in r} for r in rows]


def _page(request: web.Request, rows: list[dict[str, Any]]) -> dict[str, Any]:
    query = request.query
    try:
        page, size = int(query["page"]), int(query.get("page_size", "100"))
        if page < 1 or not 1 <= size <= MAX_PAGE_SIZE:
            raise ValueError
    except ValueError:
        raise web.HTTPBadRequest(
            text=json.dumps(
                {
                    "error": "bad_request",
                    "reason": f"page and page_size must be integers, page_size 1 to "
                    f"{MAX_PAGE_SIZE}",
                }
            ),
            content_type="application/json",
        ) from None
    name = query.get("name", "")
    filtered = rows
    if name:
        if query.get("use_regex") == "true":
            try:
                pattern = re.compile(name)
            except re.error:
                pattern = re.compile(re.escape(name))
            filtered = [r for r in rows if pattern.search(str(r.get("name", "")))]
        else:
            filtered = [r for r in rows if name.lower() in str(r.get("name", "")).lower()]
    items = filtered[(page - 1) * size : page * size]
    return {
        "filtered_count": len(filtered),
        "item_count": len(items),
        "items": items,
        "page": page,
        "page_count": max(1, -(-len(filtered) // size)),
        "page_size": size,
        "total_count": len(rows),
    }


async def read_body(request: web.Request) -> dict[str, Any]:
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


def arguments_of(body: dict[str, Any]) -> dict[str, Any]:
    """A declare's or binding's "arguments": a JSON object (absent or null:
    none); anything else is the client's error (400, the middleware's)."""
    arguments = body.get("arguments")
    if arguments is None:
        return {}
    if not isinstance(arguments, dict):
        raise ValueError(f"arguments must be a JSON object, not {type(arguments).__name__}")
    return arguments


def node_name() -> str:
    return shoal_node_name.node_name()


async def per_vhost(request: web.Request, op: str, vhost: str | None) -> list[dict[str, Any]]:
    backend = request.app[BACKEND]
    vhosts = [vhost] if vhost is not None else visible_vhosts(request)
    rows: list[dict[str, Any]] = []
    for v in vhosts:
        rows += [{**row, "vhost": v} for row in await backend.rows(op, vhost=v)]
    return rows


async def scoped(request: web.Request, op: str) -> list[dict[str, Any]]:
    """Rows of every vhost for administrators and monitoring users, else
    the user's own (RabbitMQ's rule for connections and channels)."""
    rows = await request.app[BACKEND].rows(op)
    if sees_all(request):
        return rows
    return [r for r in rows if r.get("user") == request["user"]]
