"""RabbitMQ's definitions file (`rabbitmqctl export_definitions`, the
management API's /api/definitions), both ways, without IO: what Shoal
exports imports into RabbitMQ 3.10 and what RabbitMQ exports imports into
Shoal, users (with their password hashes) and permissions included.

What is exported is what RabbitMQ exports: users, vhosts (vhost limits as
`vhost-limits` parameters), permissions, topic permissions, policies, and
the durable definitions: durable exchanges other than the amq.* ones,
durable queues that are not exclusive, bindings between durable ones. An
import adds or replaces; it removes nothing."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, NamedTuple

import msgspec

from shoal.broker.amqp import access
from shoal.broker.amqp import definitions as D

# What the file says it came from: RabbitMQ's import reads rabbit_version
# and accepts any; tools print it.
RABBIT_VERSION = "3.10.8"


class QueueRow(NamedTuple):
    vhost: str
    name: str
    durable: bool
    auto_delete: bool
    arguments: dict[str, Any]
    type: str  # classic, quorum, stream


class Imported(NamedTuple):
    vhosts: list[str]
    users: list[D.UserSet]
    vhost_limits: list[D.VHostLimitsSet]
    permissions: list[D.PermissionSet]
    topic_permissions: list[D.TopicPermissionSet]
    policies: list[D.PolicySet]
    exchanges: list[D.ExchangeDeclared]
    queues: list[QueueRow]
    bindings: list[D.Bound]
    parameters: list[D.ParameterSet]  # a shovel's (the one component besides vhost-limits)


class DefinitionsError(ValueError):
    """A definitions file that cannot be imported (and why)."""


def export(
    definitions: D.Definitions, queues: Iterable[QueueRow], default_vhost: str = "/"
) -> dict[str, Any]:
    """`queues`: those not exclusive (RabbitMQ exports the others)."""
    queue_rows = list(queues)
    exported_queues = {(q.vhost, q.name) for q in queue_rows}
    exchanges: list[dict[str, Any]] = []
    bindings: list[dict[str, Any]] = []
    for vhost, router in definitions.vhosts.items():
        for name in sorted(n for n in router.exchanges if n and not n.startswith("amq.")):
            x = router.exchanges[name]
            exchanges.append(
                {
                    "name": name,
                    "vhost": vhost,
                    "type": x.type,
                    "durable": x.durable,
                    "auto_delete": x.auto_delete,
                    "arguments": x.arguments,
                    # RabbitMQ 3.10 leaves "internal" out; kept when it is true.
                    **({"internal": True} if x.internal else {}),
                }
            )
        for x in router.exchanges.values():
            for ((kind, dest), routing_key, _frozen), arguments in x.bindings.items():
                if kind == "e" or (vhost, dest) in exported_queues:
                    bindings.append(
                        {
                            "source": x.name,
                            "vhost": vhost,
                            "destination": dest,
                            "destination_type": "queue" if kind == "q" else "exchange",
                            "routing_key": routing_key,
                            "arguments": arguments,
                        }
                    )
    limits = definitions.vhost_limits
    topic_permissions = [
        p for named in definitions.topic_permissions.values() for p in named.values()
    ]
    return {
        "rabbit_version": RABBIT_VERSION,
        "rabbitmq_version": RABBIT_VERSION,
        "users": [
            {
                "name": u.user,
                "password_hash": u.password_hash,
                "hashing_algorithm": u.hashing_algorithm,
                "tags": u.tags,
                "limits": u.limits,
            }
            for u in definitions.users.values()
        ],
        "vhosts": [
            {
                "name": vhost,
                "limits": [[k, v] for k, v in limits.get(vhost, {}).items()],
                "metadata": {
                    "description": "Default virtual host" if vhost == default_vhost else "",
                    "tags": [],
                },
            }
            for vhost in definitions.vhost_ids
        ],
        "permissions": [msgspec.structs.asdict(p) for p in definitions.permissions.values()],
        "topic_permissions": [msgspec.structs.asdict(p) for p in topic_permissions],
        "parameters": [
            {"vhost": vhost, "component": "vhost-limits", "name": "limits", "value": value}
            for vhost, value in limits.items()
            if value
        ]
        + [
            {"value": value, "vhost": vhost, "component": component, "name": name}
            for vhost, parameters in definitions.parameters.items()
            for (component, name), value in parameters.items()
        ],
        "global_parameters": [],
        "policies": [
            {"vhost": vhost, **policy}
            for vhost, named in definitions.policies.items()
            for policy in named.values()
        ],
        "queues": [
            {
                "name": q.name,
                "vhost": q.vhost,
                "durable": q.durable,
                "auto_delete": q.auto_delete,
                "arguments": q.arguments,
                "type": q.type,
            }
            for q in queue_rows
        ],
        "exchanges": exchanges,
        "bindings": bindings,
    }


def parse(doc: Any) -> Imported:
    """A definitions document, checked and typed (DefinitionsError says
    what is wrong, as RabbitMQ refuses an import)."""
    if not isinstance(doc, dict):
        raise DefinitionsError("definitions must be a JSON object")
    imported = Imported([], [], [], [], [], [], [], [], [], [])
    for entry in _entries(doc, "vhosts"):
        imported.vhosts.append(_text(entry, "name"))
    for entry in _entries(doc, "users"):
        imported.users.append(_user(entry))
    for entry in _entries(doc, "parameters"):
        if entry.get("component") == "vhost-limits":
            value = entry.get("value")
            if not isinstance(value, dict):
                raise DefinitionsError("a vhost-limits parameter's value must be an object")
            imported.vhost_limits.append(D.VHostLimitsSet(_text(entry, "vhost"), value))
        elif entry.get("component") == "shovel":
            value = entry.get("value")
            if not isinstance(value, dict):
                raise DefinitionsError("a shovel parameter's value must be an object")
            imported.parameters.append(
                D.ParameterSet(_text(entry, "vhost"), "shovel", _text(entry, "name"), value)
            )
    for entry in _entries(doc, "permissions"):
        vhost, user = _text(entry, "vhost"), _text(entry, "user")
        patterns = [_pattern(entry, k) for k in ("configure", "write", "read")]
        imported.permissions.append(D.PermissionSet(vhost, user, *patterns))
    for entry in _entries(doc, "topic_permissions"):
        vhost, user, exchange = (_text(entry, k) for k in ("vhost", "user", "exchange"))
        write, read = (_pattern(entry, k) for k in ("write", "read"))
        imported.topic_permissions.append(D.TopicPermissionSet(vhost, user, exchange, write, read))
    for entry in _entries(doc, "policies"):
        definition = entry.get("definition")
        if not isinstance(definition, dict):
            raise DefinitionsError("a policy's definition must be an object")
        imported.policies.append(
            D.PolicySet(
                _text(entry, "vhost"),
                _text(entry, "name"),
                _text(entry, "pattern"),
                str(entry.get("apply-to", "all")),
                int(entry.get("priority", 0)),
                definition,
            )
        )
    for entry in _entries(doc, "exchanges"):
        imported.exchanges.append(
            D.ExchangeDeclared(
                _text(entry, "vhost"),
                _text(entry, "name"),
                _text(entry, "type"),
                bool(entry.get("durable", True)),
                bool(entry.get("auto_delete", False)),
                bool(entry.get("internal", False)),
                _arguments(entry),
            )
        )
    for entry in _entries(doc, "queues"):
        arguments = _arguments(entry)
        imported.queues.append(
            QueueRow(
                _text(entry, "vhost"),
                _text(entry, "name"),
                bool(entry.get("durable", True)),
                bool(entry.get("auto_delete", False)),
                arguments,
                str(arguments.get("x-queue-type", entry.get("type", "classic"))),
            )
        )
    for entry in _entries(doc, "bindings"):
        kind = {"queue": "q", "exchange": "e"}.get(str(entry.get("destination_type")))
        if kind is None:
            raise DefinitionsError("a binding's destination_type is queue or exchange")
        imported.bindings.append(
            D.Bound(
                _text(entry, "vhost"),
                _text(entry, "source"),
                kind,
                _text(entry, "destination"),
                str(entry.get("routing_key", "")),
                _arguments(entry),
            )
        )
    return imported


def _entries(doc: dict[str, Any], key: str) -> list[dict[str, Any]]:
    entries = doc.get(key) or []
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise DefinitionsError(f"'{key}' must be a list of objects")
    return entries


def _text(entry: dict[str, Any], key: str) -> str:
    value = entry.get(key)
    if not isinstance(value, str):
        raise DefinitionsError(f"'{key}' missing or not a string in {entry!r:.200}")
    return value


def _pattern(entry: dict[str, Any], key: str) -> str:
    try:
        return access.check_pattern(_text(entry, key))
    except access.AccessError as exc:
        raise DefinitionsError(str(exc)) from None


def _arguments(entry: dict[str, Any]) -> dict[str, Any]:
    arguments = entry.get("arguments") or {}
    if not isinstance(arguments, dict):
        raise DefinitionsError(f"'arguments' must be an object in {entry!r:.200}")
    return arguments


def _user(entry: dict[str, Any]) -> D.UserSet:
    """A user as RabbitMQ exports one (password_hash, hashing_algorithm),
    or with a clear `password` (RabbitMQ's import hashes it)."""
    name = _text(entry, "name")
    tags = entry.get("tags", [])
    if isinstance(tags, str):  # before 3.9: "administrator,management"
        tags = tags.split(",")
    if not isinstance(tags, list) or not all(isinstance(tag, str) for tag in tags):
        raise DefinitionsError(f"user {name!r}: tags must be a list of names")
    limits = entry.get("limits") or {}
    if not isinstance(limits, dict):
        raise DefinitionsError(f"user {name!r}: limits must be an object")
    if "password" in entry:
        password_hash = access.hash_password(str(entry["password"]))
        algorithm = access.SHA256
    else:
        password_hash = str(entry.get("password_hash", ""))
        algorithm = str(entry.get("hashing_algorithm") or access.SHA256)
    return D.UserSet(name, password_hash, algorithm, access.check_tags(tags), limits)
