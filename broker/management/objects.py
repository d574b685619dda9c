"""The management API's handlers for what clients make and use: queues,
exchanges, bindings (declared, deleted, purged, published to and fetched
from over AMQP as the API's user), connections, channels and consumers."""

from __future__ import annotations

import base64
from collections.abc import Callable
from typing import Any

from aiohttp import web

from shoal.broker.amqp.properties import BASIC_PROPERTIES
from shoal.broker.management import shapes
from shoal.broker.management.http import (
    BACKEND,
    CHANNEL_RATES,
    DATA_RATES,
    EXCHANGE_RATES,
    RATES,
    arguments_of,
    check_vhost,
    error,
    is_admin,
    listing,
    node_name,
    path_name,
    path_vhost,
    per_vhost,
    read_body,
    scoped,
)
from shoal.broker.management.rates import requested_age
from shoal.broker.scheduler import control as C


async def queues(request: web.Request) -> web.Response:
    vhost = path_vhost(request) if "vhost" in request.match_info else None
    if vhost is not None:
        check_vhost(request, vhost)
    rows = await per_vhost(request, "list_queues", vhost)
    live = request.app[RATES].live()
    return listing(request, [_queue_object(request, r, live, []) for r in rows])


def _queue_object(
    request: web.Request,
    row: dict[str, Any],
    live: dict[tuple[int, bytes], Any],
    consumers: list[dict[str, Any]],
) -> dict[str, Any]:
    """A queue as RabbitMQ's API shows it: with its message rates, bytes
    and paged-out messages (its counters now) and, on its own page, its
    consumers."""
    ids = request.app[BACKEND].current().vhost_ids
    key = (ids.get(row["vhost"], -1), row["name"].encode())
    counted = live.get(key)
    if counted is not None:
        row = {
            **row,
            "message_bytes": counted.bytes,
            "messages_paged_out": counted.paged_out,
            "message_bytes_paged_out": counted.ready_bytes * counted.paged_out // counted.ready
            if counted.ready
            else 0,
        }
    age = requested_age(request.query)
    return {  # the rates' sampled gauges first: the row's counts are live
        **request.app[RATES].queue(ids, row["vhost"], row["name"], age),
        **shapes.queue_fields(row, consumers),
        "node": node_name(),
    }


async def queue(request: web.Request) -> web.StreamResponse:
    vhost, name = path_vhost(request), path_name(request)
    check_vhost(request, vhost)
    backend = request.app[BACKEND]
    if request.method == "GET":
        for row in await backend.rows("list_queues", vhost=vhost):
            if row["name"] == name:
                consumers = await consumer_details(
                    request,
                    [
                        c
                        for c in await scoped(request, "list_consumers")
                        if c["vhost"] == vhost and c["queue_name"] == name
                    ],
                )
                live = request.app[RATES].live()
                return web.json_response(
                    _queue_object(request, {**row, "vhost": vhost}, live, consumers)
                )
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
    body = await read_body(request)
    declare = lambda ch: ch.queue_declare(  # noqa: E731
        name,
        durable=bool(body.get("durable", True)),
        auto_delete=bool(body.get("auto_delete", False)),
        arguments=arguments_of(body),
    )
    return await _declared(request, "list_queues", declare)


async def queue_contents(request: web.Request) -> web.StreamResponse:
    vhost, name = path_vhost(request), path_name(request)
    check_vhost(request, vhost)
    await request.app[BACKEND].amqp(
        request["user"], request["password"], vhost, lambda ch: ch.queue_purge(name)
    )
    return web.Response(status=204)


async def queue_get(request: web.Request) -> web.Response:
    vhost, name = path_vhost(request), path_name(request)
    check_vhost(request, vhost)
    body = await read_body(request)
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


async def exchanges(request: web.Request) -> web.Response:
    vhost = path_vhost(request) if "vhost" in request.match_info else None
    if vhost is not None:
        check_vhost(request, vhost)
    rows = await per_vhost(request, "list_exchanges", vhost)
    return listing(request, await _with_stats(request, [_exchange_object(r) for r in rows]))


def _exchange_object(row: dict[str, Any]) -> dict[str, Any]:
    """An exchange as the UI reads it: the publishers into it and the
    queues out of it (incoming, outgoing, per channel and queue on RabbitMQ)
    are not counted, only its totals (message_stats, _with_stats)."""
    return {**row, "user_who_performed_action": "", "incoming": [], "outgoing": []}


async def _with_stats(
    request: web.Request, rows: list[dict[str, Any]], every: bool = True
) -> list[dict[str, Any]]:
    """The rows with their message_stats: publish_in and publish_out, summed
    over the IO workers, and their rates."""
    answer = await request.app[BACKEND].control(C.ExchangeStats())
    counts: dict[tuple[str, str], tuple[int, ...]] = {
        (c["vhost"], c["name"]): (int(c["publish_in"]), int(c["publish_out"]))
        for c in answer["rows"]
    }
    age = requested_age(request.query)
    return request.app[EXCHANGE_RATES].fields(rows, counts, age, every)


async def exchange(request: web.Request) -> web.StreamResponse:
    vhost, name = path_vhost(request), path_name(request)
    check_vhost(request, vhost)
    backend = request.app[BACKEND]
    if request.method == "GET":
        for row in await backend.rows("list_exchanges", vhost=vhost):
            if row["name"] == ("" if name == "amq.default" else name):
                shaped = _exchange_object({**row, "vhost": vhost})
                [with_stats] = await _with_stats(request, [shaped], every=False)
                return web.json_response(with_stats)
        return error(404, "Object Not Found", "Not Found")
    user, password = request["user"], request["password"]
    if request.method == "DELETE":
        if_unused = request.query.get("if-unused") == "true"
        await backend.amqp(
            user, password, vhost, lambda ch: ch.exchange_delete(name, if_unused=if_unused)
        )
        return web.Response(status=204)
    body = await read_body(request)
    declare = lambda ch: ch.exchange_declare(  # noqa: E731
        name,
        str(body.get("type", "direct")),
        durable=bool(body.get("durable", True)),
        auto_delete=bool(body.get("auto_delete", False)),
        internal=bool(body.get("internal", False)),
        arguments=arguments_of(body),
    )
    return await _declared(request, "list_exchanges", declare)


async def _declared(request: web.Request, listing_op: str, declare: Any) -> web.Response:
    """A PUT: the declare over AMQP as the API's user; 201 if it is new,
    204 if it was there (RabbitMQ's codes)."""
    vhost, name = path_vhost(request), path_name(request)
    backend = request.app[BACKEND]
    existed = any(r["name"] == name for r in await backend.rows(listing_op, vhost=vhost))
    await backend.amqp(request["user"], request["password"], vhost, declare)
    return web.Response(status=204 if existed else 201)


async def exchange_publish(request: web.Request) -> web.Response:
    vhost, name = path_vhost(request), path_name(request)
    check_vhost(request, vhost)
    body = await read_body(request)
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


_PIKA_PROPERTIES = set(BASIC_PROPERTIES)


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
    """/api/bindings[/V], and one object's: /api/queues/V/Q/bindings,
    /api/exchanges/V/X/bindings/source|destination, /api/bindings/V/e/X/q|e/D
    (the bindings between two)."""
    vhost = path_vhost(request) if "vhost" in request.match_info else None
    if vhost is not None:
        check_vhost(request, vhost)
    rows = [_binding_row(r, r["vhost"]) for r in await per_vhost(request, "list_bindings", vhost)]
    info = request.match_info
    if "queue" in info:
        rows = [
            r
            for r in rows
            if r["destination_type"] == "queue" and r["destination"] == info["queue"]
        ]
    elif "exchange" in info:
        end = "source" if info["end"] == "source" else "destination"
        rows = [r for r in rows if r[end] == info["exchange"]]
        if end == "destination":
            rows = [r for r in rows if r["destination_type"] == "exchange"]
    elif "dest" in info:
        kind = "queue" if info["kind"] == "q" else "exchange"
        rows = [
            r
            for r in rows
            if (r["source"], r["destination_type"], r["destination"])
            == (info["source"], kind, info["dest"])
        ]
    return listing(request, rows)


async def binding_create(request: web.Request) -> web.StreamResponse:
    vhost = path_vhost(request)
    check_vhost(request, vhost)
    source, dest = path_name(request, "source"), path_name(request, "dest")
    body = await read_body(request)
    key = str(body.get("routing_key", ""))
    arguments = arguments_of(body)
    if request.match_info["kind"] == "q":
        work: Callable[[Any], Any] = lambda ch: ch.queue_bind(dest, source, key, arguments)  # noqa: E731
    else:
        work = lambda ch: ch.exchange_bind(dest, source, key, arguments)  # noqa: E731
    await request.app[BACKEND].amqp(request["user"], request["password"], vhost, work)
    location = f"{request.path}/{key or '~'}"
    return web.Response(status=201, headers={"Location": location})


async def binding_delete(request: web.Request) -> web.StreamResponse:
    vhost = path_vhost(request)
    check_vhost(request, vhost)
    source, dest = path_name(request, "source"), path_name(request, "dest")
    props = path_name(request, "props")
    key = "" if props == "~" else props.split("~")[0]
    if request.match_info["kind"] == "q":
        work: Callable[[Any], Any] = lambda ch: ch.queue_unbind(dest, source, key)  # noqa: E731
    else:
        work = lambda ch: ch.exchange_unbind(dest, source, key)  # noqa: E731
    await request.app[BACKEND].amqp(request["user"], request["password"], vhost, work)
    return web.Response(status=204)


async def connection_rows(request: web.Request) -> list[dict[str, Any]]:
    rows = await scoped(request, "list_connections")
    rows = [
        {**shapes.connection_fields(r), "node": node_name(), "channels": r.get("channels", 0)}
        for r in rows
    ]
    return request.app[DATA_RATES].fields(rows, requested_age(request.query))


async def connections(request: web.Request) -> web.Response:
    return listing(request, await connection_rows(request))


async def connection(request: web.Request) -> web.StreamResponse:
    name = path_name(request)
    found = [c for c in await connection_rows(request) if c["name"] == name]
    if not found:
        return error(404, "Object Not Found", "Not Found")
    if request.method == "GET":
        return web.json_response(found[0])
    if not is_admin(request) and found[0]["user"] != request["user"]:
        return error(401, "not_authorized", "Not administrator user")  # another's connection
    reason = request.headers.get("X-Reason", "Closed via management plugin")
    await request.app[BACKEND].control({"op": "close_connection", "name": name, "reason": reason})
    return web.Response(status=204)


async def _channels_and_connections(
    request: web.Request,
) -> tuple[list[dict[str, Any]], dict[str, dict[str, Any]]]:
    """The channels the caller may see, each with its connection's peer,
    and those connections by name."""
    rows = await scoped(request, "list_channels")
    connections = {c["name"]: c for c in await scoped(request, "list_connections")}
    for row in rows:
        peer = connections.get(row["connection"], {})
        row["peer_host"], row["peer_port"] = peer.get("peer_host"), peer.get("peer_port")
    return rows, connections


async def consumer_details(
    request: web.Request, consumers: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """Consumers as RabbitMQ lists them, their channel's details whole
    (connection_name, number, user, peer: what clients' tests read)."""
    rows, _connections = await _channels_and_connections(request)
    channels = {r["name"]: r for r in rows}
    node = node_name()
    return [
        shapes.consumer_detail({**c, "node": node}, channels.get(c["channel"])) for c in consumers
    ]


async def channel_rows(request: web.Request) -> list[dict[str, Any]]:
    """Channels with their connection's peer and their consumers."""
    rows, connections = await _channels_and_connections(request)
    consumers = await scoped(request, "list_consumers")
    by_channel: dict[str, list[dict[str, Any]]] = {}
    channels = {r["name"]: r for r in rows}
    for c in consumers:
        detail = shapes.consumer_detail({**c, "node": node_name()}, channels.get(c["channel"]))
        by_channel.setdefault(c["channel"], []).append(detail)
    shaped = [
        {
            **shapes.channel_fields(
                r, connections.get(r["connection"]), by_channel.get(r["name"], [])
            ),
            "node": node_name(),
        }
        for r in rows
    ]
    return request.app[CHANNEL_RATES].fields(shaped, requested_age(request.query))


async def channels(request: web.Request) -> web.Response:
    return listing(request, await channel_rows(request))


async def channel(request: web.Request) -> web.Response:
    name = path_name(request)
    for row in await channel_rows(request):
        if row["name"] == name:
            return web.json_response(row)
    return error(404, "Object Not Found", "Not Found")


async def connection_channels(request: web.Request) -> web.Response:
    """/api/connections/NAME/channels: a connection's page lists them."""
    name = path_name(request)
    if not any(c["name"] == name for c in await scoped(request, "list_connections")):
        return error(404, "Object Not Found", "Not Found")
    return listing(request, [r for r in await channel_rows(request) if r["connection"] == name])


async def consumers(request: web.Request) -> web.Response:
    rows = await scoped(request, "list_consumers")
    vhost = path_vhost(request) if "vhost" in request.match_info else None
    chosen = [r for r in rows if vhost is None or r["vhost"] == vhost]
    return listing(request, await consumer_details(request, chosen))
