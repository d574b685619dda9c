"""`shoal ctl export_definitions` / `import_definitions` (issue 16, item 5)
in RabbitMQ's format: a file exported by RabbitMQ 3.10.8 (data/, made by
`rabbitmqctl export_definitions` on a node set up with users, vhosts,
limits, permissions, topic permissions, a policy, queues, exchanges and
bindings) imports into Shoal, its users log in with their passwords (the
hashes are RabbitMQ's), and what Shoal exports has RabbitMQ's keys and
imports into another Shoal unchanged. Pika over real sockets."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pika

from tests.broker_process import Broker
from tests.clients import shoal

RABBITMQ_EXPORT = Path(__file__).parent / "data" / "rabbitmq_3_10_definitions.json"


def ctl(broker: Broker, *args: str) -> str:
    done = shoal(broker, "ctl", *args)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def login(broker: Broker, user: str, password: str, vhost: str) -> pika.BlockingConnection:
    params = pika.ConnectionParameters(
        "127.0.0.1", broker.port, vhost, pika.PlainCredentials(user, password)
    )
    return pika.BlockingConnection(params)


def exported(broker: Broker, tmp_path: Path) -> dict[str, Any]:
    path = tmp_path / f"export-{broker.port}.json"
    ctl(broker, "export_definitions", str(path))
    result: dict[str, Any] = json.loads(path.read_text())
    return result


def test_rabbitmqs_export_imports_into_shoal(broker: Broker) -> None:
    ctl(broker, "import_definitions", str(RABBITMQ_EXPORT))
    # lu's password is lpw, guest's guest: RabbitMQ's hashes check.
    login(broker, "lu", "lpw", "/").close()
    conn = login(broker, "guest", "guest", "v")
    ch = conn.channel()
    assert ch.queue_declare("dq", passive=True).method.message_count == 0
    ch.confirm_delivery()
    ch.basic_publish("dx", "a.b", b"routed by an imported binding")
    assert ch.queue_declare("dq", passive=True).method.message_count == 1
    conn.close()
    queues = json.loads(
        ctl(broker, "list_queues", "-p", "v", "name", "arguments", "--formatter", "json")
    )
    assert {"name": "dq", "arguments": {"x-max-priority": 5}} in queues
    policies = ctl(broker, "list_policies", "-p", "v", "-q")
    assert "ttl\t^dq$\tqueues" in policies
    topic = json.loads(ctl(broker, "list_topic_permissions", "-p", "v", "--formatter", "json"))
    assert topic == [
        {"user": "u", "exchange": "amq.topic", "write": r"^allowed\..*", "read": r"^readable\..*"}
    ]
    limits = ctl(broker, "list_vhost_limits", "-p", "v", "-q")
    assert json.loads(limits) == {"max-connections": 10, "max-queues": 50}


def test_shoals_export_has_rabbitmqs_form_and_imports_unchanged(
    broker_factory: Callable[..., Broker], tmp_path: Path
) -> None:
    rabbit = json.loads(RABBITMQ_EXPORT.read_text())
    first = broker_factory()
    ctl(first, "import_definitions", str(RABBITMQ_EXPORT))
    ours = exported(first, tmp_path)
    assert sorted(ours) == sorted(rabbit)
    for kind, entries in rabbit.items():
        if isinstance(entries, list) and entries:
            assert sorted(ours[kind][0]) == sorted(entries[0]), kind
    for kind in ("users", "permissions", "topic_permissions", "policies", "exchanges", "bindings"):
        assert _sorted(ours[kind]) == _sorted(rabbit[kind]), kind
    assert _sorted(ours["queues"]) == _sorted(rabbit["queues"])
    second = broker_factory()
    path = tmp_path / "ours.json"
    path.write_text(json.dumps(ours))
    ctl(second, "import_definitions", str(path))
    again = exported(second, tmp_path)
    for kind in (
        "users",
        "vhosts",
        "permissions",
        "topic_permissions",
        "parameters",
        "policies",
        "queues",
        "exchanges",
        "bindings",
    ):
        assert _sorted(again[kind]) == _sorted(ours[kind]), kind


def _sorted(entries: list[dict[str, Any]]) -> list[str]:
    return sorted(json.dumps(e, sort_keys=True) for e in entries)
