"""The durable definitions: what of the definitions outlives the broker.

As RabbitMQ keeps them: virtual hosts, durable exchanges, durable queues
that are not exclusive (with their arguments), bindings whose source and
destination are both durable, policies and runtime parameters (shovels).
Everything else vanishes with the broker. Users, their permissions and vhost limits are kept too (as
RabbitMQ keeps them in its database, with the password hashes only).

This module is the scheduler's side: which records the log holds (`Record`:
the journal's operations, broker/amqp/definitions.py, and the log's own
queue records), and replaying them (`Restored`). The file itself (format,
appending, compaction, reading) is store/definitions_log.py's.

The scheduler, the only writer, appends a change's record and fdatasyncs it
before the change's -ok reply (journal.py, queues.py). At every start it
replays the log and writes it again as a snapshot of what it then holds
(`rewrite`), which also drops a change that a scheduler killed between the
queue table and the log had left half done; it does the same once the
appended records outgrow the snapshot (`needs_compaction`).
"""

from __future__ import annotations

import logging
import os
from typing import Any, Union

import msgspec

from shoal.broker.amqp import access, definitions_json
from shoal.broker.amqp import definitions as D
from shoal.store import records
from shoal.store.definitions_log import DefinitionsLog, QueueDeclared, QueueDeleted, UsersSeeded

log = logging.getLogger("shoal.scheduler")


def new_uid() -> int:
    """A durable queue's uid: 63 random bits, never 0."""
    return int.from_bytes(os.urandom(8), "little") >> 1 or 1


Record = Union[  # noqa: UP007 (a Union: mypy takes it as a type alias)
    D.VHostAdded,
    D.ExchangeDeclared,
    D.ExchangeDeleted,
    D.Bound,
    D.Unbound,
    QueueDeclared,
    QueueDeleted,
    D.PolicySet,
    D.PolicyCleared,
    D.VHostDeleted,
    D.VHostLimitsSet,
    D.UserSet,
    D.UserDeleted,
    D.PermissionSet,
    D.PermissionCleared,
    D.TopicPermissionSet,
    D.TopicPermissionCleared,
    D.ParameterSet,
    D.ParameterCleared,
    UsersSeeded,
]

_decode = msgspec.msgpack.Decoder(Record).decode


class UnreadableDefinitions(Exception):
    """definitions.log is not a log this version can read, or what it holds
    does not fit in the definitions journal: the broker does not start
    (rather than start without the definitions it promised)."""


def load_definitions_file(path: str) -> dict[str, Any]:
    """--load-definitions: RabbitMQ's definitions JSON, checked as an import
    checks it (broker/amqp/definitions_json.py). Unreadable, it stops the
    broker at start (RabbitMQ's node does not boot either)."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
        definitions: dict[str, Any] = msgspec.json.decode(raw)
        definitions_json.parse(definitions)
    except (OSError, msgspec.DecodeError, definitions_json.DefinitionsError) as exc:
        raise UnreadableDefinitions(f"--load-definitions {path}: {exc}") from None
    return definitions


class Restored:
    """The durable definitions as the log left them."""

    __slots__ = ("definitions", "queues", "seeded")

    def __init__(self) -> None:
        self.definitions = D.Definitions()  # vhosts, exchanges, bindings, users
        self.queues: dict[tuple[str, str], QueueDeclared] = {}  # in declaration order
        self.seeded = False

    def apply(self, record: Record) -> None:
        if isinstance(record, UsersSeeded):
            self.seeded = True
        elif isinstance(record, D.VHostDeleted):
            for key in [key for key in self.queues if key[0] == record.vhost]:
                del self.queues[key]
            self.definitions.apply(record)
        elif isinstance(record, QueueDeclared):
            self.queues[(record.vhost, record.queue)] = record
        elif isinstance(record, QueueDeleted):
            self.queues.pop((record.vhost, record.queue), None)
            self.definitions.apply(D.QueueGone(record.vhost, record.queue))
        else:
            self.definitions.apply(record)

    def operations(
        self, default_vhost: str, default_user: str = "", default_pass: str = ""
    ) -> list[D.Op]:
        """Vhosts, exchanges, bindings and users as journal operations. At
        the first start (an empty log, or one from before users were kept):
        the default vhost with its amq.* exchanges, and the default user,
        an administrator with every permission in it (RabbitMQ's first
        boot). Later, the default vhost only if the log has none at all."""
        ops = self.definitions.snapshot()
        ops += D.missing_default_exchanges(self.definitions)
        ids = self.definitions.vhost_ids
        if not self.seeded:
            if default_vhost not in ids:
                ops[:0] = D.new_vhost_ops(default_vhost, max(ids.values(), default=-1) + 1)
            if default_user:
                password_hash = access.hash_password(default_pass)
                admin = ["administrator"]
                ops.append(D.UserSet(default_user, password_hash, access.SHA256, admin, {}))
                ops.append(D.PermissionSet(default_vhost, default_user, ".*", ".*", ".*"))
            self.seeded = True
        return ops


def open_log(data_dir: str) -> tuple[DefinitionsLog, Restored]:
    """definitions.log open for appending, and what it holds replayed. A
    log this version cannot read raises UnreadableDefinitions; a torn tail
    is cut off (store/records.py) and logged."""
    try:
        file, payloads, skipped = DefinitionsLog.open(data_dir)
    except records.FormatError as exc:
        raise UnreadableDefinitions(str(exc)) from None
    if skipped is not None:
        log.warning(
            "%s: skipped %d bytes at offset %d (%s): a change cut short by a crash, "
            "never acknowledged",
            file.path,
            skipped.size,
            skipped.offset,
            skipped.reason,
        )
    restored = Restored()
    for number, payload in enumerate(payloads):
        try:
            restored.apply(_decode(payload))
        except (msgspec.DecodeError, ValueError) as exc:
            file.close()
            raise UnreadableDefinitions(f"{file.path}: record {number}: {exc}") from None
    return file, restored
