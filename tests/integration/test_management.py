"""The HTTP management API (issue 16, item 6): RabbitMQ 3.10's own
rabbitmqadmin script (data/rabbitmqadmin, unchanged) lists, declares,
publishes, gets and deletes through it; the API's logins and tags mean
what RabbitMQ's do; what a client could do is access-checked as that
user; definitions, connections and health checks. Real sockets, bounded
waits."""

from __future__ import annotations

import base64
import json
import os
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pika
import pika.exceptions
import psutil
import pytest

from tests.broker_process import Broker, free_port, wait_for
from tests.clients import connect, connections_on_both_workers, shoal

RABBITMQADMIN = Path(__file__).parent / "data" / "rabbitmqadmin"


def start_managed(broker_factory: Callable[..., Broker], *args: str) -> Broker:
    """A broker with its management listener on a free port (its
    `management_port`), once that port accepts connections."""
    port = free_port()
    broker = broker_factory(args=("--management-port", str(port), *args))
    broker.management_port = port  # type: ignore[attr-defined]

    def up() -> bool:
        with socket.socket() as s:
            return s.connect_ex(("127.0.0.1", port)) == 0

    wait_for(up, 20, "the management API")
    return broker


@pytest.fixture
def managed(broker_factory: Callable[..., Broker]) -> Broker:
    return start_managed(broker_factory)


def admin(broker: Broker, *args: str, user: str = "guest", password: str = "guest") -> str:
    port = broker.management_port  # type: ignore[attr-defined]
    done = subprocess.run(
        [sys.executable, str(RABBITMQADMIN), "-P", str(port), "-u", user, "-p", password, *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_a_channels_message_stats_count_and_rate(managed: Broker) -> None:
    """/api/channels: each channel's publish, confirm, unroutable,
    deliver/get and ack counts, and their rates (two readings at least
    shapes.DATA_RATE_MIN_INTERVAL_S apart, as the UI's polls are)."""
    conn = connect(managed)
    publisher, getter, dropper = conn.channel(), conn.channel(), conn.channel()
    publisher.queue_declare("counted")
    publisher.confirm_delivery()
    for _ in range(10):
        publisher.basic_publish("", "counted", b"m")
    for _ in range(5):
        method, _props, _body = getter.basic_get("counted")
        getter.basic_ack(method.delivery_tag)
    dropper.basic_publish("", "no-such-queue", b"lost")  # not mandatory: dropped
    conn.process_data_events(0)

    def by_number() -> dict[int, dict[str, Any]]:
        status, rows = http(managed, "GET", "/channels")
        assert status == 200
        return {row["number"]: row["message_stats"] for row in rows}

    def counted() -> dict[int, dict[str, int]] | None:
        stats = by_number()
        counts = {
            n: {k: v for k, v in s.items() if not k.endswith("_details")} for n, s in stats.items()
        }
        return counts if counts.get(3, {}).get("drop_unroutable") == 1 else None

    counts = wait_for(counted, 10, "the dropped message counted")
    assert counts[publisher.channel_number] == {
        "publish": 10,
        "confirm": 10,
        "drop_unroutable": 0,
        "return_unroutable": 0,
        "deliver_get": 0,
        "ack": 0,
    }
    assert (counts[getter.channel_number]["deliver_get"], counts[getter.channel_number]["ack"]) == (
        5,
        5,
    )
    assert counts[dropper.channel_number]["publish"] == 1

    def publishing_shows_a_rate() -> bool:
        for _ in range(20):
            publisher.basic_publish("", "counted", b"m")
        rate = by_number()[publisher.channel_number]["publish_details"]["rate"]
        return bool(rate > 0)

    wait_for(publishing_shows_a_rate, 20, "a channel's publish rate", interval=0.5)
    conn.close()


def test_an_exchanges_message_stats_count_and_rate(managed: Broker) -> None:
    """/api/exchanges: publish_in (every message published into it) and
    publish_out (those it routed), summed over both IO workers, from runs of
    publishes the C lane takes and from single ones Python takes; and their
    rates. An exchange nothing was published into has no message_stats."""
    a, b = connections_on_both_workers(managed)
    for conn in (a, b):
        ch = conn.channel()
        ch.queue_declare("x-counted", auto_delete=False)
        ch.queue_bind("x-counted", "amq.direct", "k")
        for _ in range(200):  # a run: after its first, the lane's (workers/lane.py)
            ch.basic_publish("amq.direct", "k", b"m")
        ch.basic_publish("amq.direct", "nowhere", b"dropped")  # in, not out
        ch.basic_publish("", "x-counted", b"m")  # the default exchange's
        conn.process_data_events(0)

    def stats() -> dict[str, dict[str, Any]]:
        status, rows = http(managed, "GET", "/exchanges/%2F")
        assert status == 200
        return {row["name"]: row.get("message_stats", {}) for row in rows}

    def counted() -> dict[str, dict[str, Any]] | None:
        now = stats()
        return now if now.get("amq.direct", {}).get("publish_in") == 402 else None

    now = wait_for(counted, 10, "both workers' publishes counted")
    direct = now["amq.direct"]
    assert (direct["publish_in"], direct["publish_out"]) == (402, 400)
    assert (now[""]["publish_in"], now[""]["publish_out"]) == (2, 2)
    assert now["amq.fanout"] == {}  # nothing published into it
    status, one = http(managed, "GET", "/exchanges/%2F/amq.direct?msg_rates_age=60")
    assert status == 200 and one["message_stats"]["publish_out"] == 400
    assert "samples" in one["message_stats"]["publish_in_details"]

    ch = a.channel()

    def publishing_shows_a_rate() -> bool:
        for _ in range(50):
            ch.basic_publish("amq.direct", "k", b"m")
        a.process_data_events(0)
        details = stats()["amq.direct"]["publish_in_details"]
        return bool(details["rate"] > 0)

    wait_for(publishing_shows_a_rate, 20, "an exchange's publish rate", interval=0.5)
    for conn in (a, b):
        conn.close()


def http(
    broker: Broker,
    method: str,
    path: str,
    body: Any = None,
    user: str = "guest",
    password: str = "guest",
    headers: dict[str, str] | None = None,
) -> tuple[int, Any]:
    port = broker.management_port  # type: ignore[attr-defined]
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/api{path}",
        data=None if body is None else json.dumps(body).encode(),
        method=method,
        headers={
            "Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode(),
            "Content-Type": "application/json",
            **(headers or {}),
        },
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            text = response.read()
            return response.status, json.loads(text) if text else None
    except urllib.error.HTTPError as exc:
        text = exc.read()
        try:
            return exc.code, json.loads(text) if text else None
        except ValueError:
            return exc.code, text.decode(errors="replace")  # aiohttp's own 405 page


def test_rabbitmqadmin_lists_declares_publishes_gets_and_deletes(managed: Broker) -> None:
    assert admin(managed, "list", "queues").strip() == "No items"
    admin(managed, "declare", "queue", "name=hq", "durable=true")
    admin(managed, "publish", "routing_key=hq", "payload=hello")
    listed = admin(managed, "-f", "tsv", "list", "queues", "name", "messages", "durable")
    assert listed.splitlines() == ["name\tmessages\tdurable", "hq\t1\tTrue"]
    got = json.loads(admin(managed, "-f", "raw_json", "get", "queue=hq"))
    assert [(m["payload"], m["redelivered"], m["message_count"]) for m in got] == [
        ("hello", False, 0)
    ]
    got = json.loads(
        admin(managed, "-f", "raw_json", "get", "queue=hq", "ackmode=ack_requeue_false")
    )
    assert [(m["payload"], m["redelivered"]) for m in got] == [("hello", True)]
    assert admin(managed, "-f", "tsv", "list", "queues", "name", "messages").splitlines()[1] == (
        "hq\t0"
    )
    admin(managed, "delete", "queue", "name=hq")
    assert admin(managed, "list", "queues").strip() == "No items"
    # What a client made is there too: exchanges and bindings.
    ch = connect(managed).channel()
    ch.queue_declare("bq")
    ch.exchange_declare("bx", "topic")
    ch.queue_bind("bq", "bx", "k.#")
    bindings = admin(
        managed, "-f", "tsv", "list", "bindings", "source", "destination", "routing_key"
    )
    assert "bx\tbq\tk.#" in bindings.splitlines()
    assert "bx\ttopic" in admin(managed, "-f", "tsv", "list", "exchanges", "name", "type")


def test_logins_and_tags_mean_what_rabbitmqs_do(managed: Broker) -> None:
    assert http(managed, "GET", "/overview", password="wrong")[0] == 401
    assert http(managed, "GET", "/whoami") == (200, {"name": "guest", "tags": ["administrator"]})
    status, body = http(managed, "PUT", "/users/plain", {"password": "pw", "tags": ""})
    assert status == 201, body
    assert http(managed, "GET", "/overview", user="plain", password="pw") == (
        401,
        {"error": "not_authorized", "reason": "Not management user"},
    )
    assert http(managed, "PUT", "/vhosts/mv")[0] == 201
    assert http(managed, "PUT", "/users/mgr", {"password": "pw", "tags": "management"})[0] == 201
    perms = {"configure": "^mine", "write": ".*", "read": ".*"}
    assert http(managed, "PUT", "/permissions/mv/mgr", perms)[0] == 201
    # A management user sees its own vhosts only, and is no administrator.
    status, vhosts = http(managed, "GET", "/vhosts", user="mgr", password="pw")
    assert (status, [v["name"] for v in vhosts]) == (200, ["mv"])
    assert http(managed, "GET", "/users", user="mgr", password="pw")[0] == 401
    # Declares go through AMQP as that user: configure is checked.
    assert http(managed, "PUT", "/queues/mv/mine.q", {"durable": False}, "mgr", "pw")[0] == 201
    status, body = http(managed, "PUT", "/queues/mv/other", {"durable": False}, "mgr", "pw")
    assert status == 401 and "access to queue 'other' in vhost 'mv' refused" in body["reason"]
    status, queues = http(managed, "GET", "/queues/mv", user="mgr", password="pw")
    assert [q["name"] for q in queues] == ["mine.q"]
    assert http(managed, "GET", "/queues/%2F", user="mgr", password="pw")[0] == 401


def test_definitions_connections_and_health(managed: Broker) -> None:
    status, exported = http(managed, "GET", "/definitions")
    ctl = shoal(managed, "ctl", "export_definitions", "-")
    assert status == 200 and exported["users"] == json.loads(ctl.stdout)["users"]
    exported["vhosts"].append({"name": "imported"})
    assert http(managed, "POST", "/definitions", exported)[0] == 204
    assert "imported" in [v["name"] for v in http(managed, "GET", "/vhosts")[1]]
    conn = connect(managed)
    status, connections = http(managed, "GET", "/connections")
    assert status == 200 and [c["user"] for c in connections] == ["guest"]
    name = connections[0]["name"]
    path = "/connections/" + urllib.request.quote(name, safe="")
    assert http(managed, "DELETE", path, headers={"X-Reason": "bye"})[0] == 204
    # As RabbitMQ's: answered once connection.close is written, so it is
    # here already (a look without waiting; Bunny's recovery specs count on it).
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as caught:
        conn.process_data_events(0)
    assert caught.value.reply_text == "CONNECTION_FORCED - bye"
    for check in ("alarms", "local-alarms", "virtual-hosts", f"port-listener/{managed.port}"):
        assert http(managed, "GET", f"/health/checks/{check}") == (200, {"status": "ok"})
    status, body = http(managed, "GET", "/health/checks/port-listener/1")
    assert status == 503 and body["status"] == "failed"
    status, overview = http(managed, "GET", "/overview")
    assert status == 200 and overview["rabbitmq_version"].startswith("3.")


def test_what_amqpstorms_management_api_calls_answers_as_rabbitmqs(managed: Broker) -> None:
    """The calls AMQPStorm's functional tests make that RabbitMQ 3.10 answers
    (docs/interop.md): a vhost made through the API is its maker's to use at
    once, users go in bulk, and the older health endpoints answer."""
    assert http(managed, "PUT", "/vhosts/made") == (201, None)
    assert http(managed, "GET", "/permissions/made/guest") == (
        200,
        {"user": "guest", "vhost": "made", "configure": ".*", "write": ".*", "read": ".*"},
    )
    assert http(managed, "PUT", "/queues/made/q", {"durable": True})[0] == 201
    assert http(managed, "DELETE", "/permissions/made/guest")[0] == 204
    assert http(managed, "PUT", "/vhosts/made") == (204, None)  # no grant when it exists
    assert http(managed, "GET", "/permissions/made/guest")[0] == 404

    for name in ("b1", "b2", "b3"):
        assert http(managed, "PUT", f"/users/{name}", {"password": "pw", "tags": ""})[0] == 201
    assert http(managed, "POST", "/users/bulk-delete", {"users": ["b1", "b2"]}) == (204, None)
    assert http(managed, "POST", "/users/bulk-delete", {}) == (
        400,
        {"error": "bad_request", "reason": "[{key_missing,users}]"},
    )
    assert http(managed, "POST", "/users/bulk-delete", {"users": ["b3", "nobody"]}) == (
        400,
        {"error": "bad_request", "reason": ["no_such_user", "nobody"]},
    )
    users = [u["name"] for u in http(managed, "GET", "/users")[1]]
    assert users == ["guest"]  # b3, before the unknown name, went too

    assert http(managed, "GET", "/aliveness-test/%2F") == (200, {"status": "ok"})
    assert http(managed, "GET", "/aliveness-test/nowhere")[0] == 404
    status, queue = http(managed, "GET", "/queues/%2F/aliveness-test")
    assert status == 200 and queue["messages"] == 0  # kept, its message taken back
    node = http(managed, "GET", "/overview")[1]["node"]
    for path in ("/healthchecks/node", "/healthchecks/node/", f"/healthchecks/node/{node}"):
        assert http(managed, "GET", path) == (200, {"status": "ok"}), path
    assert http(managed, "GET", "/healthchecks/node/rabbit@elsewhere")[0] == 404


@pytest.mark.slow  # its own CI step (.ci/run: slow): out of make test's 10 minutes
def test_the_virtual_hosts_check_fails_while_the_broker_cannot_serve(managed: Broker) -> None:
    """RabbitMQ's virtual-hosts check answers whether every vhost's processes
    run; here the scheduler and the IO workers serve every vhost. A stopped
    scheduler (a hung loop: its heartbeat goes stale) fails the check, and
    it passes again once the scheduler runs."""
    assert http(managed, "GET", "/health/checks/virtual-hosts") == (200, {"status": "ok"})
    scheduler = managed.pids("scheduler")[0]
    os.kill(scheduler, signal.SIGSTOP)
    try:
        wait_for(
            lambda: http(managed, "GET", "/health/checks/virtual-hosts")[0] == 503,
            20,
            "the check to fail",
        )
        _status, body = http(managed, "GET", "/health/checks/virtual-hosts")
        assert body == {
            "status": "failed",
            "reason": "Some virtual hosts are down",
            "virtual-hosts": ["/"],
        }
    finally:
        os.kill(scheduler, signal.SIGCONT)
    wait_for(
        lambda: http(managed, "GET", "/health/checks/virtual-hosts")[0] == 200,
        20,
        "the check to pass again",
    )


def test_only_rabbitmqs_methods_change_things(managed: Broker) -> None:
    assert http(managed, "PUT", "/vhosts/keep")[0] == 201
    for method in ("HEAD", "POST", "PATCH"):
        assert http(managed, method, "/vhosts/keep")[0] == 405
    assert "keep" in [v["name"] for v in http(managed, "GET", "/vhosts")[1]]
    # A policymaker sets policies only in vhosts it may use.
    assert http(managed, "PUT", "/users/pm", {"password": "pw", "tags": "policymaker"})[0] == 201
    policy = {"pattern": ".*", "definition": {"max-length": 0}}
    status, body = http(managed, "PUT", "/policies/keep/wipe", policy, "pm", "pw")
    assert status == 401, body
    assert http(managed, "GET", "/policies/keep", user="pm", password="pw")[0] == 401
    perms = {"configure": ".*", "write": ".*", "read": ".*"}
    assert http(managed, "PUT", "/permissions/keep/pm", perms)[0] == 201
    assert http(managed, "PUT", "/policies/keep/cap", policy, "pm", "pw")[0] == 201


def test_requests_the_broker_refuses_are_the_clients_fault_as_in_rabbitmq(managed: Broker) -> None:
    """A close the broker sends other than 404 and 403 is 400, as RabbitMQ's
    rabbit_mgmt_util (an unknown exchange type, COMMAND_INVALID 503, was a
    503 service_unavailable); arguments that are not an object, and names no
    AMQP short string holds, are 400 or 404, never 500 (found by random
    requests over every route)."""
    status, body = http(managed, "PUT", "/exchanges/%2F/typo", {"type": "nope"})
    assert status == 400 and "unknown exchange type 'nope'" in body["reason"], body
    status, body = http(managed, "PUT", "/exchanges/%2F/typo", {"arguments": True})
    assert status == 400 and "arguments" in body["reason"], body
    assert http(managed, "PUT", "/queues/%2F/typo", {"arguments": [1]})[0] == 400
    long_name = "q" * 300
    assert http(managed, "DELETE", f"/queues/%2F/{long_name}")[0] == 400
    assert http(managed, "POST", f"/exchanges/{long_name}/x/publish", {})[0] == 404
    user = {"name": "t", "password": "p", "tags": [["administrator"]]}  # (not names)
    status, body = http(managed, "POST", "/definitions", {"users": [user]})
    assert status == 400 and "tags must be a list of names" in body["reason"], body
    assert http(managed, "GET", "/exchanges/%2F/amq.direct")[0] == 200  # (it serves on)
    log = managed.log()
    assert "Error handling request" not in log and "Traceback" not in log


def test_an_objects_bindings_and_permissions(managed: Broker) -> None:
    ch = connect(managed).channel()
    ch.queue_declare("oq")
    ch.exchange_declare("ox", "direct")
    ch.exchange_declare("oy", "fanout")
    ch.queue_bind("oq", "ox", "k")
    ch.exchange_bind("oy", "ox", "e")
    status, of_queue = http(managed, "GET", "/queues/%2F/oq/bindings")
    assert status == 200
    assert [(b["source"], b["routing_key"]) for b in of_queue] == [("", "oq"), ("ox", "k")]
    status, from_x = http(managed, "GET", "/exchanges/%2F/ox/bindings/source")
    assert sorted((b["destination"], b["destination_type"]) for b in from_x) == [
        ("oq", "queue"),
        ("oy", "exchange"),
    ]
    status, to_y = http(managed, "GET", "/exchanges/%2F/oy/bindings/destination")
    assert [b["source"] for b in to_y] == ["ox"]
    status, between = http(managed, "GET", "/bindings/%2F/e/ox/q/oq")
    assert [b["routing_key"] for b in between] == ["k"]
    status, perms = http(managed, "GET", "/vhosts/%2F/permissions")
    assert [(p["user"], p["configure"]) for p in perms] == [("guest", ".*")]
    assert http(managed, "GET", "/users/guest/permissions")[1] == perms


def test_a_consumers_channel_details_are_whole_wherever_it_is_listed(managed: Broker) -> None:
    """RabbitMQ's consumer_details name the consumer's channel whole, on a
    queue's page and in /api/consumers: nameko's tests, for one, read
    channel_details' connection_name to see which connection consumes."""
    conn = connect(managed)
    conn.channel()  # channel 1, unused: the consumer's is number 2
    ch = conn.channel()
    ch.queue_declare("cd")
    tag = ch.basic_consume("cd", lambda *_: None)
    status, connections = http(managed, "GET", "/connections")
    assert status == 200 and len(connections) == 1
    connection = connections[0]
    node = http(managed, "GET", "/overview")[1]["node"]
    expected = {
        "name": f"{connection['name']} (2)",
        "connection_name": connection["name"],
        "number": 2,
        "user": "guest",
        "peer_host": connection["peer_host"],
        "peer_port": connection["peer_port"],
        "node": node,
    }
    status, queue = http(managed, "GET", "/queues/%2F/cd")
    assert status == 200
    assert [(c["consumer_tag"], c["channel_details"]) for c in queue["consumer_details"]] == [
        (tag, expected)
    ]
    for path in ("/consumers", "/consumers/%2F"):
        status, listed = http(managed, "GET", path)
        assert status == 200
        assert [(c["consumer_tag"], c["channel_details"]) for c in listed] == [(tag, expected)]
    conn.close()


def test_message_stats_count_and_rate_as_rabbitmqs(broker_factory: Callable[..., Broker]) -> None:
    port = free_port()
    broker = broker_factory(
        args=("--management-port", str(port), "--collect-statistics-interval", "100")
    )
    broker.management_port = port  # type: ignore[attr-defined]
    wait_for(lambda: _listening(port), 20, "the management API")
    ch = connect(broker).channel()
    ch.queue_declare("rated")
    ch.confirm_delivery()
    for _ in range(30):
        ch.basic_publish("", "rated", b"m")
    for _ in range(10):
        method, _props, _body = ch.basic_get("rated")
        ch.basic_ack(method.delivery_tag)
    method, _props, _body = ch.basic_get("rated")
    ch.basic_nack(method.delivery_tag, requeue=True)
    method, _props, _body = ch.basic_get("rated")  # redelivered
    ch.basic_ack(method.delivery_tag)

    def queue_stats() -> dict[str, Any]:
        status, queue = http(broker, "GET", "/queues/%2F/rated")
        assert status == 200
        return dict(queue)

    def counts() -> dict[str, int]:
        stats = queue_stats()["message_stats"]
        return {k: v for k, v in stats.items() if not k.endswith("_details")}

    # Sampled every 100 ms: the counts as they are once a sample is taken.
    wait_for(lambda: counts() == {"publish": 30, "ack": 11}, 10, "the counts")
    stats = queue_stats()
    assert stats["messages"] == 19 and isinstance(stats["messages_details"]["rate"], float)

    def publishing_shows_a_rate() -> bool:
        for _ in range(20):
            ch.basic_publish("", "rated", b"m")
        _status, overview = http(broker, "GET", "/overview")
        return bool(
            queue_stats()["message_stats"]["publish_details"]["rate"] > 0
            and overview["message_stats"]["publish_details"]["rate"] > 0
        )

    wait_for(publishing_shows_a_rate, 10, "a publish rate")

    def overview_totals() -> dict[str, Any]:
        _status, overview = http(broker, "GET", "/overview")
        return dict(overview["message_stats"])

    # The rates may come from the first 30 alone: the totals of a later sample.
    wait_for(lambda: overview_totals()["publish"] >= 50, 10, "the later publishes counted")
    totals = overview_totals()
    assert totals["publish"] >= 50 and totals["get"] == 12 and totals["ack"] == 11
    assert totals["redeliver"] == 1 and set(totals["deliver_get_details"]) == {"rate"}


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_limits_parameters_and_pages(managed: Broker) -> None:
    assert http(managed, "PUT", "/vhost-limits/%2F/max-queues", {"value": 50})[0] == 204
    assert http(managed, "PUT", "/vhost-limits/%2F/max-connections", {"value": 9})[0] == 204
    limits = {"max-queues": 50, "max-connections": 9}
    assert http(managed, "GET", "/vhost-limits") == (200, [{"vhost": "/", "value": limits}])
    assert http(managed, "GET", "/parameters/vhost-limits/%2F") == (
        200,
        [{"vhost": "/", "component": "vhost-limits", "name": "limits", "value": limits}],
    )
    assert http(managed, "DELETE", "/vhost-limits/%2F/max-queues")[0] == 204
    assert http(managed, "GET", "/vhost-limits/%2F")[1] == [
        {"vhost": "/", "value": {"max-connections": 9}}
    ]
    assert http(managed, "PUT", "/users/lim", {"password": "pw", "tags": ""})[0] == 201
    assert http(managed, "PUT", "/user-limits/lim/max-channels", {"value": 3})[0] == 204
    assert http(managed, "GET", "/user-limits/lim") == (
        200,
        [{"user": "lim", "value": {"max-channels": 3}}],
    )
    status, body = http(managed, "PUT", "/user-limits/lim/max-channels", {"value": "x"})
    assert status == 400 and body["error"] == "bad_request"
    assert http(managed, "GET", "/operator-policies") == (200, [])
    # rabbitmqadmin's listings of them.
    assert "max-connections" in admin(managed, "list", "vhost_limits")
    assert "vhost-limits" in admin(managed, "list", "parameters")
    # The management UI's pagination.
    ch = connect(managed).channel()
    for i in range(5):
        ch.queue_declare(f"page-{i}")
    status, page = http(managed, "GET", "/queues/%2F?page=2&page_size=2&name=page-")
    assert status == 200
    assert {k: v for k, v in page.items() if k != "items"} == {
        "filtered_count": 5,
        "item_count": 2,
        "page": 2,
        "page_count": 3,
        "page_size": 2,
        "total_count": 5,
    }
    assert [q["name"] for q in page["items"]] == ["page-2", "page-3"]


def test_a_nodes_alarms_and_limits_are_the_brokers(broker_factory: Callable[..., Broker]) -> None:
    """/api/nodes as monitoring reads it (nagios' check_rabbitmq_watermark
    alerts on mem_alarm / disk_free_alarm): the alarms in force, the disk
    limit set, and mem_limit as RabbitMQ's, the high watermark's share of RAM."""
    managed = start_managed(broker_factory, "--disk-free-limit", str(1 << 60))

    def alarmed() -> dict[str, Any] | None:
        (node,) = http(managed, "GET", "/nodes")[1]
        return node if node["disk_free_alarm"] else None

    node = wait_for(alarmed, 20, "the disk alarm in /api/nodes")
    assert node["disk_free_limit"] == 1 << 60 and node["mem_alarm"] is False
    assert node["mem_limit"] == int(psutil.virtual_memory().total * 0.4)
    assert http(managed, "GET", f"/nodes/{node['name']}")[1]["disk_free_alarm"] is True


def test_the_node_name_is_rabbitmqs_nodename_where_one_is_given(
    broker_factory: Callable[..., Broker],
) -> None:
    """--node-name (RabbitMQ's RABBITMQ_NODENAME): monitoring checks ask for
    /api/nodes/rabbit@<host> (nagios-plugins-rabbitmq); every process answers
    with the name given."""
    managed = start_managed(broker_factory, "--node-name", "rabbit@monitored")
    assert http(managed, "GET", "/overview")[1]["node"] == "rabbit@monitored"
    status, node = http(managed, "GET", "/nodes/rabbit@monitored")
    assert status == 200 and node["name"] == "rabbit@monitored"
    assert http(managed, "GET", "/nodes/shoal@monitored")[0] == 404
    conn = connect(managed)
    assert conn._impl.server_properties["cluster_name"] == "rabbit@monitored"
    conn.close()
