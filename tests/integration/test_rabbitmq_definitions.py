"""Definitions move between Shoal and a real RabbitMQ 3.10 both ways, users
and permissions included: what `shoal ctl export_definitions` writes,
`rabbitmqctl import_definitions` takes (its users log in with their
passwords, so the hashes carried over; permissions, topic permissions,
policies, vhost limits, tags, queues, exchanges and bindings are there),
and what `rabbitmqctl export_definitions` writes back, `shoal ctl
import_definitions` takes into a fresh Shoal.

Needs rabbitmq-server and rabbitmqctl (the Debian package, started as a
private node on a free port with its own directories by bench/persistent.py's
`Rabbit`); skipped without them. Every wait is bounded; the node is stopped
and its directory removed at the end, and epmd too when the node started it."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pika
import pika.exceptions
import pytest

from tests.broker_process import Broker, wait_for
from tests.clients import shoal
from tests.rabbit_node import RABBITMQ_MARKS, private_node, rabbit_json, rabbitmqctl

pytestmark = RABBITMQ_MARKS


@pytest.fixture
def rabbit() -> Iterator[Any]:
    yield from private_node()


# --- Shoal -------------------------------------------------------------------------


def ctl(broker: Broker, *args: str) -> str:
    done = shoal(broker, "ctl", *args)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


# --- either broker -----------------------------------------------------------------


def login(port: int, user: str, password: str, vhost: str) -> pika.BlockingConnection:
    return pika.BlockingConnection(
        pika.ConnectionParameters(
            "127.0.0.1",
            port,
            vhost,
            pika.PlainCredentials(user, password),
            connection_attempts=1,
            socket_timeout=10,
            blocked_connection_timeout=30,
        )
    )


def passive_count(ch: Any, queue: str) -> int:
    return int(ch.queue_declare(queue, passive=True).method.message_count)


def by(key: str, rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {row[key]: row for row in rows}


@pytest.mark.slow  # its own CI step (.ci/run: slow)
def test_definitions_round_trip_between_shoal_and_rabbitmq(
    broker_factory: Callable[..., Broker], rabbit: Any
) -> None:
    shoal_to_rabbitmq(broker_factory(), rabbit)
    rabbitmq_to_shoal(rabbit, broker_factory())


def shoal_to_rabbitmq(source: Broker, node: Any) -> None:
    ctl(source, "add_user", "alice", "s3cret")
    ctl(source, "set_user_tags", "alice", "management", "policymaker")
    ctl(source, "add_vhost", "app")
    ctl(source, "set_permissions", "-p", "app", "alice", r"^alice\.", ".*", ".*")
    ctl(source, "set_topic_permissions", "-p", "app", "alice", "amq.topic", r"^a\.", r"^b\.")
    ctl(source, "set_vhost_limits", "-p", "app", '{"max-queues": 10}')
    ctl(
        source,
        "set_policy",
        "-p",
        "app",
        "ttl",
        r"^alice\.",
        '{"message-ttl": 60000}',
        "--apply-to",
        "queues",
    )
    conn = login(source.port, "alice", "s3cret", "app")
    ch = conn.channel()
    ch.queue_declare("alice.q", durable=True, arguments={"x-max-length": 100})
    ch.exchange_declare("alice.x", "topic", durable=True)
    ch.queue_bind("alice.q", "alice.x", "k.#")
    conn.close()

    # In the node's directory: rabbitmqctl runs as the rabbitmq user (Debian's wrapper).
    exported = node.base / "from-shoal.json"
    ctl(source, "export_definitions", str(exported))
    exported.chmod(0o644)
    rabbitmqctl(node, "import_definitions", str(exported))

    # alice's password hash carried over: she logs in with hers.
    conn = login(node.port, "alice", "s3cret", "app")
    ch = conn.channel()
    assert passive_count(ch, "alice.q") == 0
    ch.confirm_delivery()
    ch.basic_publish("alice.x", "k.1", b"routed by the imported binding", mandatory=True)
    got = wait_for(lambda: ch.basic_get("alice.q", auto_ack=True)[2], 10, "the message in alice.q")
    assert got == b"routed by the imported binding"
    conn.close()

    for what in ("list_permissions", "list_topic_permissions", "list_policies"):
        print(f"$ rabbitmqctl {what} -p app\n" + rabbitmqctl(node, what, "-p", "app"))
    print(
        "$ rabbitmqctl list_vhost_limits -p app\n"
        + rabbitmqctl(node, "list_vhost_limits", "-p", "app")
    )
    print("$ rabbitmqctl list_users\n" + rabbitmqctl(node, "list_users"))

    permissions = by("user", rabbit_json(node, "list_permissions", "-p", "app"))
    assert permissions["alice"] == {
        "user": "alice",
        "configure": r"^alice\.",
        "write": ".*",
        "read": ".*",
    }
    topic = rabbit_json(node, "list_topic_permissions", "-p", "app")
    assert topic == [{"user": "alice", "exchange": "amq.topic", "write": r"^a\.", "read": r"^b\."}]
    policies = by("name", rabbit_json(node, "list_policies", "-p", "app"))
    ttl = policies["ttl"]
    definition = ttl["definition"]
    if isinstance(definition, str):
        definition = json.loads(definition)
    assert (ttl["vhost"], ttl["pattern"], ttl["apply-to"], definition, ttl["priority"]) == (
        "app",
        r"^alice\.",
        "queues",
        {"message-ttl": 60000},
        0,
    )
    # Its JSON formatter wraps this one in the node's name: the quiet table is the JSON.
    limits = rabbitmqctl(node, "list_vhost_limits", "-p", "app", "-q")
    assert json.loads(limits) == {"max-queues": 10}
    users = by("user", rabbit_json(node, "list_users"))
    assert sorted(users["alice"]["tags"]) == ["management", "policymaker"]
    queues = by("name", rabbit_json(node, "list_queues", "-p", "app", "name", "arguments"))
    # The JSON formatter gives an AMQP table as [name, type, value] triples.
    arguments = {name: value for name, _type, value in queues["alice.q"]["arguments"]}
    assert arguments == {"x-max-length": 100}


def rabbitmq_to_shoal(node: Any, target: Broker) -> None:
    rabbitmqctl(node, "add_user", "bob", "b0b")
    rabbitmqctl(node, "set_user_tags", "bob", "monitoring")
    rabbitmqctl(node, "set_permissions", "-p", "app", "bob", ".*", ".*", ".*")
    conn = login(node.port, "bob", "b0b", "app")
    conn.channel().queue_declare("bob.q", durable=True)
    conn.close()
    exported = node.base / "from-rabbitmq.json"
    rabbitmqctl(node, "export_definitions", str(exported))

    ctl(target, "import_definitions", str(exported))
    conn = login(target.port, "bob", "b0b", "app")
    ch = conn.channel()
    assert passive_count(ch, "bob.q") == 0
    assert passive_count(ch, "alice.q") == 0
    conn.close()
    conn = login(target.port, "alice", "s3cret", "app")
    ch = conn.channel()
    assert passive_count(ch, "alice.q") == 0
    ch.confirm_delivery()
    ch.basic_publish("alice.x", "k.2", b"routed in Shoal again", mandatory=True)
    got = wait_for(lambda: ch.basic_get("alice.q", auto_ack=True)[2], 10, "the message in alice.q")
    assert got == b"routed in Shoal again"
    conn.close()

    users = by("user", json.loads(ctl(target, "list_users", "--formatter", "json")))
    assert sorted(users["alice"]["tags"]) == ["management", "policymaker"]
    assert users["bob"]["tags"] == ["monitoring"]
    permissions = by(
        "user", json.loads(ctl(target, "list_permissions", "-p", "app", "--formatter", "json"))
    )
    assert permissions["alice"] == {
        "user": "alice",
        "configure": r"^alice\.",
        "write": ".*",
        "read": ".*",
    }
    assert permissions["bob"] == {"user": "bob", "configure": ".*", "write": ".*", "read": ".*"}
    topic = json.loads(ctl(target, "list_topic_permissions", "-p", "app", "--formatter", "json"))
    assert topic == [{"user": "alice", "exchange": "amq.topic", "write": r"^a\.", "read": r"^b\."}]
    assert json.loads(ctl(target, "list_vhost_limits", "-p", "app", "-q")) == {"max-queues": 10}
    assert "ttl\t^alice\\.\tqueues" in ctl(target, "list_policies", "-p", "app", "-q")
