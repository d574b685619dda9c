"""RabbitMQ 3.x's older health endpoints, which monitoring scripts and
client libraries (AMQPStorm's management API, for one) still call:
/api/aliveness-test/{vhost} and /api/healthchecks/node[/{node}]. The newer
/api/health/checks/* are admin.health."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from shoal.broker.management.http import BACKEND, check_vhost, error, node_name, path_vhost

ALIVENESS_QUEUE = "aliveness-test"


async def aliveness_test(request: web.Request) -> web.Response:
    """As RabbitMQ's: as the caller, declare the queue `aliveness-test`
    (kept: a check polled often should not create and delete a queue each
    time), publish `test_message` to it through the default exchange and
    get it back; {"status": "ok"}, or "failed" with a reason and 503."""
    vhost = path_vhost(request)
    check_vhost(request, vhost)

    def work(channel: Any) -> bool:
        channel.queue_declare(ALIVENESS_QUEUE)
        channel.basic_publish("", ALIVENESS_QUEUE, b"test_message")
        method, _properties, _body = channel.basic_get(ALIVENESS_QUEUE, auto_ack=True)
        return method is not None

    if await request.app[BACKEND].amqp(request["user"], request["password"], vhost, work):
        return web.json_response({"status": "ok"})
    return _failed("aliveness-test queue is empty")


async def node_health(request: web.Request) -> web.Response:
    """/api/healthchecks/node, or with this node's name: ok unless a
    resource alarm is in force; another name is not found."""
    name = request.match_info.get("node")
    if name is not None and name != node_name():
        return error(404, "Object Not Found", "Not Found")
    alarms = request.app[BACKEND].alarms()
    if alarms:
        return _failed(alarms)
    return web.json_response({"status": "ok"})


def _failed(reason: str) -> web.Response:
    return web.json_response({"status": "failed", "reason": reason}, status=503)


def routes(router: web.UrlDispatcher) -> None:
    router.add_get("/api/aliveness-test/{vhost}", aliveness_test)
    router.add_get("/api/healthchecks/node", node_health)
    router.add_get("/api/healthchecks/node/", node_health)  # RabbitMQ's [:node] may be empty
    router.add_get("/api/healthchecks/node/{node}", node_health)
